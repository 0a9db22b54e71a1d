//! `[[clusters]]`: endpoints, load balancing, timeouts, pools, health checks, upstream TLS.

use super::{duration_text, At, Invalid};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LbPolicy {
    /// Weighted round robin (smooth).
    #[default]
    RoundRobin,
    /// The power of two random choices, by requests in flight per unit of weight.
    LeastRequest,
    /// A Maglev table looked up by a hash of `hash_key`.
    ConsistentHash,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamProtocol {
    #[default]
    Http1,
    /// HTTP/2 over cleartext TCP (prior knowledge).
    H2c,
    /// HTTP/2 over TLS (ALPN h2); needs `[clusters.tls]`.
    H2,
}

/// `[clusters.tls]`: TLS to the cluster's endpoints.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// The name sent (SNI) and verified in the endpoints' certificates.
    pub server_name: String,
    /// CA certificates (PEM) the endpoints' certificates must chain to (default: the system's).
    pub ca: Option<PathBuf>,
    /// A client certificate chain and its key (PEM), for origins that require mTLS.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub name: String,
    /// `host:port` of each endpoint.
    pub endpoints: Vec<SocketAddr>,
    #[serde(default)]
    pub lb: LbPolicy,
    /// Each endpoint's weight (1 to 1,000), in `endpoints`' order; empty: all 1.
    #[serde(default)]
    pub weights: Vec<u32>,
    /// What `lb = "consistent_hash"` hashes.
    pub hash_key: Option<super::RequestKeyConfig>,
    #[serde(default)]
    pub protocol: UpstreamProtocol,
    #[serde(default = "default_connect_timeout", with = "duration_text")]
    pub connect_timeout: Duration,
    /// Time to wait for the upstream's response headers; past it the client gets 504.
    #[serde(default = "default_read_timeout", with = "duration_text")]
    pub read_timeout: Duration,
    /// Pooled keep-alive connections idle longer than this are closed.
    #[serde(default = "default_idle_timeout", with = "duration_text")]
    pub idle_timeout: Duration,
    /// Idle keep-alive connections kept per endpoint.
    #[serde(default = "default_pool_size")]
    pub max_idle_per_endpoint: usize,
    /// Requests in flight to the cluster at once, over all workers (from sending to the end of
    /// the response body); past it the client gets 503 at once instead of queueing behind a
    /// slow upstream.
    #[serde(default = "default_max_requests")]
    pub max_requests: usize,
    /// Requests in flight to the cluster from one client address; past it that client gets
    /// 429, so one client cannot take every slot (default: a quarter of `max_requests`, and
    /// at least 8 or `max_requests`). Read it with [`ClusterConfig::max_requests_per_client`].
    pub max_requests_per_client: Option<usize>,
    /// Longest wait for the next bytes of an upstream's response body once its headers are
    /// in (nginx's `proxy_read_timeout`); past it the response is cut and the slot freed.
    #[serde(default = "default_body_timeout", with = "duration_text")]
    pub body_timeout: Duration,
    /// TLS to the endpoints; none: cleartext.
    pub tls: Option<UpstreamTlsConfig>,
    /// Active health checks of the endpoints; none when absent.
    pub health_check: Option<HealthCheckConfig>,
    /// Passive ejection of endpoints that answer with errors; none when absent.
    pub outlier_detection: Option<OutlierConfig>,
    /// How many retries may be in flight to the cluster at once.
    #[serde(default)]
    pub retry_budget: super::RetryBudgetConfig,
    /// Failed connects in a row after which an endpoint is passed over for `fail_timeout`
    /// (passive health, as nginx's `max_fails`); 0: never.
    #[serde(default = "default_max_fails")]
    pub max_fails: u32,
    #[serde(default = "default_fail_timeout", with = "duration_text")]
    pub fail_timeout: Duration,
}

impl ClusterConfig {
    /// Every endpoint's weight (`weights`, or 1 each).
    pub fn endpoint_weights(&self) -> Vec<u32> {
        if self.weights.is_empty() {
            vec![1; self.endpoints.len()]
        } else {
            self.weights.clone()
        }
    }

    /// `max_requests_per_client`, or its default: a quarter of `max_requests`, and at least
    /// 8 (or `max_requests`, if fewer), never more than `max_requests`.
    pub fn max_requests_per_client(&self) -> usize {
        self.max_requests_per_client
            .unwrap_or((self.max_requests / 4).max(self.max_requests.min(8)))
            .min(self.max_requests)
    }
}

/// `[clusters.outlier_detection]`: an endpoint whose responses are 5xx (or gateway failures:
/// 502, 503, 504, or no answer within `read_timeout`) so many times in a row is ejected for
/// `base_ejection_time` times the number of its ejections (at most `max_ejection_time`), while
/// no more than `max_ejection_percent` of the cluster's endpoints (at least one) are out.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// 5xx responses in a row that eject; 0: not counted.
    pub consecutive_5xx: u32,
    /// Gateway failures in a row (502, 503, 504, no answer within `read_timeout`) that eject;
    /// 0: not counted.
    pub consecutive_gateway_failures: u32,
    #[serde(with = "duration_text")]
    pub base_ejection_time: Duration,
    #[serde(with = "duration_text")]
    pub max_ejection_time: Duration,
    pub max_ejection_percent: u32,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_5xx: 5,
            consecutive_gateway_failures: 5,
            base_ejection_time: Duration::from_secs(30),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_percent: 10,
        }
    }
}

/// `[clusters.health_check]`: each endpoint is asked for `path` every `interval`; one that
/// fails `unhealthy_after` checks in a row gets no requests until it passes `healthy_after`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckConfig {
    /// The path asked for (GET); a 2xx or 3xx answer within `timeout` passes.
    pub path: String,
    /// The `Host` header sent (default: the endpoint's address).
    pub host: Option<String>,
    #[serde(default = "default_check_interval", with = "duration_text")]
    pub interval: Duration,
    #[serde(default = "default_check_timeout", with = "duration_text")]
    pub timeout: Duration,
    #[serde(default = "default_unhealthy_after")]
    pub unhealthy_after: u32,
    #[serde(default = "default_healthy_after")]
    pub healthy_after: u32,
}

fn default_check_interval() -> Duration {
    Duration::from_secs(5)
}
fn default_check_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_unhealthy_after() -> u32 {
    3
}
fn default_healthy_after() -> u32 {
    2
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_read_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(90)
}
fn default_pool_size() -> usize {
    64
}
fn default_body_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_max_requests() -> usize {
    1024
}
fn default_max_fails() -> u32 {
    1
}
fn default_fail_timeout() -> Duration {
    Duration::from_secs(10)
}

impl ClusterConfig {
    /// The cluster's own fields (its name is checked against the others' by the caller).
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        self.retry_budget.validate(&at.field("retry_budget"))?;
        if self.endpoints.is_empty() {
            return at.field("endpoints").fail("at least one endpoint");
        }
        if !self.weights.is_empty() && self.weights.len() != self.endpoints.len() {
            return at.field("weights").fail(format!(
                "one weight per endpoint ({} endpoints), or none",
                self.endpoints.len()
            ));
        }
        if let Some(i) = self.weights.iter().position(|w| !(1..=1000).contains(w)) {
            return at.field("weights").index(i).fail("a weight from 1 to 1000");
        }
        match (&self.hash_key, self.lb) {
            (None, LbPolicy::ConsistentHash) => {
                return at.field("hash_key").fail(
                    "what lb = \"consistent_hash\" hashes: { header = \"...\" }, { cookie = \"...\" } or { client_address = true }",
                )
            }
            (Some(_), LbPolicy::RoundRobin | LbPolicy::LeastRequest) => {
                return at.field("hash_key").fail("only with lb = \"consistent_hash\"")
            }
            (Some(k), _) => k.validate(&at.field("hash_key"))?,
            (None, _) => {}
        }
        match (&self.tls, self.protocol) {
            (None, UpstreamProtocol::H2) => {
                return at.field("protocol").fail(
                    "\"h2\" is HTTP/2 over TLS and needs [clusters.tls]; \"h2c\" is cleartext",
                )
            }
            (Some(_), UpstreamProtocol::H2c) => {
                return at
                    .field("protocol")
                    .fail("\"h2c\" is cleartext; with [clusters.tls], \"h2\" (or \"http1\")")
            }
            (Some(t), _) if t.client_cert.is_some() != t.client_key.is_some() => {
                return at.field("tls").fail("client_cert and client_key together")
            }
            (Some(t), _) if t.server_name.is_empty() => {
                return at.field("tls").field("server_name").fail("a DNS name")
            }
            _ => {}
        }
        if self.max_requests == 0 {
            return at.field("max_requests").fail("at least 1");
        }
        if self.max_requests_per_client == Some(0) {
            return at.field("max_requests_per_client").fail("at least 1");
        }
        if self.max_fails > 0 && self.fail_timeout.is_zero() {
            return at
                .field("fail_timeout")
                .fail("greater than zero (or max_fails = 0 to turn passive checks off)");
        }
        if let Some(h) = &self.health_check {
            let at = at.field("health_check");
            if !h.path.starts_with('/') {
                return at.field("path").fail("a path starting with /");
            }
            if h.interval.is_zero() || h.timeout.is_zero() {
                return at.fail("interval and timeout must be greater than zero");
            }
            if h.unhealthy_after == 0 || h.healthy_after == 0 {
                return at.fail("unhealthy_after and healthy_after must be at least 1");
            }
        }
        if let Some(o) = &self.outlier_detection {
            let at = at.field("outlier_detection");
            if o.consecutive_5xx == 0 && o.consecutive_gateway_failures == 0 {
                return at.fail("consecutive_5xx or consecutive_gateway_failures above 0");
            }
            if o.base_ejection_time.is_zero() || o.max_ejection_time < o.base_ejection_time {
                return at
                    .field("max_ejection_time")
                    .fail("at least base_ejection_time, which must be greater than zero");
            }
            if o.max_ejection_percent == 0 || o.max_ejection_percent > 100 {
                return at
                    .field("max_ejection_percent")
                    .fail("a percent from 1 to 100");
            }
        }
        if self.read_timeout.is_zero() || self.connect_timeout.is_zero() {
            return at.fail("timeouts must be greater than zero");
        }
        Ok(())
    }

    /// Relative paths in the cluster resolved against the config file's folder.
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        if let Some(t) = &mut self.tls {
            for p in [&mut t.ca, &mut t.client_cert, &mut t.client_key]
                .into_iter()
                .flatten()
            {
                *p = base.join(&*p);
            }
        }
    }
}
