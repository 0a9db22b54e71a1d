//! Upgraded connections: the WebSocket handshake's pieces (RFC 6455, and RFC 8441 over
//! HTTP/2), which upgrades a request asks for, and the byte tunnel between the client's and
//! the upstream's taken-over connections.

use crate::http::headers::list_elements;
use http::header::{self, HeaderValue};
use http::{Method, Request, Version};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The protocol an HTTP/2 extended CONNECT names (`:protocol`, RFC 8441), if the request is
/// one. Only `websocket` is taken: it is the one such protocol an HTTP/1.1 upstream can be
/// asked for by `Upgrade`.
pub(crate) fn extended_connect_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    let protocol = req.extensions().get::<hyper::ext::Protocol>()?;
    (req.method() == Method::CONNECT
        && req.version() == Version::HTTP_2
        && protocol.as_str().eq_ignore_ascii_case("websocket"))
    .then(|| HeaderValue::from_static("websocket"))
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes, base64 (RFC 6455 §4.1).
pub(crate) fn new_key() -> HeaderValue {
    use base64::Engine as _;
    let mut nonce = [0u8; 16];
    fastrand::fill(&mut nonce);
    HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(nonce))
        .expect("base64 is a valid header value")
}

/// The `Sec-WebSocket-Accept` a server answers `key` with (RFC 6455 §4.2.2).
pub(crate) fn accept_for(key: &HeaderValue) -> HeaderValue {
    use base64::Engine as _;
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = boring::sha::sha1(&input);
    HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(digest))
        .expect("base64 is a valid header value")
}

/// The protocol an HTTP/1.1 request asks to switch to (`Connection: upgrade` and `Upgrade`).
pub(crate) fn upgrade_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    let h = req.headers();
    let asks = list_elements(h, &header::CONNECTION).any(|t| t.eq_ignore_ascii_case("upgrade"));
    (req.version() == Version::HTTP_11 && asks)
        .then(|| h.get(header::UPGRADE).cloned())
        .flatten()
}

/// Copies bytes both ways between the client's and the upstream's taken-over connections
/// until either side closes, or until nothing has moved either way for `idle` (the listener's
/// `limits.idle_timeout`, as nginx's `proxy_read_timeout` closes quiet WebSockets).
pub(crate) async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    idle: std::time::Duration,
) {
    let (client, upstream) = match tokio::join!(client, upstream) {
        (Ok(c), Ok(u)) => (c, u),
        (c, u) => {
            tracing::debug!(
                client = c.is_ok(),
                upstream = u.is_ok(),
                "upgrade not completed"
            );
            return;
        }
    };
    let start = Instant::now();
    let last = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut client = Active::new(client, &last, start);
    let mut upstream = Active::new(upstream, &last, start);
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    loop {
        let quiet =
            start.elapsed() - std::time::Duration::from_millis(last.load(Ordering::Relaxed));
        let left = idle.saturating_sub(quiet);
        if left.is_zero() {
            tracing::debug!(?idle, "idle upgraded connection closed");
            return;
        }
        tokio::select! {
            r = &mut copy => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "upgraded connection ended");
                }
                return;
            }
            _ = tokio::time::sleep(left) => {}
        }
    }
}

/// A taken-over connection that notes when it last read bytes (milliseconds after `start`).
struct Active {
    io: hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>,
    last: Arc<std::sync::atomic::AtomicU64>,
    start: Instant,
}

impl Active {
    fn new(
        io: hyper::upgrade::Upgraded,
        last: &Arc<std::sync::atomic::AtomicU64>,
        start: Instant,
    ) -> Self {
        Active {
            io: hyper_util::rt::TokioIo::new(io),
            last: last.clone(),
            start,
        }
    }
}

impl tokio::io::AsyncRead for Active {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            let now = self.start.elapsed().as_millis() as u64;
            self.last.store(now, Ordering::Relaxed);
        }
        r
    }
}

impl tokio::io::AsyncWrite for Active {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_matches_rfc_6455s_example() {
        // RFC 6455 §1.3.
        let key = HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ==");
        assert_eq!(accept_for(&key), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(new_key().len(), 24);
    }
}
