//! A gateway that holds no private keys, signing on two real key-server processes
//! (`rampart keyserver`) over mutual TLS: real curl through it, a key server killed under load,
//! refused clients, unknown keys and malformed frames.

use gateway::demo::{ensure_ca, ensure_self_signed, issue_signed, CertKind};
use keyless::client::{RemoteConfig, RemoteEngine};
use keyless::codec::{self, ErrorCode, Message, Op};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (ca, ca_key) = ensure_ca(d, "ca", "rampart test key-server CA").unwrap();
        issue_signed(d, "keyserver", &ca, &ca_key, &["keyserver.test"]).unwrap();
        issue_signed(d, "gateway-client", &ca, &ca_key, &["gateway-1"]).unwrap();
        let (other_ca, other_key) = ensure_ca(d, "rogue-ca", "not trusted").unwrap();
        issue_signed(d, "rogue-client", &other_ca, &other_key, &["rogue"]).unwrap();
        ensure_self_signed(d, "site-rsa", CertKind::Rsa2048, &["localhost"]).unwrap();
        ensure_self_signed(d, "site-ecdsa", CertKind::EcdsaP256, &["localhost"]).unwrap();
        // A certificate whose key no key server holds.
        ensure_self_signed(d, "orphan-ecdsa", CertKind::EcdsaP256, &["orphan.test"]).unwrap();
        Pki { dir }
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "port {port} never opened");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

struct KeyServerProc {
    child: Child,
    addr: SocketAddr,
    admin: u16,
}

impl Drop for KeyServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl KeyServerProc {
    async fn start(pki: &Pki, name: &str) -> Self {
        let (port, admin) = (free_port(), free_port());
        let text = format!(
            r#"
[keyserver]
listen = "127.0.0.1:{port}"
cert = "keyserver.crt"
key = "keyserver.key"
client_ca = "ca.crt"
keys = ["site-rsa.key", "site-ecdsa.key"]
[admin]
listen = "127.0.0.1:{admin}"
[key_engine]
engines = ["threads"]
threads = 1
"#
        );
        let cfg = pki.p(&format!("{name}.toml"));
        std::fs::write(&cfg, text).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_rampart"))
            .args(["keyserver", "--config"])
            .arg(&cfg)
            .env("RAMPART_LOG", "warn")
            .spawn()
            .unwrap();
        wait_port(port).await;
        wait_port(admin).await;
        KeyServerProc {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            admin,
        }
    }

    async fn metric(&self, name_and_labels: &str) -> f64 {
        // A scrape that fails (the admin listener busy on a loaded machine) is tried again:
        // a failed scrape must not read as zero.
        let mut out = None;
        for _ in 0..5 {
            let o = tokio::task::spawn_blocking({
                let url = format!("http://127.0.0.1:{}/metrics", self.admin);
                move || Command::new("curl").args(["-sS", &url]).output().unwrap()
            })
            .await
            .unwrap();
            if o.status.success() && !o.stdout.is_empty() {
                out = Some(o);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let out = out.expect("the key server's metrics could not be scraped");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(name_and_labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

fn remote(pki: &Pki, servers: &[SocketAddr]) -> Arc<RemoteEngine> {
    let connector = keyless::tls::client_connector(
        &pki.p("ca.crt"),
        &pki.p("gateway-client.crt"),
        &pki.p("gateway-client.key"),
    )
    .unwrap();
    Arc::new(
        RemoteEngine::start(RemoteConfig {
            servers: servers.to_vec(),
            server_name: "keyserver.test".into(),
            connector,
            connections_per_server: 2,
            timeout: Duration::from_millis(400),
            ping_interval: Duration::from_millis(200),
            breaker_failures: 2,
            breaker_cooldown: Duration::from_secs(1),
        })
        .unwrap(),
    )
}

async fn wait_connected(engine: &RemoteEngine, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.live_connections() < n {
        assert!(Instant::now() < deadline, "remote engine never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A gateway config whose certificates carry no private keys.
fn gateway_config(pki: &Pki, servers: &[SocketAddr]) -> PathBuf {
    let list: Vec<String> = servers.iter().map(|a| format!("\"{a}\"")).collect();
    let text = format!(
        r#"
[server]
access_log = "off"
worker_threads = 1
[admin]
listen = "127.0.0.1:0"
[key_engine]
engines = ["remote"]
[key_engine.remote]
servers = [{}]
server_name = "keyserver.test"
ca = "ca.crt"
client_cert = "gateway-client.crt"
client_key = "gateway-client.key"
[[listeners]]
name = "https"
listen = "127.0.0.1:0"
[listeners.quic]
enabled = true
[[listeners.certificates]]
server_names = ["localhost"]
rsa = {{ cert = "site-rsa.crt" }}
ecdsa = {{ cert = "site-ecdsa.crt" }}
[[listeners.certificates]]
server_names = ["orphan.test"]
ecdsa = {{ cert = "orphan-ecdsa.crt" }}
[[routes]]
cluster = "demo"
[[clusters]]
name = "demo"
endpoints = ["{{UPSTREAM}}"]
"#,
        list.join(", ")
    );
    let path = pki.p("gateway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn start_gateway(
    pki: &Pki,
    servers: &[SocketAddr],
    engine: Arc<RemoteEngine>,
) -> gateway::Running {
    let upstream = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let path = gateway_config(pki, servers);
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("{UPSTREAM}", &upstream.to_string());
    std::fs::write(&path, text).unwrap();
    let cfg = gateway::config::Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    gateway::start(
        cfg,
        gateway::StartOptions {
            engines: Some(vec![engine]),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

fn curl(port: u16, host: &str, args: &[&str]) -> Command {
    let mut c = Command::new("curl");
    c.args(["-sS", "--insecure", "--max-time", "10", "--resolve"])
        .arg(format!("{host}:{port}:127.0.0.1"))
        .args(args)
        .arg(format!("https://{host}:{port}/"));
    c
}

async fn output(mut c: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || c.output().unwrap())
        .await
        .unwrap()
}

fn bench_args(
    port: u16,
    mode: &str,
    sigalgs: &str,
    duration: Duration,
    requests: Option<u64>,
    concurrency: usize,
) -> bench::BenchArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct W {
        #[command(flatten)]
        a: bench::BenchArgs,
    }
    let mut argv = vec![
        "bench".to_string(),
        mode.into(),
        "--url".into(),
        format!("https://localhost:{port}/"),
        "--sigalgs".into(),
        sigalgs.into(),
        "--concurrency".into(),
        concurrency.to_string(),
        "--duration".into(),
        format!("{}ms", duration.as_millis()),
    ];
    if let Some(n) = requests {
        argv.push("--requests".into());
        argv.push(n.to_string());
    }
    W::parse_from(argv).a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_without_keys_serves_curl_h1_h2_through_two_key_servers() {
    let pki = Pki::new();
    let ks1 = KeyServerProc::start(&pki, "ks1").await;
    let ks2 = KeyServerProc::start(&pki, "ks2").await;
    let servers = [ks1.addr, ks2.addr];
    let engine = remote(&pki, &servers);
    wait_connected(&engine, 4).await;
    let gw = start_gateway(&pki, &servers, engine.clone()).await;
    assert_eq!(
        gw.engine.registry().private_count(),
        0,
        "the gateway holds no private key"
    );
    let port = gw.addr("https").unwrap().port();
    for http in ["--http1.1", "--http2"] {
        let out = output(curl(
            port,
            "localhost",
            &[
                http,
                "-o",
                "/dev/null",
                "-w",
                "%{http_code} %{http_version}",
            ],
        ))
        .await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("200"),
            "{http}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // RSA (PSS) and ECDSA handshakes, several each, spread over both servers.
    for sig in ["rsa_pss_rsae_sha256", "ecdsa_secp256r1_sha256"] {
        let s = bench::run_async(bench_args(
            port,
            "https-handshake",
            sig,
            Duration::from_secs(10),
            Some(20),
            4,
        ))
        .await
        .unwrap();
        assert_eq!((s.ok, s.errors), (20, 0), "{sig}: {:?}", s.errors_by_kind);
    }
    // HTTP/3: QUIC handshakes sign through the key servers too.
    let before = ks1.metric("rampart_keyserver_requests_total").await
        + ks2.metric("rampart_keyserver_requests_total").await;
    let quic_port = gw.quic_listeners[0].1.port();
    for sig in ["rsa_pss_rsae_sha256", "ecdsa_secp256r1_sha256"] {
        let s = bench::run_async(bench_args(
            quic_port,
            "h3-handshake",
            sig,
            Duration::from_secs(10),
            Some(10),
            2,
        ))
        .await
        .unwrap();
        assert_eq!(
            (s.ok, s.errors),
            (10, 0),
            "h3 {sig}: {:?}",
            s.errors_by_kind
        );
    }
    let after = ks1.metric("rampart_keyserver_requests_total").await
        + ks2.metric("rampart_keyserver_requests_total").await;
    assert!(
        after - before >= 20.0,
        "QUIC handshakes signed remotely: {before} -> {after}"
    );
    let served = ks1.metric("rampart_keyserver_requests_total").await
        + ks2.metric("rampart_keyserver_requests_total").await;
    assert!(
        served >= 42.0,
        "signatures came from the key servers: {served}"
    );
    assert!(
        ks1.metric("rampart_keyserver_requests_total").await > 0.0
            && ks2.metric("rampart_keyserver_requests_total").await > 0.0,
        "least-outstanding spreads load"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_key_server_under_load_loses_at_most_what_was_in_flight() {
    let secs: u64 = std::env::var("RAMPART_KILL_TEST_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let pki = Pki::new();
    let mut ks1 = KeyServerProc::start(&pki, "ks1").await;
    let ks2 = KeyServerProc::start(&pki, "ks2").await;
    let servers = [ks1.addr, ks2.addr];
    let engine = remote(&pki, &servers);
    wait_connected(&engine, 4).await;
    let gw = start_gateway(&pki, &servers, engine.clone()).await;
    let port = gw.addr("https").unwrap().port();
    const CONCURRENCY: usize = 8;
    let load = tokio::spawn(bench::run_async(bench_args(
        port,
        "https-handshake",
        "ecdsa_secp256r1_sha256",
        Duration::from_secs(secs),
        None,
        CONCURRENCY,
    )));
    tokio::time::sleep(Duration::from_secs(secs / 6)).await;
    let ok_before_kill = engine
        .stats(ks1.addr)
        .unwrap()
        .ok
        .load(std::sync::atomic::Ordering::Relaxed);
    ks1.child.kill().unwrap(); // SIGKILL: connections drop mid-request
    ks1.child.wait().unwrap();
    let summary = load.await.unwrap().unwrap();
    let s1 = engine.stats(ks1.addr).unwrap();
    let s2 = engine.stats(ks2.addr).unwrap();
    let rel = std::sync::atomic::Ordering::Relaxed;
    let (lost, timeouts, retries) = (
        s1.lost.load(rel),
        s1.timeouts.load(rel),
        s1.retries.load(rel),
    );
    eprintln!(
        "kill test: {} handshakes ok, {} failed; ks1 ok before kill {ok_before_kill}, lost {lost}, timed out {timeouts}, retried {retries}; ks2 ok {}",
        summary.ok,
        summary.errors,
        s2.ok.load(rel)
    );
    assert!(ok_before_kill > 0, "ks1 served before the kill");
    assert!(
        summary.errors as usize <= CONCURRENCY,
        "failures ({}) exceed what was in flight: {:?}",
        summary.errors,
        summary.errors_by_kind
    );
    assert!(
        retries >= lost + timeouts - summary.errors.min(lost + timeouts),
        "requests lost on ks1 were retried"
    );
    assert!(
        s2.ok.load(rel) > summary.ok / 2,
        "ks2 carried the load after the kill"
    );
    assert!(summary.ok > 0);
}

async fn raw_client(
    pki: &Pki,
    addr: SocketAddr,
    cert: Option<&str>,
) -> Result<tokio_boring::SslStream<tokio::net::TcpStream>, String> {
    use boring::ssl::{SslConnector, SslFiletype, SslMethod};
    let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
    b.set_ca_file(pki.p("ca.crt")).unwrap();
    if let Some(stem) = cert {
        b.set_certificate_chain_file(pki.p(&format!("{stem}.crt")))
            .unwrap();
        b.set_private_key_file(pki.p(&format!("{stem}.key")), SslFiletype::PEM)
            .unwrap();
    }
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio_boring::connect(b.build().configure().unwrap(), "keyserver.test", tcp)
        .await
        .map_err(|e| e.to_string())
}

/// Sends `frame` and reads one answer; `None` if the connection closed instead.
async fn exchange(
    s: &mut tokio_boring::SslStream<tokio::net::TcpStream>,
    frame: &[u8],
) -> Option<Message> {
    s.write_all(frame).await.ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    loop {
        if let Ok(Some((m, _))) = codec::decode(&buf) {
            return Some(m);
        }
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_valid_certificate_are_refused() {
    let pki = Pki::new();
    let ks = KeyServerProc::start(&pki, "ks").await;
    let ping = codec::encode(&Message::ping(1, vec![1]), true).unwrap();
    for cert in [None, Some("rogue-client")] {
        let refused = match raw_client(&pki, ks.addr, cert).await {
            Err(_) => true,
            Ok(mut s) => exchange(&mut s, &ping).await.is_none(),
        };
        assert!(refused, "client with {cert:?} was served");
    }
    let mut good = raw_client(&pki, ks.addr, Some("gateway-client"))
        .await
        .unwrap();
    let pong = exchange(&mut good, &ping).await.unwrap();
    assert_eq!(pong.opcode, Some(Op::Pong));
    assert!(ks.metric("rampart_keyserver_tls_failures_total").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_key_fails_the_handshake_cleanly_and_the_server_says_key_not_found() {
    let pki = Pki::new();
    let ks = KeyServerProc::start(&pki, "ks").await;
    let engine = remote(&pki, &[ks.addr]);
    wait_connected(&engine, 2).await;
    let gw = start_gateway(&pki, &[ks.addr], engine).await;
    let port = gw.addr("https").unwrap().port();
    let out = output(curl(port, "orphan.test", &["-o", "/dev/null"])).await;
    assert!(
        !out.status.success(),
        "a handshake without a signature must fail"
    );
    let out = output(curl(
        port,
        "localhost",
        &["-o", "/dev/null", "-w", "%{http_code}"],
    ))
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "200",
        "other names are unaffected"
    );
    assert!(
        ks.metric("rampart_keyserver_errors_total{error=\"key not found\"}")
            .await
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_get_errors_while_other_connections_are_served() {
    let pki = Pki::new();
    let ks = KeyServerProc::start(&pki, "ks").await;
    let mut bystander = raw_client(&pki, ks.addr, Some("gateway-client"))
        .await
        .unwrap();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/keyless_frame");
    let mut answered = 0;
    for entry in std::fs::read_dir(&corpus).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let mut s = raw_client(&pki, ks.addr, Some("gateway-client"))
            .await
            .unwrap();
        if let Some(m) = exchange(&mut s, &bytes).await {
            answered += 1;
            assert!(
                matches!(m.opcode, Some(Op::Error | Op::Pong | Op::Response)),
                "{m:?}"
            );
        }
        let ping = codec::encode(&Message::ping(7, vec![]), true).unwrap();
        let pong = exchange(&mut bystander, &ping)
            .await
            .expect("the other connection is still served");
        assert_eq!(pong.opcode, Some(Op::Pong));
    }
    assert!(answered >= 3, "malformed frames are answered with errors");
    let unknown_tag = [1, 0, 0, 4, 0, 0, 0, 9, 0x7E, 0, 1, 0];
    let mut s = raw_client(&pki, ks.addr, Some("gateway-client"))
        .await
        .unwrap();
    assert_eq!(
        exchange(&mut s, &unknown_tag).await,
        Some(Message::error(9, ErrorCode::Format))
    );
}
