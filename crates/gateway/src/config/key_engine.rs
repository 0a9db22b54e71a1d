//! `[key_engine]`: which engines sign, and each engine's settings.

use super::{duration, At, Invalid};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Inline,
    Threads,
    Batch,
    Gpu,
    Remote,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Inline => "inline",
            EngineKind::Threads => "threads",
            EngineKind::Batch => "batch",
            EngineKind::Gpu => "gpu",
            EngineKind::Remote => "remote",
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KeyEngineConfig {
    /// Engines to run; the scheduler routes each request among them.
    pub engines: Vec<EngineKind>,
    /// Crypto threads of the `threads` engine.
    pub threads: usize,
    /// Bounded queue of the `threads` engine; a full queue fails new handshakes fast.
    pub queue_capacity: usize,
    /// Pin a key kind to an engine: `rsa`, `ecdsa` → engine name.
    pub pin: PinConfig,
    /// From this share of the CPUs this process may use kept busy (sampled every 100 ms),
    /// requests go to engines that sign off the CPU (`gpu`) even where a CPU engine would
    /// finish sooner, until the share falls 0.15 below it. Only with such an engine listed.
    pub cpu_offload_above: f64,
    /// The `batch` engine: the multi-buffer kernel.
    pub batch: BatchEngineConfig,
    /// The `gpu` engine: batched RSA on a CUDA device.
    pub gpu: GpuEngineConfig,
    /// The `remote` engine: key servers speaking the keyless protocol.
    pub remote: Option<RemoteEngineConfig>,
}

/// `[key_engine.batch]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BatchEngineConfig {
    /// Crypto threads cutting batches from the engine's one queue.
    pub threads: usize,
    /// Bounded queue; a full queue fails new handshakes fast.
    pub queue_capacity: usize,
    /// Kernel lane type: "auto" (fastest this CPU runs), "ifma512", "ifma256", "portable".
    pub kernel: String,
    /// Sign at once on the event loop when the engine is idle (no hand-off at light load).
    pub inline_when_idle: bool,
    /// ECDSA P-256 nonces kept precomputed (0 disables the pool). Used where AVX-512 IFMA
    /// exists.
    pub nonce_pool: usize,
    /// Refill the pool (in idle time) when fewer nonces than this remain.
    pub nonce_refill_below: usize,
    /// Nonces computed per refill batch (one field and one scalar inversion per batch).
    pub nonce_batch: usize,
}

impl Default for BatchEngineConfig {
    fn default() -> Self {
        BatchEngineConfig {
            threads: 1,
            queue_capacity: 4096,
            kernel: "auto".into(),
            inline_when_idle: true,
            nonce_pool: 8192,
            nonce_refill_below: 4096,
            nonce_batch: 128,
        }
    }
}

impl BatchEngineConfig {
    /// The kernel backend named by `kernel`, checked against this CPU.
    pub fn backend(&self) -> Result<keyengine::KernelBackend, String> {
        use keyengine::KernelBackend;
        let b = match self.kernel.as_str() {
            "auto" => KernelBackend::best(),
            name => KernelBackend::from_name(name).ok_or_else(|| {
                format!("\"auto\", \"ifma512\", \"ifma256\" or \"portable\", not {name:?}")
            })?,
        };
        if !b.available() {
            return Err(format!(
                "kernel {b} needs AVX-512 IFMA, which this CPU lacks (use \"auto\" or \"portable\")"
            ));
        }
        Ok(b)
    }
}

/// `[key_engine.gpu]`: the `gpu` engine's queue and launch shape (see `docs/benchmarks-history.md`
/// for what each measured on an H200).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GpuEngineConfig {
    /// Requests queued at most; beyond, new handshakes go to the other engines.
    pub queue_capacity: usize,
    /// Most requests per launch; below it, batches take what is queued up to the largest size
    /// measured within `batch_latency_target`.
    pub max_batch: usize,
    /// The time a batch may take on the device: about half the p99 a request sees.
    #[serde(deserialize_with = "duration")]
    pub batch_latency_target: Duration,
    /// CUDA streams: batches in flight at once.
    pub streams: usize,
    /// Threads per request: 2 (one per CRT half), 1, or 8, 16, 32 (a group of 4, 8, 16
    /// lanes per CRT half).
    pub threads_per_request: u32,
    /// The group kernels' window table in shared memory (else a local array per thread);
    /// ignored with 1 or 2 threads per request.
    pub table_shared: bool,
    /// The group kernels' multiply-accumulate rows as PTX carry chains; ignored with 1 or 2
    /// threads per request.
    pub carry_chains: bool,
    /// Threads per block of a launch.
    pub threads_per_block: u32,
    /// Exponent window width the kernel is built with: 4, 5 or 6 bits.
    pub window: u32,
    /// A batch not finished within this (plus 5 µs per request) is re-run on the CPU.
    #[serde(deserialize_with = "duration")]
    pub batch_deadline: Duration,
    /// CPU threads that pad, blind, unblind and verify a large batch; 0 = one per CPU.
    pub cpu_threads: usize,
    /// Directory where the built kernel is kept between starts (created if missing).
    pub kernel_cache: Option<PathBuf>,
    /// Where the device's work runs: `process` (a `rampart gpu-worker` child, started again
    /// after a device fault) or `none` (in the gateway's process: a fault that leaves the CUDA
    /// context failed keeps the engine on the CPU until a restart).
    pub isolation: GpuIsolation,
}

/// `[key_engine.gpu] isolation`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum GpuIsolation {
    #[default]
    Process,
    None,
}

impl Default for GpuEngineConfig {
    fn default() -> Self {
        let d = gpu_engine::GpuConfig::default();
        GpuEngineConfig {
            queue_capacity: d.queue_capacity,
            max_batch: d.max_batch,
            batch_latency_target: d.batch_latency_target,
            streams: d.streams,
            threads_per_request: d.threads_per_request,
            table_shared: d.table_shared,
            carry_chains: d.carry_chains,
            threads_per_block: d.threads_per_block,
            window: d.window,
            batch_deadline: d.batch_deadline_base,
            cpu_threads: 0,
            kernel_cache: None,
            isolation: GpuIsolation::Process,
        }
    }
}

impl GpuEngineConfig {
    /// The first field out of range, as (field, what was expected).
    fn check(&self) -> Option<(&'static str, String)> {
        if self.queue_capacity == 0 {
            return Some(("queue_capacity", "at least 1".into()));
        }
        if !(1..=1 << 20).contains(&self.max_batch) {
            return Some(("max_batch", "1 to 1048576 requests".into()));
        }
        if !(2..=16).contains(&self.streams) {
            return Some(("streams", "2 to 16".into()));
        }
        if !gpu_engine::host_core::THREADS_PER_REQUEST.contains(&self.threads_per_request) {
            return Some(("threads_per_request", "1, 2, 8, 16 or 32".into()));
        }
        let most = if self.threads_per_request > 1 {
            gpu_engine::host_core::MAX_SPLIT_BLOCK
        } else {
            1024
        };
        if !(32..=most).contains(&self.threads_per_block)
            || !self.threads_per_block.is_multiple_of(32)
        {
            return Some((
                "threads_per_block",
                format!("a multiple of 32 from 32 to {most}"),
            ));
        }
        if !gpu_engine::host_core::WINDOWS.contains(&self.window) {
            return Some(("window", "4, 5 or 6".into()));
        }
        if self.batch_deadline.is_zero() {
            return Some(("batch_deadline", "more than zero".into()));
        }
        if self.batch_latency_target.is_zero() {
            return Some(("batch_latency_target", "more than zero".into()));
        }
        None
    }

    /// The engine's settings.
    pub fn engine_config(&self) -> gpu_engine::GpuConfig {
        let d = gpu_engine::GpuConfig::default();
        gpu_engine::GpuConfig {
            queue_capacity: self.queue_capacity,
            max_batch: self.max_batch,
            batch_latency_target: self.batch_latency_target,
            streams: self.streams,
            threads_per_request: self.threads_per_request,
            table_shared: self.table_shared,
            carry_chains: self.carry_chains,
            // FP64 arithmetic is measured on devices first (`device_bench --fp64`, `rampart
            // bench engine --engines gpu:2f`), not yet a gateway setting.
            fp64: false,
            threads_per_block: self.threads_per_block,
            window: self.window,
            batch_deadline_base: self.batch_deadline,
            kernel_cache: self.kernel_cache.clone(),
            worker: match self.isolation {
                GpuIsolation::Process => Some(worker_command()),
                GpuIsolation::None => None,
            },
            cpu_threads: if self.cpu_threads == 0 {
                d.cpu_threads
            } else {
                self.cpu_threads
            },
            ..d
        }
    }
}

/// This executable as the gpu engine's worker (`rampart gpu-worker`), by `/proc/self/exe`:
/// the image running now, also after a package upgrade replaced the file (a worker of another
/// version would not speak this one's protocol).
fn worker_command() -> gpu_engine::process::WorkerCommand {
    gpu_engine::process::WorkerCommand {
        program: "/proc/self/exe".into(),
        args: vec!["gpu-worker".into()],
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RemoteEngineConfig {
    /// Key servers, `host:port`.
    pub servers: Vec<SocketAddr>,
    /// Name the key servers' certificates must carry (also sent as SNI).
    pub server_name: String,
    /// PEM CA bundle that signed the key servers' certificates.
    pub ca: PathBuf,
    /// This gateway's client certificate and key (mutual TLS).
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Connections kept to each server.
    #[serde(default = "one")]
    pub connections_per_server: usize,
    /// Per-request deadline; past it the request is retried on another server.
    #[serde(default = "default_remote_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    /// Health-check ping interval per connection.
    #[serde(default = "default_ping_interval", deserialize_with = "duration")]
    pub ping_interval: Duration,
    /// Consecutive failures that open a server's circuit breaker.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker keeps a server out before one trial request.
    #[serde(default = "default_breaker_cooldown", deserialize_with = "duration")]
    pub breaker_cooldown: Duration,
}

fn one() -> usize {
    1
}
fn default_remote_timeout() -> Duration {
    Duration::from_millis(500)
}
fn default_ping_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_breaker_failures() -> u32 {
    3
}
fn default_breaker_cooldown() -> Duration {
    Duration::from_secs(2)
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PinConfig {
    pub rsa: Option<EngineKind>,
    pub ecdsa: Option<EngineKind>,
}

impl Default for KeyEngineConfig {
    fn default() -> Self {
        KeyEngineConfig {
            engines: vec![EngineKind::Batch],
            threads: 1,
            queue_capacity: 1024,
            pin: PinConfig::default(),
            cpu_offload_above: 0.85,
            batch: BatchEngineConfig::default(),
            gpu: GpuEngineConfig::default(),
            remote: None,
        }
    }
}

impl KeyEngineConfig {
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if self.engines.is_empty() {
            return at.field("engines").fail(
                "at least one engine (\"inline\", \"threads\", \"batch\", \"gpu\" or \"remote\")",
            );
        }
        for (field, pin) in [("rsa", self.pin.rsa), ("ecdsa", self.pin.ecdsa)] {
            if let Some(p) = pin {
                if !self.engines.contains(&p) {
                    return at.field("pin").field(field).fail(format!(
                        "engine \"{}\" is not listed in key_engine.engines",
                        p.as_str()
                    ));
                }
            }
        }
        if !(self.cpu_offload_above > 0.15 && self.cpu_offload_above <= 1.0) {
            return at
                .field("cpu_offload_above")
                .fail("a share of the CPUs above 0.15 and at most 1.0");
        }
        let remote = at.field("remote");
        match (&self.remote, self.engines.contains(&EngineKind::Remote)) {
            (None, true) => {
                return remote.fail(
                    "a [key_engine.remote] table: \"remote\" is listed in key_engine.engines",
                )
            }
            (Some(r), _) => {
                if r.servers.is_empty() {
                    return remote.field("servers").fail("at least one key server");
                }
                for (f, path) in [
                    ("ca", &r.ca),
                    ("client_cert", &r.client_cert),
                    ("client_key", &r.client_key),
                ] {
                    remote.field(f).file_exists(path)?;
                }
                if r.timeout.is_zero() || r.connections_per_server == 0 || r.breaker_failures == 0 {
                    return remote.fail("timeout, connections_per_server and breaker_failures must be greater than zero");
                }
            }
            (None, false) => {}
        }
        if self.threads == 0 || self.queue_capacity == 0 {
            return at
                .field("threads")
                .fail("threads and queue_capacity must be at least 1");
        }
        let batch = at.field("batch");
        if self.batch.threads == 0 || self.batch.queue_capacity == 0 {
            return batch.fail("threads and queue_capacity must be at least 1");
        }
        if let Err(e) = self.batch.backend() {
            return batch.field("kernel").fail(e);
        }
        if self.batch.nonce_pool > 0
            && (self.batch.nonce_batch == 0
                || self.batch.nonce_refill_below > self.batch.nonce_pool)
        {
            return batch
                .field("nonce_refill_below")
                .fail("nonce_batch at least 1 and nonce_refill_below at most nonce_pool");
        }
        if let Some((field, expected)) = self.gpu.check() {
            return at.field("gpu").field(field).fail(expected);
        }
        Ok(())
    }

    /// Relative paths in the section resolved against the config file's folder.
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        if let Some(dir) = &mut self.gpu.kernel_cache {
            *dir = base.join(&*dir);
        }
        if let Some(r) = &mut self.remote {
            for p in [&mut r.ca, &mut r.client_cert, &mut r.client_key] {
                *p = base.join(&*p);
            }
        }
    }
}
