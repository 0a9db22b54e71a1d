//! Upstream clusters: endpoints, load balancing, keep-alive pools and timeouts.

use crate::body::RequestBody;
use crate::config::{ClusterConfig, LbPolicy, UpstreamProtocol};
use http::{Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Why an upstream exchange failed; the proxy maps each to a status.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connect to {0} failed")]
    Connect(SocketAddr),
    #[error("no response headers from {0} within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("exchange with {0} failed: {1}")]
    Exchange(SocketAddr, String),
}

impl UpstreamError {
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Connect(_) => "connect",
            UpstreamError::Timeout(..) => "timeout",
            UpstreamError::Exchange(..) => "exchange",
        }
    }
}

struct Endpoint {
    addr: SocketAddr,
    authority: String,
    in_flight: AtomicUsize,
}

pub struct Cluster {
    pub name: String,
    /// This cluster's series of `rampart_upstream_response_duration_seconds`.
    pub response_seconds: prometheus::Histogram,
    endpoints: Vec<Endpoint>,
    lb: LbPolicy,
    next: AtomicUsize,
    client: Client<HttpConnector, RequestBody>,
    read_timeout: Duration,
    version: Version,
}

/// Decrements an endpoint's in-flight count when the exchange ends.
struct InFlight<'a>(&'a AtomicUsize);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Cluster {
    pub fn new(cfg: &ClusterConfig, metrics: &crate::metrics::Metrics) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.enforce_http(true);
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(cfg.idle_timeout)
            .pool_max_idle_per_host(cfg.max_idle_per_endpoint)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new());
        if cfg.protocol == UpstreamProtocol::H2c {
            builder.http2_only(true);
        }
        Cluster {
            name: cfg.name.clone(),
            response_seconds: metrics.upstream_seconds.with_label_values(&[&cfg.name]),
            endpoints: cfg
                .endpoints
                .iter()
                .map(|a| Endpoint {
                    addr: *a,
                    authority: a.to_string(),
                    in_flight: AtomicUsize::new(0),
                })
                .collect(),
            lb: cfg.lb,
            next: AtomicUsize::new(0),
            client: builder.build(connector),
            read_timeout: cfg.read_timeout,
            version: match cfg.protocol {
                UpstreamProtocol::Http1 => Version::HTTP_11,
                UpstreamProtocol::H2c => Version::HTTP_2,
            },
        }
    }

    /// Picks an endpoint index, avoiding `exclude` when there is another.
    fn pick(&self, exclude: Option<usize>) -> usize {
        let n = self.endpoints.len();
        let candidates = (0..n).filter(|i| Some(*i) != exclude || n == 1);
        match self.lb {
            LbPolicy::RoundRobin => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                (0..n)
                    .map(|k| (start + k) % n)
                    .find(|i| Some(*i) != exclude || n == 1)
                    .unwrap_or(0)
            }
            LbPolicy::LeastRequest => {
                // Least in flight; ties broken by rotating start so load spreads.
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                candidates
                    .min_by_key(|i| {
                        (
                            self.endpoints[*i].in_flight.load(Ordering::Relaxed),
                            (i + n - start % n) % n,
                        )
                    })
                    .unwrap_or(0)
            }
        }
    }

    /// Sends `req` (whose URI holds only path and query) to an endpoint. A connect failure of
    /// a request that is idempotent and has no body is retried once on another endpoint.
    pub async fn send(
        &self,
        req: Request<RequestBody>,
    ) -> Result<(Response<Incoming>, SocketAddr), UpstreamError> {
        let replay = (req.method().is_idempotent() && req.body().is_empty()).then(|| {
            let mut r = Request::new(());
            *r.method_mut() = req.method().clone();
            *r.uri_mut() = req.uri().clone();
            *r.headers_mut() = req.headers().clone();
            r
        });
        let first = self.pick(None);
        match self.send_to(first, req).await {
            Err(UpstreamError::Connect(addr)) if self.endpoints.len() > 1 && replay.is_some() => {
                tracing::debug!(cluster = %self.name, %addr, "connect failed; retrying on another endpoint");
                let second = self.pick(Some(first));
                let req = replay.expect("checked").map(|()| RequestBody::empty());
                self.send_to(second, req).await
            }
            r => r,
        }
    }

    async fn send_to(
        &self,
        idx: usize,
        mut req: Request<RequestBody>,
    ) -> Result<(Response<Incoming>, SocketAddr), UpstreamError> {
        let ep = &self.endpoints[idx];
        let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
        *req.uri_mut() = Uri::builder()
            .scheme("http")
            .authority(ep.authority.as_str())
            .path_and_query(pq)
            .build()
            .map_err(|e| UpstreamError::Exchange(ep.addr, e.to_string()))?;
        *req.version_mut() = self.version;
        ep.in_flight.fetch_add(1, Ordering::Relaxed);
        let _guard = InFlight(&ep.in_flight);
        match tokio::time::timeout(self.read_timeout, self.client.request(req)).await {
            Err(_) => Err(UpstreamError::Timeout(ep.addr, self.read_timeout)),
            Ok(Ok(resp)) => Ok((resp, ep.addr)),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Connect(ep.addr)),
            Ok(Err(e)) => {
                use std::error::Error;
                let mut msg = e.to_string();
                let mut src = e.source();
                while let Some(s) = src {
                    msg = format!("{msg}: {s}");
                    src = s.source();
                }
                Err(UpstreamError::Exchange(ep.addr, msg))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(lb: LbPolicy, n: u16) -> Cluster {
        Cluster::new(
            &ClusterConfig {
                name: "t".into(),
                endpoints: (0..n)
                    .map(|i| SocketAddr::from(([127, 0, 0, 1], 1000 + i)))
                    .collect(),
                lb,
                protocol: UpstreamProtocol::Http1,
                connect_timeout: Duration::from_secs(1),
                read_timeout: Duration::from_secs(1),
                idle_timeout: Duration::from_secs(1),
                max_idle_per_endpoint: 1,
            },
            &crate::metrics::Metrics::new(),
        )
    }

    #[tokio::test]
    async fn round_robin_cycles_and_exclusion_moves_on() {
        let c = cluster(LbPolicy::RoundRobin, 3);
        let picks: Vec<_> = (0..6).map(|_| c.pick(None)).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        for _ in 0..6 {
            let first = c.pick(None);
            assert_ne!(c.pick(Some(first)), first);
        }
    }

    #[tokio::test]
    async fn least_request_prefers_idle_endpoint() {
        let c = cluster(LbPolicy::LeastRequest, 3);
        c.endpoints[0].in_flight.store(5, Ordering::Relaxed);
        c.endpoints[2].in_flight.store(1, Ordering::Relaxed);
        for _ in 0..5 {
            assert_eq!(c.pick(None), 1);
        }
        assert_eq!(c.pick(Some(1)), 2);
    }
}
