//! Start and stop: keys loaded, the key engine assembled (so batching applies across every
//! connected gateway), the keyless listener and the admin listener bound.

use crate::config::KeyServerConfig;
use anyhow::Context as _;
use gateway::metrics::Metrics;
use gateway::{admin, assemble_key_engine, bind_listener};
use keyengine::metrics::{Families, Kind};
use keyengine::{Engine, KeyEngine, KeyRegistry};
use keyless::server::{KeyServer, ServerStats};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub struct RunningKeyServer {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub stats: Arc<ServerStats>,
    pub engine: Arc<KeyEngine>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    grace: Duration,
}

/// `/metrics`: the process's metrics, its key engines' and the key server's own.
fn render(metrics: &Metrics, engine: &KeyEngine, stats: &ServerStats) -> String {
    let c = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed) as f64;
    let mut f = Families::new();
    f.extend(engine.engines_metrics());
    f.single(
        Kind::Counter,
        "rampart_keyserver_connections_total",
        "Gateway connections accepted (TLS completed)",
        c(&stats.connections),
    )
    .single(
        Kind::Gauge,
        "rampart_keyserver_open_connections",
        "Gateway connections open",
        c(&stats.open_connections),
    )
    .single(
        Kind::Counter,
        "rampart_keyserver_tls_failures_total",
        "Connections refused in the TLS handshake (e.g. no valid client certificate)",
        c(&stats.tls_failures),
    )
    .single(
        Kind::Counter,
        "rampart_keyserver_requests_total",
        "Signing requests received",
        c(&stats.requests),
    )
    .single(
        Kind::Counter,
        "rampart_keyserver_pings_total",
        "Pings answered",
        c(&stats.pings),
    )
    .by_label(
        Kind::Counter,
        "rampart_keyserver_errors_total",
        "Error responses by code",
        "error",
        stats
            .errors_by_code()
            .into_iter()
            .map(|(code, n)| (code.to_string(), n as f64)),
    );
    metrics.render_with(f.into_vec())
}

/// Loads keys, binds, and serves on the current runtime.
pub async fn start(
    cfg: KeyServerConfig,
    engines: Option<Vec<Arc<dyn Engine>>>,
) -> anyhow::Result<RunningKeyServer> {
    let k = &cfg.keyserver;
    let mut registry = KeyRegistry::new();
    for (i, path) in k.keys.iter().enumerate() {
        let id = registry
            .load_pem_file(path)
            .with_context(|| format!("keyserver.keys[{i}]"))?;
        tracing::info!(key = %id, path = %path.display(), "serving key");
    }
    let metrics = Metrics::new();
    let engine = assemble_key_engine(registry, &cfg.key_engine, &metrics, engines, &k.keys)?;
    let acceptor =
        keyless::tls::server_acceptor(&k.cert, &k.key, &k.client_ca).context("keyserver TLS")?;
    let stats = Arc::new(ServerStats::default());
    let server = Arc::new(KeyServer {
        engine: engine.clone(),
        acceptor: Arc::new(acceptor),
        max_in_flight: k.max_in_flight_per_connection,
        handshake_timeout: k.handshake_timeout,
        stats: stats.clone(),
    });
    let listener = bind_listener(k.listen)
        .with_context(|| format!("keyserver.listen: cannot bind {}", k.listen))?;
    let addr = listener.local_addr()?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let (stop, stop_rx) = watch::channel(false);
    let mut tasks = vec![tokio::spawn(keyless::server::serve(
        listener,
        server,
        stop_rx.clone(),
    ))];
    tracing::info!(%addr, keys = k.keys.len(), "key server listening");
    let admin = match cfg.admin.listen {
        Some(a) => {
            let l = bind_listener(a).with_context(|| format!("admin.listen: cannot bind {a}"))?;
            let admin_addr = l.local_addr()?;
            let l = tokio::net::TcpListener::from_std(l)?;
            let (m, e, s) = (metrics.clone(), engine.clone(), stats.clone());
            tasks.push(tokio::spawn(admin::run(
                l,
                Arc::new(move || render(&m, &e, &s)),
                stop_rx,
            )));
            Some(admin_addr)
        }
        None => None,
    };
    Ok(RunningKeyServer {
        addr,
        admin,
        stats,
        engine,
        stop,
        tasks,
        grace: k.shutdown_grace,
    })
}

impl RunningKeyServer {
    /// Stops accepting; connections finish their in-flight requests within the grace period.
    pub async fn shutdown(self) -> bool {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let deadline = tokio::time::Instant::now() + self.grace;
        while self.stats.open_connections.load(Ordering::Relaxed) > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}
