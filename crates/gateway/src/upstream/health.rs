//! Upstream endpoint health, active and passive.
//!
//! Passive: an endpoint whose connects fail `max_fails` times in a row is passed over for
//! `fail_timeout` (nginx's rule), whatever the requests it would have had. With
//! `[clusters.outlier_detection]`, one whose responses are 5xx (or that time out) so
//! many times in a row is ejected for a time growing with each ejection, never more than a
//! share of the cluster at once (Envoy's outlier detection).
//!
//! Active health checks: one task per cluster that has a
//! `[clusters.health_check]` (on the control-plane runtime) asks every endpoint for the check
//! path each interval, over a new connection in the cluster's protocol; an endpoint that fails
//! `unhealthy_after` checks in a row is marked down and load balancing passes it over until it
//! passes `healthy_after` in a row. Every worker's copy of the cluster reads the same marks.
//! Endpoints start healthy; when every endpoint is down, requests go to all of them as if none
//! were (a gateway that refused everything would turn one bad check into an outage).

use crate::config::{ClusterConfig, HealthCheckConfig, OutlierConfig, UpstreamProtocol};
use crate::upstream::tls::{dial, UpstreamTls};
use bytes::Bytes;
use http_body_util::Empty;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Whether each endpoint of a cluster is up, shared by every worker's copy of it.
pub struct Health {
    /// The active checks' marks.
    healthy: Vec<AtomicBool>,
    /// `rampart_upstream_endpoint_healthy{cluster, endpoint}`, one per endpoint.
    gauges: Vec<prometheus::IntGauge>,
    /// Passive health: failed connects in a row, and until when (nanoseconds after `epoch`,
    /// 0 for never) an endpoint is passed over.
    fails: Vec<AtomicU32>,
    down_until: Vec<AtomicU64>,
    epoch: Instant,
    max_fails: u32,
    fail_timeout: Duration,
    cluster: String,
    endpoints: Vec<SocketAddr>,
    /// Outlier detection: its settings, and per endpoint the 5xx responses and the gateway
    /// failures in a row, and its ejections so far.
    outlier: Option<OutlierConfig>,
    errors_5xx: Vec<AtomicU32>,
    gateway_failures: Vec<AtomicU32>,
    ejections: Vec<AtomicU32>,
    ejected: prometheus::IntCounterVec,
}

impl Health {
    pub fn new(cfg: &ClusterConfig, metrics: &crate::ops::metrics::Metrics) -> Arc<Self> {
        let gauges: Vec<_> = cfg
            .endpoints
            .iter()
            .map(|a| {
                let g = metrics
                    .upstream_healthy
                    .with_label_values(&[&cfg.name, &a.to_string()]);
                g.set(1);
                g
            })
            .collect();
        Arc::new(Health {
            healthy: cfg
                .endpoints
                .iter()
                .map(|_| AtomicBool::new(true))
                .collect(),
            gauges,
            fails: cfg.endpoints.iter().map(|_| AtomicU32::new(0)).collect(),
            down_until: cfg.endpoints.iter().map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
            max_fails: cfg.max_fails,
            fail_timeout: cfg.fail_timeout,
            cluster: cfg.name.clone(),
            endpoints: cfg.endpoints.clone(),
            outlier: cfg.outlier_detection.clone(),
            errors_5xx: cfg.endpoints.iter().map(|_| AtomicU32::new(0)).collect(),
            gateway_failures: cfg.endpoints.iter().map(|_| AtomicU32::new(0)).collect(),
            ejections: cfg.endpoints.iter().map(|_| AtomicU32::new(0)).collect(),
            ejected: metrics.upstream_ejections.clone(),
        })
    }

    /// Outlier detection: the status of a response from `endpoint` (headers received).
    pub fn record_response(&self, endpoint: usize, status: u16) {
        let Some(o) = &self.outlier else { return };
        if status < 500 {
            for c in [&self.errors_5xx[endpoint], &self.gateway_failures[endpoint]] {
                if c.load(Ordering::Relaxed) != 0 {
                    c.store(0, Ordering::Relaxed);
                }
            }
            return;
        }
        let run_5xx = self.errors_5xx[endpoint].fetch_add(1, Ordering::Relaxed) + 1;
        let run_gw = if matches!(status, 502..=504) {
            self.gateway_failures[endpoint].fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.gateway_failures[endpoint].store(0, Ordering::Relaxed);
            0
        };
        let over = |n: u32, limit: u32| limit > 0 && n >= limit;
        if over(run_5xx, o.consecutive_5xx) {
            self.eject(endpoint, o, "consecutive_5xx");
        } else if over(run_gw, o.consecutive_gateway_failures) {
            self.eject(endpoint, o, "consecutive_gateway_failures");
        }
    }

    /// Outlier detection: `endpoint` did not answer within the cluster's `read_timeout`.
    pub fn record_exchange_failure(&self, endpoint: usize) {
        let Some(o) = &self.outlier else { return };
        let run = self.gateway_failures[endpoint].fetch_add(1, Ordering::Relaxed) + 1;
        if o.consecutive_gateway_failures > 0 && run >= o.consecutive_gateway_failures {
            self.eject(endpoint, o, "consecutive_gateway_failures");
        }
    }

    /// Ejects `endpoint` unless the cluster's share of ejected endpoints is reached.
    fn eject(&self, endpoint: usize, o: &OutlierConfig, why: &'static str) {
        self.errors_5xx[endpoint].store(0, Ordering::Relaxed);
        self.gateway_failures[endpoint].store(0, Ordering::Relaxed);
        let now = self.now_nanos();
        let out = (0..self.endpoints.len())
            .filter(|i| self.down_until[*i].load(Ordering::Relaxed) > now)
            .count();
        let allowed = (self.endpoints.len() * o.max_ejection_percent as usize / 100).max(1);
        if out >= allowed {
            tracing::warn!(cluster = %self.cluster, endpoint = %self.endpoints[endpoint], reason = why,
                "endpoint not ejected: max_ejection_percent of the cluster is out already");
            return;
        }
        let times = self.ejections[endpoint].fetch_add(1, Ordering::Relaxed) + 1;
        let time = (o.base_ejection_time * times).min(o.max_ejection_time);
        self.down_until[endpoint].store(now + time.as_nanos() as u64, Ordering::Relaxed);
        self.ejected
            .with_label_values(&[&self.cluster, &self.endpoints[endpoint].to_string(), why])
            .inc();
        tracing::warn!(cluster = %self.cluster, endpoint = %self.endpoints[endpoint], reason = why,
            for_ = ?time, ejections = times, "endpoint ejected");
    }

    /// Whether load balancing should pick `endpoint`: its active checks pass (or it has none)
    /// and no run of failed connects has it passed over.
    pub fn is_healthy(&self, endpoint: usize) -> bool {
        if !self.healthy[endpoint].load(Ordering::Relaxed) {
            return false;
        }
        match self.down_until[endpoint].load(Ordering::Relaxed) {
            0 => true,
            until if self.now_nanos() >= until => {
                // Served its time: back to no clock reading per pick.
                let _ = self.down_until[endpoint].compare_exchange(
                    until,
                    0,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
                true
            }
            _ => false,
        }
    }

    fn now_nanos(&self) -> u64 {
        // At least 1, so that 0 keeps meaning "never passed over".
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// Passive health: the outcome of a connect to `endpoint` made for a request.
    pub fn record_connect(&self, endpoint: usize, ok: bool) {
        if ok {
            if self.fails[endpoint].load(Ordering::Relaxed) != 0 {
                self.fails[endpoint].store(0, Ordering::Relaxed);
            }
            return;
        }
        if self.max_fails == 0 {
            return;
        }
        let fails = self.fails[endpoint].fetch_add(1, Ordering::Relaxed) + 1;
        if fails >= self.max_fails {
            self.fails[endpoint].store(0, Ordering::Relaxed);
            let until = self.now_nanos() + self.fail_timeout.as_nanos() as u64;
            self.down_until[endpoint].store(until, Ordering::Relaxed);
            tracing::warn!(
                cluster = %self.cluster,
                endpoint = %self.endpoints[endpoint],
                fails,
                for_ = ?self.fail_timeout,
                "endpoint passed over after failed connects"
            );
        }
    }

    pub(crate) fn set(&self, endpoint: usize, healthy: bool) {
        self.healthy[endpoint].store(healthy, Ordering::Relaxed);
        self.gauges[endpoint].set(i64::from(healthy));
    }

    /// Starts the cluster's checks, if it has any; they end when `stop` turns true.
    pub fn spawn_checks(
        self: &Arc<Self>,
        cfg: &ClusterConfig,
        tls: Option<Arc<UpstreamTls>>,
        stop: watch::Receiver<bool>,
    ) {
        let Some(check) = cfg.health_check.clone() else {
            return;
        };
        let health = self.clone();
        let protocol = cfg.protocol;
        tokio::spawn(async move {
            health.run(protocol, tls.as_deref(), &check, stop).await;
        });
    }

    async fn run(
        &self,
        protocol: UpstreamProtocol,
        tls: Option<&UpstreamTls>,
        check: &HealthCheckConfig,
        mut stop: watch::Receiver<bool>,
    ) {
        let (cluster, endpoints) = (self.cluster.as_str(), &self.endpoints);
        // Consecutive results against the current mark: failures while up, passes while down.
        let mut streak = vec![0u32; endpoints.len()];
        let mut tick = tokio::time::interval(check.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
            let results = futures_util::future::join_all(
                endpoints.iter().map(|a| probe(*a, protocol, tls, check)),
            )
            .await;
            for (i, result) in results.into_iter().enumerate() {
                let up = self.is_healthy(i);
                if result.is_ok() != up {
                    streak[i] += 1;
                } else {
                    streak[i] = 0;
                }
                let needed = if up {
                    check.unhealthy_after
                } else {
                    check.healthy_after
                };
                if streak[i] >= needed {
                    streak[i] = 0;
                    self.set(i, !up);
                    match result {
                        Ok(()) => {
                            tracing::info!(cluster, endpoint = %endpoints[i], "endpoint healthy again")
                        }
                        Err(why) => {
                            tracing::warn!(cluster, endpoint = %endpoints[i], %why, failed = needed, "endpoint marked unhealthy")
                        }
                    }
                }
            }
        }
    }
}

/// One check of one endpoint: a new connection, `GET path`, a 2xx or 3xx answer in time.
async fn probe(
    addr: SocketAddr,
    protocol: UpstreamProtocol,
    tls: Option<&UpstreamTls>,
    check: &HealthCheckConfig,
) -> Result<(), String> {
    let host = check.host.clone().unwrap_or_else(|| addr.to_string());
    let scheme = if tls.is_some() { "https" } else { "http" };
    let attempt = async {
        let io = dial(addr, tls, check.timeout)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let io = TokioIo::new(io);
        let get = |uri: &str| {
            http::Request::get(uri).header(http::header::USER_AGENT, "rampart-health-check")
        };
        let bad_host = |_| format!("bad host {host:?}");
        let status = match protocol {
            UpstreamProtocol::Http1 => {
                let req = get(&check.path)
                    .header(http::header::HOST, host.as_str())
                    .body(Empty::<Bytes>::new())
                    .map_err(bad_host)?;
                let (mut sender, conn) = http1::handshake(io).await.map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                let resp = sender.send_request(req).await;
                resp.map_err(|e| e.to_string())?.status()
            }
            UpstreamProtocol::H2c | UpstreamProtocol::H2 => {
                let req = get(&format!("{scheme}://{host}{}", check.path))
                    .body(Empty::<Bytes>::new())
                    .map_err(bad_host)?;
                let (mut sender, conn) = http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .handshake(io)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                let resp = sender.send_request(req).await;
                resp.map_err(|e| e.to_string())?.status()
            }
        };
        if status.is_success() || status.is_redirection() {
            Ok(())
        } else {
            Err(format!("status {status}"))
        }
    };
    tokio::time::timeout(check.timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {:?}", check.timeout)))
}
