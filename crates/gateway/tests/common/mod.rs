//! Shared helpers for the gateway's integration tests: certificates, configs, a running
//! gateway with a real upstream, and real clients (curl, openssl s_client, boring).
#![allow(dead_code)]

pub mod etcd;
pub mod redis;

use gateway::config::Config;
use gateway::demo::{ensure_self_signed, CertKind};
use gateway::{Running, StartOptions};
use keyengine::Engine;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub gw: Option<Running>,
    pub upstream: SocketAddr,
}

impl Fixture {
    pub fn addr(&self) -> SocketAddr {
        self.gw.as_ref().unwrap().addr("https").unwrap()
    }

    pub fn port(&self) -> u16 {
        self.addr().port()
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port())
    }

    pub fn gw(&self) -> &Running {
        self.gw.as_ref().unwrap()
    }

    pub fn cert(&self, stem: &str) -> PathBuf {
        self.dir.path().join(format!("{stem}.crt"))
    }
}

/// Certificates: `localhost` (RSA + ECDSA) and `other.test` (RSA + ECDSA).
pub fn make_certs(dir: &Path) {
    for (stem, kind, name) in [
        ("localhost-rsa", CertKind::Rsa2048, "localhost"),
        ("localhost-ecdsa", CertKind::EcdsaP256, "localhost"),
        ("other-rsa", CertKind::Rsa2048, "other.test"),
        ("other-ecdsa", CertKind::EcdsaP256, "other.test"),
    ] {
        ensure_self_signed(dir, stem, kind, &[name]).unwrap();
    }
}

/// A config with one listener on an ephemeral port, two certificate names, one route to
/// `upstreams`; `extra_cluster` and `extra_listener` are appended to the respective tables.
pub fn config_text(upstreams: &[SocketAddr], cluster_extra: &str, listener_extra: &str) -> String {
    let eps: Vec<String> = upstreams.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        r#"
[server]
access_log = "off"
shutdown_grace = "5s"

[admin]
listen = "127.0.0.1:0"

[key_engine]
engines = ["threads"]

[[listeners]]
name = "https"
listen = "127.0.0.1:0"
{listener_extra}

[[listeners.certificates]]
server_names = ["localhost"]
rsa = {{ cert = "localhost-rsa.crt", key = "localhost-rsa.key" }}
ecdsa = {{ cert = "localhost-ecdsa.crt", key = "localhost-ecdsa.key" }}

[[listeners.certificates]]
server_names = ["other.test", "*.other.test"]
rsa = {{ cert = "other-rsa.crt", key = "other-rsa.key" }}
ecdsa = {{ cert = "other-ecdsa.crt", key = "other-ecdsa.key" }}

[[routes]]
cluster = "app"

[[clusters]]
name = "app"
endpoints = [{eps}]
{cluster_extra}
"#,
        eps = eps.join(", ")
    )
}

pub async fn start_with(
    text: &str,
    dir: tempfile::TempDir,
    upstream: SocketAddr,
    engines: Option<Vec<Arc<dyn Engine>>>,
) -> Fixture {
    let path = dir.path().join("rampart.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let gw = gateway::start(
        cfg,
        StartOptions {
            engines,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    Fixture {
        dir,
        gw: Some(gw),
        upstream,
    }
}

/// A gateway in front of a real demo upstream.
pub async fn start(cluster_extra: &str, listener_extra: &str) -> Fixture {
    start_engine(cluster_extra, listener_extra, None).await
}

pub async fn start_engine(
    cluster_extra: &str,
    listener_extra: &str,
    engines: Option<Vec<Arc<dyn Engine>>>,
) -> Fixture {
    start_inner(cluster_extra, listener_extra, engines, |text, _| text).await
}

/// [`start`], with the config text passed through `edit` (given the config's folder) first,
/// for settings the listener and cluster extras cannot reach (`[server]`).
pub async fn start_edited(
    listener_extra: &str,
    edit: impl FnOnce(String, &Path) -> String,
) -> Fixture {
    start_inner("", listener_extra, None, edit).await
}

async fn start_inner(
    cluster_extra: &str,
    listener_extra: &str,
    engines: Option<Vec<Arc<dyn Engine>>>,
    edit: impl FnOnce(String, &Path) -> String,
) -> Fixture {
    let upstream = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let text = edit(
        config_text(&[upstream], cluster_extra, listener_extra),
        dir.path(),
    );
    start_with(&text, dir, upstream, engines).await
}

/// The value of response header `name` (lowercase) of a GET of `path` through `fx` ("" when
/// absent or when the request failed).
pub async fn response_header(fx: &Fixture, path: &str, name: &str) -> String {
    let out = run(curl(fx, &["-o", "/dev/null", "-D", "-", &fx.url(path)])).await;
    let prefix = format!("{name}: ");
    stdout(&out)
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// Runs a blocking command off the async runtime.
pub async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("spawn"))
        .await
        .unwrap()
}

/// curl against the fixture, resolving every name used in tests to loopback.
pub fn curl(fx: &Fixture, args: &[&str]) -> Command {
    let mut c = Command::new("curl");
    let port = fx.port();
    c.args(["-sS", "--insecure", "--max-time", "20"]);
    for name in ["localhost", "other.test", "www.other.test"] {
        c.arg("--resolve").arg(format!("{name}:{port}:127.0.0.1"));
    }
    c.args(args);
    c
}

/// Runs curl against the fixture and returns only the HTTP status code ("000" if none).
pub async fn curl_status(fx: &Fixture, args: &[&str]) -> String {
    let mut all = vec!["-o", "/dev/null", "-w", "%{http_code}"];
    all.extend_from_slice(args);
    stdout(&run(curl(fx, &all)).await)
}

/// [`openssl_s_client_request`]'s output (stdout): a handshake and one request.
pub async fn s_client_request(fx: &Fixture, servername: &str, extra: &[&str]) -> String {
    stdout(&run(openssl_s_client_request(fx, servername, extra)).await)
}

/// `openssl s_client` output (stdout) against the fixture.
pub async fn s_client(fx: &Fixture, servername: &str, extra: &[&str]) -> String {
    stdout(&run(openssl_s_client(fx, servername, extra)).await)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The subject CN of the certificate the server presented, from `openssl s_client` output.
pub fn presented_subject(out: &str) -> String {
    out.lines()
        .find(|l| l.starts_with("subject="))
        .unwrap_or_default()
        .to_string()
}

/// The server certificate (PEM, as `openssl s_client` prints it) from its output.
pub fn presented_certificate(out: &str) -> String {
    let begin = out.find("-----BEGIN CERTIFICATE-----").unwrap_or(0);
    let end = out[begin..]
        .find("-----END CERTIFICATE-----")
        .map_or(begin, |e| begin + e + "-----END CERTIFICATE-----".len());
    out[begin..end].to_string()
}

/// The server's public key type ("RSA" / "EC") from `openssl s_client` output.
pub fn presented_key_type(out: &str) -> &'static str {
    if out.contains("Server public key is 2048 bit") || out.contains("Peer signature type: RSA") {
        "RSA"
    } else if out.contains("Server public key is 256 bit")
        || out.contains("Peer signature type: ECDSA")
    {
        "EC"
    } else {
        "unknown"
    }
}

pub fn openssl_s_client(fx: &Fixture, servername: &str, extra: &[&str]) -> Command {
    let mut c = Command::new("openssl");
    c.args([
        "s_client",
        "-connect",
        &format!("127.0.0.1:{}", fx.port()),
        "-servername",
        servername,
    ]);
    c.args(extra);
    c.stdin(std::process::Stdio::null());
    c
}

/// `openssl s_client` that sends one HTTP/1.0 request and reads until the server closes, so
/// TLS 1.3 session tickets (sent after the handshake) are received.
pub fn openssl_s_client_request(fx: &Fixture, servername: &str, extra: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c").arg(format!(
        "printf 'GET / HTTP/1.0\\r\\nHost: {servername}\\r\\n\\r\\n' | timeout 20 openssl s_client -connect 127.0.0.1:{} -servername {servername} -ign_eof {}",
        fx.port(),
        extra.join(" ")
    ));
    c
}

/// A metric's value from the admin endpoint's text (sum over series whose labels contain all
/// of `label_parts`).
pub fn metric_sum(text: &str, name: &str, label_parts: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name)
                && (l.as_bytes().get(name.len()) == Some(&b'{')
                    || l.as_bytes().get(name.len()) == Some(&b' '))
        })
        .filter(|l| label_parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Opens a TLS connection with boring and returns whether it completed.
pub async fn tls_handshake(addr: SocketAddr, server_name: &str) -> Result<(), String> {
    tls_handshake_offering(addr, server_name, None).await
}

/// Like [`tls_handshake`], offering only the given signature algorithms.
pub async fn tls_handshake_offering(
    addr: SocketAddr,
    server_name: &str,
    sigalgs: Option<&[boring::ssl::SslSignatureAlgorithm]>,
) -> Result<(), String> {
    use boring::ssl::{SslConnector, SslMethod, SslVerifyMode};
    let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    if let Some(algs) = sigalgs {
        b.set_verify_algorithm_prefs(algs).unwrap();
    }
    let connector = b.build();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let cfg = connector.configure().unwrap();
    tokio_boring::connect(cfg, server_name, tcp)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

pub fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// One QUIC handshake with quiche as the client (ALPN h3); returns its duration.
pub async fn quic_handshake(server: std::net::SocketAddr) -> Result<std::time::Duration, String> {
    quic_handshake_alpn(server, b"h3").await
}

/// [`quic_handshake`] offering the given ALPN protocol.
pub async fn quic_handshake_alpn(
    server: std::net::SocketAddr,
    alpn: &[u8],
) -> Result<std::time::Duration, String> {
    quic_connect(server, alpn).await.map(|(took, _)| took)
}

/// The leaf certificate (DER) a QUIC handshake with `server` (ALPN h3, SNI localhost)
/// presents.
pub async fn quic_peer_certificate(server: std::net::SocketAddr) -> Result<Vec<u8>, String> {
    quic_connect(server, b"h3")
        .await?
        .1
        .ok_or_else(|| "no peer certificate".to_string())
}

/// A QUIC handshake: how long it took and the server's leaf certificate (DER).
async fn quic_connect(
    server: std::net::SocketAddr,
    alpn: &[u8],
) -> Result<(std::time::Duration, Option<Vec<u8>>), String> {
    use tokio_quiche::quiche;
    let mut cfg = quiche::Config::new(quiche::PROTOCOL_VERSION).map_err(|e| e.to_string())?;
    cfg.verify_peer(false);
    cfg.set_application_protos(&[alpn])
        .map_err(|e| e.to_string())?;
    cfg.set_initial_max_data(1 << 20);
    cfg.set_initial_max_stream_data_bidi_local(1 << 16);
    cfg.set_initial_max_streams_bidi(10);
    cfg.set_max_idle_timeout(5000);
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let local = sock.local_addr().unwrap();
    let mut scid = [0u8; 16];
    fastrand::fill(&mut scid);
    let scid = quiche::ConnectionId::from_ref(&scid);
    let mut conn = quiche::connect(Some("localhost"), &scid, local, server, &mut cfg)
        .map_err(|e| e.to_string())?;
    let start = std::time::Instant::now();
    let (mut out, mut buf) = ([0u8; 1500], [0u8; 65535]);
    loop {
        while let Ok((n, info)) = conn.send(&mut out) {
            sock.send_to(&out[..n], info.to)
                .await
                .map_err(|e| e.to_string())?;
        }
        if conn.is_established() {
            return Ok((start.elapsed(), conn.peer_cert().map(<[u8]>::to_vec)));
        }
        if conn.is_closed() || start.elapsed() > std::time::Duration::from_secs(10) {
            return Err(format!(
                "handshake failed: {:?} local {:?} timed out {} stats {:?}",
                conn.peer_error(),
                conn.local_error(),
                conn.is_timed_out(),
                conn.stats()
            ));
        }
        let wait = conn
            .timeout()
            .unwrap_or(std::time::Duration::from_millis(100));
        tokio::select! {
            r = sock.recv_from(&mut buf) => {
                let (n, from) = r.map_err(|e| e.to_string())?;
                let _ = conn.recv(&mut buf[..n], quiche::RecvInfo { from, to: local });
            }
            _ = tokio::time::sleep(wait) => conn.on_timeout(),
        }
    }
}

/// Waits (up to 5 s) until the metric's sum reaches `min`; returns the metrics text then.
/// For values recorded asynchronously (e.g. when a QUIC connection finishes closing).
pub async fn eventually_metric(fx: &Fixture, name: &str, labels: &[&str], min: f64) -> String {
    let mut m = String::new();
    for _ in 0..100 {
        m = fx.gw().metrics.render();
        if metric_sum(&m, name, labels) >= min {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{name}{labels:?} never reached {min}:\n{m}");
}

/// [`start`], writing the access log to `access.log` in the fixture's folder
/// (read it with [`access_log`]).
pub async fn start_logged(listener_extra: &str) -> Fixture {
    start_edited(listener_extra, log_to_file).await
}

/// A config edit: the access log to `access.log` in the config's folder.
pub fn log_to_file(text: String, dir: &Path) -> String {
    let log = dir.join("access.log");
    text.replace(
        "access_log = \"off\"",
        &format!("access_log = \"{}\"", log.display()),
    )
}

/// The access log of a [`start_logged`] fixture, once it holds `want` records (up to 5 s;
/// it is written by its own thread).
pub async fn access_log(fx: &Fixture, want: usize) -> Vec<serde_json::Value> {
    let path = fx.dir.path().join("access.log");
    let mut lines = Vec::new();
    for _ in 0..250 {
        lines = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        if lines.len() >= want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(lines.len(), want, "{lines:?}");
    lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// What [`spawn_faulty_upstream`] serves: a response cut short, one that never ends, and an
/// upload sink that tells whether a request body arrived whole.
pub const CUT_PATH: &str = "/fault/cut";
pub const ENDLESS_PATH: &str = "/fault/endless";
pub const UPLOAD_PATH: &str = "/fault/upload";
/// Answers an `Upgrade: websocket` request with 101 (echoing its `sec-websocket-key` as
/// `x-seen-key`), then echoes every byte; anything else gets 426.
pub const UPGRADE_PATH: &str = "/fault/ws";
/// A WebSocket upgrade the upstream answers with the wrong `Sec-WebSocket-Accept`.
pub const UPGRADE_BAD_ACCEPT_PATH: &str = "/fault/ws-bad-accept";

/// The `Sec-WebSocket-Accept` for `key` (RFC 6455 §4.2.2).
pub fn websocket_accept(key: &str) -> String {
    use base64::Engine as _;
    let digest = boring::sha::sha1(format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(digest)
}
/// The length `CUT_PATH`'s headers promise, and how much of it is sent before the close.
pub const CUT_PROMISED: usize = 1_000_000;
pub const CUT_SENT: usize = 100_000;

/// What the faulty upstream saw, reported as it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultReport {
    /// An `ENDLESS_PATH` response's connection was closed by the gateway.
    EndlessClosed,
    /// An `UPLOAD_PATH` request body: `complete` if it ended as its framing says (the last
    /// chunk, or the promised length), not if its connection closed first; the bytes read.
    Upload { complete: bool, bytes: usize },
}

pub type FaultReports = tokio::sync::mpsc::UnboundedReceiver<FaultReport>;

/// The next report, if one comes within 5 s.
pub async fn next_report(reports: &mut FaultReports) -> Option<FaultReport> {
    tokio::time::timeout(std::time::Duration::from_secs(5), reports.recv())
        .await
        .ok()
        .flatten()
}

/// Waits for the faulty upstream's next upload report and asserts the upload did not arrive
/// whole; returns the bytes that did. `how` names the case in failure messages.
pub async fn assert_upload_cut_short(reports: &mut FaultReports, how: &str) -> usize {
    match next_report(reports).await {
        Some(FaultReport::Upload { complete, bytes }) => {
            assert!(
                !complete,
                "{how}: an abandoned upload reached the upstream whole ({bytes} bytes)"
            );
            bytes
        }
        other => panic!("{how}: the upstream saw no upload end: {other:?}"),
    }
}

/// The client's failures (abandoned or malformed uploads) were not counted against the
/// upstream: `rampart_upstream_errors_total` is 0.
pub fn assert_no_upstream_errors(fx: &Fixture) {
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_upstream_errors_total", &[]),
        0.0,
        "{m}"
    );
}

/// A deliberately faulty upstream speaking HTTP/1.1 on a raw TCP socket, for what the gateway
/// does when a real server fails or a client goes away:
/// - `CUT_PATH`: headers promising `CUT_PROMISED` bytes, `CUT_SENT` of them, then a close;
/// - `ENDLESS_PATH`: a chunked body written until the reader goes away (60 s at the most),
///   reported once the gateway has closed the connection (a write fails), so a test can tell
///   a freed upstream connection from one left open;
/// - `UPLOAD_PATH`: reads the request body (chunked or with a length), reports whether it
///   arrived whole, and answers 200 if it did.
pub async fn spawn_faulty_upstream() -> (SocketAddr, FaultReports) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (report, reports) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve_faulty(s, report.clone()));
        }
    });
    (addr, reports)
}

async fn serve_faulty(
    mut s: tokio::net::TcpStream,
    report: tokio::sync::mpsc::UnboundedSender<FaultReport>,
) {
    use tokio::io::AsyncWriteExt;
    let mut data = Vec::new();
    let head_end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if !read_more(&mut s, &mut data).await {
            return;
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    if path == CUT_PATH {
        let hdr = format!("HTTP/1.1 200 OK\r\ncontent-length: {CUT_PROMISED}\r\n\r\n");
        let _ = s.write_all(hdr.as_bytes()).await;
        let _ = s.write_all(&vec![b'c'; CUT_SENT]).await;
        // Dropping the socket closes the connection with the body unfinished.
    } else if path == ENDLESS_PATH {
        let mut chunk = b"4000\r\n".to_vec();
        chunk.extend_from_slice(&[b'e'; 0x4000]);
        chunk.extend_from_slice(b"\r\n");
        let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut res = s.write_all(head).await;
        while res.is_ok() {
            match tokio::time::timeout_at(deadline, s.write_all(&chunk)).await {
                Ok(r) => res = r,
                Err(_) => return, // still open at the deadline: not reported
            }
        }
        let _ = report.send(FaultReport::EndlessClosed);
    } else if path == UPGRADE_PATH || path == UPGRADE_BAD_ACCEPT_PATH {
        // The key as sent (the head above is lowercased), and the accept value it calls for
        // (RFC 6455 §4.2.2); UPGRADE_BAD_ACCEPT_PATH answers a wrong one.
        let raw = String::from_utf8_lossy(&data[..head_end]).into_owned();
        let key = raw
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("sec-websocket-key")
                    .then(|| value.trim().to_string())
            })
            .unwrap_or_default();
        let accept = if path == UPGRADE_PATH {
            websocket_accept(&key)
        } else {
            websocket_accept("another key")
        };
        if !head.contains("upgrade: websocket") || !head.contains("connection: upgrade") {
            let _ = s
                .write_all(b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 0\r\n\r\n")
                .await;
            return;
        }
        let resp = format!(
            "HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\
             x-seen-key: {key}\r\nsec-websocket-accept: {accept}\r\n\r\n"
        );
        if s.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
    } else if path == UPLOAD_PATH {
        let mut body = data.split_off(head_end);
        let (complete, bytes) = if head.contains("transfer-encoding: chunked") {
            read_chunked(&mut s, &mut body).await
        } else {
            let want: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while body.len() < want && read_more(&mut s, &mut body).await {}
            (body.len() >= want, body.len().min(want))
        };
        let _ = report.send(FaultReport::Upload { complete, bytes });
        if complete {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
                .await;
        }
    } else {
        let _ = s
            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            .await;
    }
}

/// Appends what the socket has to `data`; false at its end or on an error.
async fn read_more(s: &mut tokio::net::TcpStream, data: &mut Vec<u8>) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16384];
    match s.read(&mut buf).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            data.extend_from_slice(&buf[..n]);
            true
        }
    }
}

/// Reads a chunked body from `data` (what has arrived) and the socket: whether its last chunk
/// came before the connection ended, and the body bytes.
async fn read_chunked(s: &mut tokio::net::TcpStream, data: &mut Vec<u8>) -> (bool, usize) {
    let (mut pos, mut bytes) = (0, 0);
    loop {
        let line_end = data[pos..].windows(2).position(|w| w == b"\r\n");
        let size = line_end.and_then(|i| {
            let line = String::from_utf8_lossy(&data[pos..pos + i]).into_owned();
            usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()
        });
        match (line_end, size) {
            (Some(_), Some(0)) => return (true, bytes),
            (Some(i), Some(n)) if data.len() >= pos + i + 2 + n + 2 => {
                pos += i + 2 + n + 2;
                bytes += n;
                continue;
            }
            (Some(_), None) => return (false, bytes), // not chunked framing
            _ => {}
        }
        if !read_more(s, data).await {
            return (false, bytes);
        }
    }
}

/// A gateway whose `/fault/` routes go to [`spawn_faulty_upstream`] and the rest to the demo
/// upstream, its access log read by [`access_log`]; also returns the faulty upstream's
/// reports.
pub async fn start_with_faulty_upstream(listener_extra: &str) -> (Fixture, FaultReports) {
    let (faulty, reports) = spawn_faulty_upstream().await;
    let faulty_routes = format!(
        "\n[[clusters]]\nname = \"faulty\"\nendpoints = [\"{faulty}\"]\n\n\
         [[routes]]\npath_prefix = \"/fault/\"\ncluster = \"faulty\"\n"
    );
    let fx = start_inner(&faulty_routes, listener_extra, None, log_to_file).await;
    (fx, reports)
}

/// An upstream whose health a test switches: every request (the health check's too) gets
/// `200` with `x-server: NAME` and the body `NAME\n` while the flag is true, `503` while it
/// is false; each connection closes after one response.
pub async fn spawn_switchable_upstream(
    name: &'static str,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let up = Arc::new(AtomicBool::new(true));
    let flag = up.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let flag = flag.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    if !read_more(&mut s, &mut head).await {
                        return;
                    }
                }
                let status = if flag.load(Ordering::Relaxed) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nx-server: {name}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{name}\n",
                    name.len() + 1
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    (addr, up)
}

/// A TLS connection to the fixture offering ALPN `alpn`.
pub async fn tls_to(fx: &Fixture, alpn: &[u8]) -> tokio_boring::SslStream<tokio::net::TcpStream> {
    tls_after(fx, alpn, b"").await.unwrap()
}

/// A TLS connection to the fixture whose TCP stream first carries `preface` (a PROXY
/// protocol header); the handshake's error if the gateway refuses it.
pub async fn tls_after(
    fx: &Fixture,
    alpn: &[u8],
    preface: &[u8],
) -> Result<tokio_boring::SslStream<tokio::net::TcpStream>, String> {
    use boring::ssl::{SslConnector, SslMethod, SslVerifyMode};
    use tokio::io::AsyncWriteExt;
    let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_alpn_protos(alpn).unwrap();
    let cfg = b.build().configure().unwrap();
    let mut tcp = tokio::net::TcpStream::connect(fx.addr()).await.unwrap();
    tcp.write_all(preface).await.unwrap();
    tokio_boring::connect(cfg, "localhost", tcp)
        .await
        .map_err(|e| e.to_string())
}

/// An upstream whose answers a test sets: every request gets `status` after `delay_ms`, with
/// `x-server: NAME` and `x-body-bytes: N` (the request body's size) and the body `NAME\n`.
/// It counts requests and keeps the `Host` of each; connections stay open (keep-alive).
pub struct ScriptedUpstream {
    pub addr: SocketAddr,
    pub hits: Arc<std::sync::atomic::AtomicUsize>,
    pub status: Arc<std::sync::atomic::AtomicU16>,
    pub delay_ms: Arc<std::sync::atomic::AtomicU64>,
    pub hosts: Arc<std::sync::Mutex<Vec<String>>>,
}

impl ScriptedUpstream {
    pub fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }
}

pub async fn spawn_scripted_upstream(name: &'static str, status: u16) -> ScriptedUpstream {
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = ScriptedUpstream {
        addr: listener.local_addr().unwrap(),
        hits: Arc::new(AtomicUsize::new(0)),
        status: Arc::new(AtomicU16::new(status)),
        delay_ms: Arc::new(AtomicU64::new(0)),
        hosts: Default::default(),
    };
    let (hits, status, delay, hosts) = (
        up.hits.clone(),
        up.status.clone(),
        up.delay_ms.clone(),
        up.hosts.clone(),
    );
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let (hits, status, delay, hosts) =
                (hits.clone(), status.clone(), delay.clone(), hosts.clone());
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (hits, status, delay, hosts) =
                        (hits.clone(), status.clone(), delay.clone(), hosts.clone());
                    async move {
                        hits.fetch_add(1, Ordering::Relaxed);
                        if let Some(h) = req.headers().get("host").and_then(|v| v.to_str().ok()) {
                            hosts.lock().unwrap().push(h.to_string());
                        }
                        let body = req.into_body().collect().await.map(|b| b.to_bytes().len());
                        let wait = delay.load(Ordering::Relaxed);
                        if wait > 0 {
                            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                        }
                        let resp = hyper::Response::builder()
                            .status(status.load(Ordering::Relaxed))
                            .header("x-server", name)
                            .header("x-body-bytes", body.unwrap_or(0))
                            .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                                "{name}\n"
                            ))))
                            .unwrap();
                        Ok::<_, std::convert::Infallible>(resp)
                    }
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), service)
                    .await;
            });
        }
    });
    up
}

/// Runs `n` requests of `args` (ending in the URL) through one curl, at most `parallel` at a
/// time; returns each request's `%{http_code}`.
pub async fn curl_parallel(fx: &Fixture, n: usize, parallel: usize, args: &[&str]) -> Vec<String> {
    let (url, opts) = args.split_last().expect("a URL");
    let parallel = parallel.to_string();
    let mut all: Vec<&str> = vec!["--parallel", "--parallel-max", &parallel];
    all.extend_from_slice(opts);
    all.extend(["-w", "%{http_code}\\n"]);
    for _ in 0..n {
        all.extend(["-o", "/dev/null"]);
    }
    all.extend(std::iter::repeat_n(*url, n));
    stdout(&run(curl(fx, &all)).await)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Over TLS 1.2 and 1.3, a session from gateway `a` (saved in `sess`) resumes on `b`, which
/// has the same ticket keys, and not on `c`, which has keys of its own.
pub async fn assert_sessions_shared(a: &Fixture, b: &Fixture, c: &Fixture, sess: &Path) {
    let sess_s = sess.to_str().unwrap();
    for tls in ["-tls1_2", "-tls1_3"] {
        let first = s_client_request(a, "localhost", &[tls, "-sess_out", sess_s]).await;
        assert!(first.contains("New,"), "{tls}:\n{first}");
        let on_b = s_client_request(b, "localhost", &[tls, "-sess_in", sess_s]).await;
        assert!(on_b.contains("Reused,"), "{tls} on b:\n{on_b}");
        let on_c = s_client_request(c, "localhost", &[tls, "-sess_in", sess_s]).await;
        assert!(on_c.contains("New,"), "{tls} on c:\n{on_c}");
    }
}

/// The mTLS tests' certificates (`tests/data/client-certs.sh`): a client CA (`ca.pem`, its
/// CRL `ca.crl`), alice (valid), bob (revoked) and mallory (from another CA), each as
/// `NAME.pem` and `NAME.key`.
pub fn client_certs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/client-certs.sh");
    let made = Command::new("sh")
        .arg(script)
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(made.success());
    dir
}

/// Listener lines asking clients for certificates from [`client_certs`]' CA (`auth`:
/// "optional" or "required"), revoked ones refused.
pub fn client_auth_listener(certs: &std::path::Path, auth: &str) -> String {
    format!(
        "tls.client_auth = \"{auth}\"\ntls.client_ca = \"{}\"\ntls.client_crl = \"{}\"",
        certs.join("ca.pem").display(),
        certs.join("ca.crl").display()
    )
}

/// A gateway of a fleet: `fleet` is its `[fleet]` section's lines (see
/// [`redis::Redis::fleet_section`]), `listener` its listener's.
pub async fn fleet_gateway(fleet: &str, listener: &str) -> Fixture {
    let fleet = format!("[fleet]\n{fleet}\n\n[[listeners]]\n");
    start_edited(listener, move |t, _| {
        t.replacen("[[listeners]]\n", &fleet, 1)
    })
    .await
}

/// Writes `text` as `rampart.toml` in `dir`, which must load, and starts a gateway from it,
/// which must be refused: returns the error with its causes (`{:#}`).
pub async fn start_refused(dir: &Path, text: &str) -> String {
    let path = dir.join("rampart.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    match gateway::start(cfg, StartOptions::default()).await {
        Ok(_) => panic!("the gateway started"),
        Err(e) => format!("{e:#}"),
    }
}

/// The OCSP test PKI (`data/ocsp-certs.sh`) in `dir`; its certificates name an OCSP
/// responder on 127.0.0.1:`port` (1 when none runs).
pub fn ocsp_pki(dir: &Path, port: u16) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ocsp-certs.sh");
    let out = Command::new("sh")
        .arg(script)
        .env("OCSP_PORT", port.to_string())
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Samples this process's resident memory every 20 ms until [`RssPeak::grew_mib`].
pub struct RssPeak {
    base: u64,
    peak: Arc<std::sync::atomic::AtomicU64>,
    sampler: tokio::task::JoinHandle<()>,
}

impl RssPeak {
    pub fn start() -> RssPeak {
        let base = rss_kib();
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(base));
        let p = peak.clone();
        let sampler = tokio::spawn(async move {
            loop {
                p.fetch_max(rss_kib(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
        RssPeak {
            base,
            peak,
            sampler,
        }
    }

    /// Stops sampling; how far the peak rose above the start, in MiB.
    pub fn grew_mib(self) -> u64 {
        self.sampler.abort();
        (self.peak.load(std::sync::atomic::Ordering::Relaxed) - self.base) / 1024
    }
}
