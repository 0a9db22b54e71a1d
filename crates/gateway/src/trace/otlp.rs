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
                loop {
                    let deadline = Instant::now() + flush;
                    while spans.len() < batch {
                        match rx.recv_deadline(deadline) {
                            Ok(s) => spans.push(s),
                            Err(crossbeam_channel::RecvTimeoutError::Timeout) => break,
                            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                                if !spans.is_empty() {
                                    let body = encode(&service, &spans);
                                    let _ = rt.block_on(post(&endpoint, body, timeout));
                                }
                                return;
                            }
                        }
                    }
                    if spans.is_empty() {
                        continue;
                    }
                    let body = encode(&service, &spans);
                    let sent = rt.block_on(post(&endpoint, body, timeout));
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

/// POSTs one batch; Ok once the collector answered 2xx within `timeout`.
async fn post(endpoint: &http::Uri, body: String, timeout: Duration) -> anyhow::Result<()> {
    let work = async {
        let host = endpoint.host().ok_or_else(|| anyhow::anyhow!("no host"))?;
        let port = endpoint.port_u16().unwrap_or(80);
        let tcp = tokio::net::TcpStream::connect((host, port)).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
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
        anyhow::ensure!(
            resp.status().is_success(),
            "the collector answered {}",
            resp.status()
        );
        anyhow::Ok(())
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {timeout:?}"))?
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
        .to_string()
}

/// An `ExportTraceServiceRequest` in OTLP's JSON encoding (ids in hex, 64-bit integers as
/// strings, enums as numbers).
pub(crate) fn encode(service: &str, spans: &[Span]) -> String {
    let attr = |k: &str, v: &AttrValue| match v {
        AttrValue::Str(s) => serde_json::json!({"key": k, "value": {"stringValue": s}}),
        AttrValue::Int(i) => serde_json::json!({"key": k, "value": {"intValue": i.to_string()}}),
    };
    let spans: Vec<serde_json::Value> = spans
        .iter()
        .map(|s| {
            let mut v = serde_json::json!({
                "traceId": super::hex(&s.context.trace_id),
                "spanId": super::hex(&s.context.span_id),
                "name": s.name,
                "kind": s.kind,
                "startTimeUnixNano": nanos(s.start),
                "endTimeUnixNano": nanos(s.end),
                "attributes": s.attributes.iter().map(|(k, v)| attr(k, v)).collect::<Vec<_>>(),
                "status": {"code": if s.error { 2 } else { 0 }},
            });
            if let Some(p) = s.parent {
                v["parentSpanId"] = serde_json::Value::String(super::hex(&p));
            }
            v
        })
        .collect();
    serde_json::json!({
        "resourceSpans": [{
            "resource": {"attributes": [attr("service.name", &AttrValue::Str(service.into()))]},
            "scopeSpans": [{"scope": {"name": "rampart"}, "spans": spans}],
        }]
    })
    .to_string()
}
