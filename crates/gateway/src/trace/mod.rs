//! Distributed tracing (`[tracing]`): W3C Trace Context (`traceparent`, `tracestate`) accepted
//! or started per request, sampled (a sampled parent is followed, otherwise `sample_ratio`),
//! passed upstream with the gateway's own span as the parent, the trace id in the access log,
//! and the spans (the request, each upstream try) exported over OTLP ([`otlp`]) on a thread of
//! their own that drops rather than blocks when the collector is slow.

pub(crate) mod otlp;

use crate::config::file::{hex_from, hex_into, to_hex as hex};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

pub(crate) static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// A span's identity within its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl SpanContext {
    /// `traceparent` naming this span as the parent (version 00).
    pub fn traceparent(&self) -> HeaderValue {
        // 00-<32 hex>-<16 hex>-<2 hex>, written in place (every proxied request makes one).
        let mut v = *b"00-00000000000000000000000000000000-0000000000000000-00";
        hex_into(&mut v[3..35], &self.trace_id);
        hex_into(&mut v[36..52], &self.span_id);
        v[54] = if self.sampled { b'1' } else { b'0' };
        HeaderValue::from_bytes(&v).expect("hex and dashes")
    }

    /// The trace id as 32 lowercase hex digits (the access log's `trace_id`).
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }
}

/// A `traceparent` value (W3C Trace Context level 1 §3.2): version, trace id, parent id,
/// flags. A version other than 00 is read by its first four fields, as the spec asks; all-zero
/// ids, uppercase hex and wrong lengths are invalid (the request then starts a new trace).
pub fn parse_traceparent(v: &[u8]) -> Option<SpanContext> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let mut parts = s.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let lower_hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !lower_hex(version, 2)
        || version == "ff"
        || !lower_hex(trace, 32)
        || !lower_hex(parent, 16)
        || !lower_hex(flags, 2)
    {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    hex_from(trace, &mut trace_id)?;
    hex_from(parent, &mut span_id)?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// A random, non-zero id (8 or 16 bytes).
fn random_id<const N: usize>() -> [u8; N] {
    loop {
        let mut id = [0u8; N];
        for c in id.chunks_mut(8) {
            c.copy_from_slice(&fastrand::u64(..).to_le_bytes()[..c.len()]);
        }
        if id != [0; N] {
            return id;
        }
    }
}

/// One finished span, as the exporter sends it.
#[derive(Debug, Clone)]
pub struct Span {
    pub context: SpanContext,
    pub parent: Option<[u8; 8]>,
    pub name: &'static str,
    /// OTLP span kind: 2 server, 3 client.
    pub kind: u8,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, AttrValue)>,
    /// An error status (a failed try, a 5xx).
    pub error: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
}

/// What a request's spans hang from: the tracer, the request's own span, and the caller's.
#[derive(Clone)]
pub struct RequestTrace {
    tracer: Arc<Tracer>,
    /// The gateway's span for this request.
    pub context: SpanContext,
    /// The client's span, when it sent a valid `traceparent`.
    pub parent: Option<[u8; 8]>,
    pub start: SystemTime,
    /// The request's method and path (sampled requests only), for its span.
    pub method: String,
    pub path: String,
}

impl RequestTrace {
    /// A child span's context for one upstream try.
    pub fn child(&self) -> SpanContext {
        SpanContext {
            span_id: random_id(),
            ..self.context
        }
    }

    /// Records a finished span of this request (only if sampled).
    pub fn record(&self, span: Span) {
        if span.context.sampled {
            self.tracer.exporter.export(span);
        }
    }
}

/// The gateway's tracer: sampling and the exporter.
pub struct Tracer {
    sample_ratio: f64,
    exporter: otlp::Exporter,
}

impl Tracer {
    /// Starts the exporter thread for `cfg` (which has an `otlp_endpoint`).
    pub fn start(cfg: &crate::config::TracingConfig) -> anyhow::Result<Arc<Tracer>> {
        Ok(Arc::new(Tracer {
            sample_ratio: cfg.sample_ratio,
            exporter: otlp::Exporter::start(cfg)?,
        }))
    }

    /// A TCP TLS handshake that just ended (it began at `start`): a trace of its own, sampled
    /// at `sample_ratio`, with the key engine's signature as a child span.
    pub fn handshake(&self, start: SystemTime, ssl: &boring::ssl::SslRef, transport: &'static str) {
        let Some(context) = self.sample_handshake() else {
            return;
        };
        let mut attributes = vec![(
            "tls.protocol.version",
            AttrValue::Str(ssl.version_str().into()),
        )];
        if let Some(c) = ssl.current_cipher() {
            attributes.push(("tls.cipher", AttrValue::Str(c.name().into())));
        }
        let sigalg = crate::tls::handshake_info::signature_algorithm(ssl);
        if let (Some(t), Some(alg)) = (crate::tls::handshake_info::sign_time(ssl), sigalg) {
            self.exporter.export(Span {
                context: SpanContext {
                    span_id: random_id(),
                    ..context
                },
                parent: Some(context.span_id),
                name: "key engine sign",
                kind: 1,
                start: t.start,
                end: t.end,
                attributes: vec![(
                    "rampart.signature_algorithm",
                    AttrValue::Str(alg.as_str().into()),
                )],
                error: false,
            });
        }
        let name = ssl.servername(boring::ssl::NameType::HOST_NAME);
        self.export_handshake(
            context,
            start,
            name,
            ssl.session_reused(),
            transport,
            attributes,
        );
    }

    /// A QUIC handshake that just ended after `took`, as a TCP one (the QUIC driver reports
    /// the name and resumption, not the SSL: no signature span).
    pub fn quic_handshake(
        &self,
        took: std::time::Duration,
        server_name: Option<&str>,
        resumed: bool,
    ) {
        if let Some(context) = self.sample_handshake() {
            let start = SystemTime::now() - took;
            self.export_handshake(context, start, server_name, resumed, "quic", Vec::new());
        }
    }

    /// A new handshake trace's root span, if this one is sampled.
    fn sample_handshake(&self) -> Option<SpanContext> {
        (fastrand::f64() < self.sample_ratio).then(|| SpanContext {
            trace_id: random_id(),
            span_id: random_id(),
            sampled: true,
        })
    }

    /// The `tls handshake` span, ended now.
    fn export_handshake(
        &self,
        context: SpanContext,
        start: SystemTime,
        server_name: Option<&str>,
        resumed: bool,
        transport: &'static str,
        mut attributes: Vec<(&'static str, AttrValue)>,
    ) {
        attributes.push(("tls.resumed", AttrValue::Str(resumed.to_string())));
        attributes.push(("network.transport", AttrValue::Str(transport.into())));
        if let Some(n) = server_name {
            attributes.push(("tls.server_name", AttrValue::Str(n.into())));
        }
        self.exporter.export(Span {
            context,
            parent: None,
            name: "tls handshake",
            kind: 2,
            start,
            end: SystemTime::now(),
            attributes,
            error: false,
        });
    }

    /// The request's trace: the client's `traceparent` continued (its sampled flag followed)
    /// or a new trace sampled at `sample_ratio`.
    pub fn request(self: &Arc<Self>, headers: &HeaderMap) -> RequestTrace {
        let parent = headers
            .get(&TRACEPARENT)
            .and_then(|v| parse_traceparent(v.as_bytes()));
        let context = match parent {
            Some(p) => SpanContext {
                span_id: random_id(),
                ..p
            },
            None => SpanContext {
                trace_id: random_id(),
                span_id: random_id(),
                sampled: fastrand::f64() < self.sample_ratio,
            },
        };
        RequestTrace {
            tracer: self.clone(),
            context,
            parent: parent.map(|p| p.span_id),
            start: SystemTime::now(),
            method: String::new(),
            path: String::new(),
        }
    }
}

/// The request's own (server) span, ended now: its route, status and how its response ended.
pub fn request_span(
    t: &RequestTrace,
    route: Option<&str>,
    status: u16,
    end: &'static str,
    client: SocketAddr,
) -> Span {
    let mut attributes = vec![
        ("http.request.method", AttrValue::Str(t.method.clone())),
        ("url.path", AttrValue::Str(t.path.clone())),
        (
            "http.response.status_code",
            AttrValue::Int(i64::from(status)),
        ),
        ("client.address", AttrValue::Str(client.ip().to_string())),
        ("rampart.response_end", AttrValue::Str(end.into())),
    ];
    if let Some(r) = route {
        attributes.push(("http.route", AttrValue::Str(r.into())));
    }
    Span {
        context: t.context,
        parent: t.parent,
        name: "request",
        kind: 2,
        start: t.start,
        end: SystemTime::now(),
        attributes,
        error: status >= 500 || end != "complete",
    }
}

/// An upstream try's span: its endpoint, the status or the failure.
pub fn try_span(
    ctx: SpanContext,
    parent: [u8; 8],
    start: SystemTime,
    endpoint: SocketAddr,
    status: Result<u16, &str>,
    attempt: u32,
) -> Span {
    let mut attributes = vec![
        ("server.address", AttrValue::Str(endpoint.ip().to_string())),
        ("server.port", AttrValue::Int(i64::from(endpoint.port()))),
        (
            "http.request.resend_count",
            AttrValue::Int(i64::from(attempt)),
        ),
    ];
    let error = match status {
        Ok(s) => {
            attributes.push(("http.response.status_code", AttrValue::Int(i64::from(s))));
            s >= 500
        }
        Err(e) => {
            attributes.push(("error.type", AttrValue::Str(e.to_string())));
            true
        }
    };
    Span {
        context: ctx,
        parent: Some(parent),
        name: "upstream try",
        kind: 3,
        start,
        end: SystemTime::now(),
        attributes,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parses_as_the_spec_says() {
        let v = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = parse_traceparent(v).unwrap();
        assert_eq!(c.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(c.sampled);
        assert_eq!(c.traceparent().as_bytes(), v);
        let unsampled =
            parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!unsampled.sampled);
        // A later version with more fields is read by its first four.
        assert!(parse_traceparent(
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
        )
        .is_some());
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"[..],
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"",
            b"\xff\xfe",
        ] {
            assert_eq!(
                parse_traceparent(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
