//! HTTP/3 over QUIC (tokio-quiche) into the same proxy pipeline as HTTPS.
//!
//! The QUIC listener's SSL context comes from the same certificate store, key engine and
//! ticket keys as the TCP listener beside it ([`crate::tls::QuicTls`]); no private key is in it.
//! Each request stream becomes an `http::Request` whose body streams from the QUIC stream, goes
//! through [`crate::http::pipeline::handle`], and the response streams back as HTTP/3 frames.

pub(crate) mod workers;

use crate::body::{client_body, BoxError, ClientBody};
use crate::config::{QuicConfig, RetryPolicy};
use crate::http::pipeline::{self, ConnInfo, ProxyShared};
use crate::tls::QuicTls;
use bytes::Bytes;
use futures_util::SinkExt;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_quiche::datagram_socket::QuicAuditStats;
use tokio_quiche::http3::driver::{
    InboundFrame, IncomingH3Headers, OutboundFrame, OutboundFrameSender, ServerH3Event,
};
use tokio_quiche::http3::settings::Http3Settings;
use tokio_quiche::metrics::DefaultMetrics;
use tokio_quiche::quic::{
    ConnectionHook, ConnectionShutdownBehaviour, HandshakeError, QuicCommand, RetryGate,
    SimpleConnectionIdGenerator,
};
use tokio_quiche::quiche::h3::{Header, NameValue};
use tokio_quiche::quiche::ConnectionId;
use tokio_quiche::settings::{CertificateKind, Hooks, QuicSettings, TlsCertificatePaths};
use tokio_quiche::socket::QuicListener;
use tokio_quiche::{ConnectionIdGenerator, QuicResult};
use tokio_quiche::{ConnectionParams, ServerH3Controller, ServerH3Driver};

/// The most request-body bytes the HTTP/3 driver takes out of quiche in one read, each read
/// becoming one body chunk for the upstream. tokio-quiche's default, 16 KiB, split a 64 KB GRO
/// train of upload into four chunks, four channel sends and four upstream writes; 64 KiB
/// matches the HTTPS side's read buffer (`RecvBuffer`). A read is sized to what is readable,
/// so small bodies still allocate little. Uploads A/B on the Zen 3 VM (docs/benchmarks-history.md,
/// 2026-11-25): 1.55–1.96 CPU s/GB at 16 KiB, 1.36–1.55 at 64 KiB, 1.26–1.39 at 256 KiB.
const H3_REQUEST_BODY_CHUNK: usize = 64 * 1024;

struct Hook {
    tls: QuicTls,
}

impl ConnectionHook for Hook {
    fn create_custom_ssl_context_builder(
        &self,
        _: TlsCertificatePaths<'_>,
    ) -> Option<boring::ssl::SslContextBuilder> {
        match self.tls.front_builder() {
            Ok(b) => Some(b),
            Err(e) => {
                tracing::error!(error = %e, "QUIC TLS context");
                None
            }
        }
    }
}

/// Connection IDs that carry this server's QUIC-LB server ID.
struct QuicLbIds {
    encoder: quiclb::Encoder,
    decoder: quiclb::Decoder,
    server_id: Vec<u8>,
}

impl ConnectionIdGenerator<'static> for QuicLbIds {
    fn new_connection_id(&self) -> ConnectionId<'static> {
        ConnectionId::from_vec(self.encoder.generate())
    }

    fn verify_connection_id(&self, cid: &ConnectionId<'_>) -> QuicResult<()> {
        match self.decoder.server_id(cid) {
            Some(sid) if sid == self.server_id => Ok(()),
            _ => Err("connection ID does not carry this server's QUIC-LB server ID".into()),
        }
    }
}

fn cid_generator(cfg: &QuicConfig) -> Arc<dyn ConnectionIdGenerator<'static>> {
    if let Some(Ok((lb, server_id))) = cfg.lb.as_ref().map(|lb| lb.build()) {
        // tokio-quiche routes short-header packets by 20-byte connection IDs.
        if let (Ok(encoder), Ok(decoder)) = (
            quiclb::Encoder::new(lb.clone(), &server_id)
                .and_then(|e| e.padded_to(quiclb::MAX_CID_LEN)),
            quiclb::Decoder::new(vec![lb]),
        ) {
            return Arc::new(QuicLbIds {
                encoder,
                decoder,
                server_id,
            });
        }
    }
    Arc::new(SimpleConnectionIdGenerator)
}

/// One worker's share of a QUIC listener.
pub struct QuicWorker {
    /// The worker's socket: index `worker` of the listener's reuseport group.
    pub socket: std::net::UdpSocket,
    pub worker: usize,
    /// How many workers serve the listener (each issues connection IDs steering to itself).
    pub workers: usize,
    pub tls: QuicTls,
    pub cfg: QuicConfig,
    /// The listener's `tls.handshake_timeout`: a QUIC handshake must finish within it too.
    pub handshake_timeout: Duration,
    /// The listener's Retry gate, shared by its workers so the pending-handshake threshold
    /// is the listener's.
    pub retry_gate: Option<Arc<RetryGate>>,
}

/// The Retry gate `cfg` asks for. With `retry = "never"` it still counts the pending
/// handshakes (and never sends a Retry), so `max_pending_handshakes` holds under every policy.
pub fn retry_gate(cfg: &QuicConfig) -> Option<Arc<RetryGate>> {
    Some(match cfg.retry {
        RetryPolicy::Never => RetryGate::when_pending_above(usize::MAX),
        RetryPolicy::Always => RetryGate::always(),
        RetryPolicy::WhenBusy => RetryGate::when_pending_above(cfg.retry_pending_above),
    })
}

/// Bytes a connection sends before path MTU discovery probes its path: more than a handshake
/// and a small response, so short connections never pay for a probe and its acknowledgement
/// (about 35 µs of server CPU each, docs/benchmarks-history.md) and longer ones are probed early on.
const PMTUD_MIN_SENT_BYTES: u64 = 32 * 1024;

/// Serves HTTP/3 on one worker's socket of a listener until `stop` turns true. Runs on the
/// calling runtime. On `stop` the open connections drain (see [`serve_connection`]) for up to
/// `grace`; returns false when some were still open then and had to be closed.
pub async fn serve(
    q: QuicWorker,
    shared: Arc<ProxyShared>,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
) -> bool {
    let QuicWorker {
        socket,
        worker,
        workers,
        tls,
        cfg,
        handshake_timeout,
        retry_gate,
    } = q;
    use futures_util::StreamExt;
    let mut settings = QuicSettings::default();
    settings.alpn = vec![b"h3".to_vec()];
    settings.enable_pacing = cfg.pacing;
    settings.max_idle_timeout = Some(shared.limits.idle_timeout);
    // A client that stalls its handshake is dropped then, not at the idle timeout.
    settings.handshake_timeout = Some(handshake_timeout);
    settings.cc_algorithm = cfg.congestion_control.clone();
    settings.initial_congestion_window_packets = cfg.initial_congestion_window;
    settings.max_send_udp_payload_size = cfg.max_udp_payload();
    settings.discover_path_mtu = cfg.pmtu_discovery;
    settings.pmtud_min_sent_bytes = PMTUD_MIN_SENT_BYTES;
    settings.ack_eliciting_threshold = cfg.ack_eliciting_threshold;
    // quiche probes no higher than the max_udp_payload_size transport parameter it sends (a
    // path is taken to carry the same size both ways), so the server also takes datagrams
    // up to the ceiling.
    settings.max_recv_udp_payload_size = cfg.max_udp_payload();
    settings.initial_max_data = cfg.initial_max_data;
    settings.initial_max_stream_data_bidi_local = cfg.initial_max_stream_data;
    settings.initial_max_stream_data_bidi_remote = cfg.initial_max_stream_data;
    settings.initial_max_stream_data_uni = cfg.initial_max_stream_data;
    settings.initial_max_streams_bidi = cfg.max_concurrent_streams;
    settings.disable_client_ip_validation = cfg.retry == RetryPolicy::Never;
    settings.enable_early_data = cfg.early_data;
    let socket = match tokio::net::UdpSocket::from_std(socket) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "QUIC socket");
            return true;
        }
    };
    let cid_generator: Arc<dyn ConnectionIdGenerator<'static>> = if workers > 1 {
        Arc::new(crate::listener::quic::workers::WorkerIds {
            inner: cid_generator(&cfg),
            worker,
            workers,
        })
    } else {
        cid_generator(&cfg)
    };
    let worker = worker.to_string();
    let mut listener = QuicListener {
        socket,
        cid_generator,
        capabilities: Default::default(),
    };
    // GSO, GRO and the like, where the kernel supports them.
    listener.apply_max_capabilities();
    let hooks = Hooks {
        connection_hook: Some(Arc::new(Hook { tls })),
    };
    // tokio-quiche consults the hook only when certificate paths are set; ours come from the
    // hook, so these names are never opened.
    let mut params = ConnectionParams::new_server(
        settings,
        TlsCertificatePaths {
            cert: "(from rampart's certificate store)",
            private_key: "(held by the key engine)",
            kind: CertificateKind::X509,
        },
        hooks,
    );
    params.retry_gate = retry_gate.clone();
    // Load shedding: at `limits.max_connections` open QUIC connections, or from a client the
    // listener's access list turns away, new attempts are refused at once (CONNECTION_REFUSED)
    // before any handshake work, and counted.
    let cap = crate::policy::admission::ConnectionCap::new(
        &shared.metrics,
        &format!("{}/quic", shared.listener),
        shared.limits.max_connections,
        shared.access.clone(),
        shared.overload.clone(),
    );
    // While shutting down, new attempts are refused the same way (and not counted as shed).
    let shutting_down = Arc::new(AtomicBool::new(false));
    // Pending handshakes are bounded too (each holds a connection's state, ~90 KB, until it
    // completes or `tls.handshake_timeout` passes): past `max_pending_handshakes` on this
    // listener, even a client with a valid Retry token is refused, and counted as shed.
    let pending = retry_gate.clone();
    let max_pending = cfg.max_pending_handshakes;
    params.refuse_new_connections = Some(Arc::new({
        let cap = cap.clone();
        let shutting_down = shutting_down.clone();
        move |peer: std::net::SocketAddr| {
            if shutting_down.load(Ordering::Relaxed) || cap.refuse(peer.ip()) {
                return true;
            }
            let too_many = pending.as_ref().is_some_and(|g| g.pending() >= max_pending);
            if too_many {
                cap.count_rejected();
            }
            too_many
        }
    }));
    let mut streams =
        match tokio_quiche::listen_with_capabilities([listener], params, DefaultMetrics) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "QUIC listener failed to start");
                return true;
            }
        };
    let mut conns = streams.remove(0);
    // Connections run as tasks of this set, so shutdown can wait for them to drain.
    let mut connections = JoinSet::new();
    let (close_now_tx, close_now) = watch::channel(false);
    loop {
        let next = tokio::select! {
            c = conns.next() => c,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = stop.wait_for(|s| *s) => break,
        };
        let Some(conn) = next else { break };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = ?e, "QUIC accept error");
                continue;
            }
        };
        shared
            .metrics
            .quic_connections
            .with_label_values(&[&shared.listener, &worker])
            .inc();
        let client = conn.peer_addr();
        let mut h3_settings = Http3Settings::default();
        h3_settings.report_connection_established = true;
        h3_settings.max_recv_body_buf_size = Some(H3_REQUEST_BODY_CHUNK);
        let (driver, controller) = ServerH3Driver::new(h3_settings);
        let stats = conn.audit_log_stats();
        let conn_stats = conn.stats().clone();
        conn.start(driver);
        let open = cap.open();
        let shared = shared.clone();
        let (stop, close_now) = (stop.clone(), close_now.clone());
        connections.spawn(async move {
            serve_connection(&shared, controller, client, &stats, stop, close_now).await;
            drop(open);
            record_closed(&shared, &conn_stats).await;
        });
    }
    // Shutdown: new connection attempts are refused from here on (CONNECTION_REFUSED, so a
    // client turns elsewhere at once). The accept stream stays open while connections drain:
    // without it the router would drop new Initials unanswered. Each open connection saw
    // `stop` and sent its GOAWAY.
    shutting_down.store(true, Ordering::Relaxed);
    if tokio::time::timeout(grace, all_ended(&mut connections))
        .await
        .is_ok()
    {
        return true;
    }
    // Out of time: close what is left (CONNECTION_CLOSE, H3_NO_ERROR) rather than go silent,
    // and give the closes a moment to leave.
    let _ = close_now_tx.send(true);
    let _ = tokio::time::timeout(CLOSE_FLUSH, all_ended(&mut connections)).await;
    drop(conns);
    false
}

/// Waits until every task of the set has ended.
async fn all_ended(tasks: &mut JoinSet<()>) {
    while tasks.join_next().await.is_some() {}
}

/// How long connections closed at the end of the grace period get to send their close.
const CLOSE_FLUSH: Duration = Duration::from_millis(200);

/// How often a draining connection asks whether its responses were delivered.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// Serves one HTTP/3 connection's requests until it closes.
///
/// On `stop` it drains (RFC 9114 section 5.2): a GOAWAY tells the client to open no more
/// requests, those already taken complete, and once every response is delivered (acknowledged,
/// not merely written, since closing discards unsent stream data) the connection closes with
/// H3_NO_ERROR. A connection still in its handshake is closed at once. `close_now` closes it
/// whatever is in flight (the grace period ran out).
async fn serve_connection(
    shared: &Arc<ProxyShared>,
    mut controller: ServerH3Controller,
    client: SocketAddr,
    stats: &QuicAuditStats,
    mut stop: watch::Receiver<bool>,
    mut close_now: watch::Receiver<bool>,
) {
    // Replaced by the connection's TLS facts when the driver reports the handshake, which
    // it does before any request.
    let mut info = quic_conn_info(client, None, false);
    let mut established = false;
    let mut requests = JoinSet::new();
    // Request streams are client-initiated bidirectional: 0, 4, 8, ... While draining,
    // `undelivered` is the lowest whose response may not have arrived yet.
    let mut next_stream = 0;
    let mut undelivered = 0;
    let mut draining = false;
    let mut closing = false;
    let mut drain_poll = tokio::time::interval(DRAIN_POLL);
    drain_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            ev = controller.event_receiver_mut().recv() => {
                let Some(ev) = ev else { break };
                match ev {
                    ServerH3Event::ConnectionEstablished { server_name, session_resumed } => {
                        established = true;
                        let us = stats.transport_handshake_duration_us().max(0);
                        shared
                            .metrics
                            .handshake_seconds
                            .with_label_values(&[
                                shared.listener.as_str(),
                                "quic",
                                if session_resumed { "true" } else { "false" },
                            ])
                            .observe(us as f64 / 1e6);
                        info = quic_conn_info(client, server_name, session_resumed);
                    }
                    ServerH3Event::Headers { incoming_headers, is_in_early_data, .. } => {
                        next_stream = next_stream.max(incoming_headers.stream_id + 4);
                        let streams = crate::ops::metrics::GaugeGuard::new(
                            shared.metrics.quic_open_streams.with_label_values(&[&shared.listener]),
                        );
                        let req = serve_request(
                            shared.clone(),
                            info.clone(),
                            incoming_headers,
                            *is_in_early_data,
                        );
                        requests.spawn(async move {
                            req.await;
                            drop(streams);
                        });
                    }
                    _ => {}
                }
            }
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
            _ = turned_true(&mut stop), if !draining => {
                draining = true;
                if established {
                    controller.send_goaway();
                } else {
                    closing = close(&controller);
                }
            }
            _ = drain_poll.tick(), if draining && !closing && requests.is_empty() => {
                undelivered = first_undelivered(&controller, undelivered, next_stream).await;
                if undelivered >= next_stream {
                    closing = close(&controller);
                }
            }
            _ = turned_true(&mut close_now), if !closing => closing = close(&controller),
        }
    }
    // The driver is gone; requests still running have nowhere to answer.
    requests.abort_all();
    if !established {
        let timed_out = stats.connection_close_reason().as_ref().is_some_and(|e| {
            matches!(e.downcast_ref(), Some(HandshakeError::Timeout))
                || e.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut)
        });
        let reason = handshake_failure(
            timed_out,
            stats.sent_conn_close_transport_error_code(),
            stats.recvd_conn_close_transport_error_code(),
        );
        shared
            .metrics
            .handshake_errors
            .with_label_values(&[&format!("{}/quic", shared.listener), reason])
            .inc();
    }
}

/// Why a QUIC connection ended before its handshake completed, as the TCP path labels it:
/// `timeout` (the listener's handshake timeout), `tls` (a TLS alert either way: QUIC's
/// CRYPTO_ERROR codes 0x100-0x1ff), or `io` (anything else, e.g. the client gave up).
fn handshake_failure(timed_out: bool, sent: i64, received: i64) -> &'static str {
    let crypto_error = |code: i64| (0x100..0x200).contains(&code);
    if timed_out {
        "timeout"
    } else if crypto_error(sent) || crypto_error(received) {
        "tls"
    } else {
        "io"
    }
}

/// Waits until the flag is true (or its sender is gone).
async fn turned_true(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|v| *v).await;
}

/// Closes a connection with H3_NO_ERROR; true once asked (false: the driver is gone).
fn close(controller: &ServerH3Controller) -> bool {
    let cmd = QuicCommand::ConnectionClose(ConnectionShutdownBehaviour {
        send_application_close: true,
        error_code: tokio_quiche::quiche::h3::WireErrorCode::NoError as u64,
        reason: Vec::new(),
    });
    controller.cmd_sender().send(cmd).is_ok()
}

/// The lowest request stream in `from..until` whose response the client has not yet
/// acknowledged in full (`until` when all have), asked of the connection itself.
async fn first_undelivered(controller: &ServerH3Controller, from: u64, until: u64) -> u64 {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let ask = QuicCommand::Custom(Box::new(move |conn| {
        let mut id = from;
        while id < until && conn.stream_send_complete(id) {
            id += 4;
        }
        let _ = tx.send(id);
    }));
    if controller.cmd_sender().send(ask).is_err() {
        return until;
    }
    // No answer: the connection went away, with nothing left to deliver.
    rx.await.unwrap_or(until)
}

/// What the access log and the proxy know of a QUIC connection (always TLS 1.3).
fn quic_conn_info(client: SocketAddr, sni: Option<String>, resumed: bool) -> Arc<ConnInfo> {
    Arc::new(ConnInfo {
        client,
        sni,
        tls_version: "TLSv1.3",
        resumed,
    })
}

/// A request body arriving on a QUIC stream.
struct H3RequestBody {
    rx: Option<mpsc::Receiver<InboundFrame>>,
    /// What the request's `content-length` still promises: a body that runs past it or ends
    /// short of it is malformed (RFC 9114 §4.1.2), an error rather than a body passed on.
    remaining: Option<u64>,
}

impl H3RequestBody {
    /// The bytes of `data` against the promised length; `fin`: the body ends with them.
    fn count(&mut self, len: usize, fin: bool) -> Result<(), BoxError> {
        let Some(left) = self.remaining.as_mut() else {
            return Ok(());
        };
        *left = left
            .checked_sub(len as u64)
            .ok_or("HTTP/3 request body longer than its content-length")?;
        if fin && *left != 0 {
            return Err("HTTP/3 request body shorter than its content-length".into());
        }
        Ok(())
    }
}

/// A request's `content-length`, if it has one: one decimal value (repeats must agree).
fn declared_length(headers: &[Header]) -> Result<Option<u64>, &'static str> {
    let mut declared = None;
    for h in headers.iter().filter(|h| h.name() == b"content-length") {
        let v = std::str::from_utf8(h.value())
            .ok()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or("bad content-length")?;
        if declared.is_some_and(|d| d != v) {
            return Err("conflicting content-length values");
        }
        declared = Some(v);
    }
    Ok(declared)
}

impl Body for H3RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            let Some(rx) = self.rx.as_mut() else {
                return Poll::Ready(None);
            };
            match rx.poll_recv(cx) {
                Poll::Ready(Some(InboundFrame::Body(data, fin))) => {
                    if fin {
                        self.rx = None;
                    }
                    if let Err(e) = self.count(data.len(), fin) {
                        self.rx = None;
                        return Poll::Ready(Some(Err(e)));
                    }
                    if data.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data.freeze()))));
                }
                Poll::Ready(Some(InboundFrame::Trailers(list))) => {
                    return Poll::Ready(Some(trailer_map(list).map(Frame::trailers)));
                }
                Poll::Ready(Some(InboundFrame::Datagram(_))) => continue,
                Poll::Ready(None) => {
                    // The driver let go of the stream before its FIN: the client reset it or
                    // the connection closed mid-body. An error, so that the upstream request
                    // is aborted instead of ended as if the body were whole.
                    self.rx = None;
                    return Poll::Ready(Some(Err(
                        "HTTP/3 request stream ended before its body's end".into(),
                    )));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// A request's trailer section as a header map. A pseudo-header or an invalid field makes the
/// request malformed (RFC 9114 §4.1.2); the error aborts the request upstream.
fn trailer_map(list: Vec<Header>) -> Result<http::HeaderMap, BoxError> {
    let mut map = http::HeaderMap::with_capacity(list.len());
    for h in list {
        if h.name().starts_with(b":") {
            return Err("pseudo-header in an HTTP/3 trailer section".into());
        }
        let name = http::HeaderName::from_bytes(h.name())?;
        let value = http::HeaderValue::from_bytes(h.value())?;
        map.append(name, value);
    }
    Ok(map)
}

/// Builds the `http::Request` of an HTTP/3 request stream (RFC 9114 §4.3.1).
fn to_request(headers: Vec<Header>, body: ClientBody) -> Result<Request<ClientBody>, &'static str> {
    let (mut method, mut scheme, mut authority, mut path) = (None, None, None, None);
    let mut map = HeaderMap::with_capacity(headers.len());
    for h in headers {
        match h.name() {
            b":method" => method = Some(Method::from_bytes(h.value()).map_err(|_| "bad :method")?),
            b":scheme" => scheme = Some(String::from_utf8_lossy(h.value()).into_owned()),
            b":authority" => authority = Some(String::from_utf8_lossy(h.value()).into_owned()),
            b":path" => path = Some(String::from_utf8_lossy(h.value()).into_owned()),
            n if n.starts_with(b":") => return Err("unknown pseudo-header"),
            // RFC 9114 §4.2: field names are lowercase, and connection-specific fields (TE
            // other than "trailers" among them) make a message malformed.
            n if n.iter().any(u8::is_ascii_uppercase) => return Err("uppercase header name"),
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => return Err("connection-specific header"),
            b"te" if h.value() != b"trailers" => return Err("TE other than trailers"),
            n => {
                let name = HeaderName::from_bytes(n).map_err(|_| "bad header name")?;
                let value = HeaderValue::from_bytes(h.value()).map_err(|_| "bad header value")?;
                map.append(name, value);
            }
        }
    }
    let method = method.ok_or("missing :method")?;
    let path = path.ok_or("missing :path")?;
    let authority = authority
        .or_else(|| {
            map.get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_string)
        })
        .ok_or("missing :authority")?;
    let uri = format!(
        "{}://{authority}{path}",
        scheme.as_deref().unwrap_or("https")
    );
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .version(Version::HTTP_3)
        .body(body)
        .map_err(|_| "bad request target")?;
    *req.headers_mut() = map;
    Ok(req)
}

async fn respond_local(send: &mut OutboundFrameSender, status: &'static [u8], body: &'static [u8]) {
    let _ = send
        .send(OutboundFrame::Headers(
            vec![Header::new(b":status", status)],
            None,
        ))
        .await;
    let _ = send
        .send(OutboundFrame::Body(Bytes::from_static(body), true))
        .await;
}

async fn serve_request(
    shared: Arc<ProxyShared>,
    info: Arc<ConnInfo>,
    incoming: IncomingH3Headers,
    early_data: bool,
) {
    let IncomingH3Headers {
        headers,
        mut send,
        recv,
        read_fin,
        ..
    } = incoming;
    let declared = match declared_length(&headers) {
        Ok(Some(n)) if n > 0 && read_fin => Err("content-length promises a body that is absent"),
        other => other,
    };
    let mut req = match declared.and_then(|remaining| {
        let body = H3RequestBody {
            rx: (!read_fin).then_some(recv),
            remaining,
        };
        to_request(headers, client_body(body))
    }) {
        Ok(r) => r,
        Err(why) => {
            tracing::debug!(why, "malformed HTTP/3 request");
            respond_local(&mut send, b"400", b"malformed request\n").await;
            return;
        }
    };
    if early_data {
        // The proxy answers what is unsafe to replay with 425 and marks the rest upstream.
        req.extensions_mut().insert(pipeline::InEarlyData);
    }
    let Ok(resp) = pipeline::handle(shared, info, req).await;
    let (parts, mut body) = resp.into_parts();
    let mut out = Vec::with_capacity(parts.headers.len() + 1);
    out.push(Header::new(b":status", parts.status.as_str().as_bytes()));
    for (name, value) in &parts.headers {
        // Connection-specific fields are not allowed in HTTP/3 (RFC 9114 §4.2).
        if name == http::header::CONNECTION
            || name == http::header::TRANSFER_ENCODING
            || name.as_str() == "keep-alive"
        {
            continue;
        }
        out.push(Header::new(name.as_str().as_bytes(), value.as_bytes()));
    }
    if send.send(OutboundFrame::Headers(out, None)).await.is_err() {
        return;
    }
    stream_body(&mut send, &mut body).await;
}

/// Streams a response body as HTTP/3 DATA frames (and trailers), then ends the stream.
async fn stream_body<B>(send: &mut OutboundFrameSender, body: &mut B)
where
    B: Body<Data = Bytes> + Unpin,
{
    loop {
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if send.send(OutboundFrame::Body(data, false)).await.is_err() {
                        return;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        let t = trailers
                            .iter()
                            .map(|(n, v)| Header::new(n.as_str().as_bytes(), v.as_bytes()))
                            .collect();
                        let _ = send.send(OutboundFrame::Trailers(t, None)).await;
                        return;
                    }
                }
            },
            Some(Err(_)) => {
                let _ = send.send(OutboundFrame::PeerStreamError).await;
                return;
            }
            None => {
                let _ = send.send(OutboundFrame::Body(Bytes::new(), true)).await;
                return;
            }
        }
    }
}

/// Records a completed QUIC handshake (called from the SSL info callback): TLS facts in
/// `rampart_tls_handshakes_total{protocol="quic"}`, QUIC version, resumption and the 0-RTT
/// outcome in `rampart_quic_handshakes_total`.
pub(crate) fn record_handshake(
    m: &crate::ops::metrics::Metrics,
    listener: &str,
    ssl: &boring::ssl::SslRef,
) {
    let resumed = if ssl.session_reused() {
        "true"
    } else {
        "false"
    };
    let sigalg =
        crate::tls::handshake_info::signature_algorithm(ssl).map_or("none", |a| a.as_str());
    let cipher = ssl.current_cipher().map_or("none", |c| c.name());
    m.handshakes
        .with_label_values(&[listener, "quic", ssl.version_str(), cipher, sigalg, resumed])
        .inc();
    // quiche speaks QUIC v1 only; other versions get Version Negotiation before a handshake.
    m.quic_handshakes
        .with_label_values(&[listener, "1", resumed, early_data_reason(ssl)])
        .inc();
}

/// BoringSSL's reason for accepting or not accepting 0-RTT on this connection.
fn early_data_reason(ssl: &boring::ssl::SslRef) -> &'static str {
    use foreign_types::ForeignTypeRef;
    // SAFETY: `ssl` is a live SSL for the duration of this call. SSL_get_early_data_reason reads
    // a field; SSL_early_data_reason_string returns a pointer to a static C string (or null).
    unsafe {
        let reason = boring_sys::SSL_get_early_data_reason(ssl.as_ptr());
        let s = boring_sys::SSL_early_data_reason_string(reason);
        if s.is_null() {
            return "unknown";
        }
        std::ffi::CStr::from_ptr(s).to_str().unwrap_or("unknown")
    }
}

/// Adds a closed connection's packet counts, extra paths and path MTU. tokio-quiche writes the final
/// statistics as the connection closes, around when its H3 driver goes away: look a few times.
async fn record_closed(
    shared: &ProxyShared,
    stats: &std::sync::Mutex<tokio_quiche::quic::QuicConnectionStats>,
) {
    for _ in 0..20 {
        let s = stats
            .lock()
            .map(|g| (g.stats.clone(), g.path_stats.as_ref().map(|p| p.pmtu)))
            .ok();
        if let Some((s, pmtu)) = s.filter(|(s, _)| s.sent > 0) {
            let m = &shared.metrics;
            let l = shared.listener.as_str();
            for (kind, n) in [
                ("sent", s.sent),
                ("received", s.recv),
                ("lost", s.lost),
                ("spurious_lost", s.spurious_lost),
                ("retransmitted", s.retrans),
            ] {
                m.quic_packets
                    .with_label_values(&[l, kind])
                    .inc_by(n as u64);
            }
            m.quic_path_migrations
                .with_label_values(&[l])
                .inc_by(s.paths_count.saturating_sub(1) as u64);
            if let Some(pmtu) = pmtu {
                m.quic_path_mtu.with_label_values(&[l]).observe(pmtu as f64);
            }
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_quic_handshakes_are_labelled_like_tcp_ones() {
        assert_eq!(handshake_failure(true, 0x0c, 0), "timeout");
        // A TLS alert (here handshake_failure, 40) sent or received as CRYPTO_ERROR.
        assert_eq!(handshake_failure(false, 0x100 + 40, 0), "tls");
        assert_eq!(handshake_failure(false, 0, 0x100 + 40), "tls");
        assert_eq!(handshake_failure(false, 0x0a, 0), "io");
        assert_eq!(handshake_failure(false, -1, -1), "io");
    }

    #[test]
    fn trailer_sections_become_header_maps_and_pseudo_headers_are_refused() {
        let map = trailer_map(vec![
            Header::new(b"grpc-status", b"0"),
            Header::new(b"x-sum", b"a"),
            Header::new(b"x-sum", b"b"),
        ])
        .unwrap();
        assert_eq!(map["grpc-status"], "0");
        assert_eq!(map.get_all("x-sum").iter().count(), 2);
        assert!(trailer_map(vec![Header::new(b":status", b"200")]).is_err());
        assert!(trailer_map(vec![Header::new(b"bad name", b"v")]).is_err());
        assert!(trailer_map(vec![Header::new(b"x", b"line\nbreak")]).is_err());
    }

    #[test]
    fn connection_specific_and_uppercase_fields_make_a_request_malformed() {
        let req = |extra: Header| {
            let mut h = vec![
                Header::new(b":method", b"GET"),
                Header::new(b":scheme", b"https"),
                Header::new(b":authority", b"localhost"),
                Header::new(b":path", b"/"),
            ];
            h.push(extra);
            to_request(h, client_body(http_body_util::Empty::new()))
        };
        assert!(req(Header::new(b"te", b"trailers")).is_ok());
        assert!(req(Header::new(b"x-fine", b"1")).is_ok());
        for (name, value) in [
            (&b"connection"[..], &b"close"[..]),
            (b"keep-alive", b"timeout=5"),
            (b"proxy-connection", b"keep-alive"),
            (b"transfer-encoding", b"chunked"),
            (b"upgrade", b"websocket"),
            (b"te", b"gzip"),
            (b"X-Upper", b"1"),
        ] {
            assert!(req(Header::new(name, value)).is_err(), "{name:?}");
        }
    }

    #[test]
    fn a_request_body_must_match_its_content_length() {
        let cl = |v: &[u8]| vec![Header::new(b"content-length", v)];
        assert_eq!(declared_length(&[]), Ok(None));
        assert_eq!(declared_length(&cl(b"1000")), Ok(Some(1000)));
        for bad in [
            &b""[..],
            b"-1",
            b"+5",
            b"1e3",
            b" 5",
            b"99999999999999999999999",
        ] {
            assert!(declared_length(&cl(bad)).is_err(), "{bad:?}");
        }
        let two = |a: &'static [u8], b: &'static [u8]| {
            vec![
                Header::new(b"content-length", a),
                Header::new(b"content-length", b),
            ]
        };
        assert_eq!(declared_length(&two(b"7", b"7")), Ok(Some(7)));
        assert!(declared_length(&two(b"7", b"8")).is_err());

        let body = |remaining| H3RequestBody {
            rx: None,
            remaining,
        };
        let mut exact = body(Some(10));
        assert!(exact.count(4, false).is_ok() && exact.count(6, true).is_ok());
        let mut short = body(Some(10));
        assert!(short.count(4, false).is_ok() && short.count(0, true).is_err());
        let mut long = body(Some(10));
        assert!(long.count(11, false).is_err());
        let mut unbounded = body(None);
        assert!(unbounded.count(1 << 40, true).is_ok());
    }
}
