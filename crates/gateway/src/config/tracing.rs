//! `[tracing]`: where spans go (OTLP over HTTP) and how many requests are sampled.

use super::{duration_text, At, Invalid};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP traces endpoint, `http://host:4318/v1/traces`; none: no
    /// spans, and `traceparent` passes upstream as the client sent it.
    pub otlp_endpoint: Option<String>,
    /// Share of requests without a sampled `traceparent` that start a sampled trace (0 to 1);
    /// a client's sampled (or unsampled) `traceparent` is followed.
    pub sample_ratio: f64,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Spans waiting for the exporter; past it they are dropped.
    pub queue: usize,
    /// Spans per export request.
    pub batch: usize,
    /// The longest a span waits for its batch to fill.
    #[serde(with = "duration_text")]
    pub flush_interval: Duration,
    /// The longest an export request may take; past it the batch is dropped.
    #[serde(with = "duration_text")]
    pub export_timeout: Duration,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            sample_ratio: 0.01,
            service_name: "rampart".into(),
            queue: 4096,
            batch: 512,
            flush_interval: Duration::from_secs(1),
            export_timeout: Duration::from_secs(2),
        }
    }
}

impl TracingConfig {
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if let Some(e) = &self.otlp_endpoint {
            let ok = e
                .parse::<http::Uri>()
                .ok()
                .is_some_and(|u| u.scheme_str() == Some("http") && u.host().is_some());
            if !ok {
                return at.field("otlp_endpoint").fail(format!(
                    "an http:// URL such as http://127.0.0.1:4318/v1/traces, not {e:?}"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return at.field("sample_ratio").fail("a share from 0 to 1");
        }
        if self.queue == 0 || self.batch == 0 || self.batch > self.queue {
            return at
                .field("batch")
                .fail("queue and batch above 0, batch at most queue");
        }
        if self.flush_interval.is_zero() || self.export_timeout.is_zero() {
            return at
                .field("export_timeout")
                .fail("flush_interval and export_timeout above zero");
        }
        Ok(())
    }
}
