//! HTTP/3 over QUIC (tokio-quiche) into the same proxy pipeline as HTTPS.
//!
//! The QUIC listener's SSL context comes from the same certificate store, key engine and
//! ticket keys as the TCP listener beside it ([`crate::tls::QuicTls`]); no private key is in it.
//! Each request stream becomes an `http::Request` whose body streams from the QUIC stream, goes
//! through [`crate::http::pipeline::handle`], and the response streams back as HTTP/3 frames.
//!
//! Here, the socket loop ([`serve`]: tokio-quiche's listener, its settings, hooks and
//! connection-ID generator, and shutdown); in `connection`, each connection's life; in
//! `bridge`, HTTP/3 requests and responses to and from `http`'s; in `workers`, the
//! `SO_REUSEPORT` group that spreads datagrams over the workers.

mod bridge;
mod connection;
pub mod reset;
pub(crate) mod workers;

use bridge::H3_REQUEST_BODY_CHUNK;
pub(crate) use connection::record_handshake;
use connection::{record_closed, serve_connection, CLOSE_FLUSH};

use crate::config::{QuicConfig, RetryPolicy};
use crate::http::pipeline::ProxyShared;
use crate::tls::QuicTls;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_quiche::http3::settings::Http3Settings;
use tokio_quiche::metrics::DefaultMetrics;
use tokio_quiche::quic::{ConnectionHook, RetryGate, SimpleConnectionIdGenerator};
use tokio_quiche::quiche::ConnectionId;
use tokio_quiche::settings::{CertificateKind, Hooks, QuicSettings, TlsCertificatePaths};
use tokio_quiche::socket::QuicListener;
use tokio_quiche::{ConnectionIdGenerator, QuicResult};
use tokio_quiche::{ConnectionParams, ServerH3Driver};

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
    /// With `fleet_retry_keys`: the fleet's keys Retry tokens are signed with.
    pub retry_keys: Option<tokio_quiche::quic::AddressTokenKeys>,
    /// The key the listener's stateless-reset tokens are derived from.
    pub reset_key: reset::ResetKey,
}

/// Retry-token keys shared through the fleet's Redis for listener `listener`, kept in step
/// every `period` ([`crate::fleet::key_list`]); empty (the listener's own key) until the
/// first read.
pub fn fleet_retry_keys(
    store: Arc<crate::fleet::FleetStore>,
    listener: &str,
    period: Duration,
) -> tokio_quiche::quic::AddressTokenKeys {
    let keys = tokio_quiche::quic::AddressTokenKeys::default();
    let weak = Arc::downgrade(&keys);
    let apply: crate::fleet::key_list::Apply = Box::new(move |text| {
        let keys = weak.upgrade()?;
        Some(
            crate::fleet::key_list::parse_hex_keys::<32>(text).map(|list| {
                *keys.write().unwrap_or_else(|e| e.into_inner()) = list;
            }),
        )
    });
    crate::fleet::key_list::spawn_sync(store, &format!("retry:{listener}"), period, 32, apply);
    keys
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

/// `IP_FREEBIND` on a QUIC socket: tokio-quiche then receives each datagram's destination
/// address and sends every reply from it (`IP_PKTINFO`), which a listener on `0.0.0.0`
/// behind a direct-server-return balancer needs to answer from the VIP.
fn allow_nonlocal_source(socket: &std::net::UdpSocket) -> std::io::Result<()> {
    let s = socket2::SockRef::from(socket);
    match socket.local_addr()? {
        std::net::SocketAddr::V4(_) => s.set_freebind_v4(true),
        std::net::SocketAddr::V6(_) => s.set_freebind_v6(true),
    }
}

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
        retry_keys,
        reset_key,
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
    if cfg.direct_server_return {
        if let Err(e) = allow_nonlocal_source(&socket) {
            tracing::error!(error = %e, "QUIC socket: direct_server_return (IP_FREEBIND)");
            return true;
        }
    }
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
    // Outermost, so the tokens it derives reach tokio-quiche.
    let cid_generator: Arc<dyn ConnectionIdGenerator<'static>> = Arc::new(reset::ResettingIds {
        inner: cid_generator,
        key: reset_key,
    });
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
    params.address_token_keys = retry_keys;
    // Load shedding: at `limits.max_connections` open QUIC connections, or from a client the
    // listener's access list turns away, new attempts are refused at once (CONNECTION_REFUSED)
    // before any handshake work, and counted.
    let cap = crate::policy::admission::ConnectionCap::new(
        &shared.metrics,
        &format!("{}/quic", shared.listener),
        shared.limits.max_connections,
        shared.access.clone(),
        shared.per_client.clone(),
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
        let (shared, cap) = (shared.clone(), cap.clone());
        let (stop, close_now) = (stop.clone(), close_now.clone());
        connections.spawn(async move {
            serve_connection(&shared, &cap, controller, client, &stats, stop, close_now).await;
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
