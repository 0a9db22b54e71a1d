//! The `rampart` binary: CLI wiring only.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use gateway::config::Config;
use gateway::demo::{self, CertKind};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// mimalloc: measured to cut the proxied-request CPU (docs/benchmarks-history.md); glibc malloc
/// showed as ~9% of a keep-alive proxying profile. The C and C++ libraries use it too (the
/// crate's `override` feature, see Cargo.toml). Building without the default `mimalloc`
/// feature leaves the system allocator in place, for heap profilers that hook malloc.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "rampart",
    version,
    about = "HTTPS edge gateway with offloaded, batched key operations"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway from a config file.
    Run {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config file (and load its certificates and keys) without serving.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print the ModSecurity directives a route's `waf` compiles (the OWASP Core Rule Set with
    /// the route's settings), to read them or to give another server the same rules.
    WafRules {
        #[arg(long, short)]
        config: PathBuf,
        /// The route's name (as in metrics and logs).
        #[arg(long)]
        route: String,
    },
    /// Self-signed certificates, a demo upstream and the gateway on 127.0.0.1:8443.
    Demo {
        /// Where certificates and the generated config are kept between runs.
        #[arg(long, default_value = "state")]
        state_dir: PathBuf,
        #[arg(long, default_value = "127.0.0.1:8443")]
        listen: SocketAddr,
        #[arg(long, default_value = "127.0.0.1:9901")]
        admin: SocketAddr,
    },
    /// Serve only the demo upstream (HTTP/1.1): /, /bytes/N, /headers, POST /echo, /delay/MS.
    Upstream {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Kernel TCP congestion control the upstream sends with (e.g. cubic, bbr); default:
        /// the kernel's (net.ipv4.tcp_congestion_control).
        #[arg(long)]
        tcp_congestion: Option<String>,
    },
    /// Run a key server: holds private keys and signs for gateways (keyless protocol, mTLS).
    Keyserver {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// The layer-4 QUIC balancer: routes datagrams to gateways by QUIC-LB server ID, direct
    /// server return.
    L4 {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Load generator: handshakes and requests against a gateway.
    Bench(Box<bench::BenchArgs>),
    /// The operator's tool over a gateway's admin API: get, apply, delete, diff, status, watch.
    Ctl(ctl::CtlArgs),
    /// The gpu engine's worker process (started by the gateway, `[key_engine.gpu] isolation`).
    #[command(hide = true)]
    GpuWorker {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("RAMPART_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// The control-plane runtime (signals, admin, ticket rotation). The data plane runs on the
/// gateway's own worker threads.
fn control_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn load(path: &Path) -> anyhow::Result<Config> {
    Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Runs the gateway from the configuration file at `path` (already loaded as `cfg`) until
/// SIGTERM or SIGINT; SIGHUP reloads the file, SIGUSR1 reopens the access log.
async fn serve_until_signal(cfg: Config, path: &Path) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let opts = gateway::StartOptions {
        config_path: Some(path.to_path_buf()),
        ..Default::default()
    };
    let running = gateway::start(cfg, opts).await?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = usr1.recv() => {
                if running.reopen_access_log() {
                    tracing::info!("access log reopened");
                }
            }
            _ = hup.recv() => match running.reload_file(path) {
                Ok(report) => {
                    tracing::info!(
                        kept = report.clusters_kept,
                        rebuilt = report.clusters_built,
                        "configuration reloaded: routes, clusters and certificates"
                    );
                    if !report.needs_restart.is_empty() {
                        tracing::warn!(
                            settings = report.needs_restart.join(", "),
                            "changed settings that take a restart were not applied"
                        );
                    }
                }
                Err(e) => tracing::error!(
                    error = format!("{e:#}"),
                    "configuration reload failed; the configuration in force is kept"
                ),
            },
        }
    }
    tracing::info!("shutting down: no new connections; waiting for in-flight requests");
    if running.shutdown().await {
        tracing::info!("shutdown complete");
    } else {
        tracing::warn!("grace period over with requests still in flight; exiting");
    }
    Ok(())
}

fn demo_config(
    state: &Path,
    listen: SocketAddr,
    admin: SocketAddr,
    upstream: SocketAddr,
) -> anyhow::Result<PathBuf> {
    let certs = state.join("certs");
    demo::ensure_self_signed(&certs, "localhost-rsa", CertKind::Rsa2048, &["localhost"])?;
    demo::ensure_self_signed(
        &certs,
        "localhost-ecdsa",
        CertKind::EcdsaP256,
        &["localhost"],
    )?;
    let text = format!(
        r#"# Generated by `rampart demo`; rewritten on each run.
[server]
access_log = "stdout"
shutdown_grace = "5s"

[admin]
listen = "{admin}"

[key_engine]
# The multi-buffer engine: batches RSA signatures under load, pooled ECDSA nonces.
engines = ["batch"]

[[listeners]]
name = "https"
listen = "{listen}"

[listeners.quic]
enabled = true
early_data = true

[[listeners.certificates]]
server_names = ["localhost"]
rsa = {{ cert = "certs/localhost-rsa.crt", key = "certs/localhost-rsa.key" }}
ecdsa = {{ cert = "certs/localhost-ecdsa.crt", key = "certs/localhost-ecdsa.key" }}

[[routes]]
host = "*"
path_prefix = "/"
cluster = "demo"

[[clusters]]
name = "demo"
endpoints = ["{upstream}"]
"#
    );
    let path = state.join("demo.toml");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Bench(_) | Command::Ctl(_)) {
        init_logging();
    }
    match cli.command {
        Command::Check { config } => {
            let text = std::fs::read_to_string(&config)
                .with_context(|| format!("{}: cannot read", config.display()))?;
            if text.lines().any(|l| l.trim() == "[keyserver]") {
                let cfg = keyserver::KeyServerConfig::load(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
                let k = &cfg.keyserver;
                let mut registry = keyengine::KeyRegistry::new();
                for (i, p) in k.keys.iter().enumerate() {
                    registry.load_pem_file(p).with_context(|| format!("keyserver.keys[{i}]"))?;
                }
                keyless::tls::server_acceptor(&k.cert, &k.key, &k.client_ca).context("keyserver TLS")?;
                println!("{}: ok (key server, {} keys)", config.display(), registry.len());
                return Ok(());
            }
            let cfg = load(&config)?;
            let metrics = gateway::metrics::Metrics::new();
            let engine = gateway::build_key_engine(&cfg, &metrics, None)?;
            for (i, l) in cfg.listeners.iter().enumerate() {
                gateway::tls::listener_tls(l, &engine, gateway::tls::ALPN_TCP, None)
                    .with_context(|| format!("listeners[{i}] ({})", l.name))?;
            }
            for (i, r) in cfg.routes.iter().enumerate() {
                if r.waf.is_some() {
                    waf::RuleSet::new(&waf_directives(&cfg, r)?)
                        .with_context(|| format!("routes[{i}].waf ({})", r.effective_name()))?;
                }
            }
            println!(
                "{}: ok ({} listeners, {} routes, {} clusters, {} keys, {} held here)",
                config.display(),
                cfg.listeners.len(),
                cfg.routes.len(),
                cfg.clusters.len(),
                engine.registry().len(),
                engine.registry().private_count()
            );
            Ok(())
        }
        Command::WafRules { config, route } => {
            let cfg = load(&config)?;
            let r = cfg
                .routes
                .iter()
                .find(|r| r.effective_name() == route)
                .with_context(|| format!("{}: no route named {route:?}", config.display()))?;
            anyhow::ensure!(r.waf.is_some(), "route {route:?} has no waf");
            print!("{}", waf_directives(&cfg, r)?);
            Ok(())
        }
        Command::Run { config } => {
            let cfg = load(&config)?;
            control_runtime()?.block_on(serve_until_signal(cfg, &config))
        }
        Command::Upstream {
            listen,
            tcp_congestion,
        } => tokio::runtime::Runtime::new()?.block_on(async {
            let addr = demo::spawn_upstream(listen, tcp_congestion.as_deref()).await?;
            eprintln!("demo upstream on http://{addr}");
            tokio::signal::ctrl_c().await?;
            Ok(())
        }),
        Command::Demo { state_dir, listen, admin } => control_runtime()?.block_on(async {
            let upstream = demo::spawn_upstream("127.0.0.1:0".parse()?, None).await?;
            let path = demo_config(&state_dir, listen, admin, upstream)?;
            let cfg = load(&path)?;
            eprintln!(
                "\nrampart demo\n  gateway   https://localhost:{port}/  HTTPS and HTTP/3 (self-signed RSA-2048 and ECDSA P-256 in {certs})\n  upstream  http://{upstream}/  (/, /bytes/N, /headers, POST /echo)\n  admin     http://{admin}/metrics  and /healthz\n  config    {cfg_path}\n\ntry:\n  curl -k https://localhost:{port}/headers\n  curl -k --http1.1 https://localhost:{port}/bytes/100\n  curl -k -d hello https://localhost:{port}/echo\n  rampart bench h3-requests --url https://localhost:{port}/ -n 10   # HTTP/3\n",
                port = listen.port(),
                certs = state_dir.join("certs").display(),
                cfg_path = path.display(),
            );
            serve_until_signal(cfg, &path).await
        }),
        Command::Keyserver { config } => {
            let cfg = keyserver::KeyServerConfig::load(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
            tokio::runtime::Runtime::new()?.block_on(async {
                use tokio::signal::unix::{signal, SignalKind};
                let running = keyserver::start(cfg, None).await?;
                eprintln!("key server on {} (admin {:?})", running.addr, running.admin);
                let mut term = signal(SignalKind::terminate())?;
                let mut int = signal(SignalKind::interrupt())?;
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                tracing::info!("key server shutting down");
                running.shutdown().await;
                Ok(())
            })
        }
        Command::L4 { config } => {
            let cfg = l4::L4Config::load(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
            l4::process::run(cfg)
        }
        Command::Bench(args) => bench::run(*args),
        Command::GpuWorker { args } => std::process::exit(gpu_engine::process::worker::run(&args)),
        Command::Ctl(args) => {
            let ok = control_runtime()?.block_on(ctl::run(&args, &mut std::io::stdout()))?;
            if !ok {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// The ModSecurity directives of route `r`'s `waf` (which it must have).
fn waf_directives(
    cfg: &gateway::config::Config,
    r: &gateway::config::RouteConfig,
) -> anyhow::Result<String> {
    let w = r.waf.as_ref().context("no waf")?;
    waf::crs_profile(&w.profile(), &cfg.waf.crs_paths()).map_err(anyhow::Error::msg)
}
