//! rampart's gateway: listeners, TLS termination, routing, upstream pools, admin, metrics.
//!
//! [`start`] turns a validated [`config::Config`] into running listeners; [`Running`] stops
//! them gracefully.

pub mod access_log;
pub mod admin;
pub mod body;
pub mod config;
pub mod demo;
pub mod metrics;
pub mod proxy;
pub mod router;
pub mod server;
pub mod tls;
pub mod upstream;

use anyhow::Context as _;
use config::{Config, EngineKind};
use hyper_util::server::graceful::GracefulShutdown;
use keyengine::{
    Engine, EngineMetrics, InlineEngine, KeyEngine, KeyKind, KeyRegistry, Scheduler,
    SchedulerPolicy, ThreadsEngine,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Options that are not part of the config file (tests, embedding).
#[derive(Default)]
pub struct StartOptions {
    /// Replace the configured engines by these (e.g. test engines that delay or corrupt).
    pub engines: Option<Vec<Arc<dyn Engine>>>,
}

/// A running gateway.
pub struct Running {
    /// (listener name, bound address), in config order.
    pub listeners: Vec<(String, SocketAddr)>,
    pub admin: Option<SocketAddr>,
    pub metrics: metrics::Metrics,
    pub engine: Arc<KeyEngine>,
    tickets: Vec<(String, Arc<tls::tickets::TicketKeys>)>,
    stop: watch::Sender<bool>,
    graceful: Arc<GracefulShutdown>,
    grace: Duration,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Builds the key engine: loads every configured key into the registry and starts engines.
pub fn build_key_engine(
    cfg: &Config,
    metrics: &metrics::Metrics,
    engines: Option<Vec<Arc<dyn Engine>>>,
) -> anyhow::Result<Arc<KeyEngine>> {
    let mut registry = KeyRegistry::new();
    for (i, l) in cfg.listeners.iter().enumerate() {
        for (j, c) in l.certificates.iter().enumerate() {
            for (kind, pair) in [("rsa", &c.rsa), ("ecdsa", &c.ecdsa)] {
                if let Some(p) = pair {
                    registry
                        .load_pem_file(&p.key)
                        .with_context(|| format!("listeners[{i}].certificates[{j}].{kind}.key"))?;
                }
            }
        }
    }
    let ke = &cfg.key_engine;
    let engines = engines.unwrap_or_else(|| {
        ke.engines
            .iter()
            .map(|k| -> Arc<dyn Engine> {
                match k {
                    EngineKind::Inline => Arc::new(InlineEngine),
                    EngineKind::Threads => {
                        Arc::new(ThreadsEngine::new(ke.threads, ke.queue_capacity))
                    }
                }
            })
            .collect()
    });
    let mut policy = SchedulerPolicy::default();
    if let Some(e) = ke.pin.rsa {
        policy.pins.insert(KeyKind::Rsa, e.as_str().into());
    }
    if let Some(e) = ke.pin.ecdsa {
        policy.pins.insert(KeyKind::EcdsaP256, e.as_str().into());
        policy.pins.insert(KeyKind::EcdsaP384, e.as_str().into());
    }
    let scheduler = Scheduler::new(engines, &policy)?;
    let em = EngineMetrics::new(&metrics.registry)?;
    Ok(KeyEngine::new(registry, scheduler, em))
}

/// Binds every listener and starts serving. Must run inside a Tokio runtime.
pub async fn start(cfg: Config, opts: StartOptions) -> anyhow::Result<Running> {
    let metrics = metrics::Metrics::new();
    let engine = build_key_engine(&cfg, &metrics, opts.engines)?;
    let access_log = access_log::AccessLog::open(&cfg.server.access_log)
        .with_context(|| format!("server.access_log: cannot open {:?}", cfg.server.access_log))?;
    let clusters: Vec<Arc<upstream::Cluster>> = cfg
        .clusters
        .iter()
        .map(|c| Arc::new(upstream::Cluster::new(c)))
        .collect();
    let (stop, stop_rx) = watch::channel(false);
    let graceful = Arc::new(GracefulShutdown::new());
    let mut tasks = Vec::new();
    let mut bound = Vec::new();
    let mut tickets = Vec::new();
    for (i, l) in cfg.listeners.iter().enumerate() {
        let tls = tls::listener_tls(l, &engine, tls::ALPN_TCP)
            .with_context(|| format!("listeners[{i}] ({})", l.name))?;
        tls.tickets.spawn_rotation(l.tls.ticket_key_rotation);
        tickets.push((l.name.clone(), tls.tickets.clone()));
        let listener = server::bind(l.listen)
            .with_context(|| format!("listeners[{i}].listen: cannot bind {}", l.listen))?;
        bound.push((l.name.clone(), listener.local_addr()?));
        let router = router::Router::new(&cfg.routes, |name| {
            cfg.clusters
                .iter()
                .position(|c| c.name == name)
                .expect("validated")
        });
        let shared = Arc::new(proxy::ProxyShared {
            listener: l.name.clone(),
            router,
            clusters: clusters.clone(),
            limits: l.limits.clone(),
            metrics: metrics.clone(),
            access_log: access_log.clone(),
        });
        let task = server::TcpListenerTask {
            listener,
            acceptor: Arc::new(tls.acceptor),
            shared,
            handshake_timeout: l.tls.handshake_timeout,
        };
        tracing::info!(listener = %l.name, addr = %bound.last().unwrap().1, "listening (TLS over TCP)");
        tasks.push(tokio::spawn(task.run(stop_rx.clone(), graceful.clone())));
    }
    let admin = match cfg.admin.listen {
        Some(a) => {
            let l = server::bind(a).with_context(|| format!("admin.listen: cannot bind {a}"))?;
            let addr = l.local_addr()?;
            tasks.push(tokio::spawn(admin::run(
                l,
                metrics.clone(),
                stop_rx.clone(),
            )));
            tracing::info!(%addr, "admin listening");
            Some(addr)
        }
        None => None,
    };
    Ok(Running {
        listeners: bound,
        admin,
        metrics,
        engine,
        tickets,
        stop,
        graceful,
        grace: cfg.server.shutdown_grace,
        tasks,
    })
}

impl Running {
    /// The address of the named listener.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
    }

    /// The session-ticket keys of the named listener (to rotate on demand).
    pub fn listener_tickets(&self, name: &str) -> Option<Arc<tls::tickets::TicketKeys>> {
        self.tickets
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, then returns.
    /// Returns false if the grace period ran out with requests still in flight.
    pub async fn shutdown(self) -> bool {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        let Ok(graceful) = Arc::try_unwrap(self.graceful) else {
            return false;
        };
        tokio::time::timeout(self.grace, graceful.shutdown())
            .await
            .is_ok()
    }
}
