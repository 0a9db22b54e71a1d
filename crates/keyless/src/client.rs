//! The `remote` engine: signs by key id on a pool of key servers.
//!
//! Each server has `connections_per_server` connections, each kept up by a manager task
//! (reconnect with backoff) on the engine's own I/O thread; requests are pipelined on them
//! and matched by id. A request goes to the healthy server with the fewest outstanding
//! requests; after a timeout or a lost connection it is retried once on another server. Each
//! server has a circuit breaker: consecutive failures open it for a cooldown. Pings check every
//! connection's health.

use crate::codec::{self, ErrorCode, Message, Op};
use crate::server::opcode_for;
use boring::ssl::SslConnector;
use keyengine::{Engine, SignError, SignFuture, SignRequest};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

const NAME: &str = "remote";

pub struct RemoteConfig {
    pub servers: Vec<SocketAddr>,
    pub server_name: String,
    pub connector: SslConnector,
    pub connections_per_server: usize,
    pub timeout: Duration,
    pub ping_interval: Duration,
    pub breaker_failures: u32,
    pub breaker_cooldown: Duration,
}

/// Counters the remote engine keeps (per server address), for metrics and tests.
#[derive(Default, Debug)]
pub struct RemoteStats {
    pub sent: AtomicU64,
    pub ok: AtomicU64,
    pub timeouts: AtomicU64,
    pub lost: AtomicU64,
    pub retries: AtomicU64,
    pub server_errors: AtomicU64,
    pub breaker_opened: AtomicU64,
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
}

type Reply = Result<Message, Lost>;

/// The connection carrying a request went away before its answer.
#[derive(Debug)]
struct Lost;

struct Connection {
    tx: mpsc::Sender<Vec<u8>>,
    pending: Mutex<HashMap<u32, oneshot::Sender<Reply>>>,
    alive: AtomicBool,
}

impl Connection {
    fn fail_all(&self) {
        self.alive.store(false, Ordering::Relaxed);
        for (_, w) in self.pending.lock().expect("pending lock").drain() {
            let _ = w.send(Err(Lost));
        }
    }
}

struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
}

struct Server {
    addr: SocketAddr,
    conns: Vec<Mutex<Option<Arc<Connection>>>>,
    next_conn: AtomicUsize,
    outstanding: AtomicUsize,
    breaker: Mutex<Breaker>,
    stats: RemoteStats,
}

impl Server {
    fn available(&self) -> bool {
        let b = self.breaker.lock().expect("breaker lock");
        b.open_until.is_none_or(|t| Instant::now() >= t)
    }

    fn live_connection(&self) -> Option<Arc<Connection>> {
        let n = self.conns.len();
        let start = self.next_conn.fetch_add(1, Ordering::Relaxed);
        (0..n).find_map(|k| {
            self.conns[(start + k) % n]
                .lock()
                .expect("conn lock")
                .as_ref()
                .filter(|c| c.alive.load(Ordering::Relaxed))
                .cloned()
        })
    }

    fn success(&self) {
        let mut b = self.breaker.lock().expect("breaker lock");
        b.failures = 0;
        b.open_until = None;
    }

    fn failure(&self, threshold: u32, cooldown: Duration) {
        let mut b = self.breaker.lock().expect("breaker lock");
        b.failures += 1;
        if b.failures >= threshold {
            if b.open_until.is_none_or(|t| Instant::now() >= t) {
                self.stats.breaker_opened.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(server = %self.addr, failures = b.failures, "key server circuit breaker open");
            }
            b.open_until = Some(Instant::now() + cooldown);
        }
    }
}

struct Inner {
    servers: Vec<Arc<Server>>,
    next_id: AtomicU32,
    timeout: Duration,
    breaker_failures: u32,
    breaker_cooldown: Duration,
}

/// A key engine whose keys live on remote key servers.
pub struct RemoteEngine {
    inner: Arc<Inner>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    io_thread: Option<std::thread::JoinHandle<()>>,
}

impl RemoteEngine {
    /// Starts the I/O thread and the connection managers. Connections come up in the
    /// background; requests before then fail over or report the engine unavailable.
    pub fn start(cfg: RemoteConfig) -> anyhow::Result<Self> {
        let inner = Arc::new(Inner {
            servers: cfg
                .servers
                .iter()
                .map(|a| {
                    Arc::new(Server {
                        addr: *a,
                        conns: (0..cfg.connections_per_server.max(1))
                            .map(|_| Mutex::new(None))
                            .collect(),
                        next_conn: AtomicUsize::new(0),
                        outstanding: AtomicUsize::new(0),
                        breaker: Mutex::new(Breaker {
                            failures: 0,
                            open_until: None,
                        }),
                        stats: RemoteStats::default(),
                    })
                })
                .collect(),
            next_id: AtomicU32::new(1),
            timeout: cfg.timeout,
            breaker_failures: cfg.breaker_failures.max(1),
            breaker_cooldown: cfg.breaker_cooldown,
        });
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let connector = Arc::new(cfg.connector);
        let managed = inner.clone();
        let (name, ping) = (cfg.server_name, cfg.ping_interval);
        let io_thread = std::thread::Builder::new()
            .name("rampart-keyless-io".into())
            .spawn(move || {
                rt.block_on(async move {
                    for server in &managed.servers {
                        for slot in 0..server.conns.len() {
                            tokio::spawn(manage(
                                server.clone(),
                                slot,
                                connector.clone(),
                                name.clone(),
                                ping,
                                managed.timeout,
                                stop_rx.clone(),
                            ));
                        }
                    }
                    let mut stop_rx = stop_rx;
                    let _ = stop_rx.wait_for(|s| *s).await;
                });
            })?;
        Ok(RemoteEngine {
            inner,
            stop: Some(stop),
            io_thread: Some(io_thread),
        })
    }

    /// Counters of the server at `addr`.
    pub fn stats(&self, addr: SocketAddr) -> Option<&RemoteStats> {
        self.inner
            .servers
            .iter()
            .find(|s| s.addr == addr)
            .map(|s| &s.stats)
    }

    /// Live connections across all servers.
    pub fn live_connections(&self) -> usize {
        self.inner
            .servers
            .iter()
            .flat_map(|s| s.conns.iter())
            .filter(|c| {
                c.lock()
                    .expect("conn lock")
                    .as_ref()
                    .is_some_and(|c| c.alive.load(Ordering::Relaxed))
            })
            .count()
    }
}

impl Drop for RemoteEngine {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.io_thread.take() {
            let _ = t.join();
        }
    }
}

/// Keeps one connection slot of a server up: connect, run, reconnect with backoff.
async fn manage(
    server: Arc<Server>,
    slot: usize,
    connector: Arc<SslConnector>,
    server_name: String,
    ping_interval: Duration,
    timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if *stop.borrow() {
            return;
        }
        match connect(
            &server,
            &connector,
            &server_name,
            timeout.max(Duration::from_secs(1)),
        )
        .await
        {
            Ok(stream) => {
                server.stats.connects.fetch_add(1, Ordering::Relaxed);
                backoff = Duration::from_millis(50);
                let (tx, rx) = mpsc::channel(1024);
                let conn = Arc::new(Connection {
                    tx,
                    pending: Mutex::new(HashMap::new()),
                    alive: AtomicBool::new(true),
                });
                *server.conns[slot].lock().expect("conn lock") = Some(conn.clone());
                tokio::select! {
                    _ = run_connection(stream, conn.clone(), rx, ping_interval, timeout) => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
                conn.fail_all();
                *server.conns[slot].lock().expect("conn lock") = None;
                tracing::info!(server = %server.addr, "key server connection closed");
            }
            Err(e) => {
                server
                    .stats
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(server = %server.addr, error = %e, "key server connect failed");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn connect(
    server: &Server,
    connector: &SslConnector,
    server_name: &str,
    limit: Duration,
) -> anyhow::Result<tokio_boring::SslStream<TcpStream>> {
    let go = async {
        let tcp = TcpStream::connect(server.addr).await?;
        tcp.set_nodelay(true)?;
        let cfg = connector.configure()?;
        tokio_boring::connect(cfg, server_name, tcp)
            .await
            .map_err(|e| anyhow::anyhow!("TLS: {e}"))
    };
    tokio::time::timeout(limit, go)
        .await
        .map_err(|_| anyhow::anyhow!("timed out"))?
}

/// Writes queued frames, reads answers and routes them by id, pings; returns when the
/// connection fails (read error, EOF, or an unanswered ping).
async fn run_connection(
    stream: tokio_boring::SslStream<TcpStream>,
    conn: Arc<Connection>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    ping_interval: Duration,
    timeout: Duration,
) {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let writer = async {
        while let Some(frame) = rx.recv().await {
            wr.write_all(&frame).await?;
            while let Ok(more) = rx.try_recv() {
                wr.write_all(&more).await?;
            }
            wr.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let reader = async {
        let mut buf = Vec::with_capacity(16 * 1024);
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            while let Some((msg, used)) =
                codec::decode(&buf).map_err(|e| std::io::Error::other(e.to_string()))?
            {
                buf.drain(..used);
                let waiter = conn.pending.lock().expect("pending lock").remove(&msg.id);
                if let Some(w) = waiter {
                    let _ = w.send(Ok(msg));
                }
            }
            let n = rd.read(&mut chunk).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let pinger = async {
        let mut tick = tokio::time::interval(ping_interval);
        tick.tick().await;
        let mut id = u32::MAX;
        loop {
            tick.tick().await;
            id = id.wrapping_sub(1) | 0x8000_0000; // pings use the top half of the id space
            let (w, r) = oneshot::channel();
            conn.pending.lock().expect("pending lock").insert(id, w);
            let Ok(frame) = codec::encode(&Message::ping(id, vec![]), true) else {
                return;
            };
            if conn.tx.send(frame).await.is_err() {
                return;
            }
            match tokio::time::timeout(timeout.max(Duration::from_millis(500)), r).await {
                Ok(Ok(Ok(m))) if m.opcode == Some(Op::Pong) => {}
                _ => {
                    tracing::warn!("key server did not answer a ping; reconnecting");
                    return;
                }
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        _ = reader => {}
        _ = pinger => {}
    }
}

enum Outcome {
    Answer(Message),
    Timeout,
    Lost,
}

enum Attempt {
    Done(Result<Vec<u8>, SignError>),
    /// Timed out or the connection was lost: worth another server.
    Retry,
}

impl Inner {
    fn pick(&self, exclude: Option<usize>) -> Option<(usize, Arc<Connection>)> {
        self.servers
            .iter()
            .enumerate()
            .filter(|(i, s)| Some(*i) != exclude && s.available())
            .filter_map(|(i, s)| s.live_connection().map(|c| (i, s, c)))
            .min_by_key(|(_, s, _)| s.outstanding.load(Ordering::Relaxed))
            .map(|(i, _, c)| (i, c))
    }

    async fn attempt(&self, idx: usize, conn: Arc<Connection>, req: &SignRequest) -> Attempt {
        let server = &self.servers[idx];
        // Ids for requests use the bottom half of the id space.
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) & 0x7FFF_FFFF;
        let msg = Message::request(id, opcode_for(req.algorithm), req.key.0, req.digest.clone());
        let Ok(frame) = codec::encode(&msg, true) else {
            return Attempt::Done(Err(SignError::Crypto("request too large".into())));
        };
        let (w, r) = oneshot::channel();
        conn.pending.lock().expect("pending lock").insert(id, w);
        server.outstanding.fetch_add(1, Ordering::Relaxed);
        server.stats.sent.fetch_add(1, Ordering::Relaxed);
        let outcome = if conn.tx.try_send(frame).is_err() {
            Outcome::Lost
        } else {
            match tokio::time::timeout(self.timeout, r).await {
                Err(_) => Outcome::Timeout,
                Ok(Ok(Ok(m))) => Outcome::Answer(m),
                Ok(_) => Outcome::Lost,
            }
        };
        server.outstanding.fetch_sub(1, Ordering::Relaxed);
        conn.pending.lock().expect("pending lock").remove(&id);
        let answer = match outcome {
            Outcome::Answer(m) => m,
            Outcome::Timeout => {
                server.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                server.failure(self.breaker_failures, self.breaker_cooldown);
                return Attempt::Retry;
            }
            Outcome::Lost => {
                server.stats.lost.fetch_add(1, Ordering::Relaxed);
                server.failure(self.breaker_failures, self.breaker_cooldown);
                return Attempt::Retry;
            }
        };
        match (answer.opcode, answer.payload) {
            (Some(Op::Response), Some(sig)) => {
                server.success();
                server.stats.ok.fetch_add(1, Ordering::Relaxed);
                Attempt::Done(Ok(sig))
            }
            (Some(Op::Error), p) => {
                // The server is healthy; the request was refused.
                server.success();
                server.stats.server_errors.fetch_add(1, Ordering::Relaxed);
                let code = p
                    .and_then(|p| p.first().copied())
                    .and_then(ErrorCode::from_byte);
                Attempt::Done(Err(match code {
                    Some(ErrorCode::KeyNotFound) => SignError::KeyNotFound(req.key),
                    other => SignError::Crypto(format!(
                        "key server {}: {}",
                        server.addr,
                        other.map_or("unknown error".to_string(), |c| c.to_string())
                    )),
                }))
            }
            _ => {
                server.failure(self.breaker_failures, self.breaker_cooldown);
                Attempt::Retry
            }
        }
    }

    async fn sign(&self, req: SignRequest) -> Result<Vec<u8>, SignError> {
        let Some((first, conn)) = self.pick(None) else {
            return Err(SignError::Unavailable(NAME, "no healthy key server".into()));
        };
        match self.attempt(first, conn, &req).await {
            Attempt::Done(r) => r,
            Attempt::Retry => {
                let Some((second, conn)) = self.pick(Some(first)) else {
                    return Err(SignError::Unavailable(
                        NAME,
                        "key server failed; no other healthy key server".into(),
                    ));
                };
                self.servers[first]
                    .stats
                    .retries
                    .fetch_add(1, Ordering::Relaxed);
                match self.attempt(second, conn, &req).await {
                    Attempt::Done(r) => r,
                    Attempt::Retry => Err(SignError::Unavailable(
                        NAME,
                        "two key servers failed".into(),
                    )),
                }
            }
        }
    }
}

/// Selects one counter of [`RemoteStats`].
type StatField = fn(&RemoteStats) -> &AtomicU64;

impl Engine for RemoteEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    fn submit(&self, request: SignRequest) -> SignFuture {
        let inner = self.inner.clone();
        Box::pin(async move { inner.sign(request).await })
    }

    fn queue_depth(&self) -> usize {
        self.inner
            .servers
            .iter()
            .map(|s| s.outstanding.load(Ordering::Relaxed))
            .sum()
    }

    fn parallelism(&self) -> usize {
        // Key servers batch across connections; model each connection as 64 lanes.
        self.inner
            .servers
            .iter()
            .map(|s| s.conns.len() * 64)
            .sum::<usize>()
            .max(1)
    }

    fn needs_private_key(&self) -> bool {
        false
    }

    fn metrics(&self) -> Vec<keyengine::metrics::MetricFamily> {
        use keyengine::metrics::{Families, Kind};
        let mut f = Families::new();
        let servers = &self.inner.servers;
        let counters: [(&str, &str, StatField); 9] = [
            ("requests_total", "Requests sent to the key server", |s| {
                &s.sent
            }),
            ("ok_total", "Signatures received", |s| &s.ok),
            (
                "timeouts_total",
                "Requests past the per-request timeout",
                |s| &s.timeouts,
            ),
            (
                "lost_total",
                "Requests whose connection went away before the answer",
                |s| &s.lost,
            ),
            (
                "retries_total",
                "Requests retried on another server after failing here",
                |s| &s.retries,
            ),
            (
                "errors_total",
                "Error answers from the key server (e.g. key not found)",
                |s| &s.server_errors,
            ),
            (
                "breaker_opened_total",
                "Times the circuit breaker opened",
                |s| &s.breaker_opened,
            ),
            ("connects_total", "Connections established", |s| &s.connects),
            (
                "connect_failures_total",
                "Failed connection attempts",
                |s| &s.connect_failures,
            ),
        ];
        for (name, help, get) in counters {
            f.by_label(
                Kind::Counter,
                &format!("rampart_remote_{name}"),
                help,
                "server",
                servers.iter().map(|srv| {
                    let n = get(&srv.stats).load(Ordering::Relaxed);
                    (srv.addr.to_string(), n as f64)
                }),
            );
        }
        f.by_label(
            Kind::Gauge,
            "rampart_remote_outstanding",
            "Requests awaiting an answer",
            "server",
            servers.iter().map(|srv| {
                let n = srv.outstanding.load(Ordering::Relaxed);
                (srv.addr.to_string(), n as f64)
            }),
        );
        f.by_label(
            Kind::Gauge,
            "rampart_remote_healthy",
            "1 if the server has a live connection and a closed breaker",
            "server",
            servers.iter().map(|srv| {
                let healthy = srv.available() && srv.live_connection().is_some();
                (srv.addr.to_string(), f64::from(u8::from(healthy)))
            }),
        );
        f.into_vec()
    }
}
