//! Start-up: the key engine assembled from config, the listeners and their workers started,
//! and [`Running`], which reloads and stops them.

mod engines;
pub mod reload;

pub use engines::{assemble_key_engine, build_key_engine, start_engines};

use crate::http::pipeline;
use crate::listener::quic::workers as quic_workers;
use crate::listener::{quic, redirect, tcp as server};
use crate::ops::{access_log, admin, metrics};
use crate::policy::{access, overload};
use crate::{config, control, tls};

use anyhow::Context as _;
use config::{Config, EngineKind};
use engines::{load_keys, rsa_key_ders};
use keyengine::{Engine, KeyEngine};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Options that are not part of the config file (tests, embedding).
#[derive(Default)]
pub struct StartOptions {
    /// Replace the configured engines by these (e.g. test engines that delay or corrupt).
    pub engines: Option<Vec<Arc<dyn Engine>>>,
    /// The file the configuration came from, for the admin API's `POST /reload`.
    pub config_path: Option<std::path::PathBuf>,
}

/// The configuration a running gateway has in force, and its clusters.
struct InForce {
    config: Config,
    clusters: Vec<reload::ClusterEntry>,
    /// The fleet's Redis (`[fleet]`, made at start: changing it needs a restart).
    fleet: Option<Arc<crate::fleet::FleetStore>>,
}

/// A running gateway.
pub struct Running {
    /// (listener name, bound address), in config order.
    pub listeners: Vec<(String, SocketAddr)>,
    /// (listener name, bound UDP address) of listeners serving HTTP/3.
    pub quic_listeners: Vec<(String, SocketAddr)>,
    pub admin: Option<SocketAddr>,
    pub metrics: metrics::Metrics,
    pub engine: Arc<KeyEngine>,
    /// The overload manager's state (its actions and their thresholds).
    pub overload: Arc<overload::Overload>,
    tickets: Vec<(String, Arc<tls::tickets::TicketKeys>)>,
    /// What puts a new configuration in force (SIGHUP, the control plane).
    applier: Arc<Applier>,
    /// The fleet's control plane, with `[control] etcd`.
    control: Option<Arc<control::Plane>>,
    access_log: access_log::AccessLog,
    stop: watch::Sender<bool>,
    workers_done: Vec<tokio::sync::oneshot::Receiver<bool>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What a reload swaps, and the configuration in force: shared by [`Running`] and the
/// control plane, which both put configurations in force through [`Applier::reload`].
pub struct Applier {
    metrics: metrics::Metrics,
    engine: Arc<KeyEngine>,
    /// Every listener's certificate stores.
    certs: Vec<tls::ListenerCerts>,
    /// Every worker's routes and clusters.
    routing: Vec<pipeline::RoutingSlot>,
    /// Every listener's `allow`/`deny`.
    access_lists: Vec<access::SharedAccessList>,
    /// The configuration in force and its clusters (reloads are serialized by this lock).
    in_force: std::sync::Mutex<InForce>,
    /// The web application firewall's threads, log and compiled rule sets.
    waf: Arc<crate::policy::waf::Inspector>,
}

/// One data-plane worker: a thread running a current-thread Tokio runtime with its own
/// listening sockets (SO_REUSEPORT) and its own upstream keep-alive pools, like an nginx
/// worker. Nothing on the request path crosses threads except key-engine requests.
struct WorkerPlan {
    index: usize,
    /// The fleet's Redis, connected from this worker as it starts (a first 0-RTT handshake
    /// or fleet-limited request should not find it still connecting).
    fleet: Option<Arc<crate::fleet::FleetStore>>,
    /// Upgraded-connection tunnels spawned by this worker's listeners.
    tunnels: tokio_util::task::TaskTracker,
    quic: Vec<(quic::QuicWorker, Arc<pipeline::ProxyShared>)>,
    listeners: Vec<(
        std::net::TcpListener,
        Arc<pipeline::ProxyShared>,
        Arc<boring::ssl::SslAcceptor>,
        Duration,
    )>,
}

fn run_worker(
    plan: WorkerPlan,
    stop: watch::Receiver<bool>,
    grace: Duration,
    done: tokio::sync::oneshot::Sender<bool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let handle = std::thread::Builder::new()
        .name(format!("rampart-worker-{}", plan.index))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "worker runtime failed to start");
                    let _ = done.send(false);
                    return;
                }
            };
            let drained = rt.block_on(async move {
                if let Some(fleet) = &plan.fleet {
                    fleet.connect_this_thread();
                }
                let connections = tokio_util::task::TaskTracker::new();
                let mut tasks = Vec::new();
                for (sock, shared, acceptor, handshake_timeout) in plan.listeners {
                    let listener = match tokio::net::TcpListener::from_std(sock) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(error = %e, "cannot register listener");
                            continue;
                        }
                    };
                    let task = server::TcpListenerTask {
                        listener,
                        acceptor,
                        shared,
                        handshake_timeout,
                    };
                    tasks.push(tokio::spawn(task.run(stop.clone(), connections.clone())));
                }
                // QUIC listeners drain their own connections (GOAWAY, then close once every
                // response is delivered) for up to `grace` after `stop`.
                let quic: Vec<_> = plan
                    .quic
                    .into_iter()
                    .map(|(q, shared)| tokio::spawn(quic::serve(q, shared, stop.clone(), grace)))
                    .collect();
                // TCP listeners return at `stop`; their connections drain themselves
                // (`server::drive`), and shutdown waits for them within `grace`.
                for t in tasks {
                    let _ = t.await;
                }
                connections.close();
                let tcp_drained = async {
                    tokio::time::timeout(grace, connections.wait())
                        .await
                        .is_ok()
                };
                let quic_drained = async {
                    let mut drained = true;
                    for t in quic {
                        drained &= t.await.unwrap_or(false);
                    }
                    drained
                };
                // Tunnels (WebSockets) get the same grace; those still open at its end close
                // with the runtime.
                let tunnels = plan.tunnels;
                tunnels.close();
                let tunnels_closed =
                    async { tokio::time::timeout(grace, tunnels.wait()).await.is_ok() };
                let (tcp, quic, tunnels) = tokio::join!(tcp_drained, quic_drained, tunnels_closed);
                tcp && quic && tunnels
            });
            let _ = done.send(drained);
        })?;
    Ok(handle)
}

/// Binds every listener on every worker and starts serving. Must be called inside a Tokio
/// runtime, which then runs the control plane (admin listener, ticket-key rotation); the data
/// plane runs on `server.worker_threads` dedicated threads.
pub async fn start(cfg: Config, opts: StartOptions) -> anyhow::Result<Running> {
    // With a control plane, the objects in etcd (or in the last snapshot) join the file's
    // before anything is built.
    let (cfg, initial) = match cfg.control.etcd {
        Some(_) => {
            let initial = control::Initial::load(cfg).await;
            (initial.config.clone(), Some(initial))
        }
        None => (cfg, None),
    };
    let metrics = metrics::Metrics::new();
    let engine = build_key_engine(&cfg, &metrics, opts.engines)?;
    let access_log = access_log::AccessLog::open(&cfg.server.access_log)
        .with_context(|| format!("server.access_log: cannot open {:?}", cfg.server.access_log))?;
    let workers = match cfg.server.worker_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let mut plans: Vec<WorkerPlan> = (0..workers)
        .map(|index| WorkerPlan {
            index,
            fleet: None,
            tunnels: tokio_util::task::TaskTracker::new(),
            quic: Vec::new(),
            listeners: Vec::new(),
        })
        .collect();
    // Each worker gets its own upstream pools; a cluster's max_requests and its endpoints'
    // health marks hold over all of them.
    let mut clusters = reload::build_clusters(&cfg, &metrics, workers, &[])?;
    let fleet = crate::fleet::FleetStore::start(&cfg.fleet, &metrics);
    for p in &mut plans {
        p.fleet = fleet.clone();
    }
    let inspector = crate::policy::waf::Inspector::start(&cfg.waf, &metrics)?;
    let tracer = match &cfg.tracing.otlp_endpoint {
        Some(_) => Some(crate::trace::Tracer::start(&cfg.tracing).context("tracing")?),
        None => None,
    };
    let wafs = inspector.route_wafs(&cfg)?;
    let routing: Vec<pipeline::RoutingSlot> =
        reload::routings(&cfg, &clusters, workers, None, fleet.as_ref(), wafs)
            .into_iter()
            .map(pipeline::RoutingSlot::new)
            .collect();
    let mut bound = Vec::new();
    let mut tickets = Vec::new();
    let mut certs = Vec::new();
    let mut access_lists = Vec::new();
    let mut quic_bound = Vec::new();
    let budget = server::connection_budget();
    let overload = overload::Overload::new(cfg.server.overload.memory_limit_bytes, &metrics);
    // The fleet's 0-RTT replay records, for a listener (TCP or QUIC, by `label`) that takes
    // early data.
    let anti_replay = |early_data: bool, label: &str| {
        fleet
            .as_ref()
            .filter(|_| early_data)
            .map(|s| crate::fleet::anti_replay::AntiReplay::new(s.clone(), label, &metrics))
    };
    for (i, l) in cfg.listeners.iter().enumerate() {
        let tcp_replays = anti_replay(l.tls.early_data, &l.name);
        let tls = tls::listener_tls(l, &engine, tls::ALPN_TCP, tcp_replays)
            .with_context(|| format!("listeners[{i}] ({})", l.name))?;
        match (&fleet, l.tls.fleet_ticket_keys) {
            (Some(store), true) => {
                tls.tickets
                    .spawn_fleet_sync(store.clone(), &l.name, l.tls.ticket_key_rotation)
            }
            _ => tls.tickets.spawn_rotation(l.tls.ticket_key_rotation),
        }
        tickets.push((l.name.clone(), tls.tickets.clone()));
        let acceptor = Arc::new(tls.acceptor);
        // The first socket fixes the port (when 0 was asked for); the others share it.
        let mut addr = l.listen;
        server::ensure_port_free(addr).with_context(|| {
            format!("listeners[{i}].listen: {addr} is already in use (another gateway running?)")
        })?;
        let mut socks = Vec::with_capacity(workers);
        for w in 0..workers {
            let sock = server::bind(addr)
                .with_context(|| format!("listeners[{i}].listen: cannot bind {addr}"))?;
            if w == 0 {
                addr = sock.local_addr()?;
            }
            socks.push(sock);
        }
        // HTTP/3 beside it: UDP on the same address unless configured, one socket per worker
        // steered by connection ID (worker 0 only where the kernel cannot steer).
        let mut quic = if l.quic.enabled {
            let udp_addr = l.quic.listen.unwrap_or(addr);
            let udp = quic_workers::bind(udp_addr, l.quic.udp_buffer_bytes, workers).with_context(
                || format!("listeners[{i}].quic.listen: cannot bind UDP {udp_addr}"),
            )?;
            let udp_addr = udp[0].local_addr()?;
            let udp: Vec<Option<std::net::UdpSocket>> = udp.into_iter().map(Some).collect();
            let observer: tls::HandshakeObserver = {
                let (m, name) = (metrics.clone(), l.name.clone());
                Arc::new(move |ssl: &boring::ssl::SslRef| quic::record_handshake(&m, &name, ssl))
            };
            let quic_replays = anti_replay(l.quic.early_data, &format!("{}/quic", l.name));
            let qtls = tls::QuicTls::new(l, &engine, &tls.tickets, Some(observer), quic_replays)
                .with_context(|| format!("listeners[{i}] ({}) QUIC", l.name))?;
            tracing::info!(listener = %l.name, addr = %udp_addr, workers = udp.len(), "listening (HTTP/3 over QUIC)");
            quic_bound.push((l.name.clone(), udp_addr));
            let retry_gate = quic::retry_gate(&l.quic);
            let retry_keys = match (&fleet, l.quic.fleet_retry_keys) {
                (Some(store), true) => Some(quic::fleet_retry_keys(
                    store.clone(),
                    &l.name,
                    l.tls.ticket_key_rotation,
                )),
                _ => None,
            };
            let reset_key = match (&l.quic.stateless_reset_key_file, &fleet) {
                (Some(path), _) => quic::reset::ResetKey::from_file(path)
                    .map_err(anyhow::Error::msg)
                    .with_context(|| format!("listeners[{i}].quic.stateless_reset_key_file"))?,
                (None, Some(store)) if l.quic.fleet_stateless_reset_key => {
                    quic::reset::ResetKey::fleet(store.clone(), &l.name)
                }
                _ => quic::reset::ResetKey::local(),
            };
            if let Some(gate) = &retry_gate {
                metrics.watch_retry_gate(&l.name, gate.clone());
                overload.watch_retry_gate(gate.clone());
            }
            Some((
                udp,
                qtls,
                retry_gate,
                retry_keys,
                reset_key,
                udp_addr.port(),
            ))
        } else {
            None
        };
        certs.push(tls::ListenerCerts::new(
            &tls.tickets,
            &tls.certs,
            quic.as_ref().map(|(_, qtls, _, _, _, _)| qtls),
        ));
        // One access list for every worker's copy of the listener, TCP and QUIC.
        let listener_access =
            access::SharedAccessList::new(access::AccessList::new(&l.allow, &l.deny));
        access_lists.push(listener_access.clone());
        let alt_svc = quic.as_ref().and_then(|(_, _, _, _, _, port)| {
            http::HeaderValue::from_str(&format!("h3=\":{port}\"; ma=86400")).ok()
        });
        if l.limits.max_connections > budget {
            tracing::warn!(
                listener = %l.name,
                configured = l.limits.max_connections,
                budget,
                "TCP connections capped below limits.max_connections, at what the open-descriptor limit holds (two per connection); raise the limit (systemd LimitNOFILE=) to allow more"
            );
        }
        // One set for the listener: its workers, TCP and QUIC, draw on the same budgets.
        let per_client = crate::policy::admission::PerClient::new(&l.limits);
        for (w, (plan, sock)) in plans.iter_mut().zip(socks).enumerate() {
            let shared = Arc::new(pipeline::ProxyShared {
                listener: l.name.clone(),
                routing: routing[w].clone(),
                limits: l.limits.clone(),
                metrics: metrics.clone(),
                access_log: access_log.clone(),
                alt_svc: alt_svc.clone(),
                abandoned_responses: metrics.responses_abandoned.with_label_values(&[&l.name]),
                access: listener_access.clone(),
                per_client: per_client.clone(),
                proxy_protocol: l.proxy_protocol,
                replace_forwarded_for: l.forwarded_for == crate::config::ForwardedFor::Replace,
                paths: l.paths.clone(),
                client_cert_headers: l
                    .asks_client_certs()
                    .then(|| pipeline::ClientCertHeaders::new(&l.tls.client_cert_headers)),
                names: l.client_auth_differs_by_name().then(|| tls.certs.clone()),
                overload: overload.clone(),
                tunnels: plan.tunnels.clone(),
                tracer: tracer.clone(),
            });
            plan.listeners.push((
                sock,
                shared.clone(),
                acceptor.clone(),
                l.tls.handshake_timeout,
            ));
            if let Some((udp, qtls, retry_gate, retry_keys, reset_key, _)) = quic.as_mut() {
                let workers = udp.len();
                // Worker w takes socket w (index w of the reuseport group).
                if let Some(socket) = udp.get_mut(w).and_then(Option::take) {
                    let q = quic::QuicWorker {
                        socket,
                        worker: w,
                        workers,
                        tls: qtls.clone(),
                        cfg: l.quic.clone(),
                        handshake_timeout: l.tls.handshake_timeout,
                        retry_gate: retry_gate.clone(),
                        retry_keys: retry_keys.clone(),
                        reset_key: reset_key.clone(),
                    };
                    plan.quic.push((q, shared));
                }
            }
        }
        tracing::info!(listener = %l.name, %addr, workers, "listening (TLS over TCP)");
        bound.push((l.name.clone(), addr));
    }
    let (stop, stop_rx) = watch::channel(false);
    reload::start_checks(&mut clusters);
    let mut tasks = Vec::new();
    if cfg.server.overload.memory_limit_bytes.is_some() {
        tasks.push(tokio::spawn(
            overload
                .clone()
                .run(cfg.server.overload.check_interval, stop_rx.clone()),
        ));
    }
    for (i, l) in cfg.listeners.iter().enumerate() {
        let Some(at) = l.http_redirect else { continue };
        let https_port = bound[i].1.port();
        let sock = server::bind(at)
            .with_context(|| format!("listeners[{i}].http_redirect: cannot bind {at}"))?;
        let addr = sock.local_addr()?;
        let sock = tokio::net::TcpListener::from_std(sock)?;
        tasks.push(tokio::spawn(redirect::run(
            sock,
            https_port,
            stop_rx.clone(),
        )));
        tracing::info!(listener = %l.name, %addr, "redirecting plain HTTP to HTTPS");
        bound.push((format!("{}/redirect", l.name), addr));
    }
    let admin_cfg = cfg.admin.clone();
    let shutdown_grace = cfg.server.shutdown_grace;
    let applier = Arc::new(Applier {
        metrics: metrics.clone(),
        engine: engine.clone(),
        certs,
        routing,
        access_lists,
        in_force: std::sync::Mutex::new(InForce {
            config: cfg,
            clusters,
            fleet,
        }),
        waf: inspector,
    });
    let control = initial.map(|i| control::Plane::new(i, applier.clone(), &metrics));
    if let Some(plane) = &control {
        tasks.push(tokio::spawn(plane.clone().run(stop_rx.clone())));
    }
    let admin = match admin_cfg.listen {
        Some(a) => {
            let l = server::bind(a).with_context(|| format!("admin.listen: cannot bind {a}"))?;
            let addr = l.local_addr()?;
            let l = tokio::net::TcpListener::from_std(l)?;
            let (m, e) = (metrics.clone(), engine.clone());
            let render: admin::Render = Arc::new(move || m.render_with(e.engines_metrics()));
            let token = match &admin_cfg.token_file {
                Some(f) => Some(
                    admin::Token::read(f)
                        .with_context(|| format!("admin.token_file: {}", f.display()))?,
                ),
                None => None,
            };
            let api = admin::Api::new(
                token,
                control.clone(),
                applier.clone(),
                opts.config_path.clone(),
            );
            let tls = match &admin_cfg.tls {
                Some(t) => Some(admin::tls_acceptor(t).context("admin.tls")?),
                None => None,
            };
            tasks.push(tokio::spawn(admin::run_with_api(
                l,
                render,
                api,
                tls,
                stop_rx.clone(),
            )));
            tracing::info!(%addr, "admin listening");
            Some(addr)
        }
        None => None,
    };
    let mut workers_done = Vec::new();
    for plan in plans {
        let (tx, rx) = tokio::sync::oneshot::channel();
        run_worker(plan, stop_rx.clone(), shutdown_grace, tx)?;
        workers_done.push(rx);
    }
    Ok(Running {
        listeners: bound,
        quic_listeners: quic_bound,
        admin,
        metrics,
        engine,
        overload,
        tickets,
        applier,
        control,
        access_log,
        stop,
        workers_done,
        tasks,
    })
}

impl Applier {
    /// Puts `new` in force without dropping a connection: its routes, its clusters (those
    /// unchanged keep their connection pools and health marks; requests in flight finish
    /// on the clusters they started on) and every listener's certificates and keys, read
    /// again from their files, over TCP and QUIC at once (new handshakes get them; session
    /// tickets stay valid). Everything is loaded and checked before anything is swapped, so on
    /// error the configuration in force is kept whole and the error names the field. Settings
    /// that take a restart (`[server]`, `[admin]`, `[key_engine]`, listener settings other
    /// than certificates) are not applied and are listed in the report. Counted in
    /// `rampart_config_reloads_total`. Call it within a Tokio runtime: new clusters' health
    /// checks are spawned on it (the binary's control runtime).
    pub(crate) fn reload(&self, new: Config) -> anyhow::Result<reload::ReloadReport> {
        let mut in_force = self.lock_in_force();
        let result = self.reload_locked(&mut in_force, new);
        self.count_reload(result.is_ok());
        result
    }

    fn lock_in_force(&self) -> std::sync::MutexGuard<'_, InForce> {
        self.in_force.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn count_reload(&self, ok: bool) {
        let label = if ok { "ok" } else { "error" };
        self.metrics
            .config_reloads
            .with_label_values(&[label])
            .inc();
    }

    fn reload_locked(
        &self,
        in_force: &mut InForce,
        new: Config,
    ) -> anyhow::Result<reload::ReloadReport> {
        let old = &in_force.config;
        let needs_restart = reload::needing_restart(old, &new);
        // Certificates and access lists come from the new file where its listeners match the
        // running ones; every other listener setting stays as running.
        let listeners: Vec<config::ListenerConfig> = if old
            .listeners
            .iter()
            .map(|l| &l.name)
            .eq(new.listeners.iter().map(|l| &l.name))
        {
            old.listeners
                .iter()
                .zip(&new.listeners)
                .map(|(o, n)| config::ListenerConfig {
                    certificates: n.certificates.clone(),
                    allow: n.allow.clone(),
                    deny: n.deny.clone(),
                    ..o.clone()
                })
                .collect()
        } else {
            old.listeners.clone()
        };
        let (registry, key_files) = load_keys(&listeners)?;
        let rsa_keys = if old.key_engine.engines.contains(&EngineKind::Gpu) {
            rsa_key_ders(&key_files)?
        } else {
            Vec::new()
        };
        let prepared = self
            .certs
            .iter()
            .zip(&listeners)
            .enumerate()
            .map(|(i, (c, l))| {
                c.prepare(l, &registry, &self.engine)
                    .with_context(|| format!("listeners[{i}] ({})", l.name))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let workers = self.routing.len();
        let mut clusters =
            reload::build_clusters(&new, &self.metrics, workers, &in_force.clusters)?;
        let wafs = self.waf.route_wafs(&new)?;

        // Everything loaded: put it in force.
        self.engine.replace_keys(registry, &rsa_keys);
        for (c, p) in self.certs.iter().zip(prepared) {
            c.install(p);
        }
        for (list, l) in self.access_lists.iter().zip(&listeners) {
            list.replace(access::AccessList::new(&l.allow, &l.deny));
        }
        let previous = self.routing[0].current();
        for (slot, routing) in self.routing.iter().zip(reload::routings(
            &new,
            &clusters,
            workers,
            Some(&previous.router),
            in_force.fleet.as_ref(),
            wafs,
        )) {
            slot.replace(routing);
        }
        let built = clusters.iter().filter(|c| c.is_fresh()).count();
        reload::start_checks(&mut clusters);
        reload::retire(&in_force.clusters, &clusters, &self.metrics);
        let report = reload::ReloadReport {
            clusters_kept: clusters.len() - built,
            clusters_built: built,
            needs_restart,
        };
        in_force.clusters = clusters;
        in_force.config = Config {
            listeners,
            routes: new.routes,
            clusters: new.clusters,
            ..in_force.config.clone()
        };
        Ok(report)
    }

    /// The configuration in force.
    pub(crate) fn config(&self) -> Config {
        self.with_config(Config::clone)
    }

    /// `f` of the configuration in force, without a copy of it (which, with thousands of
    /// routes, is dear for a status request); reloads wait meanwhile.
    pub(crate) fn with_config<R>(&self, f: impl FnOnce(&Config) -> R) -> R {
        f(&self.lock_in_force().config)
    }
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

    /// Reads every listener's certificate and key files again (the configuration in force)
    /// and puts them in force: [`Running::reload`] with the same configuration.
    pub fn reload_certificates(&self) -> anyhow::Result<()> {
        let cfg = self.applier.config();
        self.applier.reload(cfg).map(|_| ())
    }

    /// Loads the configuration file at `path` (validated as at start) and puts it in force
    /// ([`Running::reload`]) with the control plane's objects, if any; a file that does not
    /// load is an error that changes nothing. What SIGHUP does.
    pub fn reload_file(&self, path: &std::path::Path) -> anyhow::Result<reload::ReloadReport> {
        match Config::load(path) {
            Ok(cfg) => self.reload(cfg),
            Err(e) => {
                self.applier.count_reload(false);
                Err(anyhow::anyhow!("{e}"))
            }
        }
    }

    /// Puts `new` in force (see [`Applier::reload`]); with a control plane, `new` replaces
    /// the file's part and the control plane's objects are added to it.
    pub fn reload(&self, new: Config) -> anyhow::Result<reload::ReloadReport> {
        match &self.control {
            Some(plane) => plane.replace_file(new),
            None => self.applier.reload(new),
        }
    }

    /// The configuration in force (the file's and the control plane's objects together).
    pub fn config(&self) -> Config {
        self.applier.config()
    }

    /// Reopens the access log file by its path (SIGUSR1 in the binary, after logrotate renamed
    /// it). False when the log goes to stdout or is off.
    pub fn reopen_access_log(&self) -> bool {
        self.access_log.reopen()
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, then returns.
    /// Returns false if the grace period ran out with requests still in flight.
    pub async fn shutdown(self) -> bool {
        let _ = self.stop.send(true);
        reload::stop_checks(&self.applier.lock_in_force().clusters);
        for t in self.tasks {
            let _ = t.await;
        }
        let mut drained = true;
        for w in self.workers_done {
            drained &= w.await.unwrap_or(false);
        }
        drained
    }
}
