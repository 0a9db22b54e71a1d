//! The TLS-over-TCP listener: accept, handshake (bounded in time), then HTTP/1.1 or HTTP/2
//! by ALPN into the proxy pipeline. A bad connection only ever closes itself.

use crate::body::client_body;
use crate::http::pipeline::{self, ConnInfo, ProxyShared};
use crate::listener::conn_timers::{Activity, IdleLimits, IdleSet};
use crate::listener::h2_flood;
use crate::listener::proxy_protocol;
use crate::listener::recv_buffer::{ReadAvailable, RecvBuffer};
use crate::listener::send_coalescer;
use crate::ops::metrics::GaugeGuard;
use crate::policy::admission::ConnectionCap;
use crate::tls::handshake_info;
use boring::ssl::{NameType, SslAcceptor};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

pub struct TcpListenerTask {
    pub listener: TcpListener,
    pub acceptor: Arc<SslAcceptor>,
    pub shared: Arc<ProxyShared>,
    pub handshake_timeout: Duration,
}

/// Fails if another process already listens on `addr`. Worker sockets share their port with
/// SO_REUSEPORT, which would otherwise let a second gateway started by mistake silently take
/// half of the connections. (Port 0 asks for a fresh port and needs no check.)
pub fn ensure_port_free(addr: SocketAddr) -> std::io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let probe = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into())
}

/// Binds a non-blocking listening socket with a deep backlog, SO_REUSEADDR and SO_REUSEPORT
/// (so every worker can hold its own socket on the same port).
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(4096)?;
    Ok(sock.into())
}

/// Descriptors kept back from client connections: listening sockets, upstream health
/// checks, log files, the admin listener.
const RESERVED_DESCRIPTORS: u64 = 256;

/// Raises this process's open-descriptor limit to its hard limit (as Go's runtime and nginx's
/// `worker_rlimit_nofile` do), once, and returns how many TCP client connections fit in it:
/// each may hold its own descriptor and one upstream connection's. A listener takes no more
/// TCP connections than this (whatever its `max_connections`), so at the cap connections are
/// shed on purpose, with descriptors to spare, instead of accept failing with EMFILE for
/// every client alike. QUIC connections share their listener's socket and are not bounded
/// by it.
pub fn connection_budget() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(raise_descriptor_limit)
}

fn raise_descriptor_limit() -> usize {
    // SAFETY: getrlimit and setrlimit only read and write the `rlimit` struct passed by
    // pointer, which lives on this stack frame for both calls.
    let limit = unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return usize::MAX;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
        r.rlim_cur
    };
    if limit == libc::RLIM_INFINITY {
        return usize::MAX;
    }
    (limit.saturating_sub(RESERVED_DESCRIPTORS) / 2).max(16) as usize
}

impl TcpListenerTask {
    /// Accepts until `stop` turns true; each connection runs on `connections`, so shutdown
    /// can wait for in-flight requests (each connection drains itself at `stop`).
    pub async fn run(self, mut stop: watch::Receiver<bool>, connections: TaskTracker) {
        let cap = ConnectionCap::new(
            &self.shared.metrics,
            &self.shared.listener,
            self.shared.limits.max_connections.min(connection_budget()),
            self.shared.access.clone(),
            self.shared.per_client.clone(),
            self.shared.overload.clone(),
        );
        let idle = Arc::new(IdleSet::default());
        loop {
            let accepted = tokio::select! {
                r = self.listener.accept() => r,
                _ = stop.wait_for(|s| *s) => break,
            };
            match accepted {
                Ok((tcp, peer)) => {
                    // Behind a PROXY-protocol balancer the peer is the balancer: the access
                    // list waits for the client address the header carries.
                    if !self.shared.proxy_protocol && cap.deny_address(peer.ip()) {
                        drop(tcp);
                        continue;
                    }
                    // At the cap, an idle connection makes room; under memory overload
                    // nothing new is admitted.
                    let room = !cap.at_cap() || idle.evict_one();
                    if cap.stopped() || !room {
                        cap.count_rejected();
                        drop(tcp);
                        continue;
                    }
                    // Counted open from here, not from when the task first runs, so a burst
                    // of accepts cannot overshoot the cap.
                    let open = cap.open();
                    let _ = tcp.set_nodelay(true);
                    // The send timeout, kept by the kernel: a client that stops reading (its
                    // window shut, our bytes unacknowledged) loses the connection after it.
                    let _ = socket2::SockRef::from(&tcp)
                        .set_tcp_user_timeout(Some(self.shared.limits.send_timeout));
                    connections.spawn(serve_connection(
                        Accepted {
                            tcp,
                            peer,
                            open,
                            cap: cap.clone(),
                            idle: idle.clone(),
                        },
                        self.acceptor.clone(),
                        self.shared.clone(),
                        self.handshake_timeout,
                        stop.clone(),
                    ));
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning. The connection
                    // cap is kept below the descriptor limit (`connection_budget`), and idle
                    // connections are reaped early near the cap, so this is rare.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}

/// An accepted client connection, counted open until dropped.
struct Accepted {
    tcp: TcpStream,
    peer: SocketAddr,
    open: GaugeGuard,
    /// The listener's cap and access list (checked here once a PROXY header names the client).
    cap: ConnectionCap,
    /// The listener's connections, one of which may be evicted to admit another.
    idle: Arc<IdleSet>,
}

async fn serve_connection(
    Accepted {
        mut tcp,
        mut peer,
        open: _open,
        cap,
        idle: idle_set,
    }: Accepted,
    acceptor: Arc<SslAcceptor>,
    shared: Arc<ProxyShared>,
    handshake_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let m = &shared.metrics;
    let listener = shared.listener.as_str();
    let start = Instant::now();
    let failed = |reason: &str| {
        m.handshake_errors
            .with_label_values(&[listener, reason])
            .inc()
    };
    // The PROXY header first, within the handshake's time; what follows it is the handshake.
    let mut received = Vec::new();
    if shared.proxy_protocol {
        let header = tokio::select! {
            r = tokio::time::timeout(handshake_timeout, proxy_protocol::read_header(&mut tcp)) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match header {
            Ok(Ok((client, rest))) => {
                peer = client.unwrap_or(peer);
                received = rest;
            }
            Ok(Err(e)) => {
                failed("proxy_protocol");
                tracing::debug!(%peer, error = %e, "no valid PROXY protocol header");
                return;
            }
            Err(_) => return failed("timeout"),
        }
        if cap.deny_address(peer.ip()) {
            return;
        }
    }
    // The client's unit of `limits.max_connections_per_address`, held while it is open.
    let Ok(_share) = cap.client_share(peer.ip()) else {
        return;
    };
    // Under the TLS stream: reads of up to 64 KiB served from a buffer held only while data
    // flows (`RecvBuffer`), and writes held until the task's poll ends
    // (`send_coalescer::CoalescingSocket`), so several TLS records share a syscall each way.
    let (socket, send) = send_coalescer::coalescing(tcp);
    let socket = RecvBuffer::with_received(socket, received);
    let handshake = tokio::select! {
        r = tokio::time::timeout(handshake_timeout, tokio_boring::accept(&acceptor, socket)) => r,
        _ = stop.wait_for(|s| *s) => return,
    };
    let stream = match handshake {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let reason = if e.as_io_error().is_some() {
                "io"
            } else {
                "tls"
            };
            failed(reason);
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => return failed("timeout"),
    };
    let ssl = stream.ssl();
    let resumed = ssl.session_reused();
    let resumed_label = if resumed { "true" } else { "false" };
    let sigalg = handshake_info::signature_algorithm(ssl).map_or("none", |a| a.as_str());
    let cipher = ssl.current_cipher().map_or("none", |c| c.name());
    m.handshakes
        .with_label_values(&[
            listener,
            "tcp",
            ssl.version_str(),
            cipher,
            sigalg,
            resumed_label,
        ])
        .inc();
    m.handshake_seconds
        .with_label_values(&[listener, "tcp", resumed_label])
        .observe(start.elapsed().as_secs_f64());
    if let Some(t) = &shared.tracer {
        t.handshake(std::time::SystemTime::now() - start.elapsed(), ssl, "tcp");
    }
    let h2 = ssl.selected_alpn_protocol() == Some(b"h2");
    // Early data accepted: the handshake ends on a later read; until then requests are
    // marked as early (RFC 8470's rules apply to them in the pipeline).
    let early = crate::listener::recv_buffer::in_early_data(ssl)
        .then(|| Arc::new(std::sync::atomic::AtomicBool::new(true)));
    let client_cert = shared
        .client_cert_headers
        .as_ref()
        .and_then(|_| crate::tls::handshake_info::ClientCert::of(ssl))
        .map(Arc::new);
    let info = Arc::new(ConnInfo {
        client_cert,
        client: peer,
        client_key: shared.per_client.key(peer.ip()),
        sni: ssl.servername(NameType::HOST_NAME).map(str::to_string),
        tls_version: ssl.version_str(),
        resumed,
    });
    let limits = &shared.limits;
    let activity = Activity::new();
    idle_set.register(&activity, cap.open_count());
    let svc = {
        let shared = shared.clone();
        let activity = activity.clone();
        let early = early.clone();
        service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            let active = activity.begin();
            if early
                .as_ref()
                .is_some_and(|e| e.load(std::sync::atomic::Ordering::Relaxed))
            {
                req.extensions_mut().insert(pipeline::InEarlyData);
            }
            // For a tunnel made of an HTTP/2 stream (an extended CONNECT), which outlives its
            // response. Only then: an extension costs allocations on every request.
            if req.method() == http::Method::CONNECT {
                req.extensions_mut().insert(activity.clone());
            }
            // Boxed: hyper moves the service's future into place for every request (and
            // HTTP/2 spawns it), and the pipeline's is kilobytes; a box moves as a pointer.
            let handled = Box::pin(pipeline::handle(
                shared.clone(),
                info.clone(),
                req.map(client_body),
            ));
            async move {
                let resp = handled.await?;
                Ok::<_, std::convert::Infallible>(resp.map(|b| b.while_active(active)))
            }
        })
    };
    let idle = IdleLimits {
        first_request: limits.first_request_timeout,
        idle: limits.idle_timeout,
        idle_under_pressure: limits.idle_timeout_under_pressure,
    };
    let expired = activity.expired(idle, || cap.under_pressure());
    let ended = if h2 {
        let io = TokioIo::new(h2_flood::Counted::new(
            ReadAvailable(stream, early),
            limits.max_control_frames_per_second,
            m.closed_connections
                .with_label_values(&[listener, "control_flood"]),
        ));
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_concurrent_streams)
            .max_header_list_size((limits.max_header_bytes * 2) as u32)
            .keep_alive_interval(Some(limits.idle_timeout))
            .keep_alive_timeout(Duration::from_secs(20))
            // WebSockets over HTTP/2 (RFC 8441), tunnelled to HTTP/1.1 upstreams by the proxy.
            .enable_connect_protocol();
        // Under memory pressure a new connection may buffer little of what its client sends.
        if shared
            .overload
            .is_active(crate::policy::overload::Action::ShrinkWindows)
        {
            b.initial_stream_window_size(16 * 1024)
                .initial_connection_window_size(64 * 1024);
        }
        let conn = send.flush_at_yield(b.serve_connection(io, svc));
        drive(
            conn,
            |c| c.graceful_shutdown(),
            stop,
            &shared,
            &activity,
            expired,
        )
        .await
    } else {
        let io = TokioIo::new(ReadAvailable(stream, early));
        // HTTP/1.1 only (ALPN said so), with upgrades: a 101 hands the connection to the
        // proxy's tunnel (WebSocket). hyper-util's builder, as its connection with upgrades
        // can be shut down gracefully.
        let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new()).http1_only();
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.idle_timeout)
            .max_headers(limits.max_headers)
            .max_buf_size((limits.max_header_bytes + 1024).max(8192));
        let conn = send.flush_at_yield(b.serve_connection_with_upgrades(io, svc));
        drive(
            conn,
            |c| c.graceful_shutdown(),
            stop,
            &shared,
            &activity,
            expired,
        )
        .await
    };
    match ended {
        Ended::Done(Err(e)) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
        Ended::Done(Ok(())) => {}
        Ended::Closed(why) => m
            .closed_connections
            .with_label_values(&[listener, why])
            .inc(),
    }
}

/// How a connection's serving ended.
enum Ended {
    /// The connection finished (after a graceful shutdown, or the client closed it), or
    /// failed with this error.
    Done(Result<(), String>),
    /// The gateway closed it: the `rampart_connections_closed_total` reason.
    Closed(&'static str),
}

/// Serves `conn` until it ends. When the gateway stops, or the overload manager's GOAWAY
/// action turns on, it is asked once to shut down gracefully (`shutdown`: GOAWAY on HTTP/2,
/// close once idle on HTTP/1.1) and served on while its requests finish. Its timers
/// ([`crate::listener::conn_timers`]) and an eviction close it at once.
async fn drive<F, E>(
    mut conn: send_coalescer::FlushAtYield<F>,
    shutdown: impl FnOnce(std::pin::Pin<&mut F>),
    mut stop: watch::Receiver<bool>,
    shared: &ProxyShared,
    activity: &Activity,
    expired: impl std::future::Future<Output = crate::listener::conn_timers::Expiry>,
) -> Ended
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut goaway = shared.overload.goaway();
    tokio::pin!(expired);
    let mut shutdown = Some(shutdown);
    loop {
        let draining = shutdown.is_none();
        tokio::select! {
            r = &mut conn => return Ended::Done(r.map_err(|e| e.to_string())),
            why = &mut expired => return Ended::Closed(why.as_str()),
            _ = activity.evicted() => return Ended::Closed("evicted"),
            _ = stop.wait_for(|s| *s), if !draining => {}
            _ = goaway.wait_for(|g| *g), if !draining => {}
        }
        if let Some(f) = shutdown.take() {
            f(conn.inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_budget_raises_the_descriptor_limit_and_halves_what_is_left() {
        let budget = connection_budget();
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes only the struct passed by pointer.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        assert_eq!(r.rlim_cur, r.rlim_max, "soft limit raised to the hard one");
        if r.rlim_cur != libc::RLIM_INFINITY {
            let want = (r.rlim_cur.saturating_sub(RESERVED_DESCRIPTORS) / 2).max(16);
            assert_eq!(budget as u64, want);
        }
    }
}
