//! [`GpuEngine`]: the `gpu` key engine.
//!
//! `submit` queues a request (bounded queue; full → `Overloaded`, so the facade fails over).
//! One batching thread per stream takes whatever is queued, up to the backend's batch limit —
//! the batch size follows the queue, there is no timer — pads and blinds every request on the
//! CPU, launches the batch, then unblinds and verifies every result with the public key. Only
//! verified signatures are released.
//!
//! A device error, a batch past its deadline or a result that fails verification marks the
//! engine unhealthy and sends the batch's requests back to the CPU: to the fallback engine when
//! one is set ([`GpuEngine::set_fallback`]), otherwise as `Unavailable`, which makes the
//! facade re-run them on another engine. While unhealthy, requests go to the CPU at once; after
//! a backoff (doubling up to a limit) the next request triggers a re-probe: a known-answer
//! batch checked against the CPU build of the kernel core.
//!
//! Building the kernel (NVRTC, then the driver's JIT) takes tens of seconds, so [`GpuEngine::new`]
//! does it on a thread of its own: the engine reports itself unavailable ("starting") and the
//! scheduler routes around it until the kernel is loaded; then the batching threads start.
//!
//! Routing between the GPU and the CPU engines is the scheduler's: this engine reports its
//! queue and a parallelism of `max_batch × streams`, so with the measured service time (a
//! launch, several milliseconds) it is chosen only once the CPU engines' queues are deep enough
//! that their expected completion is later — light load stays on the CPU (SSLShader's
//! opportunistic offload).

use crate::backend::{BackendError, BatchBackend, StreamRunner};
use crate::batch_size::BatchSizer;
use crate::cpu_pool::CpuPool;
use crate::error::GpuError;
use crate::host_core::KeyLayout;
use crate::key::{finish_batch, prepare_batch, Finish, GpuKey, PrepareItem, Prepared};
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use keyengine::metrics::{Families, Kind};
use keyengine::{Engine, KeyId, SignError, SignFuture, SignRequest};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

const NAME: &str = "gpu";

/// Engine settings.
#[derive(Debug, Clone)]
pub struct GpuConfig {
    /// Requests queued at most (beyond: `Overloaded`).
    pub queue_capacity: usize,
    /// Most requests per launch (also capped by the backend). Below it, batches are as large
    /// as keeps their measured time within `batch_latency_target`.
    pub max_batch: usize,
    /// The time a batch may take on the device (copy in, compute, copy out, and waiting for the
    /// other streams' batches): a request waits about one batch in flight plus its own, so half
    /// the latency a p99 must stay within. 10 ms by default: on an H100 one wave of RSA-2048
    /// work takes about 2.5 ms and two streams share the device; with 5 ms the engine measured
    /// 84 k signs/s at a queue of 16,384 (docs/benchmarks-history.md).
    pub batch_latency_target: Duration,
    /// A batch not finished within `batch_deadline_base + batch_deadline_per_item × items`
    /// is abandoned and re-run on the CPU.
    pub batch_deadline_base: Duration,
    pub batch_deadline_per_item: Duration,
    /// First backoff before re-probing an unhealthy device; doubles per failed probe.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// CPU threads that pad/blind and unblind/verify/answer a large batch: one pool that every
    /// stream's batches share.
    pub cpu_threads: usize,
    /// CUDA streams, each with its own buffers: batches in flight at once (at least 2).
    pub streams: usize,
    /// Threads per block of the kernel launch.
    pub threads_per_block: u32,
    /// Exponent window width the kernel is compiled with (4, 5 or 6 bits).
    pub window: u32,
    /// Where built kernels are kept between starts (a cubin per device architecture and
    /// kernel text); `None` builds at every start.
    pub kernel_cache: Option<std::path::PathBuf>,
    /// Threads per request: 16 (a group of 8 lanes per CRT half), 8 or 32 (groups of 4 or
    /// 16), 2 (the CRT halves on neighbouring threads) or 1. On an H100 16 with the table in
    /// shared memory, carry chains and 4-bit windows signed the most within a 10 ms p99 and
    /// cut a lone request from 11.7 ms (two threads) to 2.5 ms (docs/benchmarks-history.md).
    pub threads_per_request: u32,
    /// The group kernels' window table in shared memory (else a local array per thread);
    /// ignored with 1 or 2 threads per request.
    pub table_shared: bool,
    /// The group kernels' multiply-accumulate rows as PTX carry chains; ignored with 1 or 2
    /// threads per request.
    pub carry_chains: bool,
    /// FP64 arithmetic for each CRT half (`kernels/rsa_fp64.h`), with 2, 8, 16 or 32 threads
    /// per request (ignored with 1); the window table then stays in local memory.
    pub fp64: bool,
    /// Run the device's work in this worker process ([`crate::process`]: a device fault then
    /// costs a worker, which the next probe starts again), or in this process (`None`).
    pub worker: Option<crate::process::WorkerCommand>,
}

impl GpuConfig {
    /// The kernel shape these settings build (`table_shared` and `carry_chains` apply to the
    /// group kernels only, and are ignored with 1 or 2 threads per request; `fp64` is ignored
    /// with 1, and keeps the window table out of shared memory).
    pub fn shape(&self) -> crate::host_core::KernelShape {
        let group = self.threads_per_request > 2;
        crate::host_core::KernelShape {
            window: self.window,
            threads_per_request: self.threads_per_request,
            table_shared: self.table_shared && group && !self.fp64,
            carry_chains: self.carry_chains && group,
            fp64: self.fp64 && self.threads_per_request > 1,
        }
    }
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            queue_capacity: 262_144,
            max_batch: 65_536,
            batch_latency_target: Duration::from_millis(10),
            batch_deadline_base: Duration::from_millis(100),
            batch_deadline_per_item: Duration::from_micros(5),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
            cpu_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            streams: 2,
            threads_per_block: 128,
            // 4 bits: half the shared table of 5, so more blocks fit an SM (H100, same run:
            // 505 k against 383 k signs/s within a 10 ms p99) and RSA-4096's fits 100 KiB.
            window: 4,
            threads_per_request: 16,
            table_shared: true,
            carry_chains: true,
            fp64: false,
            kernel_cache: None,
            worker: None,
        }
    }
}

enum Reply {
    Done(Result<Vec<u8>, SignError>),
    /// Not signed on the GPU; run it on the CPU.
    Rerun(SignRequest, &'static str),
}

struct Job {
    request: SignRequest,
    key: Arc<GpuKey>,
    reply: oneshot::Sender<Reply>,
}

enum Msg {
    Sign(Job),
    Probe,
}

#[derive(Default)]
struct Counters {
    submitted: AtomicU64,
    batches: AtomicU64,
    batch_items: AtomicU64,
    batch_ns: AtomicU64,
    gpu_signed: AtomicU64,
    faults: AtomicU64,
    device_errors: AtomicU64,
    deadline_misses: AtomicU64,
    cpu_reruns: AtomicU64,
    not_on_gpu: AtomicU64,
    probes: AtomicU64,
    probe_failures: AtomicU64,
    last_batch: AtomicU64,
}

struct HealthState {
    failures: u32,
    retry_at: Option<Instant>,
    probe_pending: bool,
    reason: String,
}

enum Admission {
    Go,
    ProbeThenGo,
    Backoff,
}

/// Where the engine is in its start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuStatus {
    /// A device was found; the kernel is being built (requests go to the other engines).
    Starting,
    /// The kernel is loaded and the batching threads run.
    Ready,
    /// No device, or the kernel could not be built: why.
    Unavailable(String),
}

struct Shared {
    config: GpuConfig,
    backend: OnceLock<Arc<dyn BatchBackend>>,
    /// The CPU steps' threads, started with the batching threads.
    cpu: OnceLock<CpuPool>,
    status: Mutex<GpuStatus>,
    ready: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    keys: RwLock<HashMap<KeyId, Arc<GpuKey>>>,
    depth: AtomicUsize,
    healthy: AtomicBool,
    health: Mutex<HealthState>,
    counters: Counters,
    fallback: OnceLock<Arc<dyn Engine>>,
    /// Batch sizing per key size (RSA-2048, 3072, 4096: their batches take different times).
    sizers: [BatchSizer; 3],
}

/// The `gpu` engine. See the module docs.
pub struct GpuEngine {
    shared: Arc<Shared>,
    tx: Option<Sender<Msg>>,
    streams: usize,
    max_batch: usize,
}

impl GpuEngine {
    /// The engine on the first CUDA device, or an unavailable engine (with the reason logged)
    /// where there is no driver, no NVRTC or no device. With a device, the kernel is built on a
    /// thread of its own ([`GpuStatus::Starting`] until it is loaded).
    pub fn new(config: GpuConfig) -> Self {
        // With a worker process, this process makes no CUDA context: the worker describes the
        // device once it has started.
        let found = match config.worker {
            Some(_) => crate::device_present().map(|()| "in a worker process".to_string()),
            None => crate::probe().map(|info| info.to_string()),
        };
        match found {
            Ok(info) => {
                tracing::info!(device = %info, "gpu engine: device found; building the kernel");
                let build_config = config.clone();
                Self::starting(config, move || match &build_config.worker {
                    Some(cmd) => Ok(Arc::new(crate::process::ProcessBackend::start(
                        cmd.clone(),
                        &build_config,
                    )?) as Arc<dyn BatchBackend>),
                    None => crate::cuda_backend(&build_config),
                })
            }
            Err(e) => {
                tracing::warn!(reason = %e, "gpu engine unavailable; requests go to the CPU engines");
                Self::unavailable(e.to_string())
            }
        }
    }

    /// An engine that reports itself unavailable: every request is answered `Unavailable`
    /// at once (the facade fails over).
    pub fn unavailable(reason: String) -> Self {
        GpuEngine {
            shared: Arc::new(Shared::new(
                GpuConfig::default(),
                GpuStatus::Unavailable(reason),
            )),
            tx: None,
            streams: 0,
            max_batch: 1,
        }
    }

    /// The engine over `backend`, one batching thread per stream, ready at once.
    pub fn with_backend(backend: Arc<dyn BatchBackend>, config: GpuConfig) -> Self {
        let (engine, rx) = Self::queued(config, backend.streams());
        start_batching(&engine.shared, backend, rx);
        engine
    }

    /// The engine over the backend `build` returns, built on a thread of its own: until it
    /// returns the engine is [`GpuStatus::Starting`] (unavailable to the scheduler, requests
    /// answered `Unavailable`); then [`GpuStatus::Ready`], or [`GpuStatus::Unavailable`] with
    /// the build's error. `config.streams` must be the backend's stream count.
    pub fn starting<F>(config: GpuConfig, build: F) -> Self
    where
        F: FnOnce() -> Result<Arc<dyn BatchBackend>, GpuError> + Send + 'static,
    {
        // The CUDA backend runs at least two streams.
        let streams = config.streams.max(2);
        let (engine, rx) = Self::queued(config, streams);
        let shared = engine.shared.clone();
        let started = Instant::now();
        // Not joined on drop: a process stopping during the build need not wait for it. Once
        // the engine is dropped the queue is closed and the batching threads exit at once.
        let spawned = std::thread::Builder::new()
            .name("rampart-gpu-start".into())
            .spawn(move || match build() {
                Ok(backend) => {
                    tracing::info!(
                        device = %backend.describe(),
                        seconds = started.elapsed().as_secs_f64(),
                        "gpu engine: kernel built; device ready"
                    );
                    start_batching(&shared, backend, rx);
                }
                Err(e) => {
                    tracing::warn!(reason = %e, "gpu engine unavailable: the kernel did not build; requests go to the CPU engines");
                    shared.set_status(GpuStatus::Unavailable(e.to_string()));
                }
            });
        if let Err(e) = spawned {
            engine.shared.set_status(GpuStatus::Unavailable(format!(
                "spawning the start thread: {e}"
            )));
        }
        engine
    }

    /// A queue for `config` with the engine `Starting`.
    fn queued(config: GpuConfig, streams: usize) -> (Self, Receiver<Msg>) {
        let streams = streams.max(1);
        let max_batch = config.max_batch.max(1);
        let (tx, rx) = bounded::<Msg>(config.queue_capacity.max(1));
        let shared = Arc::new(Shared::new(config, GpuStatus::Starting));
        (
            GpuEngine {
                shared,
                tx: Some(tx),
                streams,
                max_batch,
            },
            rx,
        )
    }

    /// Whether the engine takes requests: a device (or simulated device) is loaded.
    pub fn available(&self) -> bool {
        self.shared.ready.load(Ordering::Acquire)
    }

    /// Where the engine is in its start.
    pub fn status(&self) -> GpuStatus {
        self.shared
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits (polling) until the engine has left [`GpuStatus::Starting`] or `timeout` passed;
    /// returns the status then.
    pub fn wait_started(&self, timeout: Duration) -> GpuStatus {
        let until = Instant::now() + timeout;
        loop {
            let status = self.status();
            if status != GpuStatus::Starting || Instant::now() >= until {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Why the engine does not take requests, if it does not (starting, or unavailable).
    pub fn unavailable_reason(&self) -> Option<String> {
        match self.status() {
            GpuStatus::Ready => None,
            GpuStatus::Starting => Some("starting: the kernel is being built".into()),
            GpuStatus::Unavailable(why) => Some(why),
        }
    }

    /// Whether the device is currently trusted (false after an error, until a re-probe passes).
    pub fn healthy(&self) -> bool {
        self.available() && self.shared.healthy.load(Ordering::SeqCst)
    }

    /// Where requests the GPU could not sign are re-run (e.g. the `threads` engine). Without
    /// one, they are answered `Unavailable` and the facade re-runs them on another engine.
    /// Only the first call has an effect.
    pub fn set_fallback(&self, engine: Arc<dyn Engine>) {
        let _ = self.shared.fallback.set(engine);
    }

    /// Prepares an RSA private key (PKCS#1 or PKCS#8 DER) for the GPU. Requests for keys not
    /// added here are sent back to the CPU.
    pub fn add_key(&self, der: &[u8]) -> Result<KeyId, GpuError> {
        let key = Arc::new(GpuKey::from_der(der)?);
        let id = key.id();
        self.shared
            .keys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, key);
        Ok(id)
    }

    fn key(&self, id: &KeyId) -> Option<Arc<GpuKey>> {
        self.shared
            .keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Signatures released from GPU results (verified).
    pub fn gpu_signed(&self) -> u64 {
        self.shared.counters.gpu_signed.load(Ordering::Relaxed)
    }

    /// Requests the GPU path handed back to the CPU (device errors, deadlines, faults,
    /// unhealthy periods).
    pub fn cpu_reruns(&self) -> u64 {
        self.shared.counters.cpu_reruns.load(Ordering::Relaxed)
    }

    /// Batches launched.
    pub fn batches(&self) -> u64 {
        self.shared.counters.batches.load(Ordering::Relaxed)
    }

    /// Re-runs `request` on the CPU: through the fallback engine, or back to the facade.
    fn rerun(shared: &Arc<Shared>, request: SignRequest, why: &'static str) -> SignFuture {
        shared.counters.cpu_reruns.fetch_add(1, Ordering::Relaxed);
        match shared.fallback.get() {
            Some(f) => f.submit(request),
            None => Box::pin(std::future::ready(Err(SignError::Unavailable(
                NAME,
                why.into(),
            )))),
        }
    }
}

impl Shared {
    fn new(config: GpuConfig, status: GpuStatus) -> Self {
        Shared {
            backend: OnceLock::new(),
            cpu: OnceLock::new(),
            status: Mutex::new(status),
            ready: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            keys: RwLock::default(),
            depth: AtomicUsize::new(0),
            healthy: AtomicBool::new(true),
            health: Mutex::new(HealthState {
                failures: 0,
                retry_at: None,
                probe_pending: false,
                reason: String::new(),
            }),
            counters: Counters::default(),
            fallback: OnceLock::new(),
            sizers: std::array::from_fn(|_| {
                BatchSizer::new(config.batch_latency_target, config.max_batch, 256)
            }),
            config,
        }
    }

    /// The batch sizer for primes of `half` limbs.
    fn sizer(&self, half: usize) -> &BatchSizer {
        &self.sizers[crate::host_core::size_index(half)]
    }

    fn set_status(&self, status: GpuStatus) {
        let ready = status == GpuStatus::Ready;
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = status;
        self.ready.store(ready, Ordering::Release);
    }

    fn admission(&self) -> Admission {
        if self.healthy.load(Ordering::SeqCst) {
            return Admission::Go;
        }
        let mut h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if h.probe_pending || h.retry_at.is_some_and(|t| Instant::now() < t) {
            return Admission::Backoff;
        }
        h.probe_pending = true;
        Admission::ProbeThenGo
    }

    /// Marks the device unhealthy and sets when to probe it again. Failures of other batches
    /// while it is already unhealthy (the other streams' batches of one incident) leave the
    /// backoff alone; a failed probe doubles it.
    fn mark_unhealthy(&self, reason: String) {
        self.unhealthy(reason, false)
    }

    fn probe_failed(&self, reason: String) {
        self.unhealthy(reason, true)
    }

    fn unhealthy(&self, reason: String, probe: bool) {
        let mut h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let first = self.healthy.swap(false, Ordering::SeqCst);
        if !first && !probe {
            h.reason = reason;
            return;
        }
        h.failures = if first {
            1
        } else {
            h.failures.saturating_add(1)
        };
        let backoff = self
            .config
            .backoff_initial
            .saturating_mul(1u32 << (h.failures - 1).min(20))
            .min(self.config.backoff_max);
        h.retry_at = Some(Instant::now() + backoff);
        h.probe_pending = false;
        if first {
            tracing::error!(%reason, ?backoff, "gpu engine unhealthy; requests go to the CPU");
        } else {
            tracing::warn!(%reason, ?backoff, "gpu engine still unhealthy");
        }
        h.reason = reason;
    }

    fn mark_healthy(&self) {
        let mut h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if !self.healthy.swap(true, Ordering::SeqCst) {
            tracing::info!(after = %h.reason, "gpu engine healthy again");
        }
        h.failures = 0;
        h.retry_at = None;
        h.probe_pending = false;
    }

    fn deadline(&self, items: usize) -> Duration {
        self.config.batch_deadline_base + self.config.batch_deadline_per_item * items as u32
    }

    fn answer(&self, job: Job, reply: Reply) {
        self.depth.fetch_sub(1, Ordering::Relaxed);
        send_reply(job, reply);
    }

    fn rerun_all(&self, jobs: Vec<Job>, why: &'static str) {
        for mut job in jobs {
            let req = std::mem::replace(&mut job.request, placeholder_request());
            self.answer(job, Reply::Rerun(req, why));
        }
    }
}

/// Answers `job` (its queue depth already taken off).
fn send_reply(job: Job, reply: Reply) {
    // The handshake may have gone away; nothing to do then.
    let _ = job.reply.send(reply);
}

/// Stands in for a request moved out of a job that is being answered.
fn placeholder_request() -> SignRequest {
    SignRequest {
        key: KeyId([0; 20]),
        kind: keyengine::KeyKind::Rsa,
        private: None,
        algorithm: keyengine::SignatureAlgorithm::RsaPssSha256,
        digest: Vec::new(),
    }
}

impl Engine for GpuEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn prepare_rsa_key(&self, der: &[u8]) {
        // Without a device nothing reaches the GPU (a device still starting takes keys).
        if let GpuStatus::Unavailable(_) = self.status() {
            return;
        }
        if let Err(e) = self.add_key(der) {
            tracing::warn!(error = %e, "gpu engine: key not loaded; it signs on the CPU engines");
        }
    }

    fn submit(&self, request: SignRequest) -> SignFuture {
        let shared = &self.shared;
        shared.counters.submitted.fetch_add(1, Ordering::Relaxed);
        let Some(tx) = self.tx.as_ref().filter(|_| self.available()) else {
            let why = self.unavailable_reason().unwrap_or_default();
            return Box::pin(std::future::ready(Err(SignError::Unavailable(NAME, why))));
        };
        let Some(key) = self.key(&request.key) else {
            // ECDSA, or an RSA key not loaded on the GPU.
            shared.counters.not_on_gpu.fetch_add(1, Ordering::Relaxed);
            return Self::rerun(shared, request, "key not loaded on the GPU");
        };
        match shared.admission() {
            Admission::Go => {}
            Admission::Backoff => return Self::rerun(shared, request, "GPU unhealthy"),
            Admission::ProbeThenGo => {
                if tx.try_send(Msg::Probe).is_err() {
                    shared
                        .health
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .probe_pending = false;
                    return Self::rerun(shared, request, "GPU unhealthy");
                }
            }
        }
        let (reply, rx) = oneshot::channel();
        shared.depth.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(Msg::Sign(Job {
            request,
            key,
            reply,
        })) {
            Ok(()) => {
                let shared = shared.clone();
                Box::pin(async move {
                    match rx.await {
                        Ok(Reply::Done(r)) => r,
                        Ok(Reply::Rerun(req, why)) => GpuEngine::rerun(&shared, req, why).await,
                        Err(_) => Err(SignError::Stopped(NAME)),
                    }
                })
            }
            Err(e) => {
                shared.depth.fetch_sub(1, Ordering::Relaxed);
                let err = match e {
                    TrySendError::Full(_) => SignError::Overloaded(NAME),
                    TrySendError::Disconnected(_) => SignError::Stopped(NAME),
                };
                Box::pin(std::future::ready(Err(err)))
            }
        }
    }

    fn queue_depth(&self) -> usize {
        self.shared.depth.load(Ordering::Relaxed)
    }

    fn parallelism(&self) -> usize {
        (self.max_batch * self.streams).max(1)
    }

    fn available(&self) -> bool {
        GpuEngine::available(self)
    }

    /// The exponentiation runs on the device; the CPU pads, blinds and checks (about 20 µs
    /// of an H100 host's CPU per RSA-2048 signature against about 190 µs to sign on it).
    fn offloads_cpu(&self) -> bool {
        true
    }

    /// GPU results (RSA) are verified before release; re-runs through a fallback engine and
    /// other key kinds are not, so the facade checks those.
    fn verifies_signatures(&self, kind: keyengine::KeyKind) -> bool {
        kind == keyengine::KeyKind::Rsa && self.shared.fallback.get().is_none()
    }

    fn metrics(&self) -> Vec<keyengine::metrics::MetricFamily> {
        self.families()
    }
}

impl GpuEngine {
    fn families(&self) -> Vec<keyengine::metrics::MetricFamily> {
        let s = &self.shared;
        let c = &s.counters;
        let mut f = Families::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        f.single(
            Kind::Gauge,
            "rampart_gpu_available",
            "Whether a CUDA device backs the gpu engine (0: no driver, NVRTC or device, or its kernel still building).",
            f64::from(u8::from(self.available())),
        );
        f.single(
            Kind::Gauge,
            "rampart_gpu_starting",
            "1 while the gpu engine's kernel is being built (the other engines sign meanwhile).",
            f64::from(u8::from(self.status() == GpuStatus::Starting)),
        );
        if !self.available() {
            return f.into_vec();
        }
        f.single(
            Kind::Gauge,
            "rampart_gpu_healthy",
            "Whether the gpu engine currently trusts its device.",
            f64::from(u8::from(self.healthy())),
        );
        f.single(
            Kind::Gauge,
            "rampart_gpu_queue_depth",
            "Requests accepted by the gpu engine and not yet answered.",
            self.queue_depth() as f64,
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_requests_total",
            "Requests submitted to the gpu engine.",
            get(&c.submitted),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_batches_total",
            "Batches launched and completed.",
            get(&c.batches),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_batch_requests_total",
            "Requests in completed batches.",
            get(&c.batch_items),
        );
        f.single(
            Kind::Gauge,
            "rampart_gpu_batch_latency_target_seconds",
            "The time a batch may take on the device ([key_engine.gpu] batch_latency_target).",
            self.shared.config.batch_latency_target.as_secs_f64(),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_batch_seconds_total",
            "Time spent in completed batches (copy in, compute, copy out).",
            c.batch_ns.load(Ordering::Relaxed) as f64 / 1e9,
        );
        f.single(
            Kind::Gauge,
            "rampart_gpu_last_batch_size",
            "Requests in the last batch.",
            get(&c.last_batch),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_signatures_total",
            "Signatures from GPU results that verified and were released.",
            get(&c.gpu_signed),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_faults_total",
            "GPU results that failed verification (never released).",
            get(&c.faults),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_device_errors_total",
            "Batches that failed with a device error.",
            get(&c.device_errors),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_deadline_misses_total",
            "Batches abandoned past their deadline.",
            get(&c.deadline_misses),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_cpu_reruns_total",
            "Requests handed back to the CPU (errors, deadlines, faults, unhealthy device, keys not on the GPU).",
            get(&c.cpu_reruns),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_not_on_gpu_total",
            "Requests for keys not loaded on the GPU (ECDSA, unsupported RSA).",
            get(&c.not_on_gpu),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_probes_total",
            "Re-probes of an unhealthy device.",
            get(&c.probes),
        );
        f.single(
            Kind::Counter,
            "rampart_gpu_probe_failures_total",
            "Re-probes that failed.",
            get(&c.probe_failures),
        );
        let sizes = crate::host_core::HALF_LIMBS;
        f.by_label(
            Kind::Gauge,
            "rampart_gpu_batch_limit",
            "Most requests the next batch of this key size may take: the largest measured within the latency target.",
            "bits",
            sizes.iter().map(|&half| {
                let limit = s.sizer(half).limit().min(self.max_batch);
                ((half * 64).to_string(), limit as f64)
            }),
        );
        f.by_label(
            Kind::Gauge,
            "rampart_gpu_batch_latency_target_met",
            "0 when batches of every size measured for this key size took longer than the latency target.",
            "bits",
            sizes.iter().map(|&half| {
                let met = s.sizer(half).target_met();
                ((half * 64).to_string(), f64::from(u8::from(met)))
            }),
        );
        f.into_vec()
    }
}

impl Drop for GpuEngine {
    fn drop(&mut self) {
        self.tx.take(); // closes the queue; batching threads drain it and exit
        let threads = std::mem::take(
            &mut *self
                .shared
                .threads
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for t in threads {
            let _ = t.join();
        }
    }
}

/// Installs `backend`, starts one batching thread per stream and marks the engine ready.
fn start_batching(shared: &Arc<Shared>, backend: Arc<dyn BatchBackend>, rx: Receiver<Msg>) {
    let streams = backend.streams().max(1);
    let max_batch = shared.config.max_batch.min(backend.max_batch()).max(1);
    let cpu = match CpuPool::new(shared.config.cpu_threads) {
        Ok(pool) => pool,
        Err(e) => return shared.set_status(GpuStatus::Unavailable(e)),
    };
    if shared.backend.set(backend).is_err() || shared.cpu.set(cpu).is_err() {
        return;
    }
    let mut threads = shared.threads.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..streams {
        let s = shared.clone();
        let rx = rx.clone();
        match std::thread::Builder::new()
            .name(format!("rampart-gpu-{i}"))
            .spawn(move || batch_loop(&s, i, &rx, max_batch))
        {
            Ok(t) => threads.push(t),
            Err(e) => {
                drop(threads);
                shared.set_status(GpuStatus::Unavailable(format!(
                    "spawning batching thread {i}: {e}"
                )));
                return;
            }
        }
    }
    drop(threads);
    shared.set_status(GpuStatus::Ready);
}

/// One batching thread: takes what is queued (up to `max_batch`), runs it, answers.
fn batch_loop(shared: &Arc<Shared>, index: usize, rx: &Receiver<Msg>, max_batch: usize) {
    let backend = shared
        .backend
        .get()
        .cloned()
        .expect("batching threads start after the backend is set");
    let mut runner: Option<Box<dyn StreamRunner>> = None;
    let mut jobs: Vec<Job> = Vec::with_capacity(max_batch.min(4096));
    while let Ok(first) = rx.recv() {
        let mut probe = false;
        let mut push = |m: Msg, jobs: &mut Vec<Job>| match m {
            Msg::Sign(j) => jobs.push(j),
            Msg::Probe => probe = true,
        };
        push(first, &mut jobs);
        // Sized for the first request's key size (most batches hold one size).
        let half = jobs.first().map_or(32, |j| j.key.half());
        let limit = shared.sizer(half).limit().min(max_batch);
        while jobs.len() < limit {
            match rx.try_recv() {
                Ok(m) => push(m, &mut jobs),
                Err(_) => break,
            }
        }
        // While unhealthy, what was collected goes to the CPU before a probe that may take a
        // while (a new worker process loading its kernel).
        if !shared.healthy.load(Ordering::SeqCst) && !jobs.is_empty() {
            shared.rerun_all(std::mem::take(&mut jobs), "GPU unhealthy");
        }
        if probe {
            run_probe(shared, &*backend, index, &mut runner);
        }
        if jobs.is_empty() {
            continue;
        }
        if runner.is_none() {
            match backend.open_stream(index) {
                Ok(r) => runner = Some(r),
                Err(e) => {
                    shared
                        .counters
                        .device_errors
                        .fetch_add(1, Ordering::Relaxed);
                    shared.mark_unhealthy(format!("opening stream {index}: {e}"));
                    shared.rerun_all(std::mem::take(&mut jobs), "GPU device error");
                    continue;
                }
            }
        }
        run_jobs(shared, &*backend, &mut runner, std::mem::take(&mut jobs));
    }
}

/// Re-probe: a one-request known-answer batch on a fresh runner, checked against the CPU
/// build of the core. With no key loaded, opening the stream is the probe.
fn run_probe(
    shared: &Shared,
    backend: &dyn BatchBackend,
    index: usize,
    runner: &mut Option<Box<dyn StreamRunner>>,
) {
    shared.counters.probes.fetch_add(1, Ordering::Relaxed);
    let key = shared
        .keys
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .next()
        .cloned();
    let result = (|| -> Result<(), String> {
        *runner = None;
        let mut r = backend.open_stream(index).map_err(|e| e.to_string())?;
        if let Some(key) = key {
            let half = key.half();
            // A public test input: 0x5a5a.. below n (one byte shorter than the modulus).
            let mut input = vec![0x5a5a_5a5au32; 2 * half];
            input[2 * half - 1] = 0x005a_5a5a;
            let expect = key.crt().crt(&input);
            let st = r.stage(half, 1, 1).map_err(|e| e.to_string())?;
            st.keys.copy_from_slice(key.record());
            st.key_index[0] = 0;
            st.input.copy_from_slice(&input);
            let out = r.run(shared.deadline(1)).map_err(|e| e.to_string())?;
            if out != expect.as_slice() {
                return Err(GpuError::SelfTest.to_string());
            }
        }
        *runner = Some(r);
        Ok(())
    })();
    match result {
        Ok(()) => shared.mark_healthy(),
        Err(e) => {
            shared
                .counters
                .probe_failures
                .fetch_add(1, Ordering::Relaxed);
            shared.probe_failed(format!("re-probe failed: {e}"));
        }
    }
}

/// Runs `jobs` (any sizes, any keys) as one batch per key size (and per `max_keys` keys).
fn run_jobs(
    shared: &Shared,
    backend: &dyn BatchBackend,
    runner: &mut Option<Box<dyn StreamRunner>>,
    jobs: Vec<Job>,
) {
    let mut by_size: [Vec<Job>; 3] = Default::default();
    for j in jobs {
        by_size[crate::host_core::size_index(j.key.half())].push(j);
    }
    for group in by_size.into_iter().filter(|g| !g.is_empty()) {
        let mut rest = group;
        while !rest.is_empty() {
            // Take requests while they use at most max_keys distinct keys.
            let mut keys: Vec<KeyId> = Vec::new();
            let mut cut = rest.len();
            for (i, j) in rest.iter().enumerate() {
                if !keys.contains(&j.key.id()) {
                    if keys.len() == backend.max_keys() {
                        cut = i;
                        break;
                    }
                    keys.push(j.key.id());
                }
            }
            let tail = rest.split_off(cut);
            if runner.is_none() || !shared.healthy.load(Ordering::SeqCst) {
                shared.rerun_all(rest, "GPU unhealthy");
            } else {
                run_batch(shared, runner, rest);
            }
            rest = tail;
        }
    }
}

/// One launch: requests of one key size over at most `max_keys` keys.
fn run_batch(shared: &Shared, runner: &mut Option<Box<dyn StreamRunner>>, jobs: Vec<Job>) {
    let c = &shared.counters;
    let cpu = shared
        .cpu
        .get()
        .expect("batching threads start after the CPU pool");
    // Chunks of 64 or more: each takes one modular inversion for its blinding factors.
    let prepared = cpu.map_chunks(&jobs, cpu.chunk(jobs.len(), 64), |chunk| {
        let items: Vec<PrepareItem> = chunk
            .iter()
            .map(|j| PrepareItem {
                key: &j.key,
                alg: j.request.algorithm,
                digest: &j.request.digest,
            })
            .collect();
        prepare_batch(&items)
    });
    let mut ready: Vec<(Job, Prepared)> = Vec::with_capacity(jobs.len());
    for (job, p) in jobs.into_iter().zip(prepared) {
        match p {
            Ok(p) => ready.push((job, p)),
            Err(e) => shared.answer(job, Reply::Done(Err(e))),
        }
    }
    if ready.is_empty() {
        return;
    }
    let half = ready[0].0.key.half();
    let mut keys: Vec<&Arc<GpuKey>> = Vec::new();
    let index: Vec<u32> = ready
        .iter()
        .map(
            |(j, _)| match keys.iter().position(|k| k.id() == j.key.id()) {
                Some(i) => i as u32,
                None => {
                    keys.push(&j.key);
                    (keys.len() - 1) as u32
                }
            },
        )
        .collect();
    let r = runner.as_mut().expect("checked by the caller");
    let deadline = shared.deadline(ready.len());
    let outcome = launch(r.as_mut(), half, &keys, &index, &ready, deadline);
    match outcome {
        Ok((out, took)) => {
            c.batches.fetch_add(1, Ordering::Relaxed);
            c.batch_items
                .fetch_add(ready.len() as u64, Ordering::Relaxed);
            c.last_batch.store(ready.len() as u64, Ordering::Relaxed);
            c.batch_ns
                .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
            shared.sizer(half).record(ready.len(), took);
            let sigs = finish_all(cpu, half, &ready, out);
            // Counted before anyone hears back, so a caller's answer is in the counters.
            let faults = sigs.iter().filter(|s| s.is_none()).count() as u64;
            c.gpu_signed
                .fetch_add(sigs.len() as u64 - faults, Ordering::Relaxed);
            shared.depth.fetch_sub(ready.len(), Ordering::Relaxed);
            // Answered on the CPU threads too: a wake-up per request adds up at 16,384.
            cpu.for_each_pair(ready, sigs, 256, |(mut job, _), sig| match sig {
                Some(sig) => send_reply(job, Reply::Done(Ok(sig))),
                None => {
                    let req = std::mem::replace(&mut job.request, placeholder_request());
                    send_reply(job, Reply::Rerun(req, "GPU result failed verification"));
                }
            });
            if faults > 0 {
                c.faults.fetch_add(faults, Ordering::Relaxed);
                tracing::error!(
                    faults,
                    "gpu results failed verification; not released, re-run on the CPU"
                );
                *runner = None;
                shared.mark_unhealthy(format!("{faults} results failed verification"));
            }
        }
        Err(e) => {
            if let BackendError::Deadline(d) = &e {
                // Past its deadline: at least that long, for the sizer.
                shared.sizer(half).record(ready.len(), *d);
            }
            match &e {
                BackendError::Deadline(_) => c.deadline_misses.fetch_add(1, Ordering::Relaxed),
                BackendError::Device(_) => c.device_errors.fetch_add(1, Ordering::Relaxed),
            };
            *runner = None;
            shared.mark_unhealthy(e.to_string());
            let why = match e {
                BackendError::Deadline(_) => "GPU batch past its deadline",
                BackendError::Device(_) => "GPU device error",
            };
            shared.rerun_all(ready.into_iter().map(|(j, _)| j).collect(), why);
        }
    }
}

/// Unblinds and verifies each kernel result (`out`, 2·`half` limbs per request, in the order
/// of `ready`): the signature, or `None` where it failed verification.
fn finish_all(
    cpu: &CpuPool,
    half: usize,
    ready: &[(Job, Prepared)],
    out: &[u32],
) -> Vec<Option<Vec<u8>>> {
    let items: Vec<Finish> = ready
        .iter()
        .enumerate()
        .map(|(i, (j, p))| Finish {
            key: &j.key,
            prepared: p,
            raw: &out[i * 2 * half..(i + 1) * 2 * half],
            alg: j.request.algorithm,
            digest: &j.request.digest,
        })
        .collect();
    cpu.map_chunks(&items, cpu.chunk(items.len(), 8), finish_batch)
}

/// Stages one batch into the runner's buffers and runs it.
fn launch<'r>(
    r: &'r mut dyn StreamRunner,
    half: usize,
    keys: &[&Arc<GpuKey>],
    index: &[u32],
    ready: &[(Job, Prepared)],
    deadline: Duration,
) -> Result<(&'r [u32], Duration), BackendError> {
    let words = KeyLayout::words(half);
    let st = r.stage(half, keys.len(), ready.len())?;
    for (i, k) in keys.iter().enumerate() {
        st.keys[i * words..(i + 1) * words].copy_from_slice(k.record());
    }
    st.key_index.copy_from_slice(index);
    for (i, (_, p)) in ready.iter().enumerate() {
        st.input[i * 2 * half..(i + 1) * 2 * half].copy_from_slice(&p.input);
    }
    let start = Instant::now();
    let out = r.run(deadline)?;
    Ok((out, start.elapsed()))
}
