//! Start and stop: a first health round (so the balancer knows its gateways before the first
//! datagram), the worker threads, the health checker's thread and the admin listener.

use crate::config::L4Config;
use crate::forward::{self, Worker};
use crate::health::Checker;
use crate::metrics::Metrics;
use crate::route::Router;
use anyhow::Context as _;
use gateway::{admin, bind_listener};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

pub struct RunningL4 {
    /// The admin listener's address (`/healthz`, `/metrics`), when configured.
    pub admin: Option<SocketAddr>,
    /// Gateways up after the first health round.
    pub healthy_at_start: usize,
    stop: Arc<AtomicBool>,
    admin_stop: watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Binds everything and starts forwarding; the admin listener runs on the calling runtime.
pub async fn start(cfg: &L4Config) -> anyhow::Result<RunningL4> {
    let (lb, backends) = cfg
        .build()
        .map_err(|(path, msg)| anyhow::anyhow!("{path}: {msg}"))?;
    let l4 = &cfg.l4;
    let metrics = Arc::new(Metrics::new(&backends));
    let mut checker = Checker::new(backends.clone(), l4.health.clone(), metrics.clone());
    let checker = tokio::task::spawn_blocking(move || {
        checker.round();
        checker
    })
    .await?;
    let shared = checker.shared();
    let healthy_at_start = shared.read().expect("health snapshot lock").table.healthy();
    let (admin_stop, admin_rx) = watch::channel(false);
    let admin = match cfg.admin.listen {
        Some(a) => {
            // Bound before the workers start, so a refused address leaves nothing running.
            let l = bind_listener(a).with_context(|| format!("admin.listen: cannot bind {a}"))?;
            let addr = l.local_addr()?;
            let l = tokio::net::TcpListener::from_std(l)?;
            let m = metrics.clone();
            tokio::spawn(admin::run(l, Arc::new(move || m.render()), admin_rx));
            Some(addr)
        }
        None => None,
    };
    let router = Arc::new(Router::new(lb, l4.routing, l4.cid_len));
    let stop = Arc::new(AtomicBool::new(false));
    let workers = l4
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut threads = Vec::with_capacity(workers + 1);
    for i in 0..workers {
        let worker = Worker {
            socket: forward::bind_vip(cfg.vip(), l4.udp_buffer_bytes)
                .with_context(|| format!("l4.listen: cannot bind {}", l4.listen))?,
            packets: forward::packet_socket()?,
            vip: cfg.vip(),
            batch: l4.batch,
            router: router.clone(),
            shared: shared.clone(),
            metrics: metrics.clone(),
        };
        let stop = stop.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("l4-worker-{i}"))
                .spawn(move || {
                    if let Err(e) = worker.run(stop) {
                        tracing::error!(error = %e, worker = i, "l4 worker stopped");
                    }
                })?,
        );
    }
    let health_stop = stop.clone();
    threads.push(
        std::thread::Builder::new()
            .name("l4-health".into())
            .spawn(move || checker.run(health_stop))?,
    );
    tracing::info!(
        vip = %l4.listen,
        workers,
        gateways = backends.len(),
        up = healthy_at_start,
        routing = ?l4.routing,
        "l4 balancer forwarding"
    );
    Ok(RunningL4 {
        admin,
        healthy_at_start,
        stop,
        admin_stop,
        threads,
    })
}

impl RunningL4 {
    /// Stops the workers (within their 100 ms receive timeout) and the health checker.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.admin_stop.send(true);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// `rampart l4`: runs until SIGTERM or SIGINT.
pub fn run(cfg: L4Config) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate())?;
            let mut int = signal(SignalKind::interrupt())?;
            let running = start(&cfg).await?;
            eprintln!(
                "l4 balancer on {} ({} of {} gateways up; admin {:?})",
                cfg.l4.listen,
                running.healthy_at_start,
                cfg.l4.backends.len(),
                running.admin
            );
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("l4 balancer shutting down");
            running.shutdown();
            Ok(())
        })
}
