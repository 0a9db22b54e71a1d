//! A route's retry policy: which failed tries are sent again, how many times, after what
//! backoff, within what time per try. Whether a retry may go at all is also the cluster's
//! retry budget's say (see [`crate::upstream`]).

use crate::config::{RetryConfig, RetryOn};
use http::StatusCode;
use std::time::Duration;

/// Why a try failed, as far as retrying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryFailure {
    /// No connection: nothing of the request was sent.
    Connect,
    /// The exchange broke before response headers.
    Reset,
    /// No response headers within the try's timeout.
    Timeout,
    /// The upstream answered with this status.
    Status(StatusCode),
}

impl TryFailure {
    /// The `reason` label of `rampart_upstream_retries_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            TryFailure::Connect => "connect",
            TryFailure::Reset => "reset",
            TryFailure::Timeout => "timeout",
            TryFailure::Status(s) if s.is_server_error() => "5xx",
            TryFailure::Status(_) => "status",
        }
    }
}

/// A route's retry policy, from its validated [`RetryConfig`].
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Retries after the first try.
    pub attempts: u32,
    on: Vec<RetryOn>,
    statuses: Vec<u16>,
    /// Each try's wait for response headers; `None`: the cluster's `read_timeout`.
    pub per_try_timeout: Option<Duration>,
    backoff_base: Duration,
    backoff_max: Duration,
    non_idempotent: bool,
    /// Whether a request may go again after it was sent (anything but a failed connect is
    /// retried), so its body, when small, is kept for that.
    pub retries_after_send: bool,
}

impl RetryPolicy {
    pub fn new(cfg: &RetryConfig) -> RetryPolicy {
        RetryPolicy {
            attempts: cfg.attempts,
            on: cfg.on.clone(),
            statuses: cfg.statuses.clone(),
            per_try_timeout: (!cfg.per_try_timeout.is_zero()).then_some(cfg.per_try_timeout),
            backoff_base: cfg.backoff_base,
            backoff_max: cfg.backoff_max,
            non_idempotent: cfg.non_idempotent,
            retries_after_send: cfg.attempts > 0
                && (!cfg.statuses.is_empty() || cfg.on.iter().any(|o| *o != RetryOn::Connect)),
        }
    }

    /// Whether a response with `status` counts as a failed try.
    pub fn retries_status(&self, status: StatusCode) -> bool {
        let gateway_error = matches!(status.as_u16(), 502..=504);
        (gateway_error && self.on.contains(&RetryOn::GatewayError))
            || self.statuses.contains(&status.as_u16())
    }

    /// Whether a try that failed so is sent again (the budget and the count of retries
    /// aside), its method `idempotent` or not. A connect failure sent nothing, so any method
    /// may go again; after the others the upstream may have acted on the request, so only an
    /// idempotent one does, unless the route says otherwise.
    pub fn retries(&self, failure: TryFailure, idempotent: bool) -> bool {
        let listed = match failure {
            TryFailure::Connect => self.on.contains(&RetryOn::Connect),
            TryFailure::Reset => self.on.contains(&RetryOn::Reset),
            TryFailure::Timeout => self.on.contains(&RetryOn::Timeout),
            TryFailure::Status(s) => self.retries_status(s),
        };
        listed && (failure == TryFailure::Connect || self.non_idempotent || idempotent)
    }

    /// How long to wait before retry `n` (1 for the first): a random time up to
    /// `backoff_base` × 2^(n-1), at most `backoff_max` ("full jitter", so that clients that
    /// failed together do not retry together).
    pub fn backoff(&self, n: u32) -> Duration {
        let cap = self
            .backoff_base
            .saturating_mul(1u32 << n.saturating_sub(1).min(20))
            .min(self.backoff_max);
        if cap.is_zero() {
            return Duration::ZERO;
        }
        cap.mul_f64(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(on: Vec<RetryOn>, statuses: Vec<u16>, non_idempotent: bool) -> RetryPolicy {
        RetryPolicy::new(&RetryConfig {
            on,
            statuses,
            non_idempotent,
            ..RetryConfig::default()
        })
    }

    #[test]
    fn only_listed_failures_and_safe_methods_are_retried() {
        let p = policy(
            vec![RetryOn::Connect, RetryOn::GatewayError],
            vec![409],
            false,
        );
        let s = |n| TryFailure::Status(StatusCode::from_u16(n).unwrap());
        assert!(p.retries(s(503), true));
        assert!(p.retries(s(409), true));
        assert!(!p.retries(s(500), true));
        assert!(!p.retries(TryFailure::Reset, true));
        assert!(!p.retries(TryFailure::Timeout, true));
        // After a send, a POST is not repeated; before one, it is.
        assert!(!p.retries(s(503), false));
        assert!(p.retries(TryFailure::Connect, false));
        let any = policy(vec![RetryOn::Reset], vec![], true);
        assert!(any.retries(TryFailure::Reset, false));
        assert!(!any.retries(TryFailure::Connect, true));
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter() {
        let p = RetryPolicy::new(&RetryConfig {
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            ..RetryConfig::default()
        });
        for n in 1..=8 {
            let cap = Duration::from_millis((10u64 << (n - 1)).min(50));
            let waits: Vec<_> = (0..200).map(|_| p.backoff(n)).collect();
            assert!(waits.iter().all(|w| *w <= cap), "{n}: {waits:?}");
            // Jittered: not all the same, and some above half the cap.
            assert!(waits.iter().any(|w| *w > cap / 2), "{n}");
            assert!(waits.iter().any(|w| *w < cap / 2), "{n}");
        }
        let none = RetryPolicy::new(&RetryConfig::connect_only());
        assert_eq!(none.backoff(1), Duration::ZERO);
        assert!(!none.retries_after_send, "a failed connect sends nothing");
        assert!(p.retries_after_send);
    }
}
