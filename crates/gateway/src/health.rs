//! Active health checks of upstream endpoints. One task per cluster that has a
//! `[clusters.health_check]` (on the control-plane runtime) asks every endpoint for the check
//! path each interval, over a new connection in the cluster's protocol; an endpoint that fails
//! `unhealthy_after` checks in a row is marked down and load balancing passes it over until it
//! passes `healthy_after` in a row. Every worker's copy of the cluster reads the same marks.
//! Endpoints start healthy; when every endpoint is down, requests go to all of them as if none
//! were (a gateway that refused everything would turn one bad check into an outage).

use crate::config::{ClusterConfig, HealthCheckConfig, UpstreamProtocol};
use bytes::Bytes;
use http_body_util::Empty;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

/// Whether each endpoint of a cluster is up, shared by every worker's copy of it.
pub struct Health {
    healthy: Vec<AtomicBool>,
    /// `rampart_upstream_endpoint_healthy{cluster, endpoint}`, one per endpoint.
    gauges: Vec<prometheus::IntGauge>,
}

impl Health {
    pub fn new(cfg: &ClusterConfig, metrics: &crate::metrics::Metrics) -> Arc<Self> {
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
        })
    }

    pub fn is_healthy(&self, endpoint: usize) -> bool {
        self.healthy[endpoint].load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self, endpoint: usize, healthy: bool) {
        self.healthy[endpoint].store(healthy, Ordering::Relaxed);
        self.gauges[endpoint].set(i64::from(healthy));
    }

    /// Starts the cluster's checks, if it has any; they end when `stop` turns true.
    pub fn spawn_checks(self: &Arc<Self>, cfg: &ClusterConfig, stop: watch::Receiver<bool>) {
        let Some(check) = cfg.health_check.clone() else {
            return;
        };
        let health = self.clone();
        let (name, endpoints, protocol) = (cfg.name.clone(), cfg.endpoints.clone(), cfg.protocol);
        tokio::spawn(async move {
            health.run(&name, &endpoints, protocol, &check, stop).await;
        });
    }

    async fn run(
        &self,
        cluster: &str,
        endpoints: &[SocketAddr],
        protocol: UpstreamProtocol,
        check: &HealthCheckConfig,
        mut stop: watch::Receiver<bool>,
    ) {
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
                endpoints.iter().map(|a| probe(*a, protocol, check)),
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
    check: &HealthCheckConfig,
) -> Result<(), String> {
    let host = check.host.clone().unwrap_or_else(|| addr.to_string());
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let io = TokioIo::new(tcp);
        let req = http::Request::get(check.path.as_str())
            .header(http::header::USER_AGENT, "rampart-health-check")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let status = match protocol {
            UpstreamProtocol::Http1 => {
                let (mut sender, conn) = http1::handshake(io).await.map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                let (mut parts, body) = req.into_parts();
                parts.headers.insert(
                    http::header::HOST,
                    host.parse().map_err(|_| format!("bad host {host:?}"))?,
                );
                let req = http::Request::from_parts(parts, body);
                sender
                    .send_request(req)
                    .await
                    .map_err(|e| e.to_string())?
                    .status()
            }
            UpstreamProtocol::H2c => {
                let (mut sender, conn) = http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .handshake(io)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                let (mut parts, body) = req.into_parts();
                parts.uri = format!("http://{host}{}", check.path)
                    .parse()
                    .map_err(|_| format!("bad host {host:?}"))?;
                let req = http::Request::from_parts(parts, body);
                sender
                    .send_request(req)
                    .await
                    .map_err(|e| e.to_string())?
                    .status()
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
