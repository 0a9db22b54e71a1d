//! One QUIC connection's life: its requests served until it closes, its drain on shutdown
//! (GOAWAY, the responses delivered, then CONNECTION_CLOSE), and what is recorded of it (the
//! handshake's facts, a failed handshake's reason, the connection's statistics).

use super::bridge::serve_request;
use crate::http::pipeline::{ConnInfo, ProxyShared};
use crate::listener::conn_timers::RECHECK;
use crate::policy::admission::ConnectionCap;
use crate::tls::handshake_info::ClientCert;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_quiche::datagram_socket::QuicAuditStats;
use tokio_quiche::http3::driver::ServerH3Event;
use tokio_quiche::quic::{ConnectionShutdownBehaviour, HandshakeError, QuicCommand};
use tokio_quiche::quiche::h3::WireErrorCode;
use tokio_quiche::ServerH3Controller;

/// How long connections closed at the end of the grace period get to send their close.
pub(super) const CLOSE_FLUSH: Duration = Duration::from_millis(200);

/// How often a draining connection asks whether its responses were delivered.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// Serves one HTTP/3 connection's requests until it closes.
///
/// On `stop` it drains (RFC 9114 section 5.2): a GOAWAY tells the client to open no more
/// requests, those already taken complete, and once every response is delivered (acknowledged,
/// not merely written, since closing discards unsent stream data) the connection closes with
/// H3_NO_ERROR. A connection still in its handshake is closed at once. `close_now` closes it
/// whatever is in flight (the grace period ran out).
pub(super) async fn serve_connection(
    shared: &Arc<ProxyShared>,
    cap: &ConnectionCap,
    mut controller: ServerH3Controller,
    client: SocketAddr,
    stats: &QuicAuditStats,
    mut stop: watch::Receiver<bool>,
    mut close_now: watch::Receiver<bool>,
) {
    // Replaced by the connection's TLS facts when the driver reports the handshake, which
    // it does before any request.
    let key = shared.per_client.key(client.ip());
    let mut info = quic_conn_info(client, key, None, false, None);
    // The client's unit of `limits.max_connections_per_address`, held while it is open.
    let mut _share = None;
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
    // As on TCP: with no request in flight, the connection closes after
    // `first_request_timeout` (none yet) or the idle limit (since the last one ended),
    // whatever else arrives. QUIC's own idle timeout restarts with every packet, PINGs
    // included, so a client that pings and asks for nothing would otherwise keep its
    // connection for ever. The limit is asked again at every wake, at most
    // `conn_timers::RECHECK` apart, so pressure that arises later shortens it too.
    let mut quiet_since = tokio::time::Instant::now();
    let idle = tokio::time::sleep(RECHECK.min(quiet_limit(shared, cap, false)));
    tokio::pin!(idle);
    let mut served = false;
    loop {
        tokio::select! {
            // Events first: a request that arrives as the idle timer ends is served.
            biased;
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
                        if let Some(t) = &shared.tracer {
                            let took = std::time::Duration::from_micros(us as u64);
                            t.quic_handshake(took, server_name.as_deref(), session_resumed);
                        }
                        // Where the listener asks for client certificates, the verified one
                        // goes with every request of the connection.
                        let client_cert = match shared.client_cert_headers {
                            Some(_) => verified_client_cert(&controller).await,
                            None => None,
                        };
                        info = quic_conn_info(client, key, server_name, session_resumed, client_cert);
                        quiet_since = tokio::time::Instant::now();
                        idle.as_mut().reset(next_wake(quiet_since, quiet_limit(shared, cap, served)));
                        // The client's address is validated now (it completed the
                        // handshake), so it can be charged for the connection; an Initial's
                        // address can be forged.
                        if cap.too_fast(client.ip()) {
                            closing = close_with(&controller, WireErrorCode::ExcessiveLoad);
                        } else {
                            match cap.client_share(client.ip()) {
                                Ok(share) => _share = share,
                                Err(()) => {
                                    closing = close_with(&controller, WireErrorCode::ExcessiveLoad);
                                }
                            }
                        }
                    }
                    ServerH3Event::Headers { incoming_headers, is_in_early_data, .. } => {
                        next_stream = next_stream.max(incoming_headers.stream_id + 4);
                        served = true;
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
            Some(_) = requests.join_next(), if !requests.is_empty() => {
                if requests.is_empty() {
                    quiet_since = tokio::time::Instant::now();
                    idle.as_mut().reset(next_wake(quiet_since, quiet_limit(shared, cap, served)));
                }
            }
            _ = &mut idle, if established && requests.is_empty() && !draining && !closing => {
                // Pressure may have changed the limit since the timer was set.
                let limit = quiet_limit(shared, cap, served);
                if quiet_since.elapsed() < limit {
                    idle.as_mut().reset(next_wake(quiet_since, limit));
                    continue;
                }
                // Closing discards what the client has not acknowledged: a response written
                // but still in flight waits (checked again shortly).
                undelivered = first_undelivered(&controller, undelivered, next_stream).await;
                if undelivered < next_stream {
                    idle.as_mut().reset(tokio::time::Instant::now() + DRAIN_POLL);
                    continue;
                }
                shared
                    .metrics
                    .closed_connections
                    .with_label_values(&[
                        format!("{}/quic", shared.listener).as_str(),
                        if served { "idle" } else { "no_request" },
                    ])
                    .inc();
                close(&controller);
                // Whether or not the command was taken (the driver may be gone already),
                // this connection is ending: the timer must not fire again.
                closing = true;
            }
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

/// How long a connection may stay without a request in flight, as on TCP: the idle limit
/// once it has `served` a request, else the shorter of it and `first_request_timeout`. The
/// idle limit is `limits.idle_timeout`, or `idle_timeout_under_pressure` when shorter while
/// the QUIC listener holds more than 3/4 of its cap or the overload manager closes idle
/// connections.
fn quiet_limit(shared: &ProxyShared, cap: &ConnectionCap, served: bool) -> Duration {
    let limits = &shared.limits;
    let idle = if cap.under_pressure() {
        limits.idle_timeout.min(limits.idle_timeout_under_pressure)
    } else {
        limits.idle_timeout
    };
    if served {
        idle
    } else {
        idle.min(limits.first_request_timeout)
    }
}

/// When the idle timer next wakes: at the limit, or sooner to ask about pressure again.
fn next_wake(quiet_since: tokio::time::Instant, limit: Duration) -> tokio::time::Instant {
    (quiet_since + limit).min(tokio::time::Instant::now() + RECHECK)
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
    close_with(controller, WireErrorCode::NoError)
}

/// Closes the connection with an HTTP/3 error code (CONNECTION_CLOSE of the application
/// kind); false if the connection is already gone.
fn close_with(controller: &ServerH3Controller, code: WireErrorCode) -> bool {
    let cmd = QuicCommand::ConnectionClose(ConnectionShutdownBehaviour {
        send_application_close: true,
        error_code: code as u64,
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
fn quic_conn_info(
    client: SocketAddr,
    client_key: std::net::IpAddr,
    sni: Option<String>,
    resumed: bool,
    client_cert: Option<Arc<ClientCert>>,
) -> Arc<ConnInfo> {
    Arc::new(ConnInfo {
        client,
        client_key,
        sni,
        tls_version: "TLSv1.3",
        resumed,
        client_cert,
    })
}

/// The certificate the client presented, asked of the connection once its handshake is done
/// (a presented certificate that did not verify ended the handshake).
async fn verified_client_cert(controller: &ServerH3Controller) -> Option<Arc<ClientCert>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let ask = QuicCommand::Custom(Box::new(move |conn| {
        let _ = tx.send(conn.peer_cert().map(<[u8]>::to_vec));
    }));
    controller.cmd_sender().send(ask).ok()?;
    let der = rx.await.ok()??;
    ClientCert::from_der(&der).map(Arc::new)
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
pub(super) async fn record_closed(
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
}
