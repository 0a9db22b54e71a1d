//! HTTP/3 over QUIC (tokio-quiche) into the same proxy pipeline as HTTPS.
//!
//! The QUIC listener's SSL context comes from the same certificate store, key engine and
//! ticket keys as the TCP listener beside it ([`crate::tls::QuicTls`]); no private key is in it.
//! Each request stream becomes an `http::Request` whose body streams from the QUIC stream, goes
//! through [`proxy::handle`], and the response streams back as HTTP/3 frames.

use crate::body::{client_body, BoxError, ClientBody};
use crate::proxy::{self, ConnInfo, ProxyShared};
use crate::tls::QuicTls;
use bytes::Bytes;
use futures_util::SinkExt;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{mpsc, watch};
use tokio_quiche::http3::driver::{
    InboundFrame, IncomingH3Headers, OutboundFrame, OutboundFrameSender, ServerH3Event,
};
use tokio_quiche::http3::settings::Http3Settings;
use tokio_quiche::metrics::DefaultMetrics;
use tokio_quiche::quic::ConnectionHook;
use tokio_quiche::quiche::h3::{Header, NameValue};
use tokio_quiche::settings::{CertificateKind, Hooks, QuicSettings, TlsCertificatePaths};
use tokio_quiche::{ConnectionParams, ServerH3Driver};

/// Socket buffer size asked for the UDP socket: bursts of Initial packets overflow the
/// kernel's default (~208 KiB) and handshakes then take seconds.
pub const UDP_BUFFER: usize = 4 << 20;

/// Binds the UDP socket of a QUIC listener, with large buffers (warning when capped).
pub fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    sock.set_reuse_address(true)?;
    for (name, set, get) in [
        (
            "receive",
            socket2::Socket::set_recv_buffer_size
                as fn(&socket2::Socket, usize) -> std::io::Result<()>,
            socket2::Socket::recv_buffer_size as fn(&socket2::Socket) -> std::io::Result<usize>,
        ),
        (
            "send",
            socket2::Socket::set_send_buffer_size,
            socket2::Socket::send_buffer_size,
        ),
    ] {
        set(&sock, UDP_BUFFER)?;
        // Linux reports twice the granted size.
        let got = get(&sock)? / 2;
        if got < UDP_BUFFER {
            tracing::warn!(%addr, asked = UDP_BUFFER, got, "UDP {name} buffer capped by the kernel (raise net.core.{}mem_max)", if name == "receive" { "r" } else { "w" });
        }
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    Ok(sock.into())
}

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

/// Serves HTTP/3 on `socket` until `stop` turns true. Runs on the calling runtime.
pub async fn serve(
    socket: std::net::UdpSocket,
    tls: QuicTls,
    shared: Arc<ProxyShared>,
    mut stop: watch::Receiver<bool>,
) {
    use futures_util::StreamExt;
    let mut settings = QuicSettings::default();
    settings.alpn = vec![b"h3".to_vec()];
    settings.enable_pacing = true;
    settings.max_idle_timeout = Some(shared.limits.idle_timeout);
    let hooks = Hooks {
        connection_hook: Some(Arc::new(Hook { tls })),
    };
    // tokio-quiche consults the hook only when certificate paths are set; ours come from the
    // hook, so these names are never opened.
    let params = ConnectionParams::new_server(
        settings,
        TlsCertificatePaths {
            cert: "(from rampart's certificate store)",
            private_key: "(held by the key engine)",
            kind: CertificateKind::X509,
        },
        hooks,
    );
    let mut streams = match tokio_quiche::listen([socket], params, DefaultMetrics) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "QUIC listener failed to start");
            return;
        }
    };
    let mut conns = streams.remove(0);
    loop {
        let next = tokio::select! {
            c = conns.next() => c,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Some(conn) = next else { return };
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = ?e, "QUIC accept error");
                continue;
            }
        };
        let info = Arc::new(ConnInfo {
            client: conn.peer_addr(),
            sni: None,
            tls_version: "TLSv1.3",
            resumed: false,
        });
        let (driver, mut controller) = ServerH3Driver::new(Http3Settings::default());
        conn.start(driver);
        let shared = shared.clone();
        tokio::spawn(async move {
            while let Some(ev) = controller.event_receiver_mut().recv().await {
                if let ServerH3Event::Headers {
                    incoming_headers, ..
                } = ev
                {
                    tokio::spawn(serve_request(
                        shared.clone(),
                        info.clone(),
                        incoming_headers,
                    ));
                }
            }
        });
    }
}

/// A request body arriving on a QUIC stream.
struct H3RequestBody {
    rx: Option<mpsc::Receiver<InboundFrame>>,
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
                    if data.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data.freeze()))));
                }
                Poll::Ready(Some(InboundFrame::Datagram(_))) => continue,
                Poll::Ready(None) => {
                    self.rx = None;
                    return Poll::Ready(None);
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

async fn serve_request(shared: Arc<ProxyShared>, info: Arc<ConnInfo>, incoming: IncomingH3Headers) {
    let IncomingH3Headers {
        headers,
        mut send,
        recv,
        read_fin,
        ..
    } = incoming;
    let body = H3RequestBody {
        rx: (!read_fin).then_some(recv),
    };
    let req = match to_request(headers, client_body(body)) {
        Ok(r) => r,
        Err(why) => {
            tracing::debug!(why, "malformed HTTP/3 request");
            let _ = send
                .send(OutboundFrame::Headers(
                    vec![Header::new(b":status", b"400")],
                    None,
                ))
                .await;
            let _ = send
                .send(OutboundFrame::Body(
                    Bytes::from_static(b"malformed request\n"),
                    true,
                ))
                .await;
            return;
        }
    };
    let Ok(resp) = proxy::handle(shared, info, req).await;
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
