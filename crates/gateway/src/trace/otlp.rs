//! The span exporter: OTLP over HTTP with the JSON encoding (`POST …/v1/traces`,
//! `application/json`), batched by a thread of its own behind a bounded queue. A full queue,
//! a collector that fails or does not answer within `export_timeout`: the spans are dropped
//! and counted; a request never waits for the collector.

use super::{AttrValue, Span};
use crate::config::TracingConfig;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Spans the collector took, and spans dropped (queue full, or their batch failed), in this
/// process (`rampart_tracing_spans_exported_total`, `rampart_tracing_spans_dropped_total`).
pub static EXPORTED: AtomicU64 = AtomicU64::new(0);
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

pub(crate) struct Exporter {
    tx: crossbeam_channel::Sender<Span>,
}

impl Exporter {
    pub fn start(cfg: &TracingConfig) -> anyhow::Result<Exporter> {
        let endpoint: http::Uri = cfg
            .otlp_endpoint
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("tracing.otlp_endpoint: none"))?
            .parse()?;
        let (tx, rx) = crossbeam_channel::bounded::<Span>(cfg.queue);
        let (batch, flush, timeout) = (cfg.batch, cfg.flush_interval, cfg.export_timeout);
        let service = cfg.service_name.clone();
        std::thread::Builder::new()
            .name("rampart-otlp".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                let mut spans = Vec::with_capacity(batch);
                let mut last_error: Option<Instant> = None;
                let mut conn = None;
                loop {
                    let deadline = Instant::now() + flush;
                    while spans.len() < batch {
                        match rx.recv_deadline(deadline) {
                            Ok(s) => spans.push(s),
                            Err(crossbeam_channel::RecvTimeoutError::Timeout) => break,
                            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                                if !spans.is_empty() {
                                    let body = encode(&service, &spans);
                                    let _ = rt.block_on(post(&mut conn, &endpoint, body, timeout));
                                }
                                return;
                            }
                        }
                    }
                    if spans.is_empty() {
                        continue;
                    }
                    let body = encode(&service, &spans);
                    let sent = rt.block_on(post(&mut conn, &endpoint, body, timeout));
                    if sent.is_ok() {
                        EXPORTED.fetch_add(spans.len() as u64, Ordering::Relaxed);
                    }
                    if let Err(e) = sent {
                        DROPPED.fetch_add(spans.len() as u64, Ordering::Relaxed);
                        // At most one line per minute while the collector stays away.
                        if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                            tracing::warn!(collector = %endpoint, error = %e, spans = spans.len(),
                                "tracing: export failed; the spans are dropped");
                            last_error = Some(Instant::now());
                        }
                    }
                    spans.clear();
                }
            })?;
        Ok(Exporter { tx })
    }

    /// Queues a span; a full queue drops it (counted).
    pub fn export(&self, span: Span) {
        if self.tx.try_send(span).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The exporter's connection to the collector, kept between batches.
type Conn = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// POSTs one batch over `conn` (made again when it is gone); Ok once the collector answered
/// 2xx within `timeout`. A failure drops the connection.
async fn post(
    conn: &mut Option<Conn>,
    endpoint: &http::Uri,
    body: String,
    timeout: Duration,
) -> anyhow::Result<()> {
    let work = async {
        let host = endpoint.host().ok_or_else(|| anyhow::anyhow!("no host"))?;
        let reusable = match conn.as_mut() {
            Some(c) => c.ready().await.is_ok(),
            None => false,
        };
        if !reusable {
            let port = endpoint.port_u16().unwrap_or(80);
            let tcp = tokio::net::TcpStream::connect((host, port)).await?;
            let (sender, c) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
            tokio::spawn(c);
            *conn = Some(sender);
        }
        let sender = conn.as_mut().expect("set above");
        let req = http::Request::post(
            endpoint
                .path_and_query()
                .map_or("/v1/traces", |p| p.as_str()),
        )
        .header(
            http::header::HOST,
            endpoint.authority().map_or(host, |a| a.as_str()),
        )
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        // Read the answer to its end, so the connection can carry the next batch.
        http_body_util::BodyExt::collect(resp.into_body()).await?;
        anyhow::ensure!(status.is_success(), "the collector answered {status}");
        anyhow::Ok(())
    };
    let r = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {timeout:?}"))
        .and_then(|r| r);
    if r.is_err() {
        *conn = None;
    }
    r
}

fn nanos(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// `s` as a JSON string.
fn json_str(o: &mut String, s: &str) {
    use std::fmt::Write as _;
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if c < ' ' => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
}

fn json_attr(o: &mut String, k: &str, v: &AttrValue) {
    use std::fmt::Write as _;
    o.push_str("{\"key\":");
    json_str(o, k);
    match v {
        AttrValue::Str(s) => {
            o.push_str(",\"value\":{\"stringValue\":");
            json_str(o, s);
            o.push_str("}}");
        }
        AttrValue::Int(i) => {
            let _ = write!(o, ",\"value\":{{\"intValue\":\"{i}\"}}}}");
        }
    }
}

/// An `ExportTraceServiceRequest` in OTLP's JSON encoding (ids in hex, 64-bit integers as
/// strings, enums as numbers), written directly: it is built on the exporter's thread for
/// every span a sampled request makes.
pub(crate) fn encode(service: &str, spans: &[Span]) -> String {
    use std::fmt::Write as _;
    let mut o = String::with_capacity(256 + spans.len() * 512);
    o.push_str("{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    json_attr(&mut o, "service.name", &AttrValue::Str(service.into()));
    o.push_str("]},\"scopeSpans\":[{\"scope\":{\"name\":\"rampart\"},\"spans\":[");
    for (i, s) in spans.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(
            o,
            "{{\"traceId\":\"{}\",\"spanId\":\"{}\",",
            super::hex(&s.context.trace_id),
            super::hex(&s.context.span_id)
        );
        if let Some(p) = s.parent {
            let _ = write!(o, "\"parentSpanId\":\"{}\",", super::hex(&p));
        }
        o.push_str("\"name\":");
        json_str(&mut o, s.name);
        let _ = write!(
            o,
            ",\"kind\":{},\"startTimeUnixNano\":\"{}\",\"endTimeUnixNano\":\"{}\",\"attributes\":[",
            s.kind,
            nanos(s.start),
            nanos(s.end)
        );
        for (j, (k, v)) in s.attributes.iter().enumerate() {
            if j > 0 {
                o.push(',');
            }
            json_attr(&mut o, k, v);
        }
        let _ = write!(
            o,
            "],\"status\":{{\"code\":{}}}}}",
            if s.error { 2 } else { 0 }
        );
    }
    o.push_str("]}]}]}");
    o
}

#[cfg(test)]
mod tests {
    use super::super::{AttrValue, Span, SpanContext};
    use std::time::{Duration, SystemTime};

    #[test]
    fn the_encoding_is_json_with_otlp_field_names() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789);
        let span = Span {
            context: SpanContext {
                trace_id: [0xab; 16],
                span_id: [0x01; 8],
                sampled: true,
            },
            parent: Some([0x02; 8]),
            name: "request",
            kind: 2,
            start: t0,
            end: t0 + Duration::from_millis(3),
            attributes: vec![
                ("url.path", AttrValue::Str("/a\"b\\c\n".into())),
                ("http.response.status_code", AttrValue::Int(503)),
            ],
            error: true,
        };
        let root = span.clone();
        let root = Span {
            parent: None,
            ..root
        };
        let text = super::encode("edge \"1\"", &[span, root]);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let rs = &v["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0]["value"]["stringValue"],
            "edge \"1\""
        );
        let s = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "ab".repeat(16));
        assert_eq!(s["spanId"], "01".repeat(8));
        assert_eq!(s["parentSpanId"], "02".repeat(8));
        assert_eq!(s["kind"], 2);
        assert_eq!(s["startTimeUnixNano"], "1700000000123456789");
        assert_eq!(s["endTimeUnixNano"], "1700000000126456789");
        assert_eq!(s["attributes"][0]["value"]["stringValue"], "/a\"b\\c\n");
        assert_eq!(s["attributes"][1]["value"]["intValue"], "503");
        assert_eq!(s["status"]["code"], 2);
        assert!(rs["scopeSpans"][0]["spans"][1]
            .get("parentSpanId")
            .is_none());
    }
}
