//! `rampart bench`: a bounded load generator for rampart (or any HTTPS server).
//!
//! Modes: `https-handshake` (a new TCP + TLS connection per request; `--resume` resumes with
//! session tickets) and `https-requests` (keep-alive connections, HTTP/1.1 or HTTP/2). Every
//! run is bounded by `--duration` and optionally `--requests`, and stops by itself.

mod cpu;
pub mod engine;
mod h3;
mod packet_seal;
mod quic_send;
mod replay;
mod request_set;
pub mod sign;
mod sign_load;
mod stats;
mod udp;

use anyhow::{anyhow, bail, Context as _};
use boring::ssl::{SslConnector, SslMethod, SslSessionCacheMode, SslVerifyMode, SslVersion};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use http::{Request, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper_util::rt::TokioIo;
use stats::{Recorder, Summary};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Mode {
    /// A new TCP + TLS connection per request.
    HttpsHandshake,
    /// Keep-alive requests (HTTP/1.1 or HTTP/2).
    HttpsRequests,
    /// An attack, for the server's limits under it: each worker completes a TLS handshake,
    /// sends nothing and holds the connection until the server closes it (the operation's
    /// latency is how long the server kept it), then opens another.
    HttpsHold,
    /// Single-operation signs/s on one thread, aws-lc vs BoringSSL (no server; --url unused).
    Sign,
    /// Signing load through a key engine: in process, or on key servers (--engine remote).
    SignLoad,
    /// A new QUIC connection per HTTP/3 request (`--resume`, `--early-data`).
    H3Handshake,
    /// Requests on kept-open HTTP/3 connections.
    H3Requests,
    /// An attack, for the server's memory under it: QUIC Initials (a client's first flight,
    /// each from a new UDP port) that never go further, at `--rate` per second; the server's
    /// Retries and handshake replies are never read.
    H3InitialFlood,
    /// Bulk HTTP/3 download (use a large /bytes/N): Gbit/s and server CPU s/GB.
    H3Download,
    /// Bulk HTTPS download (HTTP/1.1 over TLS, or HTTP/2 with `--http h2`), the same figures for comparison.
    HttpsDownload,
    /// Bulk HTTP/3 upload: POSTs of `--upload-bytes` each (use the demo upstream's /discard):
    /// Gbit/s and server CPU s/GB.
    H3Upload,
    /// Bulk HTTPS upload, the same over HTTP/1.1 (or HTTP/2 with `--http h2`).
    HttpsUpload,
    /// In-process signs/s and latency per key engine, algorithm and concurrency (no server).
    Engine,
    /// Timing-leak check (dudect) of the RSA kernel: fixed vs random exponent, Welch's t.
    /// `-n` measurements (default 4000); `--engines batch:KERNEL` picks the kernel.
    CtRsa,
    /// quiche's server-side cost per packet of a bulk download, in process (no sockets, no
    /// server; --url unused): packet building and sealing, ACK processing, body buffering.
    QuicSend,
    /// Sealing one QUIC packet, BoringSSL's AEAD against packetseal, and a 16 KB TLS record
    /// as the per-byte reference (in process; --url unused).
    PacketSeal,
    /// Datagrams for a layer-4 balancer (`--url udp://VIP:PORT`): QUIC short-header packets of
    /// `--datagram-bytes`, their connection IDs QUIC-LB encoded (`--lb-*`) across
    /// `--connections` connections, sent with sendmmsg as fast as one thread can.
    UdpFlood,
    /// The anchor `rampart l4` is measured against: a plain userspace UDP forwarder
    /// (`recv_from`, then `send_to` `--forward-to`, one datagram at a time) on `--url`'s
    /// address; prints datagrams forwarded and its CPU seconds.
    UdpForward,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum HttpVersion {
    H1,
    H2,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub mode: Mode,
    /// Target URL, e.g. https://localhost:8443/bytes/100
    #[arg(long, default_value = "https://localhost:8443/")]
    pub url: String,
    /// Concurrent connections (workers).
    #[arg(long, short, default_value_t = 16)]
    pub concurrency: usize,
    /// Stop after this long (e.g. 10s).
    #[arg(long, short, default_value = "10s", value_parser = humantime_duration)]
    pub duration: Duration,
    /// Stop after this many operations (in addition to --duration).
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,
    /// Resume TLS sessions with tickets (https-handshake, h3-handshake).
    #[arg(long)]
    pub resume: bool,
    /// h3-handshake: resume and send the request as 0-RTT early data.
    #[arg(long)]
    pub early_data: bool,
    /// HTTP version for https-requests, https-download and https-upload.
    #[arg(long, value_enum, default_value = "h1")]
    pub http: HttpVersion,
    /// TLS version: 1.2 or 1.3.
    #[arg(long, default_value = "1.3")]
    pub tls: String,
    /// Signature algorithms the client offers (BoringSSL list, e.g. "rsa_pss_rsae_sha256" to
    /// get an RSA certificate or "ecdsa_secp256r1_sha256" for ECDSA).
    #[arg(long)]
    pub sigalgs: Option<String>,
    /// h3-initial-flood: Initials per second over all workers.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Report this process's CPU time over the run (the server under test).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Client threads (engine: threads submitting signatures, each a current-thread runtime
    /// with its share of the concurrency, as the gateway's workers).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// sign-load: the engine, `inline`, `threads` or `remote`.
    #[arg(long, default_value = "threads")]
    pub engine: String,
    /// sign-load: PEM private key to sign with (remote: only its public half is used here).
    #[arg(long)]
    pub key_file: Option<std::path::PathBuf>,
    /// sign-load --engine remote: a key server address (repeatable).
    #[arg(long)]
    pub keyserver: Vec<SocketAddr>,
    /// sign-load --engine remote: the key servers' certificate name.
    #[arg(long, default_value = "keyserver.internal")]
    pub server_name: String,
    /// sign-load --engine remote: CA, client certificate and key for mutual TLS. The HTTPS
    /// modes present `--client-cert` (PEM chain) and `--client-key` when a gateway asks.
    #[arg(long)]
    pub ca: Option<std::path::PathBuf>,
    #[arg(long)]
    pub client_cert: Option<std::path::PathBuf>,
    #[arg(long)]
    pub client_key: Option<std::path::PathBuf>,
    /// engine: engines to measure, comma-separated (inline, threads, batch, batch:ifma512,
    /// batch:ifma256, batch:portable, gpu, gpu:SHAPE, boringssl, and replay: no signing, the
    /// ceiling of the harness and the reply path).
    #[arg(long, default_value = "boringssl,inline,threads,batch,gpu")]
    pub engines: String,
    /// engine: concurrency levels, comma-separated.
    #[arg(long, default_value = "1,8,64,512")]
    pub levels: String,
    /// HTTP/3 modes: do not ask the kernel for coalesced datagrams (UDP_GRO). With GRO, a
    /// server's GSO send crosses loopback as one buffer, as a hardware-offloading NIC would
    /// carry it; without, the kernel splits every send into datagrams on the server's CPU.
    #[arg(long)]
    pub no_gro: bool,
    /// HTTP/3 modes: send every packet with its own `sendto` instead of runs of full-size
    /// packets as one GSO buffer (UDP_SEGMENT). With GSO an upload crosses loopback as
    /// coalesced buffers, as a receiving NIC's GRO would hand them to the server.
    #[arg(long)]
    pub no_gso: bool,
    /// HTTP/3 modes: the client socket's receive buffer (SO_RCVBUF, bytes; the kernel caps it
    /// at net.core.rmem_max). 0, the default, keeps the kernel's (often 208 KiB, which drops
    /// whole 64-packet GSO trains now and then); Chromium asks for 1 MiB, quic-go for 7 MiB.
    /// With a larger buffer the client drains more per read and, without `--ack-every`,
    /// acknowledges far less often (docs/benchmarks-history.md).
    #[arg(long, default_value_t = 0)]
    pub udp_recv_buffer: usize,
    /// HTTP/3 modes: acknowledge after at most this many datagrams received. 0, the default,
    /// sends only once the socket is drained, as quiche's example client does; Chromium
    /// acknowledges every 10 packets of a bulk transfer.
    #[arg(long, default_value_t = 0)]
    pub ack_every: usize,
    /// HTTP/3 modes: the client's receive window per request stream (bytes): how far ahead of
    /// the client's reads the server may send. Chromium starts at 6 MiB; quic-go grows to 6 MiB.
    /// The window stays fixed; the connection's is twice this, at least 64 MiB.
    #[arg(long, default_value_t = 32 << 20)]
    pub stream_window: u64,
    /// h3-upload, https-upload: bytes in each request's body.
    #[arg(long, default_value_t = 100_000_000)]
    pub upload_bytes: u64,
    /// sign-load --engine remote: connections per key server.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// https-requests: a header sent with every request, `name: value` (repeatable).
    #[arg(long = "header", short = 'H')]
    pub headers: Vec<String>,
    /// https-requests: requests sent in turn instead of `--url`'s path, one JSON object per line
    /// with the status each must get (see `request_set`); a different status is an error.
    #[arg(long)]
    pub request_set: Option<std::path::PathBuf>,
    /// udp-flood: UDP payload bytes per datagram.
    #[arg(long, default_value_t = 1200)]
    pub datagram_bytes: usize,
    /// udp-flood: the gateways' QUIC-LB server IDs (hex, comma-separated), nonce length and
    /// key (32 hex digits; none: plaintext IDs).
    #[arg(long, default_value = "01")]
    pub lb_server_ids: String,
    #[arg(long, default_value_t = 8)]
    pub lb_nonce_len: usize,
    #[arg(long)]
    pub lb_key: Option<String>,
    /// udp-forward: where each datagram goes.
    #[arg(long)]
    pub forward_to: Option<SocketAddr>,
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1e3,
        "m" => n * 60.0,
        _ => return Err(format!("invalid duration unit in {s:?}; use ms, s or m")),
    };
    Ok(Duration::from_secs_f64(secs))
}

struct Target {
    addr: SocketAddr,
    host: String,
    path: String,
    connector: SslConnector,
    session: Arc<Mutex<Option<boring::ssl::SslSession>>>,
}

fn connector(
    args: &BenchArgs,
    alpn: &[u8],
    session: Arc<Mutex<Option<boring::ssl::SslSession>>>,
) -> anyhow::Result<SslConnector> {
    let mut b = SslConnector::builder(SslMethod::tls())?;
    b.set_verify(SslVerifyMode::NONE);
    let v = match args.tls.as_str() {
        "1.2" => SslVersion::TLS1_2,
        "1.3" => SslVersion::TLS1_3,
        other => bail!("--tls {other}: expected 1.2 or 1.3"),
    };
    b.set_min_proto_version(Some(v))?;
    b.set_max_proto_version(Some(v))?;
    if let Some(s) = &args.sigalgs {
        b.set_verify_algorithm_prefs(&parse_sigalgs(s)?)?;
    }
    if let (Some(cert), Some(key)) = (&args.client_cert, &args.client_key) {
        b.set_certificate_chain_file(cert)
            .with_context(|| format!("--client-cert {}", cert.display()))?;
        b.set_private_key_file(key, boring::ssl::SslFiletype::PEM)
            .with_context(|| format!("--client-key {}", key.display()))?;
    }
    b.set_alpn_protos(alpn)?;
    b.set_session_cache_mode(SslSessionCacheMode::CLIENT);
    b.set_new_session_callback(move |_ssl, sess| {
        *session.lock().unwrap() = Some(sess);
    });
    Ok(b.build())
}

fn parse_sigalgs(s: &str) -> anyhow::Result<Vec<boring::ssl::SslSignatureAlgorithm>> {
    use boring::ssl::SslSignatureAlgorithm as A;
    s.split([':', ','])
        .map(|n| {
            Ok(match n.trim() {
                "rsa_pss_rsae_sha256" => A::RSA_PSS_RSAE_SHA256,
                "rsa_pss_rsae_sha384" => A::RSA_PSS_RSAE_SHA384,
                "rsa_pkcs1_sha256" => A::RSA_PKCS1_SHA256,
                "ecdsa_secp256r1_sha256" => A::ECDSA_SECP256R1_SHA256,
                other => bail!("--sigalgs: unknown algorithm {other:?}"),
            })
        })
        .collect()
}

impl Target {
    async fn tls_connect(
        &self,
        resume: bool,
    ) -> anyhow::Result<tokio_boring::SslStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await.context("connect")?;
        tcp.set_nodelay(true)?;
        let mut cfg = self.connector.configure()?;
        cfg.set_verify_hostname(false);
        if resume {
            if let Some(s) = self.session.lock().unwrap().clone() {
                // SAFETY: the session comes from a connector built with the same settings.
                unsafe { cfg.set_session(&s)? };
            }
        }
        let s = tokio_boring::connect(cfg, &self.host, tcp)
            .await
            .map_err(|e| anyhow!("tls: {e}"))?;
        Ok(s)
    }
}

async fn one_handshake(t: &Target, resume: bool) -> anyhow::Result<bool> {
    let mut s = t.tls_connect(resume).await?;
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        t.path, t.host
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::with_capacity(1024);
    s.read_to_end(&mut buf).await.context("read")?;
    if !buf.starts_with(b"HTTP/1.1 200") {
        bail!(
            "status: {}",
            String::from_utf8_lossy(&buf[..buf.len().min(12)])
        );
    }
    // New tickets arrive through the connector's new-session callback.
    Ok(s.ssl().session_reused())
}

/// A TLS connection that says nothing after its handshake, held until the server closes it
/// or `deadline` passes.
async fn hold_connection(t: &Target, deadline: Instant) -> anyhow::Result<()> {
    let mut s = t.tls_connect(false).await?;
    let mut buf = [0u8; 1024];
    let left = deadline.saturating_duration_since(Instant::now());
    let _ = tokio::time::timeout(left, async {
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    Ok(())
}

/// A request body of `total` bytes, in 64 KiB frames sliced from one shared buffer.
fn upload_body(total: u64) -> BoxBody<Bytes, std::convert::Infallible> {
    const CHUNK: u64 = 64 * 1024;
    let chunk = Bytes::from(vec![0x5a; CHUNK as usize]);
    let frames = (0..total.div_ceil(CHUNK)).map(move |i| {
        let len = (total - i * CHUNK).min(CHUNK) as usize;
        Ok(hyper::body::Frame::data(chunk.slice(..len)))
    });
    StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

async fn request_worker(
    t: Arc<Target>,
    args: Arc<BenchArgs>,
    rec: Recorder,
    set: Option<(Arc<Vec<request_set::SetRequest>>, usize)>,
) -> anyhow::Result<()> {
    let uri: Uri = args.url.parse()?;
    let upload = args.mode == Mode::HttpsUpload;
    // With a request set: this worker's next request in it (workers start apart).
    let mut next = set.as_ref().map_or(0, |(_, first)| *first);
    'reconnect: while !rec.should_stop() {
        let s = match t.tls_connect(false).await {
            Ok(s) => s,
            Err(e) => {
                rec.error(&e);
                continue;
            }
        };
        let io = TokioIo::new(s);
        macro_rules! drive {
            ($sender:expr) => {{
                let mut sender = $sender;
                while rec.start_op() {
                    let start = Instant::now();
                    let item = set.as_ref().map(|(s, _)| {
                        next = (next + 1) % s.len();
                        &s[next]
                    });
                    let (method, body) = match item {
                        Some(r) => (
                            http::Method::from_bytes(r.method.as_bytes())?,
                            http_body_util::Full::new(r.body())
                                .map_err(|never| match never {})
                                .boxed(),
                        ),
                        None if upload => (http::Method::POST, upload_body(args.upload_bytes)),
                        None => (http::Method::GET, Empty::<Bytes>::new().boxed()),
                    };
                    let path = item.map_or(t.path.as_str(), |r| r.path.as_str());
                    // HTTP/1.1: origin-form target plus Host; HTTP/2: the full URI
                    // becomes :scheme/:authority/:path.
                    let req = match args.http {
                        HttpVersion::H1 => Request::builder()
                            .uri(path)
                            .header(http::header::HOST, t.host.as_str()),
                        HttpVersion::H2 => Request::builder().uri(
                            Uri::builder()
                                .scheme("https")
                                .authority(uri.authority().map_or(t.host.as_str(), |a| a.as_str()))
                                .path_and_query(path)
                                .build()?,
                        ),
                    }
                    .method(method);
                    let req =
                        args.headers
                            .iter()
                            .filter_map(|h| h.split_once(':'))
                            .map(|(k, v)| (k.trim(), v.trim()))
                            .chain(item.into_iter().flat_map(|r| {
                                r.headers.iter().map(|(k, v)| (k.as_str(), v.as_str()))
                            }))
                            .fold(req, |r, (k, v)| r.header(k, v))
                            .body(body)?;
                    let r = async {
                        let resp = sender.send_request(req).await?;
                        let status = resp.status();
                        let mut body = resp.into_body();
                        let mut n = 0u64;
                        while let Some(frame) = body.frame().await {
                            if let Some(d) = frame?.data_ref() {
                                n += d.len() as u64;
                            }
                        }
                        anyhow::Ok((status, n))
                    }
                    .await;
                    let wanted =
                        |st: http::StatusCode| item.map_or(st.is_success(), |r| r.accepts(st));
                    match r {
                        Ok((st, n)) if wanted(st) => {
                            rec.bytes(if upload { args.upload_bytes } else { n });
                            rec.ok(start.elapsed())
                        }
                        Ok((st, _)) => rec.error(&anyhow!("status {}", st.as_u16())),
                        Err(e) => {
                            rec.error(&e);
                            continue 'reconnect;
                        }
                    }
                }
            }};
        }
        match args.http {
            HttpVersion::H1 => {
                let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
                tokio::spawn(conn);
                drive!(sender)
            }
            HttpVersion::H2 => {
                let (sender, conn) =
                    hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                        .await?;
                tokio::spawn(conn);
                drive!(sender)
            }
        }
    }
    Ok(())
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.mode == Mode::Engine {
        engine::run(&args)?;
        return Ok(());
    }
    if args.mode == Mode::CtRsa {
        return engine::ct_rsa(&args);
    }
    if args.mode == Mode::QuicSend {
        return quic_send::run(&args);
    }
    if args.mode == Mode::PacketSeal {
        return packet_seal::run(&args);
    }
    if args.mode == Mode::UdpFlood {
        return udp::flood(&args);
    }
    if args.mode == Mode::UdpForward {
        return udp::forward(&args);
    }
    if args.mode == Mode::Sign {
        let rates = sign::measure(args.duration)?;
        for r in &rates {
            if args.json {
                println!("{}", serde_json::to_string(r)?);
            } else {
                println!(
                    "{:<28} {:<20} {:>10.0} signs/s",
                    r.implementation, r.algorithm, r.signs_per_sec
                );
            }
        }
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()?;
    let summary = if args.mode == Mode::SignLoad {
        rt.block_on(sign_load::run(args.clone()))?
    } else {
        rt.block_on(run_async(args.clone()))?
    };
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{}", summary.to_text());
    }
    Ok(())
}

/// Runs one bounded benchmark and returns its summary.
pub async fn run_async(args: BenchArgs) -> anyhow::Result<Summary> {
    let uri: Uri = args.url.parse().context("--url")?;
    if uri.scheme_str() != Some("https") {
        bail!("--url must be https://");
    }
    let host = uri
        .host()
        .ok_or_else(|| anyhow!("--url has no host"))?
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await?
        .next()
        .ok_or_else(|| anyhow!("cannot resolve {host}"))?;
    let alpn: &[u8] = match (args.mode, args.http) {
        (Mode::HttpsRequests | Mode::HttpsDownload | Mode::HttpsUpload, HttpVersion::H2) => {
            b"\x02h2"
        }
        _ => b"\x08http/1.1",
    };
    let session = Arc::new(Mutex::new(None));
    let target = Arc::new(Target {
        addr,
        host,
        path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
        connector: connector(&args, alpn, session.clone())?,
        session,
    });
    if args.mode == Mode::HttpsHandshake && args.resume {
        one_handshake(&target, true)
            .await
            .context("warm-up connection")?;
    }
    let budget = Arc::new(AtomicI64::new(args.requests.map_or(i64::MAX, |n| n as i64)));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + args.duration;
    let server_cpu = cpu::ServerCpuMeter::start(args.server_pid)?;
    let start = Instant::now();
    let recorders: Vec<Recorder> = (0..args.concurrency.max(1))
        .map(|_| Recorder::new(budget.clone(), stop.clone(), deadline))
        .collect();
    let set = match &args.request_set {
        Some(f) => Some(Arc::new(request_set::load(f)?)),
        None => None,
    };
    let args = Arc::new(args);
    let mut tasks = Vec::new();
    for (worker, rec) in recorders.iter().cloned().enumerate() {
        let t = target.clone();
        let args = args.clone();
        let set = set.clone();
        tasks.push(tokio::spawn(async move {
            match args.mode {
                Mode::HttpsHandshake => {
                    while rec.start_op() {
                        let s = Instant::now();
                        match one_handshake(&t, args.resume).await {
                            Ok(reused) if args.resume && !reused => {
                                rec.error(&anyhow!("not resumed"))
                            }
                            Ok(_) => rec.ok(s.elapsed()),
                            Err(e) => rec.error(&e),
                        }
                    }
                    Ok(())
                }
                Mode::HttpsHold => {
                    while rec.start_op() {
                        let s = Instant::now();
                        match hold_connection(&t, deadline).await {
                            Ok(()) => rec.ok(s.elapsed()),
                            Err(e) => rec.error(&e),
                        }
                    }
                    Ok(())
                }
                Mode::HttpsRequests | Mode::HttpsDownload | Mode::HttpsUpload => {
                    request_worker(t, args, rec, set.map(|s| (s, worker))).await
                }
                Mode::H3Handshake
                | Mode::H3Requests
                | Mode::H3Download
                | Mode::H3Upload
                | Mode::H3InitialFlood => {
                    let h3t = Arc::new(h3::H3Target {
                        addr: t.addr,
                        host: t.host.clone(),
                        path: t.path.clone(),
                        sigalgs: args.sigalgs.clone(),
                        gro: !args.no_gro,
                        recv_buffer: args.udp_recv_buffer,
                        ack_every: args.ack_every,
                        gso: !args.no_gso,
                        stream_window: args.stream_window,
                    });
                    h3::worker(h3t, args, rec).await
                }
                Mode::Sign
                | Mode::SignLoad
                | Mode::Engine
                | Mode::CtRsa
                | Mode::QuicSend
                | Mode::PacketSeal
                | Mode::UdpFlood
                | Mode::UdpForward => {
                    unreachable!("handled in run")
                }
            }
        }));
    }
    let progress = {
        let recs = recorders.clone();
        let stop = stop.clone();
        let quiet = args.json;
        tokio::spawn(async move {
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let (ok, err) = stats::totals(&recs);
                if !quiet {
                    eprint!(
                        "\r[{:>4.0}s] ok {ok:>9}  errors {err:>6}  {:>8}/s   ",
                        start.elapsed().as_secs_f64(),
                        ok - last
                    );
                }
                last = ok;
            }
        })
    };
    let watchdog = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline.into()).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    for t in tasks {
        // A worker's setup error counts as an error, not a crash of the whole run.
        if let Ok(Err(e)) = t.await {
            recorders[0].error(&e);
        }
    }
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    watchdog.abort();
    let _ = progress.await;
    if !args.json {
        eprintln!();
    }
    let server_cpu = cpu::ServerCpuMeter::stop(server_cpu)?;
    Ok(Summary::build(&args, &recorders, elapsed, server_cpu))
}
