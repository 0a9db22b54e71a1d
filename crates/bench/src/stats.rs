//! Per-worker recording and the run summary.

use crate::cpu::CpuTime;
use crate::BenchArgs;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Inner {
    latencies_us: Vec<u32>,
    errors: BTreeMap<String, u64>,
    bytes: u64,
}

/// One worker's results; cheap to clone (shared).
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Mutex<Inner>>,
    budget: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    deadline: Instant,
}

fn error_kind(e: &anyhow::Error) -> String {
    let s = e.to_string();
    let s = s.split(':').next().unwrap_or("error").trim();
    s.chars().take(60).collect()
}

impl Recorder {
    pub fn new(budget: Arc<AtomicI64>, stop: Arc<AtomicBool>, deadline: Instant) -> Self {
        Recorder {
            inner: Default::default(),
            budget,
            stop,
            deadline,
        }
    }

    pub fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
            || Instant::now() >= self.deadline
            || self.budget.load(Ordering::Relaxed) <= 0
    }

    /// Claims one operation from the budget; false when the run is over.
    pub fn start_op(&self) -> bool {
        !self.should_stop() && self.budget.fetch_sub(1, Ordering::Relaxed) > 0
    }

    pub fn ok(&self, d: Duration) {
        let us = d.as_micros().min(u32::MAX as u128) as u32;
        self.inner.lock().unwrap().latencies_us.push(us);
    }

    /// Counts body bytes moved: responses in download modes, requests in upload modes.
    pub fn bytes(&self, n: u64) {
        self.inner.lock().unwrap().bytes += n;
    }

    pub fn error(&self, e: &anyhow::Error) {
        *self
            .inner
            .lock()
            .unwrap()
            .errors
            .entry(error_kind(e))
            .or_default() += 1;
        // An erroring target must not be hammered in a tight loop.
        std::thread::yield_now();
    }
}

pub fn totals(recs: &[Recorder]) -> (u64, u64) {
    recs.iter().fold((0, 0), |(o, e), r| {
        let i = r.inner.lock().unwrap();
        (
            o + i.latencies_us.len() as u64,
            e + i.errors.values().sum::<u64>(),
        )
    })
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub mode: String,
    pub url: String,
    pub concurrency: usize,
    pub ok: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub seconds: f64,
    pub rate_per_sec: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_p90: f64,
    pub latency_ms_p99: f64,
    pub server_cpu_seconds: Option<f64>,
    pub server_cpu_us_per_op: Option<f64>,
    /// Body bytes moved (download and upload modes).
    pub bytes: u64,
    pub gbit_per_sec: f64,
    /// Server CPU seconds per GB (10^9 bytes) of body moved.
    pub server_cpu_seconds_per_gb: Option<f64>,
    /// The user-space part of `server_cpu_seconds_per_gb`.
    pub server_user_cpu_seconds_per_gb: Option<f64>,
    /// The kernel part of `server_cpu_seconds_per_gb`.
    pub server_system_cpu_seconds_per_gb: Option<f64>,
}

impl Summary {
    pub fn build(
        args: &BenchArgs,
        recs: &[Recorder],
        elapsed: Duration,
        server_cpu: Option<CpuTime>,
    ) -> Self {
        let mut lat = Vec::new();
        let mut errors_by_kind = BTreeMap::new();
        let mut bytes = 0;
        for r in recs {
            let i = r.inner.lock().unwrap();
            bytes += i.bytes;
            lat.extend_from_slice(&i.latencies_us);
            for (k, v) in &i.errors {
                *errors_by_kind.entry(k.clone()).or_default() += v;
            }
        }
        lat.sort_unstable();
        let pct = |p: f64| {
            if lat.is_empty() {
                0.0
            } else {
                lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1e3
            }
        };
        let ok = lat.len() as u64;
        let secs = elapsed.as_secs_f64();
        let per_gb = |part: fn(CpuTime) -> f64| {
            server_cpu
                .filter(|_| bytes > 0)
                .map(|c| part(c) / (bytes as f64 / 1e9))
        };
        let server_cpu_total = server_cpu.map(CpuTime::total);
        Summary {
            mode: format!("{:?}", args.mode),
            url: args.url.clone(),
            concurrency: args.concurrency,
            ok,
            errors: errors_by_kind.values().sum(),
            errors_by_kind,
            seconds: secs,
            rate_per_sec: ok as f64 / secs,
            latency_ms_p50: pct(0.50),
            latency_ms_p90: pct(0.90),
            latency_ms_p99: pct(0.99),
            server_cpu_seconds: server_cpu_total,
            server_cpu_us_per_op: server_cpu_total
                .filter(|_| ok > 0)
                .map(|c| c * 1e6 / ok as f64),
            bytes,
            gbit_per_sec: bytes as f64 * 8.0 / secs / 1e9,
            server_cpu_seconds_per_gb: per_gb(CpuTime::total),
            server_user_cpu_seconds_per_gb: per_gb(|c| c.user),
            server_system_cpu_seconds_per_gb: per_gb(|c| c.system),
        }
    }

    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{} {} concurrency={}\n  ok {}  errors {}  in {:.2}s  →  {:.1}/s\n  latency p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms\n",
            self.mode, self.url, self.concurrency, self.ok, self.errors, self.seconds, self.rate_per_sec,
            self.latency_ms_p50, self.latency_ms_p90, self.latency_ms_p99
        );
        if self.bytes > 0 {
            s += &format!(
                "  {} bytes  →  {:.2} Gbit/s\n",
                self.bytes, self.gbit_per_sec
            );
        }
        if let (Some(per_gb), Some(user), Some(system)) = (
            self.server_cpu_seconds_per_gb,
            self.server_user_cpu_seconds_per_gb,
            self.server_system_cpu_seconds_per_gb,
        ) {
            s += &format!(
                "  server CPU {per_gb:.2} s per GB (user {user:.2}, kernel {system:.2})\n"
            );
        }
        if let (Some(c), Some(per)) = (self.server_cpu_seconds, self.server_cpu_us_per_op) {
            s += &format!("  server CPU {c:.2}s  →  {per:.1} µs per operation\n");
        }
        for (k, v) in &self.errors_by_kind {
            s += &format!("  error {k}: {v}\n");
        }
        s
    }
}
