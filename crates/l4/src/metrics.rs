//! The balancer's metrics (`/metrics` on its admin listener). Handles are resolved once, so
//! a worker's per-batch flush is a few atomic adds.

use crate::config::Backend;
use crate::route::{DropReason, HashReason};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

pub(crate) struct Metrics {
    registry: Registry,
    pub datagrams: Vec<IntCounter>,
    pub bytes: Vec<IntCounter>,
    hashed: Vec<IntCounter>,
    dropped: Vec<IntCounter>,
    pub batches: IntCounter,
    pub received: IntCounter,
    up: Vec<IntGauge>,
    checks_ok: Vec<IntCounter>,
    checks_failed: Vec<IntCounter>,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

/// A registered counter family with `labels`.
fn counters(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

/// A registered counter.
fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(r, IntCounter::new(name, help).expect("valid metric"))
}

impl Metrics {
    pub fn new(backends: &[Backend]) -> Metrics {
        let r = Registry::new();
        // `SERVER_ID@ADDRESS`, in the order of the configuration.
        let labels: Vec<String> = backends
            .iter()
            .map(|b| {
                let sid: String = b.server_id.iter().map(|x| format!("{x:02x}")).collect();
                format!("{sid}@{}", b.address)
            })
            .collect();
        let per_backend = |name: &str, help: &str| {
            let v = counters(&r, name, help, &["backend"]);
            labels
                .iter()
                .map(|l| v.with_label_values(&[l.as_str()]))
                .collect::<Vec<_>>()
        };
        let datagrams = per_backend(
            "rampart_l4_datagrams_total",
            "Datagrams forwarded, by gateway (server ID @ address)",
        );
        let bytes = per_backend(
            "rampart_l4_forwarded_bytes_total",
            "UDP payload bytes forwarded, by gateway",
        );
        let hashed_v = counters(
            &r,
            "rampart_l4_hashed_total",
            "Datagrams placed by hashing instead of by a server ID, by reason",
            &["reason"],
        );
        let hashed = HashReason::ALL
            .iter()
            .map(|r| hashed_v.with_label_values(&[r.label()]))
            .collect();
        let dropped_v = counters(
            &r,
            "rampart_l4_dropped_total",
            "Datagrams dropped, by reason",
            &["reason"],
        );
        let dropped = DropReason::ALL
            .iter()
            .map(|r| dropped_v.with_label_values(&[r.label()]))
            .collect();
        let batches = counter(
            &r,
            "rampart_l4_receive_batches_total",
            "recvmmsg calls that returned datagrams",
        );
        let received = counter(&r, "rampart_l4_received_total", "Datagrams received");
        let up_v = register(
            &r,
            IntGaugeVec::new(
                Opts::new(
                    "rampart_l4_backend_up",
                    "1 while the gateway takes traffic (health checks)",
                ),
                &["backend"],
            )
            .expect("valid metric"),
        );
        let up = labels
            .iter()
            .map(|l| up_v.with_label_values(&[l.as_str()]))
            .collect();
        let checks_v = counters(
            &r,
            "rampart_l4_health_checks_total",
            "Health probes, by gateway and result",
            &["backend", "result"],
        );
        let checks = |result: &str| {
            labels
                .iter()
                .map(|l| checks_v.with_label_values(&[l.as_str(), result]))
                .collect::<Vec<_>>()
        };
        Metrics {
            datagrams,
            bytes,
            hashed,
            dropped,
            batches,
            received,
            up,
            checks_ok: checks("ok"),
            checks_failed: checks("failed"),
            registry: r,
        }
    }

    pub fn hashed(&self, reason: HashReason, n: u64) {
        self.hashed[reason.index()].inc_by(n);
    }

    pub fn dropped(&self, reason: DropReason, n: u64) {
        self.dropped[reason.index()].inc_by(n);
    }

    pub fn set_up(&self, backend: usize, up: bool) {
        self.up[backend].set(i64::from(up));
    }

    pub fn health_check(&self, backend: usize, ok: bool) {
        if ok {
            self.checks_ok[backend].inc();
        } else {
            self.checks_failed[backend].inc();
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        use prometheus::Encoder as _;
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).expect("UTF-8 metrics")
    }
}
