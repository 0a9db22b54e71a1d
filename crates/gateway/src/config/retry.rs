//! A route's `retry` policy and a cluster's `retry_budget`.

use super::{duration_text, At, Invalid};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What a route retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryOn {
    /// The connection could not be made (nothing was sent).
    Connect,
    /// The upstream closed or reset the exchange before answering.
    Reset,
    /// No response headers within the try's timeout.
    Timeout,
    /// A 502, 503 or 504 response.
    GatewayError,
}

/// `[routes.retry]`: a failed try is sent again to another endpoint of the cluster (one not
/// yet tried, while there is one), after a backoff with full jitter, while the cluster's
/// retry budget allows. A request whose body was not read whole (see
/// `limits.buffer_body_bytes`) is retried only when nothing of it was sent (a connect failure).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Retries after the first try (0 to 10).
    pub attempts: u32,
    /// Failures retried.
    pub on: Vec<RetryOn>,
    /// Other response statuses retried (such as 409).
    pub statuses: Vec<u16>,
    /// Each try's wait for response headers; 0: the cluster's `read_timeout`.
    #[serde(with = "duration_text")]
    pub per_try_timeout: Duration,
    /// The first retry waits a random time up to this; each next one up to twice the last.
    #[serde(with = "duration_text")]
    pub backoff_base: Duration,
    /// The longest backoff.
    #[serde(with = "duration_text")]
    pub backoff_max: Duration,
    /// Retry methods that are not idempotent (POST, PATCH) after they may have reached the
    /// upstream. A connect failure is retried for every method: nothing was sent.
    pub non_idempotent: bool,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            attempts: 2,
            on: vec![RetryOn::Connect, RetryOn::Reset, RetryOn::GatewayError],
            statuses: vec![],
            per_try_timeout: Duration::ZERO,
            backoff_base: Duration::from_millis(25),
            backoff_max: Duration::from_millis(250),
            non_idempotent: false,
        }
    }
}

impl RetryConfig {
    /// A route without `retry`: a connect failure is retried once, at once.
    pub fn connect_only() -> Self {
        RetryConfig {
            attempts: 1,
            on: vec![RetryOn::Connect],
            backoff_base: Duration::ZERO,
            backoff_max: Duration::ZERO,
            ..RetryConfig::default()
        }
    }

    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if self.attempts > 10 {
            return at.field("attempts").fail("at most 10 retries");
        }
        for (i, s) in self.statuses.iter().enumerate() {
            if !(100..=599).contains(s) {
                return at
                    .field("statuses")
                    .index(i)
                    .fail("an HTTP status (100-599)");
            }
        }
        if self.backoff_max < self.backoff_base {
            return at.field("backoff_max").fail("at least backoff_base");
        }
        Ok(())
    }
}

/// `[clusters.retry_budget]`: retries in flight to the cluster (from every route and worker)
/// may be at most `percent` of its requests in flight, or `min_concurrent`, whichever is more,
/// so that retries cannot multiply the load on a failing cluster (Envoy's retry budget).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryBudgetConfig {
    pub percent: f64,
    pub min_concurrent: u32,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig {
            percent: 20.0,
            min_concurrent: 3,
        }
    }
}

impl RetryBudgetConfig {
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if !(self.percent.is_finite() && (0.0..=100.0).contains(&self.percent)) {
            return at.field("percent").fail("a percent from 0 to 100");
        }
        Ok(())
    }
}
