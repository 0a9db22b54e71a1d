//! HTTP/3 ↔ `http`: a request stream's headers and body become an `http::Request` for the
//! pipeline (malformed ones refused), and the pipeline's response goes back as HTTP/3 frames.

use crate::body::{client_body, BoxError, ClientBody};
use crate::http::pipeline::{self, ConnInfo, ProxyShared};
use bytes::Bytes;
use futures_util::SinkExt;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio_quiche::http3::driver::{
    InboundFrame, IncomingH3Headers, OutboundFrame, OutboundFrameSender,
};
use tokio_quiche::quiche::h3::{Header, NameValue};

/// The most request-body bytes the HTTP/3 driver takes out of quiche in one read, each read
/// becoming one body chunk for the upstream. tokio-quiche's default, 16 KiB, split a 64 KB GRO
/// train of upload into four chunks, four channel sends and four upstream writes; 64 KiB
/// matches the HTTPS side's read buffer (`RecvBuffer`). A read is sized to what is readable,
/// so small bodies still allocate little. Uploads A/B on the Zen 3 VM (docs/benchmarks-history.md,
/// 2026-11-25): 1.55–1.96 CPU s/GB at 16 KiB, 1.36–1.55 at 64 KiB, 1.26–1.39 at 256 KiB.
pub(super) const H3_REQUEST_BODY_CHUNK: usize = 64 * 1024;

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

pub(super) async fn serve_request(
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

#[cfg(test)]
mod tests {
    use super::*;

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
