//! The request pipeline: one request, one [`RequestCtx`], and named phases in the order
//! [`run`] calls them:
//!
//! 1. [`checks::canonical_target`]: host and path normalized, so every rule below sees the
//!    same ones ([`crate::http::request_target`]); [`checks::authoritative`]: a host whose
//!    client-certificate settings differ from those of the name the connection was made for
//!    is 421 (a connection without a certificate must not reach a name that requires one).
//! 2. [`checks::mark_early_data`], [`checks::refuse_early_data`]: RFC 8470's rules for 0-RTT.
//! 3. [`checks::limits`]: header and body sizes, methods the gateway does not pass, transfer
//!    codings it cannot.
//! 4. [`checks::route`]: host, path and the route's conditions to a route.
//! 5. [`checks::admit`]: the route's access list, then its rate limit.
//! 6. [`waf::inspect`]: the route's web application firewall (ModSecurity with the OWASP Core
//!    Rule Set, on threads of its own); [`checks::split`]: the cluster, when the route splits
//!    its traffic.
//! 7. [`rewrite::request`]: hop-by-hop headers out, forwarding headers in, upgrades set up.
//! 8. [`forward::buffer_body`]: a small body read whole before an upstream slot is taken
//!    (and kept, when the route may retry after a send or mirrors the request).
//! 9. [`mirror::send_copy`]: a share of the route's requests copied to its shadow cluster.
//! 10. [`forward::send`]: the exchange with the cluster, retried as the route says; a failure
//!     is mapped to a status and to whose fault it was ([`Fault`]).
//! 11. [`waf::inspect_response`]: the upstream's status and headers (and, with
//!     `waf.response_body`, the first part of its body, held until inspected) through the
//!     WAF, when the route asks for it.
//! 12. [`respond::response`]: the upstream's answer checked and rewritten for the client.
//! 13. [`finish`]: counted, tagged (request id, `Alt-Svc`, the route's response headers) and
//!     logged when its body ends.
//!
//! A phase either continues with what the next one needs or ends the request with an
//! [`Outcome`] (`ControlFlow::Break`); a locally answered request is an outcome like any
//! other, never an error.

mod checks;
mod forward;
mod mirror;
mod respond;
mod rewrite;
mod waf;

use crate::body::{BodyProgress, ClientBody, OnResponseDone, ResponseBody, ResponseEnd};
use crate::config::LimitsConfig;
use crate::http::router::{Route, Router};
use crate::ops::access_log::{AccessLog, AccessRecord};
use crate::ops::metrics::Metrics;
use crate::upstream::Cluster;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What a request is routed by: the routes, and one worker's copies of the clusters they
/// name. A configuration reload replaces it whole; a request keeps the one it started with.
pub struct Routing {
    pub router: Arc<Router>,
    pub clusters: Vec<Arc<Cluster>>,
}

/// A worker's [`Routing`], shared by its listeners and swapped by a reload.
pub type RoutingSlot = crate::swappable::Swappable<Routing>;

/// What every request on a listener shares.
pub struct ProxyShared {
    pub listener: String,
    pub routing: RoutingSlot,
    pub limits: LimitsConfig,
    pub metrics: Metrics,
    pub access_log: AccessLog,
    /// `Alt-Svc` advertising HTTP/3, added to HTTP/1.1 and HTTP/2 responses.
    pub alt_svc: Option<HeaderValue>,
    /// This listener's `rampart_http_responses_abandoned_total`.
    pub abandoned_responses: prometheus::IntCounter,
    /// Which clients the listener serves (checked when a connection arrives; reloadable).
    pub access: crate::policy::access::SharedAccessList,
    /// The listener's per-client limits at accept and what they count a client by: one for
    /// the listener, shared by its workers and by TCP and QUIC.
    pub per_client: crate::policy::admission::PerClient,
    /// TCP connections begin with a PROXY protocol header naming the client.
    pub proxy_protocol: bool,
    /// `forwarded_for = "replace"`: a client's own `X-Forwarded-For` is dropped, not extended.
    pub replace_forwarded_for: bool,
    /// The gateway's overload actions in force.
    pub overload: Arc<crate::policy::overload::Overload>,
    /// How request paths are normalized before routing.
    pub paths: crate::http::request_target::PathPolicy,
    /// With `tls.client_auth`: the headers that carry the client certificate upstream
    /// (removed from every request first).
    pub client_cert_headers: Option<ClientCertHeaders>,
    /// With client-certificate settings that differ between server names: the listener's
    /// certificates, to tell whether a connection may serve a request's host
    /// ([`checks::authoritative`]).
    pub names: Option<crate::tls::CertSlot>,
    /// The worker's WebSocket (upgraded-connection) tunnels, which outlive the HTTP
    /// connection they came from: shutdown waits for them within its grace period.
    pub tunnels: tokio_util::task::TaskTracker,
    /// `[tracing]` with an OTLP endpoint: requests' traces and their spans.
    pub tracer: Option<Arc<crate::trace::Tracer>>,
}

/// The header names of `tls.client_cert_headers`.
#[derive(Debug, Clone)]
pub struct ClientCertHeaders {
    pub subject: HeaderName,
    pub san: HeaderName,
    pub sha256: HeaderName,
}

impl ClientCertHeaders {
    /// From a validated config.
    pub fn new(cfg: &crate::config::ClientCertHeadersConfig) -> Self {
        let name = |n: &str| HeaderName::from_bytes(n.as_bytes()).expect("validated");
        ClientCertHeaders {
            subject: name(&cfg.subject),
            san: name(&cfg.san),
            sha256: name(&cfg.sha256),
        }
    }
}

/// Facts about the client connection a request arrived on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub client: SocketAddr,
    /// What per-client limits count this client by: its address, an IPv6 one cut to the
    /// listener's `limits.client_ipv6_prefix` ([`crate::policy::client_key`]).
    pub client_key: std::net::IpAddr,
    pub sni: Option<String>,
    pub tls_version: &'static str,
    pub resumed: bool,
    /// The client certificate the handshake verified (`tls.client_auth`).
    pub client_cert: Option<Arc<crate::tls::handshake_info::ClientCert>>,
}

/// Marks a request that arrived in TLS early data (0-RTT), before the handshake completed.
#[derive(Debug, Clone, Copy)]
pub struct InEarlyData;

static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Whose fault a request's failure was, as the access log says it (`fault`): an operator
/// tells a client's broken upload from an upstream's reset, and both from the gateway's own
/// limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The client: its body stalled, broke off or exceeded the limit, or it asked for more
    /// than its share.
    Client,
    /// The upstream: it could not be reached, timed out, or broke the exchange.
    Upstream,
    /// The gateway: its capacity for the cluster (`max_requests`) was spent.
    Gateway,
}

impl Fault {
    fn as_str(self) -> &'static str {
        match self {
            Fault::Client => "client",
            Fault::Upstream => "upstream",
            Fault::Gateway => "gateway",
        }
    }
}

/// How a request ended.
pub(crate) enum Outcome {
    /// The upstream's response, passed on.
    Proxied(Response<ResponseBody>),
    /// Answered by the gateway: the request was refused by a rule or limit (a bad target,
    /// too large, no route, forbidden, rate limited, too early) and never went upstream.
    Refused(Response<ResponseBody>),
    /// The exchange failed; the response says so with a status.
    Failed {
        fault: Fault,
        response: Response<ResponseBody>,
    },
}

impl Outcome {
    fn into_response(self) -> (Response<ResponseBody>, Option<Fault>) {
        match self {
            Outcome::Proxied(r) | Outcome::Refused(r) => (r, None),
            Outcome::Failed { fault, response } => (response, Some(fault)),
        }
    }
}

/// A phase's verdict: go on with `T`, or end the request with an [`Outcome`].
pub(crate) type Phase<T> = ControlFlow<Outcome, T>;

/// One request's state as it passes the phases.
pub(crate) struct RequestCtx<'a> {
    pub shared: &'a ProxyShared,
    pub conn: &'a ConnInfo,
    pub routing: &'a Routing,
    /// The client's valid `X-Request-Id`, or a new one.
    pub request_id: String,
    /// The request arrived in 0-RTT early data.
    pub early_data: bool,
    /// How much of the request body was read, and how it ended.
    pub progress: Arc<BodyProgress>,
    /// The access-log record, filled in only when the log is on.
    pub rec: AccessRecord,
    /// The route, once [`checks::route`] has found one.
    pub route: Option<&'a Route>,
    /// How long the upstream took to answer (headers), once it has.
    pub upstream_time: Option<Duration>,
    /// The request's trace (`[tracing]`): its span, continuing the client's `traceparent`.
    pub trace: Option<crate::trace::RequestTrace>,
    /// The request's WAF transaction, kept for its response (`waf.response_headers`,
    /// `waf.response_body`).
    pub waf_response: Option<crate::policy::waf::PendingResponse>,
}

impl<'a> RequestCtx<'a> {
    fn new(
        shared: &'a ProxyShared,
        conn: &'a ConnInfo,
        routing: &'a Routing,
        req: &Request<ClientBody>,
    ) -> Self {
        let early_data = req.extensions().get::<InEarlyData>().is_some();
        let request_id = req
            .headers()
            .get(&X_REQUEST_ID)
            .filter(|v| rewrite::valid_request_id(v))
            .and_then(|v| v.to_str().ok())
            .map_or_else(rewrite::new_request_id, str::to_string);
        let trace = shared.tracer.as_ref().map(|t| {
            let mut tr = t.request(req.headers());
            if tr.context.sampled {
                tr.method = req.method().to_string();
                tr.path = req.uri().path().to_string();
            }
            tr
        });
        // The trace id: the request's trace's, or (tracing off) the client's `traceparent`'s.
        let trace_id = || match &trace {
            Some(t) => Some(t.context.trace_id_hex()),
            None => req
                .headers()
                .get(&crate::trace::TRACEPARENT)
                .and_then(|v| crate::trace::parse_traceparent(v.as_bytes()))
                .map(|c| c.trace_id_hex()),
        };
        let rec = if shared.access_log.enabled() {
            AccessRecord {
                time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                request_id: request_id.clone(),
                client: Some(conn.client),
                listener: shared.listener.clone(),
                protocol: match req.version() {
                    Version::HTTP_2 => "h2",
                    Version::HTTP_3 => "h3",
                    _ => "http/1.1",
                },
                tls_version: conn.tls_version,
                tls_resumed: conn.resumed,
                early_data,
                sni: conn.sni.clone(),
                method: req.method().to_string(),
                path: req.uri().path().to_string(),
                trace_id: trace_id(),
                ..Default::default()
            }
        } else {
            AccessRecord::default()
        };
        RequestCtx {
            shared,
            conn,
            routing,
            request_id,
            early_data,
            progress: Arc::new(BodyProgress::default()),
            rec,
            route: None,
            upstream_time: None,
            trace,
            waf_response: None,
        }
    }

    /// Whether the access log is on (the record is worth filling in).
    fn logging(&self) -> bool {
        self.shared.access_log.enabled()
    }
}

/// A plain-text response the gateway writes itself.
pub(crate) fn local(status: StatusCode, msg: impl Into<bytes::Bytes>) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::local(msg));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Handles one request. Never fails: every error becomes a status the client can read.
pub async fn handle(
    shared: Arc<ProxyShared>,
    conn: Arc<ConnInfo>,
    req: Request<ClientBody>,
) -> Result<Response<ResponseBody>, Infallible> {
    let start = Instant::now();
    let routing = shared.routing.current();
    let mut ctx = RequestCtx::new(&shared, &conn, &routing, &req);
    let is_h3 = req.version() == Version::HTTP_3;
    let outcome = match run(&mut ctx, req).await {
        ControlFlow::Break(o) | ControlFlow::Continue(o) => o,
    };
    waf::close_unanswered(&mut ctx);
    Ok(finish(ctx, outcome, is_h3, start))
}

/// The phases, in order (see the module's documentation).
async fn run<'a>(
    ctx: &mut RequestCtx<'a>,
    mut req: Request<ClientBody>,
) -> ControlFlow<Outcome, Outcome> {
    let target = checks::canonical_target(ctx, &req);
    let replay_safe = checks::mark_early_data(ctx, &mut req);
    let target = target?;
    checks::authoritative(ctx, &target)?;
    checks::refuse_early_data(ctx, replay_safe)?;
    let (req, declared_len) = checks::limits(ctx, req).await?;
    let route = checks::route(ctx, &target, &req)?;
    let req = checks::admit(ctx, route, req).await?;
    let req = waf::inspect(ctx, route, req).await?;
    let cluster = &ctx.routing.clusters[checks::split(ctx, route, &req)];
    let prepared = rewrite::request(ctx, route, &target, req);
    let upgrade = prepared.plan.upgrade.is_some();
    let mirror = mirror::chosen(route).filter(|_| !upgrade);
    let keep_copy = route.retry.retries_after_send || mirror.is_some();
    let (req, exchange_plan, copy) =
        forward::buffer_body(ctx, prepared, declared_len, keep_copy).await?;
    if let Some(m) = mirror {
        mirror::send_copy(ctx, route, m, copy.as_deref());
    }
    let exchange = forward::send(ctx, cluster, route, (req, copy.as_deref()), upgrade).await?;
    let (exchange, read_ahead) = waf::inspect_response(ctx, route, cluster, exchange).await?;
    ControlFlow::Continue(respond::response(
        ctx,
        cluster,
        (exchange, read_ahead),
        exchange_plan,
    ))
}

/// Phase: the end of every request. Counts it by route and status, adds the request id,
/// `Alt-Svc` and the route's response headers (last, over the gateway's own), and hands the
/// access-log record to the body, to be written when the body ends.
fn finish(
    ctx: RequestCtx<'_>,
    outcome: Outcome,
    is_h3: bool,
    start: Instant,
) -> Response<ResponseBody> {
    let (mut resp, fault) = outcome.into_response();
    let RequestCtx {
        shared,
        route,
        mut rec,
        request_id,
        progress,
        upstream_time,
        trace,
        conn,
        ..
    } = ctx;
    if let Some(t) = upstream_time {
        rec.upstream_ms = Some(t.as_secs_f64() * 1e3);
    }
    let status = resp.status();
    rec.status = status.as_u16();
    rec.fault = fault.map(Fault::as_str);
    shared
        .metrics
        .requests
        .with_label_values(&[route.map_or("none", |r| r.name.as_str()), status.as_str()])
        .inc();
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().entry(&X_REQUEST_ID).or_insert(v);
    }
    if let (Some(alt), false) = (&shared.alt_svc, is_h3) {
        resp.headers_mut().insert(header::ALT_SVC, alt.clone());
    }
    if let Some(route) = route {
        route.response_headers.apply(resp.headers_mut());
    }
    let span = trace.filter(|t| t.context.sampled).map(|t| RequestSpan {
        trace: t,
        route: route.map(|r| r.name.clone()),
        client: conn.client,
        status: status.as_u16(),
    });
    if !shared.access_log.enabled() && span.is_none() {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let body = body.on_done(Box::new(LogOnDone {
        rec,
        start,
        log: shared.access_log.clone(),
        request_body: progress,
        span,
    }));
    Response::from_parts(parts, body)
}

/// What the request's span needs once its response ends.
struct RequestSpan {
    trace: crate::trace::RequestTrace,
    route: Option<String>,
    client: SocketAddr,
    status: u16,
}

/// Finishes the access-log record when the response body ends.
struct LogOnDone {
    rec: AccessRecord,
    start: Instant,
    log: AccessLog,
    request_body: Arc<BodyProgress>,
    /// A sampled request's span, recorded when the response ends.
    span: Option<RequestSpan>,
}

impl OnResponseDone for LogOnDone {
    fn done(mut self: Box<Self>, bytes_out: u64, end: ResponseEnd) {
        if let Some(s) = &self.span {
            s.trace.record(crate::trace::request_span(
                &s.trace,
                s.route.as_deref(),
                s.status,
                end.as_str(),
                s.client,
            ));
        }
        if self.log.enabled() {
            self.rec.bytes_out = bytes_out;
            self.rec.response_end = end.as_str();
            self.rec.bytes_in = self.request_body.bytes.load(Ordering::Relaxed);
            self.rec.duration_ms = self.start.elapsed().as_secs_f64() * 1e3;
            self.log.write(self.rec);
        }
    }
}

/// What the phases' unit tests share: a listener's [`ProxyShared`] with no clusters and the
/// access log off, a client connection, and requests with bodies.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::config::RouteConfig;

    pub fn shared(routes: &[RouteConfig]) -> ProxyShared {
        let metrics = Metrics::new();
        let router = Router::new(routes, |_| 0);
        ProxyShared {
            listener: "test".into(),
            routing: RoutingSlot::new(Routing {
                router: Arc::new(router),
                clusters: Vec::new(),
            }),
            limits: LimitsConfig::default(),
            abandoned_responses: metrics.responses_abandoned.with_label_values(&["test"]),
            overload: crate::policy::overload::Overload::new(None, &metrics),
            metrics,
            access_log: AccessLog::open("off").expect("off"),
            alt_svc: None,
            access: crate::swappable::Swappable::new(crate::policy::access::AccessList::new(
                &[],
                &[],
            )),
            per_client: crate::policy::admission::PerClient::new(&Default::default()),
            proxy_protocol: false,
            replace_forwarded_for: false,
            paths: Default::default(),
            client_cert_headers: None,
            names: None,
            tunnels: tokio_util::task::TaskTracker::new(),
            tracer: None,
        }
    }

    pub fn conn() -> ConnInfo {
        ConnInfo {
            client: "192.0.2.7:50000".parse().unwrap(),
            client_key: "192.0.2.7".parse().unwrap(),
            sni: None,
            tls_version: "TLSv1.3",
            resumed: false,
            client_cert: None,
        }
    }

    /// A request as a client sends it, `Host: www.example`.
    pub fn client_request(method: &str, uri: &str, body: &'static str) -> Request<ClientBody> {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, "www.example")
            .body(crate::body::client_body(http_body_util::Full::new(
                bytes::Bytes::from(body),
            )))
            .unwrap()
    }

    /// Runs `f` over a context on `shared` for a plain `GET /` from [`conn`] (a test that
    /// needs another sets the context's fields).
    pub fn with_ctx<R>(shared: &ProxyShared, f: impl FnOnce(&mut RequestCtx<'_>) -> R) -> R {
        let conn = conn();
        let routing = shared.routing.current();
        let mut ctx = RequestCtx::new(shared, &conn, &routing, &client_request("GET", "/", ""));
        f(&mut ctx)
    }

    /// The route `routing` gives a plain `GET /` to `www.example`.
    pub fn plain_get_route(routing: &Routing) -> &Route {
        let headers = http::HeaderMap::new();
        let facts = crate::http::route_match::RequestFacts {
            method: &http::Method::GET,
            headers: &headers,
            query: None,
            client_cert: None,
        };
        routing
            .router
            .route("www.example", "/", false, &facts)
            .expect("a route for GET /")
    }

    /// The status an outcome answers with.
    pub fn status<T>(phase: Phase<T>) -> Option<StatusCode> {
        match phase {
            ControlFlow::Continue(_) => None,
            ControlFlow::Break(o) => Some(o.into_response().0.status()),
        }
    }
}
