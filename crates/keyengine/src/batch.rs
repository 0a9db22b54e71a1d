//! The `batch` engine: requests from every event loop enter one bounded queue; crypto threads
//! cut batches from it and sign RSA on the multi-buffer kernel (`mbcrypto`), several requests
//! per pass.
//!
//! A batch is cut when it reaches the lane width or when nothing more is pending right now —
//! never on a timer, so a lone request never waits for company. What a cut becomes depends on
//! measured costs: a kernel pass costs about the same for one request as for a full set of
//! lanes, so a group goes to the kernel only when one pass beats signing its requests one by
//! one on the single-operation path (aws-lc); smaller groups, and everything the kernel does
//! not handle, take that path. When the engine is idle, a request is signed on the submitting
//! thread, like the `inline` engine (opportunistic, as in SSLShader): the request first lets
//! the event loop's other ready tasks run once, and if nothing else was submitted meanwhile it
//! is signed there and then, with no hand-off; otherwise it joins the queue. Batch size
//! therefore follows the queue.
//!
//! Every RSA signature is checked against the public key before it leaves the engine: the
//! kernel checks its lanes; a lane that fails is re-signed on the single-operation path and
//! counted.

use crate::algorithm::{HashAlgorithm, SignatureAlgorithm};
use crate::engine::{Engine, SignFuture, SignRequest};
use crate::error::SignError;
use crate::metrics::{Families, Kind};
use crate::scheduler::ewma;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use mbcrypto::ecdsa::NoncePool;
use mbcrypto::rsa::{RsaError, Scheme, SignJob};
use mbcrypto::{Backend, Hash};
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// Crypto threads cutting batches from the shared queue.
    pub threads: usize,
    /// Requests accepted and not yet started; beyond it new requests fail fast (overload).
    pub queue_capacity: usize,
    /// The kernel's lane type (see [`Backend`]); [`Backend::best`] by default.
    pub backend: Backend,
    /// Sign on the submitting thread when the engine is idle (lowest latency at light load).
    pub inline_when_idle: bool,
    /// ECDSA P-256 nonce pool (filled by the crypto threads in idle time and whenever it runs
    /// low under load). Used only where AVX-512 IFMA generates nonces faster than aws-lc signs;
    /// `None` disables it.
    pub nonce_pool: Option<mbcrypto::ecdsa::PoolConfig>,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            threads: 1,
            queue_capacity: 4096,
            backend: Backend::best(),
            inline_when_idle: true,
            nonce_pool: Some(mbcrypto::ecdsa::PoolConfig::default()),
        }
    }
}

struct Job {
    request: SignRequest,
    reply: oneshot::Sender<Result<Vec<u8>, SignError>>,
    queued: Instant,
}

/// RSA sizes the kernel handles, indexing the cost estimates.
const SIZES: [usize; 3] = [2048, 3072, 4096];

fn size_class(bits: usize) -> usize {
    SIZES.iter().position(|&b| b == bits).unwrap_or(0)
}

/// Initial single-operation costs (ns) before anything is measured: aws-lc on the reference
/// machine (docs/benchmarks-history.md). Measurements replace them within a few requests.
const SINGLE_NS: [u64; 3] = [290_000, 850_000, 1_900_000];

struct Stats {
    registry: Registry,
    pass_size: Histogram,
    queue_wait: Histogram,
    lanes_used: IntCounter,
    lanes_offered: IntCounter,
    lane_fill: Gauge,
    operations: IntCounterVec,
    faults: IntCounter,
    overload: IntCounter,
}

impl Stats {
    fn new(lanes: usize) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let sizes: Vec<f64> = (1..=lanes.max(1)).map(|n| n as f64).collect();
        let s = Stats {
            pass_size: Histogram::with_opts(
                HistogramOpts::new(
                    "rampart_batch_pass_size",
                    "Requests signed per multi-buffer kernel pass",
                )
                .buckets(sizes),
            )?,
            queue_wait: Histogram::with_opts(
                HistogramOpts::new(
                    "rampart_batch_queue_wait_seconds",
                    "Time a request waited in the batch engine's queue before a crypto thread took it",
                )
                .buckets(vec![
                    0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                    0.05, 0.1,
                ]),
            )?,
            lanes_used: IntCounter::new(
                "rampart_batch_lanes_used_total",
                "Kernel lanes that carried a request",
            )?,
            lanes_offered: IntCounter::new(
                "rampart_batch_lanes_total",
                "Kernel lanes run (used or idle)",
            )?,
            lane_fill: Gauge::new(
                "rampart_batch_lane_fill_ratio",
                "Lanes used / lanes run since start",
            )?,
            operations: IntCounterVec::new(
                Opts::new(
                    "rampart_batch_operations_total",
                    "Signatures by path: kernel (multi-buffer pass), single (one at a time on a crypto thread), idle (at once on the submitting thread), pool (ECDSA P-256 with a precomputed nonce, on a crypto thread), resign (a kernel lane failed verification)",
                ),
                &["path", "algorithm"],
            )?,
            faults: IntCounter::new(
                "rampart_batch_faults_total",
                "Kernel lanes whose signature failed verification (re-signed, never released)",
            )?,
            overload: IntCounter::new(
                "rampart_batch_overload_rejections_total",
                "Requests refused because the batch queue was full",
            )?,
            registry,
        };
        s.registry.register(Box::new(s.pass_size.clone()))?;
        s.registry.register(Box::new(s.queue_wait.clone()))?;
        s.registry.register(Box::new(s.lanes_used.clone()))?;
        s.registry.register(Box::new(s.lanes_offered.clone()))?;
        s.registry.register(Box::new(s.lane_fill.clone()))?;
        s.registry.register(Box::new(s.operations.clone()))?;
        s.registry.register(Box::new(s.faults.clone()))?;
        s.registry.register(Box::new(s.overload.clone()))?;
        Ok(s)
    }
}

struct Shared {
    config: BatchConfig,
    lanes: usize,
    depth: AtomicUsize,
    /// EWMA of one single-operation RSA signature, per size class (ns).
    single_ns: [AtomicU64; 3],
    /// EWMA of one kernel pass, per size class (ns); 0 until measured.
    pass_ns: [AtomicU64; 3],
    /// Precomputed ECDSA P-256 nonces, shared by every P-256 key.
    pool: Option<NoncePool>,
    /// Idle refilling under way: started below the pool's threshold, goes on to capacity.
    filling: std::sync::atomic::AtomicBool,
    /// The nonce pool's health check failed and that was logged.
    pool_alarm: std::sync::atomic::AtomicBool,
    stats: Stats,
}

fn scheme(a: SignatureAlgorithm) -> Option<Scheme> {
    use SignatureAlgorithm::*;
    let h = |h: HashAlgorithm| match h {
        HashAlgorithm::Sha256 => Hash::Sha256,
        HashAlgorithm::Sha384 => Hash::Sha384,
        HashAlgorithm::Sha512 => Hash::Sha512,
    };
    match a {
        RsaPkcs1Sha256 | RsaPkcs1Sha384 | RsaPkcs1Sha512 => Some(Scheme::Pkcs1(h(a.hash()))),
        RsaPssSha256 | RsaPssSha384 | RsaPssSha512 => Some(Scheme::Pss(h(a.hash()))),
        _ => None,
    }
}

impl Shared {
    /// The smallest group worth a kernel pass for this size class: the first n for which one
    /// pass is expected to beat n single operations. `None` when no group of up to `lanes`
    /// requests is (e.g. the portable backend).
    fn min_pass(&self, class: usize) -> Option<usize> {
        if self.lanes < 2 {
            return None;
        }
        let single = self.single_ns[class].load(Ordering::Relaxed).max(1);
        let pass = self.pass_estimate(class);
        (2..=self.lanes).find(|&n| pass < n as u64 * single)
    }

    /// The expected time of one kernel pass (ns): measured, or before any pass has run, the
    /// kernel's measured advantage on IFMA (1.5x at full lanes) applied to single operations.
    fn pass_estimate(&self, class: usize) -> u64 {
        match self.pass_ns[class].load(Ordering::Relaxed) {
            0 => self.single_ns[class].load(Ordering::Relaxed).max(1) * self.lanes as u64 * 2 / 3,
            p => p,
        }
    }

    /// The kernel pass a request could go into, for RSA keys the kernel handles.
    fn kernel_class(&self, r: &SignRequest) -> Option<usize> {
        let key = r.private.as_ref()?.batch_rsa()?;
        scheme(r.algorithm)?;
        Some(size_class(key.bits()))
    }

    /// The pool and pooled key for an ECDSA P-256 request, when nonces are pooled.
    fn pooled<'a>(
        &'a self,
        r: &'a SignRequest,
    ) -> Option<(&'a NoncePool, &'a mbcrypto::ecdsa::P256Key)> {
        let pool = self.pool.as_ref()?;
        if r.algorithm != SignatureAlgorithm::EcdsaP256Sha256 {
            return None;
        }
        if pool.is_disabled() {
            // A repeated r disabled the pool: sign as if there were none, and say so once.
            if !self.pool_alarm.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    engine = "batch",
                    repeated_r = pool.stats().repeated_r,
                    "ECDSA nonce pool produced a repeated r: pool disabled, signing without it"
                );
            }
            return None;
        }
        Some((pool, r.private.as_ref()?.pooled_p256()?))
    }

    /// Signs with a pooled nonce (the pool must not be empty, or this signs directly).
    fn sign_pooled(
        &self,
        r: &SignRequest,
        pool: &NoncePool,
        key: &mbcrypto::ecdsa::P256Key,
        path: &str,
    ) -> Result<Vec<u8>, SignError> {
        let expected = r.algorithm.hash().output_len();
        if r.digest.len() != expected {
            return Err(SignError::BadDigest {
                expected,
                got: r.digest.len(),
            });
        }
        let sig = mbcrypto::ecdsa::sign(key, pool, &r.digest)
            .map_err(|e| SignError::Crypto(e.to_string()))?;
        self.stats
            .operations
            .with_label_values(&[path, r.algorithm.as_str()])
            .inc();
        Ok(sig)
    }

    /// Fills the nonce pool in idle time, a batch per call: once it fell below the refill
    /// threshold, up to capacity. Returns whether it did any work.
    fn refill_when_idle(&self) -> bool {
        let Some(p) = &self.pool else { return false };
        if p.needs_refill() {
            self.filling.store(true, Ordering::Relaxed);
        }
        if !self.filling.load(Ordering::Relaxed) || p.len() >= p.capacity() {
            self.filling.store(false, Ordering::Relaxed);
            return false;
        }
        p.refill(p.config().batch) > 0
    }

    /// Signs on the single-operation path (or with a pooled nonce when one is ready) and checks
    /// RSA results against the public key.
    fn sign_single(&self, r: &SignRequest, path: &str) -> Result<Vec<u8>, SignError> {
        if let Some((pool, key)) = self.pooled(r) {
            if !pool.is_empty() {
                return self.sign_pooled(r, pool, key, path);
            }
        }
        let start = Instant::now();
        let sig = r.sign_locally()?;
        if let (true, Some(k)) = (r.algorithm.is_rsa(), &r.private) {
            if let Some(mb) = k.batch_rsa() {
                ewma(&self.single_ns[size_class(mb.bits())], start.elapsed());
            }
            if !k.verify_digest(r.algorithm, &r.digest, &sig) {
                self.stats.faults.inc();
                tracing::error!(engine = "batch", key = %r.key, algorithm = %r.algorithm,
                    "single-operation signature failed verification; not released");
                return Err(SignError::FaultDetected("batch"));
            }
        }
        self.stats
            .operations
            .with_label_values(&[path, r.algorithm.as_str()])
            .inc();
        Ok(sig)
    }

    fn finish(&self, job: Job, result: Result<Vec<u8>, SignError>) {
        self.depth.fetch_sub(1, Ordering::Relaxed);
        // The handshake may have gone away meanwhile; nothing to do then.
        let _ = job.reply.send(result);
    }

    /// Signs one cut: kernel passes for groups worth one, the single path for the rest.
    fn process(&self, jobs: Vec<Job>) {
        let mut groups: [Vec<Job>; 3] = Default::default();
        let mut pooled = Vec::new();
        for job in jobs {
            if self.pooled(&job.request).is_some() {
                pooled.push(job);
                continue;
            }
            match self.kernel_class(&job.request) {
                Some(c) => groups[c].push(job),
                None => {
                    let r = self.sign_single(&job.request, "single");
                    self.finish(job, r);
                }
            }
        }
        if let (Some(pool), false) = (&self.pool, pooled.is_empty()) {
            // Under load the pool is refilled here, a batch at a time: generating nonces in
            // a batch and signing with them beats signing each request from scratch.
            if pool.len() < pooled.len() {
                pool.refill(pool.config().batch.max(pooled.len()));
            }
            for job in pooled {
                let (pool, key) = self.pooled(&job.request).expect("checked above");
                let r = self.sign_pooled(&job.request, pool, key, "pool");
                self.finish(job, r);
            }
        }
        for (class, group) in groups.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            // A full set of lanes always goes to the kernel (it is built to win there, and
            // this keeps its cost estimate fresh); a partial one when the estimate says so.
            let full = self.lanes > 1 && group.len() >= self.lanes;
            match self.min_pass(class) {
                _ if full => self.kernel_pass(class, group),
                Some(min) if group.len() >= min => self.kernel_pass(class, group),
                _ => {
                    for job in group {
                        let r = self.sign_single(&job.request, "single");
                        self.finish(job, r);
                    }
                }
            }
        }
    }

    fn kernel_pass(&self, class: usize, group: Vec<Job>) {
        let start = Instant::now();
        let results = {
            let jobs: Vec<SignJob> = group
                .iter()
                .map(|j| SignJob {
                    key: j
                        .request
                        .private
                        .as_ref()
                        .and_then(|k| k.batch_rsa())
                        .expect("grouped by kernel_class"),
                    scheme: scheme(j.request.algorithm).expect("grouped by kernel_class"),
                    digest: &j.request.digest,
                })
                .collect();
            mbcrypto::rsa::sign_batch(self.config.backend, &jobs)
        };
        let took = start.elapsed();
        let n = group.len();
        let passes = n.div_ceil(self.lanes);
        ewma(&self.pass_ns[class], took / passes as u32);
        let s = &self.stats;
        s.pass_size.observe(n as f64);
        s.lanes_used.inc_by(n as u64);
        s.lanes_offered.inc_by((passes * self.lanes) as u64);
        s.lane_fill
            .set(s.lanes_used.get() as f64 / s.lanes_offered.get().max(1) as f64);
        for (job, result) in group.into_iter().zip(results) {
            let alg = job.request.algorithm;
            let r = match result {
                Ok(sig) => {
                    s.operations
                        .with_label_values(&["kernel", alg.as_str()])
                        .inc();
                    Ok(sig)
                }
                Err(RsaError::FaultDetected) => {
                    s.faults.inc();
                    tracing::error!(engine = "batch", key = %job.request.key, algorithm = %alg,
                        "kernel lane failed verification; re-signing on the single-operation path");
                    self.sign_single(&job.request, "resign")
                }
                Err(RsaError::Padding(mbcrypto::rsa::PaddingError::BadDigest {
                    expected,
                    got,
                })) => Err(SignError::BadDigest { expected, got }),
                Err(e) => Err(SignError::Crypto(e.to_string())),
            };
            self.finish(job, r);
        }
    }
}

/// The multi-buffer engine. See the module documentation.
pub struct BatchEngine {
    shared: Arc<Shared>,
    tx: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl BatchEngine {
    /// Starts the crypto threads. Fails if `config.backend` does not run on this CPU.
    pub fn new(config: BatchConfig) -> Result<Self, SignError> {
        if !config.backend.available() {
            return Err(SignError::Unavailable(
                "batch",
                format!(
                    "backend {} needs AVX-512 IFMA, absent on this CPU",
                    config.backend
                ),
            ));
        }
        let lanes = config.backend.lanes();
        let stats = Stats::new(lanes).map_err(|e| SignError::Crypto(e.to_string()))?;
        let (tx, rx) = bounded::<Job>(config.queue_capacity.max(1));
        // Pooled nonces pay only where IFMA generates them (~4 µs each vs ~14 µs for aws-lc's
        // whole signature); the portable generator is slower than aws-lc.
        let pool = match &config.nonce_pool {
            Some(p) if Backend::Ifma512.available() => Some(NoncePool::new(*p, Backend::Ifma512)),
            _ => None,
        };
        let shared = Arc::new(Shared {
            pool,
            filling: std::sync::atomic::AtomicBool::new(true),
            pool_alarm: std::sync::atomic::AtomicBool::new(false),
            lanes,
            depth: AtomicUsize::new(0),
            single_ns: SINGLE_NS.map(AtomicU64::new),
            pass_ns: Default::default(),
            stats,
            config,
        });
        let threads = (0..shared.config.threads.max(1))
            .map(|i| {
                let shared = shared.clone();
                let rx = rx.clone();
                std::thread::Builder::new()
                    .name(format!("rampart-batch-{i}"))
                    .spawn(move || crypto_thread(&shared, &rx))
                    .expect("spawn crypto thread")
            })
            .collect();
        Ok(BatchEngine {
            shared,
            tx: Some(tx),
            threads,
        })
    }

    /// The kernel backend in use.
    pub fn backend(&self) -> Backend {
        self.shared.config.backend
    }
}

/// Uncounts a submitted request from the engine's depth when dropped, unless disarmed.
struct DepthGuard(Option<Arc<Shared>>);

impl Drop for DepthGuard {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.depth.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Takes whatever is pending (up to the lane width) after the first request, never waiting for
/// more, and signs it.
fn crypto_thread(shared: &Shared, rx: &Receiver<Job>) {
    loop {
        let first = match rx.try_recv() {
            Ok(j) => j,
            Err(crossbeam_channel::TryRecvError::Empty) => {
                // Idle: turn the time into burst capacity, then look again.
                if shared.refill_when_idle() {
                    continue;
                }
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            }
            Err(crossbeam_channel::TryRecvError::Disconnected) => return,
        };
        let mut jobs = Vec::with_capacity(shared.lanes);
        jobs.push(first);
        while jobs.len() < shared.lanes {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let now = Instant::now();
        for j in &jobs {
            shared
                .stats
                .queue_wait
                .observe(now.saturating_duration_since(j.queued).as_secs_f64());
        }
        shared.process(jobs);
    }
}

impl Engine for BatchEngine {
    fn name(&self) -> &'static str {
        "batch"
    }

    fn submit(&self, request: SignRequest) -> SignFuture {
        let Some(tx) = self.tx.clone() else {
            return Box::pin(std::future::ready(Err(SignError::Stopped("batch"))));
        };
        let shared = self.shared.clone();
        // Counted at once, so that requests submitted together see each other; uncounted by
        // the guard unless handed to a crypto thread (which uncounts it when it finishes), so
        // a handshake dropped while waiting here does not leave the engine looking busy.
        shared.depth.fetch_add(1, Ordering::Relaxed);
        let mut counted = DepthGuard(Some(shared.clone()));
        Box::pin(async move {
            if shared.config.inline_when_idle {
                // Let the other ready tasks of this event loop run (and submit) first. If after
                // that this request is still the only one, sign it here and now: the fastest
                // path at light load. Otherwise it joins the queue and shares a batch.
                tokio::task::yield_now().await;
                if shared.depth.load(Ordering::Relaxed) == 1 {
                    let r = shared.sign_single(&request, "idle");
                    drop(counted);
                    return r;
                }
            }
            let (reply, rx) = oneshot::channel();
            let job = Job {
                request,
                reply,
                queued: Instant::now(),
            };
            if let Err(e) = tx.try_send(job) {
                drop(counted);
                return Err(match e {
                    TrySendError::Full(_) => {
                        shared.stats.overload.inc();
                        SignError::Overloaded("batch")
                    }
                    TrySendError::Disconnected(_) => SignError::Stopped("batch"),
                });
            }
            drop(counted.0.take()); // the crypto thread's `finish` uncounts it now
            rx.await.unwrap_or(Err(SignError::Stopped("batch")))
        })
    }

    fn queue_depth(&self) -> usize {
        self.shared.depth.load(Ordering::Relaxed)
    }

    fn parallelism(&self) -> usize {
        self.shared.config.threads.max(1) * self.shared.lanes
    }

    fn expected_completion(&self, kind: crate::KeyKind) -> Option<Duration> {
        let s = &self.shared;
        let n = s.depth.load(Ordering::Relaxed) + 1;
        let threads = s.config.threads.max(1) as u64;
        if kind != crate::KeyKind::Rsa {
            return None;
        }
        let single = s.single_ns[0].load(Ordering::Relaxed);
        if n == 1 && s.config.inline_when_idle {
            return Some(Duration::from_nanos(single));
        }
        let ns = match s.min_pass(0) {
            Some(min) if n >= min => {
                (n.div_ceil(s.lanes) as u64).div_ceil(threads) * s.pass_estimate(0)
            }
            _ => (n as u64).div_ceil(threads) * single,
        };
        Some(Duration::from_nanos(ns))
    }

    /// RSA results are verified here (kernel lanes and the single path alike); ECDSA ones
    /// are left to the facade.
    fn verifies_signatures(&self, kind: crate::KeyKind) -> bool {
        kind == crate::KeyKind::Rsa
    }

    fn metrics(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut f = Families::new();
        f.extend(self.shared.stats.registry.gather());
        if let Some(p) = &self.shared.pool {
            let s = p.stats();
            f.single(
                Kind::Gauge,
                "rampart_batch_nonce_pool_size",
                "ECDSA P-256 nonces ready in the pool",
                p.len() as f64,
            )
            .single(
                Kind::Counter,
                "rampart_batch_nonces_generated_total",
                "ECDSA P-256 nonces precomputed",
                s.generated as f64,
            )
            .single(
                Kind::Counter,
                "rampart_batch_nonce_fallbacks_total",
                "ECDSA signatures made without a pooled nonce (pool empty)",
                s.fallbacks as f64,
            )
            .single(
                Kind::Counter,
                "rampart_batch_nonce_repeated_r_total",
                "Precomputed ECDSA nonces whose r repeated a recent one (the first disables the pool; alert on any)",
                s.repeated_r as f64,
            )
            .single(
                Kind::Gauge,
                "rampart_batch_nonce_pool_disabled",
                "1 once a repeated r has disabled the ECDSA nonce pool",
                f64::from(u8::from(p.is_disabled())),
            );
        }
        f.into_vec()
    }
}

impl Drop for BatchEngine {
    fn drop(&mut self) {
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
