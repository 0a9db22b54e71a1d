//! Configuration: TOML parsed once into typed structs, then validated. Unknown fields are
//! rejected; every error names the file, the field path and what was expected.

use serde::{Deserialize, Deserializer};
use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A configuration error: where (file, field path, line) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if !self.path.is_empty() && self.path != "." {
            write!(f, ": field `{}`", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub key_engine: KeyEngineConfig,
    pub listeners: Vec<ListenerConfig>,
    pub routes: Vec<RouteConfig>,
    pub clusters: Vec<ClusterConfig>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Event-loop threads; 0 means one per CPU.
    pub worker_threads: usize,
    /// How long in-flight requests may run after SIGTERM.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// `stdout`, `off`, or a file path to append JSON lines to.
    pub access_log: String,
    /// Memory-aware overload actions (`[server.overload]`).
    pub overload: OverloadConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            worker_threads: 0,
            shutdown_grace: Duration::from_secs(30),
            access_log: "stdout".into(),
            overload: OverloadConfig::default(),
        }
    }
}

/// `[server.overload]`: actions taken as the process's memory nears a limit (see
/// `gateway::overload`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OverloadConfig {
    /// Resident memory the gateway should stay under; none: no overload actions.
    pub memory_limit_bytes: Option<u64>,
    /// How often memory is read.
    #[serde(deserialize_with = "duration")]
    pub check_interval: Duration,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            memory_limit_bytes: None,
            check_interval: Duration::from_millis(250),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address of the admin listener (`/healthz`, `/metrics`); must be loopback.
    pub listen: Option<SocketAddr>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9901))),
        }
    }
}

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
            threads_per_block: self.threads_per_block,
            window: self.window,
            batch_deadline_base: self.batch_deadline,
            kernel_cache: self.kernel_cache.clone(),
            cpu_threads: if self.cpu_threads == 0 {
                d.cpu_threads
            } else {
                self.cpu_threads
            },
            ..d
        }
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
            batch: BatchEngineConfig::default(),
            gpu: GpuEngineConfig::default(),
            remote: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub name: String,
    pub listen: SocketAddr,
    pub certificates: Vec<CertificateConfig>,
    #[serde(default)]
    pub tls: TlsConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub quic: QuicConfig,
    /// A plain-HTTP address whose every request is redirected (308) to this listener over
    /// HTTPS.
    pub http_redirect: Option<SocketAddr>,
    /// Client addresses served (addresses or CIDR blocks); empty: all not denied. Others are
    /// turned away before any TLS or QUIC handshake work.
    #[serde(default)]
    pub allow: Vec<crate::policy::access::Cidr>,
    /// Client addresses turned away, checked before `allow`.
    #[serde(default)]
    pub deny: Vec<crate::policy::access::Cidr>,
    /// Every TCP connection starts with a PROXY protocol header (version 1 or 2) from the
    /// layer-4 balancer in front, whose client address then stands for the connection's peer
    /// (access lists, rate limits, `X-Forwarded-For`, the access log). A connection without
    /// one is closed. QUIC is unaffected.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// How request paths are normalized before routing (`[listeners.paths]`).
    #[serde(default)]
    pub paths: crate::http::request_target::PathPolicy,
}

/// HTTP/3 over QUIC beside a TLS listener.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QuicConfig {
    /// Serve HTTP/3 and advertise it with `Alt-Svc` on TCP responses.
    pub enabled: bool,
    /// UDP address; default: the TCP listener's address and port.
    pub listen: Option<SocketAddr>,
    /// Congestion control: "cubic", "reno", "bbr2" (quiche's names).
    pub congestion_control: String,
    /// Connection-level flow-control window (bytes).
    pub initial_max_data: u64,
    /// Stream-level flow-control window (bytes).
    pub initial_max_stream_data: u64,
    /// Concurrent request streams a client may open.
    pub max_concurrent_streams: u64,
    /// UDP socket send and receive buffer (bytes); the kernel may cap it (a warning says so).
    pub udp_buffer_bytes: usize,
    /// Address validation with Retry: "never", "always" or "when_busy" (while more than
    /// `retry_pending_above` handshakes are pending on this listener).
    pub retry: RetryPolicy,
    /// With `retry = "when_busy"`: Retry while more handshakes than this are pending.
    pub retry_pending_above: usize,
    /// Handshakes pending at once on this listener (all workers); past it new connection
    /// attempts are refused (CONNECTION_REFUSED), Retry token or not, so a flood of Initials
    /// holds bounded memory.
    pub max_pending_handshakes: usize,
    /// Routable connection IDs (QUIC-LB); absent: random 20-byte IDs.
    pub lb: Option<QuicLbConfig>,
    /// Accept 0-RTT early data on resumed connections: safe methods (GET, HEAD, OPTIONS) are
    /// forwarded with `Early-Data: 1`; any other method in early data gets 425 Too Early.
    pub early_data: bool,
    /// Pace outgoing packets (spread over the RTT instead of bursts): each GSO send gets a
    /// release time (`SO_TXTIME`, honoured by the `fq` qdisc) and spans at most 1 ms of them.
    /// bbr2 paces by its own model; cubic and reno by Linux TCP's rule (quiche patch 20).
    pub pacing: bool,
    /// Initial congestion window in packets (RFC 9002 suggests 10).
    pub initial_congestion_window: usize,
    /// Path MTU discovery (RFC 8899 DPLPMTUD, quiche's): a connection starts at QUIC's
    /// 1,200 bytes and probes up to `max_udp_payload`; a probe lost three times is taken as too
    /// big (binary search below it), and probe loss is not taken as congestion.
    pub pmtu_discovery: bool,
    /// Largest UDP payload this server sends (bytes). Unset: 1452 (what a 1,500-byte IPv6
    /// path carries) with `pmtu_discovery`, else 1350 (fits every common path MTU without
    /// discovery). Read it with [`QuicConfig::max_udp_payload`].
    pub max_udp_payload: Option<usize>,
    /// ACK decimation: in-order ack-eliciting packets received before an ACK is sent, unless
    /// a quarter of the RTT (1 ms to `max_ack_delay`) passes first. A gap is acknowledged at
    /// once. 1 acknowledges every batch of received packets, as quiche does by default.
    pub ack_eliciting_threshold: u64,
}

impl QuicConfig {
    /// The UDP payload ceiling in force: `max_udp_payload`, or its default for
    /// `pmtu_discovery`.
    pub fn max_udp_payload(&self) -> usize {
        self.max_udp_payload
            .unwrap_or(if self.pmtu_discovery { 1452 } else { 1350 })
    }
}

impl Default for QuicConfig {
    fn default() -> Self {
        QuicConfig {
            enabled: false,
            listen: None,
            congestion_control: "cubic".into(),
            initial_max_data: 10 << 20,
            initial_max_stream_data: 1 << 20,
            max_concurrent_streams: 100,
            udp_buffer_bytes: 4 << 20,
            retry: RetryPolicy::WhenBusy,
            retry_pending_above: 256,
            max_pending_handshakes: 1024,
            lb: None,
            early_data: false,
            pacing: true,
            initial_congestion_window: 10,
            pmtu_discovery: true,
            max_udp_payload: None,
            ack_eliciting_threshold: 10,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryPolicy {
    Never,
    Always,
    WhenBusy,
}

/// QUIC-LB (draft-ietf-quic-load-balancers-21) connection-ID configuration, shared with the
/// L4 balancers in front.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuicLbConfig {
    /// Config rotation id, 0..=6.
    #[serde(default)]
    pub rotation: u8,
    /// This server's ID, hex.
    pub server_id: String,
    /// Nonce bytes (≥ 4; server ID + nonce ≤ 19).
    pub nonce_len: usize,
    /// AES-128 key, 32 hex digits; absent: plaintext server IDs.
    pub key: Option<String>,
}

impl QuicLbConfig {
    /// The quiclb configuration and the server ID bytes.
    pub fn build(&self) -> Result<(quiclb::Config, Vec<u8>), String> {
        let sid = hex(&self.server_id).ok_or("server_id: expected hex digits")?;
        let key = match &self.key {
            Some(k) => Some(
                hex(k)
                    .and_then(|b| <[u8; 16]>::try_from(b).ok())
                    .ok_or("key: expected 32 hex digits (AES-128)")?,
            ),
            None => None,
        };
        let cfg = quiclb::Config {
            rotation: self.rotation,
            server_id_len: sid.len(),
            nonce_len: self.nonce_len,
            key,
            self_encode_length: true,
        };
        cfg.validate().map_err(|e| e.to_string())?;
        Ok((cfg, sid))
    }
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Enabled versions: any of "1.2", "1.3".
    pub versions: Vec<TlsVersion>,
    /// TLS 1.2 cipher suites (OpenSSL names), ECDHE only. TLS 1.3 suites are fixed.
    pub tls12_ciphers: Vec<String>,
    /// How often the session-ticket key rotates; the previous key still decrypts.
    #[serde(deserialize_with = "duration")]
    pub ticket_key_rotation: Duration,
    /// Session-ticket keys shared by a fleet: a file of hex keys, the first sealing new tickets
    /// and every one opening them, re-read every `ticket_key_rotation` (none: keys made and
    /// rotated in process).
    pub ticket_key_file: Option<PathBuf>,
    /// Time allowed for a client to complete the TLS handshake.
    #[serde(deserialize_with = "duration")]
    pub handshake_timeout: Duration,
}

pub const TLS12_ECDHE_CIPHERS: &[&str] = &[
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
];

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            versions: vec![TlsVersion::Tls12, TlsVersion::Tls13],
            tls12_ciphers: TLS12_ECDHE_CIPHERS.iter().map(|s| s.to_string()).collect(),
            ticket_key_rotation: Duration::from_secs(3600),
            ticket_key_file: None,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// Names this certificate serves (exact, or `*.example.com`). The first certificate of a
    /// listener is also the default for clients that send no or an unknown SNI.
    pub server_names: Vec<String>,
    pub rsa: Option<CertKeyPair>,
    pub ecdsa: Option<CertKeyPair>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertKeyPair {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key, loaded into the key engine (never into a TLS context). Omit it when
    /// the `remote` engine signs with keys held by key servers (the edge then holds none).
    pub key: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Total bytes of request headers (names + values); more gets 431.
    pub max_header_bytes: usize,
    /// Number of request headers; more gets 431.
    pub max_headers: usize,
    /// Request body bytes; more gets 413.
    pub max_body_bytes: u64,
    /// Close a client connection idle this long between requests (no request in flight,
    /// whatever else arrives: HTTP/2 PINGs keep no connection open).
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Close a connection that sends no request this long after its TLS handshake.
    #[serde(deserialize_with = "duration")]
    pub first_request_timeout: Duration,
    /// While the listener holds more than 3/4 of `max_connections`, idle connections are
    /// closed after this instead of `idle_timeout`, so descriptors go back to new clients.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout_under_pressure: Duration,
    /// A request body whose length is known and at most this is read whole before an
    /// upstream is picked (nginx's `client_body_buffer_size`), so a client trickling it holds
    /// no upstream connection or slot meanwhile; 0: every body is streamed.
    pub buffer_body_bytes: u64,
    /// Longest wait for the next bytes of a request body (nginx's `client_body_timeout`);
    /// past it the request fails with 408 and its upstream slot is freed.
    #[serde(deserialize_with = "duration")]
    pub body_timeout: Duration,
    /// Longest time sent bytes may stay unacknowledged by a client that stopped reading
    /// (nginx's `send_timeout`, kept by the kernel as `TCP_USER_TIMEOUT`); past it the
    /// connection is closed and its requests' upstream slots freed.
    #[serde(deserialize_with = "duration")]
    pub send_timeout: Duration,
    /// HTTP/2 SETTINGS, PING and PRIORITY frames a client may send per second, on average
    /// (with a burst of ten seconds' worth); past it the connection is closed as a flood.
    pub max_control_frames_per_second: u32,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// Open client connections on this listener (all workers); beyond it new connections are
    /// closed at once and counted, so overload sheds instead of stalling everyone.
    pub max_connections: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            max_body_bytes: 1 << 30,
            idle_timeout: Duration::from_secs(60),
            first_request_timeout: Duration::from_secs(20),
            idle_timeout_under_pressure: Duration::from_secs(2),
            buffer_body_bytes: 16 * 1024,
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            max_control_frames_per_second: 100,
            max_concurrent_streams: 256,
            max_connections: 100_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Host to match: exact, `*.example.com`, or `*` (default) for any.
    #[serde(default = "any_host")]
    pub host: String,
    /// Path prefix to match (default `/`). The longest matching prefix wins.
    #[serde(default = "root_path")]
    pub path_prefix: String,
    /// Upstream cluster name.
    pub cluster: String,
    /// Name for metrics and logs (default: `host` + `path_prefix`).
    pub name: Option<String>,
    /// Client addresses served (addresses or CIDR blocks); empty: all not denied.
    #[serde(default)]
    pub allow: Vec<crate::policy::access::Cidr>,
    /// Client addresses refused with 403, checked before `allow`.
    #[serde(default)]
    pub deny: Vec<crate::policy::access::Cidr>,
    /// Requests a client address may make; beyond it, 429.
    pub rate_limit: Option<RateLimitConfig>,
    /// Gzip text-like responses for clients that accept it.
    #[serde(default)]
    pub compress: bool,
    /// HTTP/1.1 `Upgrade` protocols passed to the upstream (which may then switch the
    /// connection to a tunnel); a request asking for any other is forwarded as a plain
    /// request without its upgrade. `h2c` is never accepted: inside its tunnel, requests would
    /// pass no rule.
    #[serde(default = "default_upgrades")]
    pub upgrade_protocols: Vec<String>,
    /// Headers removed from, then set on, requests before they go upstream.
    #[serde(default)]
    pub request_headers: HeaderRewriteConfig,
    /// Headers removed from, then set on, every response of the route (the gateway's own
    /// answers, such as 403 or 502, included).
    #[serde(default)]
    pub response_headers: HeaderRewriteConfig,
}

#[cfg(test)]
impl RouteConfig {
    /// A route to `cluster` for `host` and `path_prefix`, every other option at its default.
    pub fn simple(host: &str, path_prefix: &str, cluster: &str) -> Self {
        RouteConfig {
            host: host.into(),
            path_prefix: path_prefix.into(),
            cluster: cluster.into(),
            name: None,
            allow: vec![],
            deny: vec![],
            rate_limit: None,
            request_headers: Default::default(),
            response_headers: Default::default(),
            compress: false,
            upgrade_protocols: vec!["websocket".into()],
        }
    }
}

/// A route's `request_headers` or `response_headers`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderRewriteConfig {
    /// Name → value, replacing any value the message had.
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, String>,
    /// Names removed.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// Header names a route may not set or remove: the connection's own (the proxy handles them).
const UNREWRITABLE: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

impl HeaderRewriteConfig {
    /// The first bad entry: (its path under `at`, what was expected).
    fn check(&self, at: &str) -> Option<(String, String)> {
        let name_ok = |n: &str| {
            http::HeaderName::from_bytes(n.as_bytes()).is_ok()
                && !UNREWRITABLE.contains(&n.to_ascii_lowercase().as_str())
        };
        let expected_name = "a header name (not a connection header such as connection, \
                             transfer-encoding or content-length)";
        for (k, v) in &self.set {
            if !name_ok(k) {
                return Some((format!("{at}.set.{k}"), expected_name.into()));
            }
            if http::HeaderValue::from_str(v).is_err() {
                return Some((
                    format!("{at}.set.{k}"),
                    "a header value (visible ASCII)".into(),
                ));
            }
        }
        for (i, n) in self.remove.iter().enumerate() {
            if !name_ok(n) {
                return Some((format!("{at}.remove[{i}]"), expected_name.into()));
            }
        }
        None
    }
}

/// A route's `rate_limit`: a token bucket per client address.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests a second per client.
    pub per_second: f64,
    /// Requests a client may make at once before the rate applies (default: `per_second`,
    /// at least 1).
    pub burst: Option<u32>,
}

impl RateLimitConfig {
    pub fn burst(&self) -> u32 {
        self.burst
            .unwrap_or_else(|| self.per_second.ceil().clamp(1.0, u32::MAX as f64) as u32)
    }
}

fn default_upgrades() -> Vec<String> {
    vec!["websocket".to_string()]
}

fn any_host() -> String {
    "*".into()
}
fn root_path() -> String {
    "/".into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LbPolicy {
    #[default]
    RoundRobin,
    LeastRequest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    #[default]
    Http1,
    /// HTTP/2 over cleartext TCP (prior knowledge).
    H2c,
    /// HTTP/2 over TLS (ALPN h2); needs `[clusters.tls]`.
    H2,
}

/// `[clusters.tls]`: TLS to the cluster's endpoints.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// The name sent (SNI) and verified in the endpoints' certificates.
    pub server_name: String,
    /// CA certificates (PEM) the endpoints' certificates must chain to (default: the system's).
    pub ca: Option<PathBuf>,
    /// A client certificate chain and its key (PEM), for origins that require mTLS.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub name: String,
    /// `host:port` of each endpoint.
    pub endpoints: Vec<SocketAddr>,
    #[serde(default)]
    pub lb: LbPolicy,
    #[serde(default)]
    pub protocol: UpstreamProtocol,
    #[serde(default = "default_connect_timeout", deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// Time to wait for the upstream's response headers; past it the client gets 504.
    #[serde(default = "default_read_timeout", deserialize_with = "duration")]
    pub read_timeout: Duration,
    /// Pooled keep-alive connections idle longer than this are closed.
    #[serde(default = "default_idle_timeout", deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Idle keep-alive connections kept per endpoint.
    #[serde(default = "default_pool_size")]
    pub max_idle_per_endpoint: usize,
    /// Requests in flight to the cluster at once, over all workers (from sending to the end of
    /// the response body); past it the client gets 503 at once instead of queueing behind a
    /// slow upstream.
    #[serde(default = "default_max_requests")]
    pub max_requests: usize,
    /// Requests in flight to the cluster from one client address; past it that client gets
    /// 429, so one client cannot take every slot (default: a quarter of `max_requests`, and
    /// at least 8 or `max_requests`). Read it with [`ClusterConfig::max_requests_per_client`].
    pub max_requests_per_client: Option<usize>,
    /// Longest wait for the next bytes of an upstream's response body once its headers are
    /// in (nginx's `proxy_read_timeout`); past it the response is cut and the slot freed.
    #[serde(default = "default_body_timeout", deserialize_with = "duration")]
    pub body_timeout: Duration,
    /// TLS to the endpoints; none: cleartext.
    pub tls: Option<UpstreamTlsConfig>,
    /// Active health checks of the endpoints; none when absent.
    pub health_check: Option<HealthCheckConfig>,
    /// Failed connects in a row after which an endpoint is passed over for `fail_timeout`
    /// (passive health, as nginx's `max_fails`); 0: never.
    #[serde(default = "default_max_fails")]
    pub max_fails: u32,
    #[serde(default = "default_fail_timeout", deserialize_with = "duration")]
    pub fail_timeout: Duration,
}

impl ClusterConfig {
    /// `max_requests_per_client`, or its default: a quarter of `max_requests`, and at least
    /// 8 (or `max_requests`, if fewer), never more than `max_requests`.
    pub fn max_requests_per_client(&self) -> usize {
        self.max_requests_per_client
            .unwrap_or((self.max_requests / 4).max(self.max_requests.min(8)))
            .min(self.max_requests)
    }
}

/// `[clusters.health_check]`: each endpoint is asked for `path` every `interval`; one that
/// fails `unhealthy_after` checks in a row gets no requests until it passes `healthy_after`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckConfig {
    /// The path asked for (GET); a 2xx or 3xx answer within `timeout` passes.
    pub path: String,
    /// The `Host` header sent (default: the endpoint's address).
    pub host: Option<String>,
    #[serde(default = "default_check_interval", deserialize_with = "duration")]
    pub interval: Duration,
    #[serde(default = "default_check_timeout", deserialize_with = "duration")]
    pub timeout: Duration,
    #[serde(default = "default_unhealthy_after")]
    pub unhealthy_after: u32,
    #[serde(default = "default_healthy_after")]
    pub healthy_after: u32,
}

fn default_check_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_check_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_unhealthy_after() -> u32 {
    3
}
fn default_healthy_after() -> u32 {
    2
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_read_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(90)
}
fn default_pool_size() -> usize {
    64
}
fn default_body_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_max_requests() -> usize {
    1024
}
fn default_max_fails() -> u32 {
    1
}
fn default_fail_timeout() -> Duration {
    Duration::from_secs(10)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {s:?} ({e}); expected e.g. \"500ms\", \"30s\", \"1h\""
        ))
    })
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        load_file(path, Self::parse)
    }

    /// Parses and validates config text; relative paths resolve against `base_dir`.
    pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let mut cfg: Config = parse_toml(text, file)?;
        cfg.resolve_paths(base_dir);
        cfg.validate().map_err(|(path, message)| ConfigError {
            file: file.into(),
            path,
            line: None,
            message,
        })?;
        Ok(cfg)
    }

    fn resolve_paths(&mut self, base: &Path) {
        if let Some(dir) = &mut self.key_engine.gpu.kernel_cache {
            *dir = base.join(&*dir);
        }
        if let Some(r) = &mut self.key_engine.remote {
            for p in [&mut r.ca, &mut r.client_cert, &mut r.client_key] {
                *p = base.join(&*p);
            }
        }
        for c in &mut self.clusters {
            if let Some(t) = &mut c.tls {
                for p in [&mut t.ca, &mut t.client_cert, &mut t.client_key]
                    .into_iter()
                    .flatten()
                {
                    *p = base.join(&*p);
                }
            }
        }
        for l in &mut self.listeners {
            if let Some(f) = &mut l.tls.ticket_key_file {
                *f = base.join(&*f);
            }
            for c in &mut l.certificates {
                for pair in [&mut c.rsa, &mut c.ecdsa].into_iter().flatten() {
                    pair.cert = base.join(&pair.cert);
                    pair.key = pair.key.as_ref().map(|k| base.join(k));
                }
            }
        }
    }

    /// Cross-field checks. Returns (field path, what was expected).
    fn validate(&self) -> Result<(), (String, String)> {
        let err = |p: String, m: String| Err((p, m));
        if let Some(a) = self.admin.listen {
            if !a.ip().is_loopback() {
                return err("admin.listen".into(), format!("{a} is not a loopback address; the admin listener must stay on 127.0.0.0/8 or ::1"));
            }
        }
        if self
            .server
            .overload
            .memory_limit_bytes
            .is_some_and(|b| b < 16 << 20)
        {
            return err(
                "server.overload.memory_limit_bytes".into(),
                "at least 16777216 (16 MiB), or absent for no overload actions".into(),
            );
        }
        if self.server.overload.check_interval < Duration::from_millis(10) {
            return err(
                "server.overload.check_interval".into(),
                "at least 10ms".into(),
            );
        }
        let ke = &self.key_engine;
        if ke.engines.is_empty() {
            return err(
                "key_engine.engines".into(),
                "at least one engine (\"inline\", \"threads\", \"batch\", \"gpu\" or \"remote\")"
                    .into(),
            );
        }
        for (field, pin) in [("rsa", ke.pin.rsa), ("ecdsa", ke.pin.ecdsa)] {
            if let Some(p) = pin {
                if !ke.engines.contains(&p) {
                    return err(
                        format!("key_engine.pin.{field}"),
                        format!(
                            "engine \"{}\" is not listed in key_engine.engines",
                            p.as_str()
                        ),
                    );
                }
            }
        }
        match (&ke.remote, ke.engines.contains(&EngineKind::Remote)) {
            (None, true) => {
                return err(
                    "key_engine.remote".into(),
                    "a [key_engine.remote] table: \"remote\" is listed in key_engine.engines"
                        .into(),
                )
            }
            (Some(r), _) => {
                if r.servers.is_empty() {
                    return err(
                        "key_engine.remote.servers".into(),
                        "at least one key server".into(),
                    );
                }
                for (f, path) in [
                    ("ca", &r.ca),
                    ("client_cert", &r.client_cert),
                    ("client_key", &r.client_key),
                ] {
                    if !path.is_file() {
                        return err(
                            format!("key_engine.remote.{f}"),
                            format!("file {} does not exist", path.display()),
                        );
                    }
                }
                if r.timeout.is_zero() || r.connections_per_server == 0 || r.breaker_failures == 0 {
                    return err("key_engine.remote".into(), "timeout, connections_per_server and breaker_failures must be greater than zero".into());
                }
            }
            (None, false) => {}
        }
        if ke.threads == 0 || ke.queue_capacity == 0 {
            return err(
                "key_engine.threads".into(),
                "threads and queue_capacity must be at least 1".into(),
            );
        }
        if ke.batch.threads == 0 || ke.batch.queue_capacity == 0 {
            return err(
                "key_engine.batch".into(),
                "threads and queue_capacity must be at least 1".into(),
            );
        }
        if let Err(e) = ke.batch.backend() {
            return err("key_engine.batch.kernel".into(), e);
        }
        if ke.batch.nonce_pool > 0
            && (ke.batch.nonce_batch == 0 || ke.batch.nonce_refill_below > ke.batch.nonce_pool)
        {
            return err(
                "key_engine.batch.nonce_refill_below".into(),
                "nonce_batch at least 1 and nonce_refill_below at most nonce_pool".into(),
            );
        }
        if let Some((field, expected)) = ke.gpu.check() {
            return err(format!("key_engine.gpu.{field}"), expected);
        }
        if self.listeners.is_empty() {
            return err("listeners".into(), "at least one listener".into());
        }
        let mut names = HashSet::new();
        let mut addrs = HashSet::new();
        for (i, l) in self.listeners.iter().enumerate() {
            let p = format!("listeners[{i}]");
            if !names.insert(&l.name) {
                return err(
                    format!("{p}.name"),
                    format!("duplicate listener name {:?}", l.name),
                );
            }
            if !addrs.insert(l.listen) {
                return err(
                    format!("{p}.listen"),
                    format!("address {} is used by another listener", l.listen),
                );
            }
            if l.certificates.is_empty() {
                return err(
                    format!("{p}.certificates"),
                    "at least one certificate".into(),
                );
            }
            for (j, c) in l.certificates.iter().enumerate() {
                let cp = format!("{p}.certificates[{j}]");
                if c.server_names.is_empty() {
                    return err(
                        format!("{cp}.server_names"),
                        "at least one server name".into(),
                    );
                }
                for (k, n) in c.server_names.iter().enumerate() {
                    if !valid_server_name(n) {
                        return err(
                            format!("{cp}.server_names[{k}]"),
                            format!("{n:?} is not a DNS name or *.wildcard"),
                        );
                    }
                }
                if c.rsa.is_none() && c.ecdsa.is_none() {
                    return err(cp, "an `rsa` or an `ecdsa` certificate (or both)".into());
                }
                for (kind, pair) in [("rsa", &c.rsa), ("ecdsa", &c.ecdsa)] {
                    if let Some(pair) = pair {
                        if pair.key.is_none() && !ke.engines.contains(&EngineKind::Remote) {
                            return err(
                                format!("{cp}.{kind}.key"),
                                "a private key file, unless key_engine.engines includes \"remote\""
                                    .into(),
                            );
                        }
                        let key = pair.key.iter().map(|k| ("key", k));
                        for (f, path) in std::iter::once(("cert", &pair.cert)).chain(key) {
                            if !path.is_file() {
                                return err(
                                    format!("{cp}.{kind}.{f}"),
                                    format!("file {} does not exist", path.display()),
                                );
                            }
                        }
                    }
                }
            }
            let t = &l.tls;
            if t.versions.is_empty() {
                return err(
                    format!("{p}.tls.versions"),
                    "at least one of \"1.2\", \"1.3\"".into(),
                );
            }
            for (k, c) in t.tls12_ciphers.iter().enumerate() {
                if !TLS12_ECDHE_CIPHERS.contains(&c.as_str()) {
                    return err(
                        format!("{p}.tls.tls12_ciphers[{k}]"),
                        format!(
                            "{c:?} is not an allowed ECDHE suite; expected one of {}",
                            TLS12_ECDHE_CIPHERS.join(", ")
                        ),
                    );
                }
            }
            if t.versions.contains(&TlsVersion::Tls12) && t.tls12_ciphers.is_empty() {
                return err(
                    format!("{p}.tls.tls12_ciphers"),
                    "TLS 1.2 is enabled: at least one suite".into(),
                );
            }
            if t.ticket_key_rotation < Duration::from_secs(1) {
                return err(format!("{p}.tls.ticket_key_rotation"), "at least 1s".into());
            }
            let q = &l.quic;
            if q.enabled {
                if !["cubic", "reno", "bbr2"].contains(&q.congestion_control.as_str()) {
                    return err(
                        format!("{p}.quic.congestion_control"),
                        format!(
                            "{:?}: expected \"cubic\", \"reno\" or \"bbr2\"",
                            q.congestion_control
                        ),
                    );
                }
                if q.max_pending_handshakes == 0 {
                    return err(
                        format!("{p}.quic.max_pending_handshakes"),
                        "at least 1".into(),
                    );
                }
                if !(2..=1000).contains(&q.initial_congestion_window) {
                    return err(
                        format!("{p}.quic.initial_congestion_window"),
                        format!("{}: expected 2..=1000 packets", q.initial_congestion_window),
                    );
                }
                if !(1..=1000).contains(&q.ack_eliciting_threshold) {
                    return err(
                        format!("{p}.quic.ack_eliciting_threshold"),
                        format!("{}: expected 1..=1000 packets", q.ack_eliciting_threshold),
                    );
                }
                if !(1200..=65527).contains(&q.max_udp_payload()) {
                    return err(
                        format!("{p}.quic.max_udp_payload"),
                        format!("{}: expected 1200..=65527 bytes", q.max_udp_payload()),
                    );
                }
                if !t.versions.contains(&TlsVersion::Tls13) {
                    return err(
                        format!("{p}.quic.enabled"),
                        "QUIC needs TLS 1.3 in tls.versions".into(),
                    );
                }
                if let Some(lb) = &q.lb {
                    if let Err(e) = lb.build() {
                        return err(format!("{p}.quic.lb"), e);
                    }
                }
            }
            if l.limits.max_control_frames_per_second == 0 {
                return err(
                    format!("{p}.limits.max_control_frames_per_second"),
                    "at least 1".into(),
                );
            }
            if l.limits.max_header_bytes < 1024 || l.limits.max_headers == 0 {
                return err(
                    format!("{p}.limits.max_header_bytes"),
                    "at least 1024 bytes and 1 header".into(),
                );
            }
        }
        let mut cluster_names = HashSet::new();
        for (i, c) in self.clusters.iter().enumerate() {
            if !cluster_names.insert(c.name.as_str()) {
                return err(
                    format!("clusters[{i}].name"),
                    format!("duplicate cluster name {:?}", c.name),
                );
            }
            if c.endpoints.is_empty() {
                return err(
                    format!("clusters[{i}].endpoints"),
                    "at least one endpoint".into(),
                );
            }
            match (&c.tls, c.protocol) {
                (None, UpstreamProtocol::H2) => {
                    return err(
                        format!("clusters[{i}].protocol"),
                        "\"h2\" is HTTP/2 over TLS and needs [clusters.tls]; \"h2c\" is cleartext"
                            .into(),
                    )
                }
                (Some(_), UpstreamProtocol::H2c) => {
                    return err(
                        format!("clusters[{i}].protocol"),
                        "\"h2c\" is cleartext; with [clusters.tls], \"h2\" (or \"http1\")".into(),
                    )
                }
                (Some(t), _) if t.client_cert.is_some() != t.client_key.is_some() => {
                    return err(
                        format!("clusters[{i}].tls"),
                        "client_cert and client_key together".into(),
                    )
                }
                (Some(t), _) if t.server_name.is_empty() => {
                    return err(
                        format!("clusters[{i}].tls.server_name"),
                        "a DNS name".into(),
                    )
                }
                _ => {}
            }
            if c.max_requests == 0 {
                return err(format!("clusters[{i}].max_requests"), "at least 1".into());
            }
            if c.max_requests_per_client == Some(0) {
                return err(
                    format!("clusters[{i}].max_requests_per_client"),
                    "at least 1".into(),
                );
            }
            if c.max_fails > 0 && c.fail_timeout.is_zero() {
                return err(
                    format!("clusters[{i}].fail_timeout"),
                    "greater than zero (or max_fails = 0 to turn passive checks off)".into(),
                );
            }
            if let Some(h) = &c.health_check {
                let p = format!("clusters[{i}].health_check");
                if !h.path.starts_with('/') {
                    return err(format!("{p}.path"), "a path starting with /".into());
                }
                if h.interval.is_zero() || h.timeout.is_zero() {
                    return err(p, "interval and timeout must be greater than zero".into());
                }
                if h.unhealthy_after == 0 || h.healthy_after == 0 {
                    return err(
                        p,
                        "unhealthy_after and healthy_after must be at least 1".into(),
                    );
                }
            }
            if c.read_timeout.is_zero() || c.connect_timeout.is_zero() {
                return err(
                    format!("clusters[{i}]"),
                    "timeouts must be greater than zero".into(),
                );
            }
        }
        if self.routes.is_empty() {
            return err("routes".into(), "at least one route".into());
        }
        for (i, r) in self.routes.iter().enumerate() {
            for (which, rw) in [
                ("request_headers", &r.request_headers),
                ("response_headers", &r.response_headers),
            ] {
                if let Some((path, expected)) = rw.check(&format!("routes[{i}].{which}")) {
                    return err(path, expected);
                }
            }
            if let Some(rl) = &r.rate_limit {
                if !(rl.per_second.is_finite() && rl.per_second > 0.0) {
                    return err(
                        format!("routes[{i}].rate_limit.per_second"),
                        "a number of requests greater than zero".into(),
                    );
                }
                if rl.burst == Some(0) {
                    return err(format!("routes[{i}].rate_limit.burst"), "at least 1".into());
                }
            }
            if !cluster_names.contains(r.cluster.as_str()) {
                let known: Vec<_> = self.clusters.iter().map(|c| c.name.as_str()).collect();
                return err(
                    format!("routes[{i}].cluster"),
                    format!(
                        "no cluster named {:?}; expected one of: {}",
                        r.cluster,
                        known.join(", ")
                    ),
                );
            }
            if !r.path_prefix.starts_with('/') {
                return err(
                    format!("routes[{i}].path_prefix"),
                    format!("{:?} must start with '/'", r.path_prefix),
                );
            }
            // Requests are matched by their normalized path, so a prefix in any other form
            // would never match.
            let keep = crate::http::request_target::PathPolicy {
                encoded_slash: crate::http::request_target::SeparatorAction::Keep,
                backslash: crate::http::request_target::SeparatorAction::Keep,
                ..Default::default()
            };
            match crate::http::request_target::normalize_path(r.path_prefix.as_bytes(), &keep) {
                Ok(n) if n == r.path_prefix => {}
                Ok(n) => {
                    return err(
                        format!("routes[{i}].path_prefix"),
                        format!(
                            "{:?} in normal form, as requests are matched: {n:?}",
                            r.path_prefix
                        ),
                    )
                }
                Err(e) => {
                    return err(
                        format!("routes[{i}].path_prefix"),
                        format!("a path ({:?}: {e})", r.path_prefix),
                    )
                }
            }
            for (j, p) in r.upgrade_protocols.iter().enumerate() {
                let token = !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b));
                if !token || p.eq_ignore_ascii_case("h2c") {
                    return err(
                        format!("routes[{i}].upgrade_protocols[{j}]"),
                        format!("an upgrade protocol token other than h2c, not {p:?}"),
                    );
                }
            }
            if r.host != "*" && !valid_server_name(&r.host) {
                return err(
                    format!("routes[{i}].host"),
                    format!("{:?} is not a host name, *.wildcard or *", r.host),
                );
            }
        }
        Ok(())
    }
}

/// Reads `path` and hands its text to `parse` with the file name and directory.
fn load_file<T>(
    path: &Path,
    parse: impl FnOnce(&str, &str, &Path) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        path: String::new(),
        line: None,
        message: format!("cannot read: {e}"),
    })?;
    parse(&text, &file, path.parent().unwrap_or(Path::new(".")))
}

/// TOML text into `T`, with errors naming the field path and line.
fn parse_toml<T: serde::de::DeserializeOwned>(text: &str, file: &str) -> Result<T, ConfigError> {
    let line_of = |span: Option<std::ops::Range<usize>>| {
        span.map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
    };
    let de = toml::Deserializer::parse(text).map_err(|e| ConfigError {
        file: file.into(),
        path: String::new(),
        line: line_of(e.span()),
        message: e.message().to_string(),
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| ConfigError {
        file: file.into(),
        path: e.path().to_string(),
        line: line_of(e.inner().span()),
        message: e.inner().message().to_string(),
    })
}

/// A key server's configuration (`rampart keyserver --config FILE`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyServerConfig {
    pub keyserver: KeyServerSection,
    #[serde(default = "keyserver_admin")]
    pub admin: AdminConfig,
    #[serde(default)]
    pub key_engine: KeyEngineConfig,
}

fn keyserver_admin() -> AdminConfig {
    AdminConfig {
        listen: Some(SocketAddr::from(([127, 0, 0, 1], 9902))),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyServerSection {
    /// Where gateways connect (mutual TLS).
    pub listen: SocketAddr,
    /// This key server's certificate chain and its (transport) key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA bundle that gateways' client certificates must chain to.
    pub client_ca: PathBuf,
    /// Private keys served, as PEM files; requests name them by SKI.
    pub keys: Vec<PathBuf>,
    /// Requests one connection may have in flight; reading pauses beyond it.
    #[serde(default = "default_in_flight")]
    pub max_in_flight_per_connection: usize,
    #[serde(default = "default_ks_handshake", deserialize_with = "duration")]
    pub handshake_timeout: Duration,
    /// After SIGTERM, how long in-flight requests may finish.
    #[serde(default = "default_ks_grace", deserialize_with = "duration")]
    pub shutdown_grace: Duration,
}

fn default_in_flight() -> usize {
    1024
}
fn default_ks_handshake() -> Duration {
    Duration::from_secs(10)
}
fn default_ks_grace() -> Duration {
    Duration::from_secs(10)
}

impl KeyServerConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load_file(path, Self::parse)
    }

    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Self, ConfigError> {
        let mut cfg: KeyServerConfig = parse_toml(text, file)?;
        let k = &mut cfg.keyserver;
        for p in [&mut k.cert, &mut k.key, &mut k.client_ca]
            .into_iter()
            .chain(k.keys.iter_mut())
        {
            *p = base.join(&*p);
        }
        let fail = |path: String, message: String| ConfigError {
            file: file.into(),
            path,
            line: None,
            message,
        };
        let k = &cfg.keyserver;
        for (f, p) in [
            ("cert", &k.cert),
            ("key", &k.key),
            ("client_ca", &k.client_ca),
        ] {
            if !p.is_file() {
                return Err(fail(
                    format!("keyserver.{f}"),
                    format!("file {} does not exist", p.display()),
                ));
            }
        }
        if k.keys.is_empty() {
            return Err(fail(
                "keyserver.keys".into(),
                "at least one private key file".into(),
            ));
        }
        for (i, p) in k.keys.iter().enumerate() {
            if !p.is_file() {
                return Err(fail(
                    format!("keyserver.keys[{i}]"),
                    format!("file {} does not exist", p.display()),
                ));
            }
        }
        if cfg.key_engine.engines.contains(&EngineKind::Remote) || cfg.key_engine.engines.is_empty()
        {
            return Err(fail(
                "key_engine.engines".into(),
                "local engines only (\"inline\", \"threads\", \"batch\")".into(),
            ));
        }
        if let Some(a) = cfg.admin.listen {
            if !a.ip().is_loopback() {
                return Err(fail(
                    "admin.listen".into(),
                    format!("{a} is not a loopback address"),
                ));
            }
        }
        Ok(cfg)
    }
}

fn valid_server_name(n: &str) -> bool {
    let n = n.strip_prefix("*.").unwrap_or(n);
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c.pem"), "").unwrap();
        std::fs::write(dir.path().join("k.pem"), "").unwrap();
        Config::parse(text, "test.toml", dir.path())
    }

    const MINIMAL: &str = r#"
[[listeners]]
name = "https"
listen = "127.0.0.1:8443"
[[listeners.certificates]]
server_names = ["localhost"]
ecdsa = { cert = "c.pem", key = "k.pem" }

[[routes]]
cluster = "app"

[[clusters]]
name = "app"
endpoints = ["127.0.0.1:8080"]
"#;

    #[test]
    fn unknown_field_names_path_and_line() {
        let text = MINIMAL.replace("name = \"app\"", "name = \"app\"\nlb_policy = \"x\"");
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "clusters[0].lb_policy");
        assert!(e.message.contains("unknown field"), "{e}");
        assert!(e.line.is_some());
        assert!(e.to_string().starts_with("test.toml:"), "{e}");
    }

    #[test]
    fn a_bad_access_list_entry_names_its_place() {
        let text = MINIMAL.replace(
            "cluster = \"app\"",
            "cluster = \"app\"\nallow = [\"10.0.0.0/8\", \"10.0.0.0/40\"]",
        );
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "routes[0].allow[1]");
        assert!(e.message.contains("CIDR block like"), "{e}");
    }

    #[test]
    fn health_checks_are_validated_with_their_paths() {
        // MINIMAL ends with the cluster's table.
        let with = |table: &str| format!("{MINIMAL}[clusters.health_check]\n{table}\n");
        assert!(parse(&with("path = \"/healthz\"")).is_ok());
        let e = parse(&with("path = \"healthz\"")).unwrap_err();
        assert_eq!(e.path, "clusters[0].health_check.path");
        let e = parse(&with("path = \"/h\"\nhealthy_after = 0")).unwrap_err();
        assert_eq!(e.path, "clusters[0].health_check");
        let e = parse(&with("path = \"/h\"\ninterval = \"often\"")).unwrap_err();
        assert_eq!(e.path, "clusters[0].health_check.interval");
        let e = parse(&with("path = \"/h\"\nrise = 2")).unwrap_err();
        assert_eq!(e.path, "clusters[0].health_check.rise");
    }

    #[test]
    fn rate_limits_are_validated_with_their_paths() {
        let with = |rl: &str| {
            MINIMAL.replace(
                "cluster = \"app\"",
                &format!("cluster = \"app\"\nrate_limit = {{ {rl} }}"),
            )
        };
        let c = parse(&with("per_second = 2.5")).unwrap();
        assert_eq!(c.routes[0].rate_limit.unwrap().burst(), 3);
        let e = parse(&with("per_second = 0")).unwrap_err();
        assert_eq!(e.path, "routes[0].rate_limit.per_second");
        let e = parse(&with("per_second = 5, burst = 0")).unwrap_err();
        assert_eq!(e.path, "routes[0].rate_limit.burst");
        let e = parse(&with("rps = 5")).unwrap_err();
        assert_eq!(e.path, "routes[0].rate_limit.rps");
    }

    #[test]
    fn header_rewrites_are_validated_with_their_paths() {
        let with = |rw: &str| {
            MINIMAL.replace(
                "cluster = \"app\"",
                &format!("cluster = \"app\"\nresponse_headers = {{ {rw} }}"),
            )
        };
        assert!(parse(&with(
            "set = { \"strict-transport-security\" = \"max-age=60\" }"
        ))
        .is_ok());
        let e = parse(&with("set = { \"bad name\" = \"x\" }")).unwrap_err();
        assert_eq!(e.path, "routes[0].response_headers.set.bad name");
        let e = parse(&with("set = { \"x-ok\" = \"line\\nbreak\" }")).unwrap_err();
        assert_eq!(e.path, "routes[0].response_headers.set.x-ok");
        let e = parse(&with("remove = [\"server\", \"Transfer-Encoding\"]")).unwrap_err();
        assert_eq!(e.path, "routes[0].response_headers.remove[1]");
        let e = parse(&with("add = {}")).unwrap_err();
        assert_eq!(e.path, "routes[0].response_headers.add");
    }

    #[test]
    fn upstream_tls_and_protocol_must_agree() {
        let with = |extra: &str| format!("{MINIMAL}{extra}\n");
        let tls = "[clusters.tls]\nserver_name = \"origin.internal\"";
        let c = parse(&with(&format!("protocol = \"h2\"\n{tls}"))).unwrap();
        assert_eq!(c.clusters[0].protocol, UpstreamProtocol::H2);
        let e = parse(&with("protocol = \"h2\"")).unwrap_err();
        assert_eq!(e.path, "clusters[0].protocol");
        assert!(e.message.contains("needs [clusters.tls]"), "{e}");
        let e = parse(&with(&format!("protocol = \"h2c\"\n{tls}"))).unwrap_err();
        assert_eq!(e.path, "clusters[0].protocol");
        let e = parse(&with(&format!("{tls}\nclient_cert = \"c.pem\""))).unwrap_err();
        assert_eq!(e.path, "clusters[0].tls");
    }

    #[test]
    fn a_cluster_takes_at_least_one_request() {
        let e = parse(&MINIMAL.replace("name = \"app\"", "name = \"app\"\nmax_requests = 0"))
            .unwrap_err();
        assert_eq!(e.path, "clusters[0].max_requests");
        assert!(e.message.contains("at least 1"), "{e}");
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.clusters[0].max_requests, 1024);
    }

    #[test]
    fn bad_enum_and_duration_say_what_was_expected() {
        let e = parse(&MINIMAL.replace("name = \"app\"", "name = \"app\"\nlb = \"fastest\""))
            .unwrap_err();
        assert_eq!(e.path, "clusters[0].lb");
        assert!(e.message.contains("round_robin"), "{e}");
        let e =
            parse(&MINIMAL.replace("name = \"app\"", "name = \"app\"\nread_timeout = \"soon\""))
                .unwrap_err();
        assert_eq!(e.path, "clusters[0].read_timeout");
        assert!(e.message.contains("expected e.g."), "{e}");
    }

    #[test]
    fn dangling_cluster_reference_is_rejected() {
        let e = parse(&MINIMAL.replace("cluster = \"app\"", "cluster = \"nope\"")).unwrap_err();
        assert_eq!(e.path, "routes[0].cluster");
        assert!(e.message.contains("expected one of: app"), "{e}");
    }

    #[test]
    fn admin_must_be_loopback_and_ciphers_ecdhe() {
        let e = parse(&format!("[admin]\nlisten = \"0.0.0.0:9901\"\n{MINIMAL}")).unwrap_err();
        assert_eq!(e.path, "admin.listen");
        let text = MINIMAL.replace(
            "[[listeners.certificates]]",
            "[listeners.tls]\ntls12_ciphers = [\"AES128-GCM-SHA256\"]\n[[listeners.certificates]]",
        );
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "listeners[0].tls.tls12_ciphers[0]");
    }

    #[test]
    fn missing_certificate_file_names_the_field() {
        let e = parse(&MINIMAL.replace("k.pem", "missing.pem")).unwrap_err();
        assert_eq!(e.path, "listeners[0].certificates[0].ecdsa.key");
        assert!(e.message.contains("does not exist"), "{e}");
    }

    /// MINIMAL with a QUIC listener carrying `extra` settings.
    fn with_quic(extra: &str) -> String {
        MINIMAL.replace(
            "[[listeners.certificates]]",
            &format!("[listeners.quic]\nenabled = true\n{extra}\n[[listeners.certificates]]"),
        )
    }

    #[test]
    fn quic_transport_settings_are_range_checked() {
        let e = parse(&with_quic("initial_congestion_window = 1")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.initial_congestion_window");
        assert!(e.message.contains("2..=1000"), "{e}");
        let e = parse(&with_quic("ack_eliciting_threshold = 0")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.ack_eliciting_threshold");
        assert!(e.message.contains("1..=1000"), "{e}");
        let e = parse(&with_quic("max_udp_payload = 70000")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.max_udp_payload");
        let e = parse(&with_quic("retry = \"sometimes\"")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.retry");
        assert!(e.message.contains("when_busy"), "{e}");
        let c = parse(&with_quic(
            "retry = \"when_busy\"\nretry_pending_above = 32",
        ))
        .unwrap();
        assert_eq!(c.listeners[0].quic.retry, RetryPolicy::WhenBusy);
        assert_eq!(c.listeners[0].quic.retry_pending_above, 32);
        assert_eq!(c.listeners[0].quic.initial_congestion_window, 10);
    }

    #[test]
    fn udp_payload_ceiling_follows_pmtu_discovery() {
        let quic = |extra: &str| parse(&with_quic(extra)).unwrap().listeners[0].quic.clone();
        let q = quic("");
        assert!(q.pmtu_discovery);
        assert_eq!(q.max_udp_payload(), 1452);
        assert_eq!(quic("pmtu_discovery = false").max_udp_payload(), 1350);
        let q = quic("pmtu_discovery = false\nmax_udp_payload = 1400");
        assert_eq!(q.max_udp_payload(), 1400);
        assert_eq!(quic("max_udp_payload = 9000").max_udp_payload(), 9000);
        let e = parse(&with_quic("max_udp_payload = 1100")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.max_udp_payload");
        assert!(e.message.contains("1200..=65527"), "{e}");
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.clusters[0].lb, LbPolicy::RoundRobin);
        assert_eq!(c.routes[0].host, "*");
        assert_eq!(
            c.listeners[0].tls.versions,
            vec![TlsVersion::Tls12, TlsVersion::Tls13]
        );
        assert_eq!(c.admin.listen, Some("127.0.0.1:9901".parse().unwrap()));
    }
}
