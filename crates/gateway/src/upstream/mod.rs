//! Upstream clusters: endpoints, load balancing, keep-alive pools and timeouts.
//!
//! Each worker owns its clusters, so pools are per worker (like nginx's per-worker keepalive
//! cache) and a checkout never contends with another thread. HTTP/1.1 connections return to
//! their endpoint's idle stack when the response body has been read to its end; an h2c
//! endpoint keeps one multiplexed connection.

mod balance;
pub(crate) mod health;
mod retry;
pub(crate) mod tls;

pub use retry::{RequestCopy, Retry};

use crate::body::{RequestBody, UpstreamLease};
use crate::config::{ClusterConfig, UpstreamProtocol};
use crate::policy::client_share::{ClientShare, ClientShares};
use crate::upstream::health::Health;
use crate::upstream::tls::{dial, UpstreamIo, UpstreamTls};
use balance::{Balancer, Pick};
use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why an upstream exchange failed; the proxy maps each to a status.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("connect to {0} failed: {1}")]
    Connect(SocketAddr, String),
    #[error("no response headers from {0} within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("exchange with {0} failed: {1}")]
    Exchange(SocketAddr, String),
    #[error("{0} requests already in flight (max_requests)")]
    Overflow(usize),
    #[error("{0} requests already in flight from this client (max_requests_per_client)")]
    ClientShare(usize),
}

impl UpstreamError {
    pub fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Connect(..) => "connect",
            UpstreamError::Timeout(..) => "timeout",
            UpstreamError::Exchange(..) => "exchange",
            UpstreamError::Overflow(_) => "overflow",
            UpstreamError::ClientShare(_) => "client_share",
        }
    }
}

struct Idle {
    sender: http1::SendRequest<RequestBody>,
    since: Instant,
}

struct Endpoint {
    addr: SocketAddr,
    in_flight: AtomicUsize,
    idle: Mutex<Vec<Idle>>,
    h2: Mutex<Option<http2::SendRequest<RequestBody>>>,
    max_idle: usize,
    idle_timeout: Duration,
    /// A task closes idle connections past `idle_timeout` while any are pooled.
    reaping: std::sync::atomic::AtomicBool,
}

impl Endpoint {
    /// Starts the endpoint's reaper unless it runs: it closes pooled connections on time
    /// (not only at the next checkout) and ends once the pool is empty.
    fn reap_idle(ep: &Arc<Endpoint>) {
        if ep.reaping.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            ep.reaping.store(false, Ordering::Release);
            return;
        };
        let ep = ep.clone();
        rt.spawn(async move {
            loop {
                let oldest = ep
                    .idle
                    .lock()
                    .expect("pool lock")
                    .iter()
                    .map(|i| i.since)
                    .min();
                let Some(oldest) = oldest else {
                    ep.reaping.store(false, Ordering::Release);
                    // A connection pooled between the look and the store starts a new reaper.
                    if ep.idle.lock().expect("pool lock").is_empty()
                        || ep.reaping.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                    continue;
                };
                tokio::time::sleep_until((oldest + ep.idle_timeout).into()).await;
                // Dropped outside the lock: closing a connection is not done holding it.
                let expired: Vec<Idle> = {
                    let mut idle = ep.idle.lock().expect("pool lock");
                    let (old, kept) = std::mem::take(&mut *idle).into_iter().partition(|i| {
                        i.since.elapsed() >= ep.idle_timeout || i.sender.is_closed()
                    });
                    *idle = kept;
                    old
                };
                drop(expired);
            }
        });
    }
}

/// An HTTP/1.1 upstream connection lent to one exchange; give it back with [`release`]
/// once the response body has ended, or drop it to close the connection.
///
/// [`release`]: PooledConn::release
pub struct PooledConn {
    endpoint: Arc<Endpoint>,
    sender: http1::SendRequest<RequestBody>,
}

impl PooledConn {
    pub fn release(self) {
        if self.sender.is_closed() {
            return;
        }
        let mut idle = self.endpoint.idle.lock().expect("pool lock");
        if idle.len() < self.endpoint.max_idle {
            idle.push(Idle {
                sender: self.sender,
                since: Instant::now(),
            });
            drop(idle);
            Endpoint::reap_idle(&self.endpoint);
        }
    }
}

/// The requests in flight to one cluster, shared by every worker's copy of it and bounded
/// by its `max_requests`; `rampart_upstream_requests_in_flight{cluster}` follows the count.
pub struct RequestSlots {
    in_flight: AtomicUsize,
    /// `max_requests`; a reload that changes it keeps the count of requests in flight.
    pub(crate) max: AtomicUsize,
    /// Requests in flight per client (`max_requests_per_client`), so that one client cannot
    /// hold every slot.
    per_client: Arc<ClientShares>,
    gauge: prometheus::IntGauge,
    /// Retries in flight, and the `retry_budget` in force (`percent` as f64 bits).
    retries_in_flight: AtomicUsize,
    budget_percent: std::sync::atomic::AtomicU64,
    budget_min: AtomicUsize,
}

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoSlot {
    /// All `max_requests` are taken.
    Full(usize),
    /// This client holds its `max_requests_per_client`.
    ClientShare(usize),
}

impl From<NoSlot> for UpstreamError {
    fn from(n: NoSlot) -> Self {
        match n {
            NoSlot::Full(max) => UpstreamError::Overflow(max),
            NoSlot::ClientShare(max) => UpstreamError::ClientShare(max),
        }
    }
}

impl RequestSlots {
    pub fn new(cfg: &ClusterConfig, metrics: &crate::ops::metrics::Metrics) -> Arc<Self> {
        Arc::new(RequestSlots {
            in_flight: AtomicUsize::new(0),
            max: AtomicUsize::new(cfg.max_requests),
            per_client: ClientShares::new(cfg.max_requests_per_client()),
            gauge: metrics.upstream_in_flight.with_label_values(&[&cfg.name]),
            retries_in_flight: AtomicUsize::new(0),
            budget_percent: cfg.retry_budget.percent.to_bits().into(),
            budget_min: AtomicUsize::new(cfg.retry_budget.min_concurrent as usize),
        })
    }

    /// The same slots, counting on, with `cfg`'s `max_requests` (a reload).
    pub fn reuse(self: &Arc<Self>, cfg: &ClusterConfig) -> Arc<Self> {
        self.max.store(cfg.max_requests, Ordering::Relaxed);
        self.per_client.set_max(cfg.max_requests_per_client());
        self.budget_percent
            .store(cfg.retry_budget.percent.to_bits(), Ordering::Relaxed);
        self.budget_min
            .store(cfg.retry_budget.min_concurrent as usize, Ordering::Relaxed);
        self.clone()
    }

    /// A place for one more request from `client`, unless all are taken or the client holds
    /// its share.
    fn take(self: &Arc<Self>, client: IpAddr) -> Result<RequestSlot, NoSlot> {
        let max = self.max.load(Ordering::Relaxed);
        if self.in_flight.fetch_add(1, Ordering::Relaxed) >= max {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(NoSlot::Full(max));
        }
        let Some(share) = self.per_client.take(client) else {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            return Err(NoSlot::ClientShare(self.per_client.max()));
        };
        self.gauge.inc();
        Ok(RequestSlot {
            slots: self.clone(),
            _share: share,
        })
    }
}

/// One request's place among its cluster's `max_requests`, given back when dropped (with the
/// response body, or at once if the exchange fails).
pub struct RequestSlot {
    slots: Arc<RequestSlots>,
    /// The client's unit of `max_requests_per_client`, given back with the slot.
    _share: ClientShare,
}

impl Drop for RequestSlot {
    fn drop(&mut self) {
        let s = &self.slots;
        s.in_flight.fetch_sub(1, Ordering::Relaxed);
        s.gauge.dec();
    }
}

/// A response from upstream, with the connection to release and the request slot to give
/// back when its body ends.
pub struct Exchange {
    pub response: Response<Incoming>,
    pub endpoint: SocketAddr,
    pub conn: Option<PooledConn>,
    pub slot: Option<RequestSlot>,
}

impl Exchange {
    /// The connection and slot, for the response body to give back when it ends.
    pub fn lease(conn: Option<PooledConn>, slot: Option<RequestSlot>) -> Box<dyn UpstreamLease> {
        Box::new(Lease { conn, slot })
    }
}

/// An upstream response's connection and request slot until its body ends.
struct Lease {
    conn: Option<PooledConn>,
    slot: Option<RequestSlot>,
}

impl UpstreamLease for Lease {
    fn end(self: Box<Self>, reusable: bool) {
        let Lease { conn, slot } = *self;
        // An upstream body read to its end leaves the connection reusable; one abandoned
        // midway is closed by dropping it.
        if let (Some(c), true) = (conn, reusable) {
            c.release();
        }
        drop(slot);
    }
}

pub struct Cluster {
    pub name: String,
    /// This cluster's series of `rampart_upstream_response_duration_seconds`.
    pub response_seconds: prometheus::Histogram,
    /// This cluster's `rampart_upstream_errors_total{kind="body"}`: response bodies that failed
    /// midway.
    pub body_errors: prometheus::IntCounter,
    /// `rampart_upstream_retries_total`, labelled by this cluster and a reason per retry.
    retries: prometheus::IntCounterVec,
    /// This cluster's `rampart_upstream_retries_refused_total`.
    retries_refused: prometheus::IntCounter,
    slots: Arc<RequestSlots>,
    health: Arc<Health>,
    /// TLS to the endpoints, when the cluster has it.
    tls: Option<Arc<UpstreamTls>>,
    endpoints: Vec<Arc<Endpoint>>,
    balancer: Balancer,
    connect_timeout: Duration,
    read_timeout: Duration,
    /// `body_timeout`: the longest wait for the next bytes of a response body.
    pub body_timeout: Duration,
    protocol: UpstreamProtocol,
}

/// Decrements an endpoint's in-flight count when the exchange ends.
struct InFlight<'a>(&'a AtomicUsize);
impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Runs an upstream connection's I/O until it closes; its errors surface on the requests.
fn drive<C>(conn: C)
where
    C: std::future::Future + Send + 'static,
{
    tokio::spawn(async move {
        let _ = conn.await;
    });
}

fn describe(e: &hyper::Error) -> String {
    use std::error::Error;
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}

impl Cluster {
    /// A worker's copy of the cluster `cfg`; `slots`, `health` and `tls` are shared by every
    /// worker's copy.
    pub fn new(
        cfg: &ClusterConfig,
        metrics: &crate::ops::metrics::Metrics,
        slots: Arc<RequestSlots>,
        health: Arc<Health>,
        tls: Option<Arc<UpstreamTls>>,
    ) -> Self {
        Cluster {
            name: cfg.name.clone(),
            slots,
            health,
            tls,
            response_seconds: metrics.upstream_seconds.with_label_values(&[&cfg.name]),
            body_errors: metrics
                .upstream_errors
                .with_label_values(&[&cfg.name, "body"]),
            retries: metrics.upstream_retries.clone(),
            retries_refused: metrics
                .upstream_retries_refused
                .with_label_values(&[&cfg.name]),
            endpoints: cfg
                .endpoints
                .iter()
                .map(|a| {
                    Arc::new(Endpoint {
                        addr: *a,
                        in_flight: AtomicUsize::new(0),
                        idle: Mutex::new(Vec::new()),
                        h2: Mutex::new(None),
                        max_idle: cfg.max_idle_per_endpoint,
                        idle_timeout: cfg.idle_timeout,
                        reaping: Default::default(),
                    })
                })
                .collect(),
            balancer: Balancer::new(cfg),
            connect_timeout: cfg.connect_timeout,
            read_timeout: cfg.read_timeout,
            body_timeout: cfg.body_timeout,
            protocol: cfg.protocol,
        }
    }

    /// Picks an endpoint index for `req` (`None`: in tests) by the cluster's balancer,
    /// passing over those `tried` (unless all were) and those failing their health checks
    /// (unless all are).
    fn pick(&self, req: Option<&Pick<'_>>, tried: impl Fn(usize) -> bool) -> usize {
        let n = self.endpoints.len();
        let load = |i: usize| self.endpoints[i].in_flight.load(Ordering::Relaxed);
        let healthy_untried = |i: usize| !tried(i) && self.health.is_healthy(i);
        let untried = |i: usize| !tried(i);
        let healthy = |i: usize| self.health.is_healthy(i);
        let any = |_: usize| true;
        // Every endpoint down: all of them as if none were (a gateway that refused them all
        // would turn one bad check into an outage).
        self.balancer
            .pick(n, req, &[&healthy_untried, &untried, &healthy, &any], load)
            .unwrap_or(0)
    }

    /// A connection to endpoint `i` (for an upgrade, a new HTTP/1.1 one that can be taken
    /// over), its connect failures told to passive health.
    async fn acquire_at(&self, i: usize, upgrade: bool) -> Result<Conn, UpstreamError> {
        let ep = &self.endpoints[i];
        let r = if upgrade {
            Box::pin(self.new_h1(ep, true))
                .await
                .map(|sender| Conn::H1 {
                    sender,
                    reused: false,
                })
        } else {
            self.acquire(ep).await
        };
        match &r {
            Ok(_) => self.health.record_connect(i, true),
            Err(UpstreamError::Connect(..)) => self.health.record_connect(i, false),
            Err(_) => {}
        }
        r
    }

    /// A connection to `ep`: a pooled one if any is open, else a new one. The connecting
    /// branches are boxed: they are rarely taken, and their state (a TLS handshake's, a
    /// protocol handshake's) would otherwise enlarge every request's future, which is moved
    /// whole when a connection starts serving it.
    async fn acquire(&self, ep: &Endpoint) -> Result<Conn, UpstreamError> {
        match self.protocol {
            UpstreamProtocol::H2c | UpstreamProtocol::H2 => Ok(Conn::H2(self.h2_sender(ep).await?)),
            UpstreamProtocol::Http1 => match self.checkout_h1(ep).await {
                Some(s) => Ok(Conn::H1 {
                    sender: s,
                    reused: true,
                }),
                None => Ok(Conn::H1 {
                    sender: Box::pin(self.new_h1(ep, false)).await?,
                    reused: false,
                }),
            },
        }
    }

    async fn connect(&self, ep: &Endpoint) -> Result<TokioIo<UpstreamIo>, UpstreamError> {
        dial(ep.addr, self.tls.as_deref(), self.connect_timeout)
            .await
            .map(TokioIo::new)
            .map_err(|why| UpstreamError::Connect(ep.addr, why))
    }

    /// An idle pooled HTTP/1.1 connection that is still open, if any.
    async fn checkout_h1(&self, ep: &Endpoint) -> Option<http1::SendRequest<RequestBody>> {
        loop {
            let idle = ep.idle.lock().expect("pool lock").pop()?;
            if idle.sender.is_closed() || idle.since.elapsed() > ep.idle_timeout {
                continue;
            }
            let mut sender = idle.sender;
            // Released only after the previous body ended, so this resolves at once unless
            // the connection broke meanwhile.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    /// A new HTTP/1.1 connection; with `upgradable`, one a 101 response can take over.
    async fn new_h1(
        &self,
        ep: &Endpoint,
        upgradable: bool,
    ) -> Result<http1::SendRequest<RequestBody>, UpstreamError> {
        let io = self.connect(ep).await?;
        let (sender, conn) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| UpstreamError::Exchange(ep.addr, describe(&e)))?;
        if upgradable {
            drive(conn.with_upgrades());
        } else {
            drive(conn);
        }
        Ok(sender)
    }

    /// The endpoint's shared HTTP/2 connection, made if there is none open.
    async fn h2_sender(
        &self,
        ep: &Endpoint,
    ) -> Result<http2::SendRequest<RequestBody>, UpstreamError> {
        if let Some(s) = ep
            .h2
            .lock()
            .expect("pool lock")
            .as_ref()
            .filter(|s| !s.is_closed())
        {
            return Ok(s.clone());
        }
        Box::pin(self.new_h2(ep)).await
    }

    /// A new HTTP/2 connection, kept as the endpoint's shared one.
    async fn new_h2(
        &self,
        ep: &Endpoint,
    ) -> Result<http2::SendRequest<RequestBody>, UpstreamError> {
        let io = self.connect(ep).await?;
        let (sender, conn) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(io)
            .await
            .map_err(|e| UpstreamError::Exchange(ep.addr, describe(&e)))?;
        drive(conn);
        *ep.h2.lock().expect("pool lock") = Some(sender.clone());
        Ok(sender)
    }

    async fn exchange(
        &self,
        ep: &Arc<Endpoint>,
        conn: Conn,
        mut req: Request<RequestBody>,
    ) -> Result<Exchange, SendFailure> {
        let addr = ep.addr;
        // Clients speaking HTTP/2 send an absolute URI; HTTP/1.1 upstreams get origin-form.
        let pq = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        match conn {
            Conn::H2(mut sender) => {
                *req.version_mut() = Version::HTTP_2;
                // HTTP/2 carries the target as :scheme/:authority/:path; the authority is the
                // client's Host (kept end to end), else the endpoint.
                let authority = req
                    .headers()
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map_or_else(|| addr.to_string(), str::to_string);
                let uri = http::Uri::builder()
                    .scheme(if self.tls.is_some() { "https" } else { "http" })
                    .authority(authority.as_str())
                    .path_and_query(pq)
                    .build();
                match uri {
                    Ok(u) => *req.uri_mut() = u,
                    Err(e) => {
                        return Err(SendFailure::with_body(
                            UpstreamError::Exchange(addr, e.to_string()),
                            req,
                        ))
                    }
                }
                req.headers_mut().remove(http::header::HOST);
                if let Err(e) = sender.ready().await {
                    return Err(SendFailure::with_body(
                        UpstreamError::Exchange(addr, describe(&e)),
                        req,
                    ));
                }
                let response = sender
                    .send_request(req)
                    .await
                    .map_err(|e| exchange_error(addr, &e))?;
                Ok(Exchange {
                    response,
                    endpoint: addr,
                    conn: None,
                    slot: None,
                })
            }
            Conn::H1 { mut sender, reused } => {
                *req.version_mut() = Version::HTTP_11;
                if req.uri().scheme().is_some() {
                    *req.uri_mut() = http::Uri::from(pq);
                }
                let response = match sender.try_send_request(req).await {
                    Ok(r) => r,
                    // A pooled connection the upstream closed just now hands the unsent request
                    // back: send it on a fresh connection.
                    Err(mut e) if reused && e.message().is_some() => {
                        let req = e.take_message().expect("checked");
                        sender = match Box::pin(self.new_h1(ep, false)).await {
                            Ok(s) => s,
                            Err(err) => return Err(SendFailure::with_body(err, req)),
                        };
                        sender
                            .send_request(req)
                            .await
                            .map_err(|e| exchange_error(addr, &e))?
                    }
                    Err(e) => return Err(exchange_error(addr, e.error())),
                };
                let conn = Some(PooledConn {
                    endpoint: ep.clone(),
                    sender,
                });
                Ok(Exchange {
                    response,
                    endpoint: addr,
                    conn,
                    slot: None,
                })
            }
        }
    }
}

enum Conn {
    H1 {
        sender: http1::SendRequest<RequestBody>,
        reused: bool,
    },
    H2(http2::SendRequest<RequestBody>),
}

fn exchange_error(addr: SocketAddr, e: &hyper::Error) -> SendFailure {
    UpstreamError::Exchange(addr, describe(e)).into()
}

/// A failed send: the error and, when the request never left, its unread body.
pub struct SendFailure {
    pub error: UpstreamError,
    pub unsent_body: Option<RequestBody>,
}

impl SendFailure {
    fn with_body(error: UpstreamError, req: Request<RequestBody>) -> Self {
        SendFailure {
            error,
            unsent_body: Some(req.into_body()),
        }
    }
}

impl From<UpstreamError> for SendFailure {
    fn from(error: UpstreamError) -> Self {
        SendFailure {
            error,
            unsent_body: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LbPolicy;

    fn config(lb: LbPolicy, n: u16) -> ClusterConfig {
        ClusterConfig {
            name: "t".into(),
            endpoints: (0..n)
                .map(|i| SocketAddr::from(([127, 0, 0, 1], 1000 + i)))
                .collect(),
            lb,
            weights: vec![],
            hash_key: None,
            protocol: UpstreamProtocol::Http1,
            connect_timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            max_idle_per_endpoint: 1,
            max_requests: 2,
            max_requests_per_client: None,
            body_timeout: Duration::from_secs(60),
            health_check: None,
            outlier_detection: None,
            retry_budget: Default::default(),
            tls: None,
            max_fails: 1,
            fail_timeout: Duration::from_secs(10),
        }
    }

    fn cluster(lb: LbPolicy, n: u16) -> Cluster {
        cluster_of(&config(lb, n))
    }

    fn cluster_of(cfg: &ClusterConfig) -> Cluster {
        let cfg = cfg.clone();
        let metrics = crate::ops::metrics::Metrics::new();
        let (slots, health) = (
            RequestSlots::new(&cfg, &metrics),
            Health::new(&cfg, &metrics),
        );
        Cluster::new(&cfg, &metrics, slots, health, None)
    }

    #[test]
    fn request_slots_are_bounded_shared_and_given_back() {
        let cfg = config(LbPolicy::RoundRobin, 1);
        let metrics = crate::ops::metrics::Metrics::new();
        let slots = RequestSlots::new(&cfg, &metrics);
        let ip = IpAddr::from([127, 0, 0, 1]);
        let a = slots.take(ip).expect("first");
        let b = slots
            .clone()
            .take(ip)
            .expect("second, through another worker's handle");
        assert_eq!(
            slots.take(IpAddr::from([10, 0, 0, 1])).err(),
            Some(NoSlot::Full(2)),
            "a third past max_requests = 2"
        );
        assert!(metrics
            .render()
            .contains("rampart_upstream_requests_in_flight{cluster=\"t\"} 2"));
        drop(a);
        let c = slots.take(ip).expect("a slot given back is taken again");
        drop((b, c));
        assert_eq!(slots.in_flight.load(Ordering::Relaxed), 0);
        assert!(metrics
            .render()
            .contains("rampart_upstream_requests_in_flight{cluster=\"t\"} 0"));
    }

    #[test]
    fn one_client_takes_no_more_than_its_share() {
        let cfg = ClusterConfig {
            max_requests: 10,
            max_requests_per_client: Some(3),
            ..config(LbPolicy::RoundRobin, 1)
        };
        let slots = RequestSlots::new(&cfg, &crate::ops::metrics::Metrics::new());
        let (greedy, other) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        let held: Vec<_> = (0..3).map(|_| slots.take(greedy).unwrap()).collect();
        assert_eq!(slots.take(greedy).err(), Some(NoSlot::ClientShare(3)));
        assert_eq!(
            slots.in_flight.load(Ordering::Relaxed),
            3,
            "a refusal holds nothing"
        );
        let others: Vec<_> = (0..3).map(|_| slots.take(other).unwrap()).collect();
        drop(held);
        assert!(slots.take(greedy).is_ok(), "given back, taken again");
        drop(others);
        assert!(slots.per_client.clients() == 0, "no entry kept at zero");
        // The default: a quarter of max_requests, but never fewer than 8 (or max_requests).
        let share = |max, per| {
            ClusterConfig {
                max_requests: max,
                max_requests_per_client: per,
                ..config(LbPolicy::RoundRobin, 1)
            }
            .max_requests_per_client()
        };
        assert_eq!(share(1024, None), 256);
        assert_eq!(share(20, None), 8);
        assert_eq!(share(2, None), 2);
        assert_eq!(share(1024, Some(1024)), 1024);
    }

    #[tokio::test]
    async fn pooled_connections_are_closed_when_their_idle_timeout_passes() {
        // A real HTTP/1.1 connection to a listener that answers nothing: only the pool's
        // sender matters here.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move { listener.accept().await.unwrap().0 });
        let cfg = ClusterConfig {
            endpoints: vec![addr],
            ..config(LbPolicy::RoundRobin, 1)
        };
        let c = cluster_of(&cfg);
        let sender = c.new_h1(&c.endpoints[0], false).await.unwrap();
        let _server_side = accept.await.unwrap();
        PooledConn {
            endpoint: c.endpoints[0].clone(),
            sender,
        }
        .release();
        assert_eq!(c.endpoints[0].idle.lock().unwrap().len(), 1);
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        assert!(
            c.endpoints[0].idle.lock().unwrap().is_empty(),
            "closed on time, not at the next checkout"
        );
        assert!(
            !c.endpoints[0].reaping.load(Ordering::Relaxed),
            "the reaper ended"
        );
    }

    #[tokio::test]
    async fn round_robin_cycles_and_exclusion_moves_on() {
        let c = cluster(LbPolicy::RoundRobin, 3);
        let picks: Vec<_> = (0..6).map(|_| c.pick(None, |_| false)).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        for _ in 0..6 {
            let first = c.pick(None, |_| false);
            assert_ne!(c.pick(None, |i| i == first), first);
        }
    }

    #[tokio::test]
    async fn unhealthy_endpoints_are_passed_over_unless_all_are() {
        for lb in [LbPolicy::RoundRobin, LbPolicy::LeastRequest] {
            let c = cluster(lb, 3);
            c.health.set(1, false);
            for _ in 0..6 {
                let first = c.pick(None, |_| false);
                assert_ne!(first, 1, "{lb:?}");
                let second = c.pick(None, |i| i == first);
                assert!(second != 1 && second != first, "{lb:?}: retry on {second}");
            }
            c.health.set(0, false);
            c.health.set(2, false);
            // (Least request draws at random among equals: enough picks to see each.)
            let picks: std::collections::HashSet<_> =
                (0..60).map(|_| c.pick(None, |_| false)).collect();
            assert_eq!(picks.len(), 3, "{lb:?}: all down, all tried");
        }
        // Round robin keeps its turn when falling back: two endpoints, both down, alternate.
        let c = cluster(LbPolicy::RoundRobin, 2);
        c.health.set(0, false);
        c.health.set(1, false);
        let picks: Vec<_> = (0..4).map(|_| c.pick(None, |_| false)).collect();
        assert_eq!(picks, [0, 1, 0, 1]);
    }

    #[tokio::test]
    async fn failed_connects_pass_an_endpoint_over_for_fail_timeout() {
        let mut cfg = config(LbPolicy::RoundRobin, 2);
        cfg.max_fails = 2;
        cfg.fail_timeout = Duration::from_millis(100);
        let health = Health::new(&cfg, &crate::ops::metrics::Metrics::new());
        health.record_connect(0, false);
        assert!(health.is_healthy(0), "one failure of two");
        health.record_connect(0, true);
        health.record_connect(0, false);
        assert!(health.is_healthy(0), "a success resets the run");
        health.record_connect(0, false);
        assert!(!health.is_healthy(0) && health.is_healthy(1));
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(health.is_healthy(0), "back after fail_timeout");
        cfg.max_fails = 0;
        let never = Health::new(&cfg, &crate::ops::metrics::Metrics::new());
        for _ in 0..5 {
            never.record_connect(1, false);
        }
        assert!(never.is_healthy(1), "max_fails = 0 turns it off");
    }

    #[tokio::test]
    async fn outliers_are_ejected_for_growing_times_and_never_more_than_the_share() {
        let mut cfg = config(LbPolicy::RoundRobin, 4);
        cfg.outlier_detection = Some(crate::config::OutlierConfig {
            consecutive_5xx: 3,
            consecutive_gateway_failures: 2,
            base_ejection_time: Duration::from_millis(200),
            max_ejection_time: Duration::from_millis(350),
            max_ejection_percent: 50,
        });
        let metrics = crate::ops::metrics::Metrics::new();
        let health = Health::new(&cfg, &metrics);
        // Two 500s and a 200 reset the run; three in a row eject.
        for s in [500, 500, 200, 500, 500] {
            health.record_response(0, s);
        }
        assert!(health.is_healthy(0));
        health.record_response(0, 500);
        assert!(!health.is_healthy(0), "ejected after 3 in a row");
        // Two gateway failures (a 503, a timeout) eject endpoint 1: 2 of 4 is the share.
        health.record_response(1, 503);
        health.record_exchange_failure(1);
        assert!(!health.is_healthy(1));
        for _ in 0..3 {
            health.record_response(2, 500);
        }
        assert!(
            health.is_healthy(2),
            "not ejected: half the cluster is out already"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(
            health.is_healthy(0) && health.is_healthy(1),
            "back after the base time"
        );
        // A second ejection lasts twice the base, capped at max_ejection_time.
        for _ in 0..3 {
            health.record_response(0, 500);
        }
        // (Twice the base would be 400 ms; the cap makes it 350.)
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(
            !health.is_healthy(0),
            "the second ejection is longer than the first"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(health.is_healthy(0), "capped at max_ejection_time");
        let m = metrics.render();
        assert!(m.contains("rampart_upstream_ejections_total"), "{m}");
    }

    #[tokio::test]
    async fn least_request_prefers_idle_endpoint() {
        let c = cluster(LbPolicy::LeastRequest, 3);
        c.endpoints[0].in_flight.store(5, Ordering::Relaxed);
        c.endpoints[2].in_flight.store(1, Ordering::Relaxed);
        // Two drawn, the less loaded taken: the busiest never wins a draw; the idle one is in
        // two of three draws (40 of 60 expected; 25 is four standard deviations below).
        let picks: Vec<usize> = (0..60).map(|_| c.pick(None, |_| false)).collect();
        assert!(!picks.contains(&0), "{picks:?}");
        assert!(picks.iter().filter(|p| **p == 1).count() >= 25, "{picks:?}");
        assert_eq!(c.pick(None, |i| i == 1), 2);
    }
}
