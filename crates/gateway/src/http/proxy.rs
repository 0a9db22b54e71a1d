//! The request pipeline, in named phases: limits → route → rewrite headers → forward →
//! respond (and log). Each phase is a small function so later phases (access control, 0-RTT
//! rules) have an obvious place.

use super::headers::list_elements;
use crate::body::{
    BodyProgress, ClientBody, EndCounters, OnResponseDone, RequestBody, ResponseBody, ResponseEnd,
};
use crate::config::LimitsConfig;
use crate::http::compress;
use crate::http::request_target::Target;
use crate::http::router::{Route, Router};
use crate::ops::access_log::{AccessLog, AccessRecord};
use crate::ops::metrics::Metrics;
use crate::upstream::{Cluster, Exchange, UpstreamError};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

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
    /// TCP connections begin with a PROXY protocol header naming the client.
    pub proxy_protocol: bool,
    /// The gateway's overload actions in force.
    pub overload: Arc<crate::policy::overload::Overload>,
    /// How request paths are normalized before routing.
    pub paths: crate::http::request_target::PathPolicy,
    /// The worker's WebSocket (upgraded-connection) tunnels, which outlive the HTTP
    /// connection they came from: shutdown waits for them within its grace period.
    pub tunnels: tokio_util::task::TaskTracker,
}

/// Facts about the client connection a request arrived on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub client: SocketAddr,
    pub sni: Option<String>,
    pub tls_version: &'static str,
    pub resumed: bool,
}

static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Whether a request's `TE` lists `trailers`.
fn accepts_trailers(h: &HeaderMap) -> bool {
    list_elements(h, &header::TE).any(|t| {
        t.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("trailers")
    })
}

/// Removes hop-by-hop headers (RFC 9110 §7.6.1), including those named by `Connection`.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = list_elements(h, &header::CONNECTION)
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        &header::CONNECTION,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &header::TE,
        &header::TRAILER,
        &header::TRANSFER_ENCODING,
        &header::UPGRADE,
        &header::PROXY_AUTHENTICATE,
        &header::PROXY_AUTHORIZATION,
    ] {
        h.remove(n);
    }
}

fn valid_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
}

fn new_request_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

fn version_label(v: Version) -> &'static str {
    match v {
        Version::HTTP_2 => "2",
        Version::HTTP_10 => "1.0",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// Finishes the access-log record and request metrics when the response body ends.
struct Finish {
    rec: AccessRecord,
    start: Instant,
    log: AccessLog,
    request_body: Arc<BodyProgress>,
}

impl OnResponseDone for Finish {
    fn done(mut self: Box<Self>, bytes_out: u64, end: ResponseEnd) {
        if self.log.enabled() {
            self.rec.bytes_out = bytes_out;
            self.rec.response_end = end.as_str();
            self.rec.bytes_in = self.request_body.bytes.load(Ordering::Relaxed);
            self.rec.duration_ms = self.start.elapsed().as_secs_f64() * 1e3;
            self.log.write(self.rec);
        }
    }
}

fn local(status: StatusCode, msg: impl Into<bytes::Bytes>) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::local(msg));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Marks a request that arrived in TLS early data (0-RTT), before the handshake completed.
#[derive(Debug, Clone, Copy)]
pub struct InEarlyData;

static EARLY_DATA: HeaderName = HeaderName::from_static("early-data");

/// Handles one request. Never fails: every error becomes a status the client can read.
pub async fn handle(
    shared: Arc<ProxyShared>,
    conn: Arc<ConnInfo>,
    mut req: Request<ClientBody>,
) -> Result<Response<ResponseBody>, Infallible> {
    let start = Instant::now();
    let routing = shared.routing.current();
    let early_data = req.extensions().get::<InEarlyData>().is_some();
    let is_h3 = req.version() == Version::HTTP_3;
    let request_id = req
        .headers()
        .get(&X_REQUEST_ID)
        .filter(|v| valid_request_id(v))
        .and_then(|v| v.to_str().ok())
        .map_or_else(new_request_id, str::to_string);
    // Phase: canonical target, first, so that every rule below sees the same host and path.
    let target = canonical_target(&shared.paths, &req);
    // The access record is only built when a log will be written.
    let logging = shared.access_log.enabled();
    let mut rec = if logging {
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
            host: target
                .as_ref()
                .map_or_else(|_| String::new(), |t| t.host.clone()),
            path: req.uri().path().to_string(),
            ..Default::default()
        }
    } else {
        AccessRecord::default()
    };
    let progress = Arc::new(BodyProgress::default());
    // RFC 8470: from early data, which an attacker can replay, only requests that are safe to
    // replay go upstream, marked `Early-Data: 1`; the rest are told to retry after the handshake.
    let replay_safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if early_data && replay_safe {
        shared.metrics.early_data_accepted.inc();
        req.headers_mut()
            .insert(&EARLY_DATA, HeaderValue::from_static("1"));
    }
    let (status_route, mut resp, upstream_start) = match target {
        Err(e) => (None, bad_target(e), None),
        Ok(_)
            if early_data
                && (!replay_safe
                    || shared
                        .overload
                        .is_active(crate::policy::overload::Action::RefuseEarlyData)) =>
        {
            shared.metrics.early_data_rejected.inc();
            let too_early = local(
                StatusCode::TOO_EARLY,
                "too early: retry after the handshake\n",
            );
            (None, too_early, None)
        }
        Ok(target) => match forward(
            &shared,
            &routing,
            &conn,
            req,
            &target,
            &request_id,
            &progress,
            &mut rec,
        )
        .await
        {
            Ok((route, resp, t)) => (route, resp, Some(t)),
            Err((route, resp)) => (route, resp, None),
        },
    };
    if let Some(t) = upstream_start {
        rec.upstream_ms = Some(t.as_secs_f64() * 1e3);
    }
    let status = resp.status();
    rec.status = status.as_u16();
    shared
        .metrics
        .requests
        .with_label_values(&[
            status_route.map_or("none", |r| r.name.as_str()),
            status.as_str(),
        ])
        .inc();
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().entry(&X_REQUEST_ID).or_insert(v);
    }
    if let (Some(alt), false) = (&shared.alt_svc, is_h3) {
        resp.headers_mut().insert(header::ALT_SVC, alt.clone());
    }
    // The route's own rules come last, over the gateway's additions too.
    if let Some(route) = status_route {
        route.response_headers.apply(resp.headers_mut());
    }
    if !logging {
        return Ok(resp);
    }
    let (parts, body) = resp.into_parts();
    let body = body.on_done(Box::new(Finish {
        rec,
        start,
        log: shared.access_log.clone(),
        request_body: progress,
    }));
    Ok(Response::from_parts(parts, body))
}

type Routed<'a> = (Option<&'a Route>, Response<ResponseBody>);

#[allow(clippy::too_many_arguments)]
async fn forward<'a>(
    shared: &ProxyShared,
    routing: &'a Routing,
    conn: &ConnInfo,
    req: Request<ClientBody>,
    target: &Target,
    request_id: &str,
    progress: &Arc<BodyProgress>,
    rec: &mut AccessRecord,
) -> Result<
    (
        Option<&'a Route>,
        Response<ResponseBody>,
        std::time::Duration,
    ),
    Routed<'a>,
> {
    // Phase: limits.
    let limits = &shared.limits;
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len())
        .sum();
    if req.headers().len() > limits.max_headers || header_bytes > limits.max_header_bytes {
        return Err((
            None,
            local(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request headers too large\n",
            ),
        ));
    }
    let declared_len = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_len.is_some_and(|n| n > limits.max_body_bytes) {
        let resp = local(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
        return Err((None, refuse_unread(req.into_body(), progress, resp).await));
    }

    // TRACE would echo the request, credentials included, from wherever it ends (as nginx).
    if req.method() == Method::TRACE {
        let mut resp = local(StatusCode::METHOD_NOT_ALLOWED, "TRACE is not served\n");
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOWED));
        return Err((None, refuse_unread(req.into_body(), progress, resp).await));
    }
    // A transfer coding other than chunked (which hyper decodes) would reach the upstream
    // still applied but no longer declared: RFC 9112 §6.1 answers 501.
    if !only_chunked(req.headers()) {
        let resp = local(
            StatusCode::NOT_IMPLEMENTED,
            "transfer coding not supported\n",
        );
        return Err((None, resp));
    }

    // RFC 8441: a WebSocket over an HTTP/2 stream (an extended CONNECT naming `:protocol`)
    // goes upstream as an HTTP/1.1 upgrade (RFC 6455), and the upstream's 101 becomes the
    // stream's 200. A reverse proxy tunnels no other CONNECT.
    let h2_websocket = extended_connect_protocol(&req);
    if req.method() == Method::CONNECT && h2_websocket.is_none() {
        let mut resp = local(
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not served here\n",
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOWED));
        return Err((None, resp));
    }

    // Phase: route.
    let Some(route) = routing.router.route(
        &target.host,
        &target.path,
        shared.paths.case_insensitive_routes,
    ) else {
        return Err((
            None,
            local(StatusCode::NOT_FOUND, "no route for this host and path\n"),
        ));
    };
    let matched = Some(route);
    if shared.access_log.enabled() {
        rec.route = Some(route.name.clone());
    }

    // Phase: access list, then rate limit.
    if !route.access.permits(conn.client.ip()) {
        let resp = local(StatusCode::FORBIDDEN, "forbidden\n");
        return Err((
            matched,
            refuse_unread(req.into_body(), progress, resp).await,
        ));
    }
    if let Some(Err(wait)) = route
        .rate_limit
        .as_ref()
        .map(|rl| rl.take(conn.client.ip()))
    {
        let mut resp = local(StatusCode::TOO_MANY_REQUESTS, "too many requests\n");
        let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return Err((
            matched,
            refuse_unread(req.into_body(), progress, resp).await,
        ));
    }
    let cluster = &routing.clusters[route.cluster];

    // Phase: rewrite headers.
    // An HTTP/1.1 `Upgrade` (a WebSocket handshake) keeps its upgrade headers and, once the
    // upstream answers 101, becomes a byte tunnel between the two taken-over connections.
    let mut req = req;
    let gzip_for =
        (route.compress && compress::accepts_gzip(req.headers())).then(|| req.method().clone());
    let upgrade = upgrade_protocol(&req)
        .filter(|p| route.upgrades(p))
        .or_else(|| h2_websocket.clone());
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    // An HTTP/2 stream turned tunnel keeps its connection busy for the connection's idle
    // timer (an HTTP/1.1 connection is handed over whole instead).
    let tunnel_active = h2_websocket.as_ref().and_then(|_| {
        req.extensions()
            .get::<Arc<crate::listener::conn_timers::Activity>>()
            .map(|a| a.begin())
    });
    let (mut parts, body) = req.into_parts();
    let via = format!("{} rampart", version_label(parts.version));
    let h = &mut parts.headers;
    let accepts_trailers = accepts_trailers(h);
    strip_hop_by_hop(h);
    // The client's `Expect: 100-continue` is the gateway's to answer (hyper sends the interim
    // 100 on HTTP/1.1 when the body is first read), not the upstream's: the body is forwarded
    // without waiting, so the upstream's own 100 would only be dropped, and a server that
    // does not implement expectations would answer 417 (as Envoy and nginx, not forwarded).
    if h.get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
    {
        h.remove(header::EXPECT);
    }
    if accepts_trailers {
        // The one TE a request keeps (RFC 9113 §8.2.2 allows it over HTTP/2): it says only
        // that the client takes trailers, which the proxy passes, and gRPC servers require it.
        h.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if let Some(protocol) = &upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, protocol.clone());
    }
    let websocket_key = h2_websocket.is_some().then(|| {
        parts.method = Method::GET;
        let key = websocket_key();
        h.insert(header::SEC_WEBSOCKET_KEY, key.clone());
        key
    });
    // One Host upstream, the canonical one (replacing the client's, which may have named
    // something else in an absolute-form request or been listed in `Connection`).
    if let Ok(v) = HeaderValue::from_str(&target.authority) {
        h.insert(header::HOST, v);
    }
    if shared.paths.forward_normalized {
        forward_path(&mut parts.uri, &target.path);
    }
    let client_ip = conn.client.ip().to_string();
    let xff = match h.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {client_ip}"),
        None => client_ip,
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        h.insert(&X_FORWARDED_FOR, v);
    }
    h.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("https"));
    if let Ok(v) = HeaderValue::from_str(&target.host) {
        h.insert(&X_FORWARDED_HOST, v);
    }
    if let Ok(v) = HeaderValue::from_str(&via) {
        h.append(header::VIA, v);
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert(&X_REQUEST_ID, v);
    }
    route.request_headers.apply(h);
    // Phase: buffer a small body. A body whose size is known and small is read whole before
    // an upstream slot is taken (as nginx's client_body_buffer_size), so a client trickling it
    // holds no upstream connection or slot while it does.
    let body = match buffer_small_body(body, declared_len, limits).await {
        Ok(b) => b,
        Err(e) => return Err((matched, body_failed(e == BufferError::TimedOut))),
    };
    let body = RequestBody::new(body, limits.max_body_bytes, progress.clone())
        .idle_timeout(limits.body_timeout);
    let req = Request::from_parts(parts, body);

    // Phase: forward.
    let sent = Instant::now();
    let result = cluster.send(req, upgrade.is_some(), conn.client.ip()).await;
    let upstream_time = sent.elapsed();
    let metrics = &shared.metrics;
    let exchange = match result {
        Ok(r) => r,
        Err(failure) => {
            let e = failure.error;
            // An exchange the client's body broke (over the limit, or the client gone
            // midway) is not the upstream's failure.
            if progress.client_failed.load(Ordering::Relaxed) {
                tracing::debug!(cluster = %cluster.name, error = %e, "request body ended early");
                let timed_out = progress.timed_out.load(Ordering::Relaxed);
                return Err((matched, body_failed(timed_out)));
            }
            if progress.too_large.load(Ordering::Relaxed) {
                let parked = progress.overflow.lock().ok().and_then(|mut s| s.take());
                let unread = match parked {
                    Some(b) => {
                        discard_body(RequestBody::new(b, u64::MAX, Default::default())).await
                    }
                    None => None,
                };
                let (parts, body) =
                    local(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n").into_parts();
                return Err((matched, Response::from_parts(parts, body.holding(unread))));
            }
            metrics
                .upstream_errors
                .with_label_values(&[&cluster.name, e.kind()])
                .inc();
            tracing::debug!(cluster = %cluster.name, error = %e, "upstream failed");
            let resp = match e {
                UpstreamError::Timeout(..) => {
                    local(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n")
                }
                UpstreamError::Connect(..) => {
                    local(StatusCode::BAD_GATEWAY, "upstream connect failed\n")
                }
                UpstreamError::Exchange(..) => {
                    local(StatusCode::BAD_GATEWAY, "upstream exchange failed\n")
                }
                UpstreamError::Overflow(_) => {
                    local(StatusCode::SERVICE_UNAVAILABLE, "upstream busy\n")
                }
                UpstreamError::ClientShare(_) => local(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many requests in flight from this client\n",
                ),
            };
            // Read and discard a small unread request body first (as nginx does): answering
            // an HTTP/2 stream whose upload is unfinished ends it with RST_STREAM, which some
            // clients report as an error instead of reading the response. A larger body is
            // held until the response is written, then dropped.
            let unread = match failure.unsent_body {
                Some(b) => discard_body(b).await,
                None => None,
            };
            let (parts, body) = resp.into_parts();
            let body = body.holding(unread);
            return Err((matched, Response::from_parts(parts, body)));
        }
    };
    cluster
        .response_seconds
        .observe(upstream_time.as_secs_f64());
    rec.upstream = Some(exchange.endpoint);

    // Phase: respond.
    let mut response = exchange.response;
    let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let upstream_protocol = response.headers().get(header::UPGRADE).cloned();
    // A switch only to what was asked for: any other 101 would turn the connection into a
    // tunnel no rule sees.
    let asked = |p: &HeaderValue| {
        upgrade
            .as_ref()
            .is_some_and(|u| u.as_bytes().eq_ignore_ascii_case(p.as_bytes()))
    };
    if switched && !upstream_protocol.as_ref().is_some_and(asked) {
        tracing::debug!(cluster = %cluster.name, "upstream switched protocols unasked");
        return Err((
            matched,
            local(
                StatusCode::BAD_GATEWAY,
                "upstream switched protocols unasked\n",
            ),
        ));
    }
    // An upstream's transfer coding other than chunked would reach the client undeclared
    // once hyper has removed the chunking.
    if !only_chunked(response.headers()) {
        tracing::debug!(cluster = %cluster.name, "upstream used a transfer coding other than chunked");
        return Err((
            matched,
            local(
                StatusCode::BAD_GATEWAY,
                "upstream transfer coding not supported\n",
            ),
        ));
    }
    // RFC 9112 §6.3: with Transfer-Encoding, a Content-Length is wrong and must not be passed.
    if response.headers().contains_key(header::TRANSFER_ENCODING) {
        response.headers_mut().remove(header::CONTENT_LENGTH);
    }
    if let (true, Some(key)) = (switched, &websocket_key) {
        // Only the gateway saw the key it sent, so only it can check the upstream's answer.
        let accept = response.headers().get(header::SEC_WEBSOCKET_ACCEPT);
        if accept != Some(&websocket_accept(key)) {
            tracing::debug!(cluster = %cluster.name, "upstream answered a WebSocket upgrade without the matching Sec-WebSocket-Accept");
            return Err((
                matched,
                local(
                    StatusCode::BAD_GATEWAY,
                    "upstream WebSocket handshake failed\n",
                ),
            ));
        }
    }
    if let (true, Some(client), Some(_)) = (switched, client_upgrade, &upstream_protocol) {
        let upstream = hyper::upgrade::on(&mut response);
        let idle = limits.idle_timeout;
        shared.tunnels.spawn(async move {
            tunnel(client, upstream, idle).await;
            drop(tunnel_active);
        });
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let gzip =
        !switched && gzip_for.is_some_and(|m| compress::worth_it(&m, parts.status, &parts.headers));
    if gzip {
        compress::mark(&mut parts.headers);
    }
    match (switched, upstream_protocol) {
        // HTTP/2: the stream itself is the tunnel once answered 200 (RFC 8441 §5).
        (true, Some(_)) if websocket_key.is_some() => {
            parts.status = StatusCode::OK;
            parts.headers.remove(header::SEC_WEBSOCKET_ACCEPT);
        }
        (true, Some(protocol)) => {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol);
        }
        _ => {}
    }
    if let Ok(v) = HeaderValue::from_str(&via) {
        parts.headers.append(header::VIA, v);
    }
    Ok((
        matched,
        Response::from_parts(parts, {
            let body = ResponseBody::upstream(
                body,
                Some(Exchange::lease(exchange.conn, exchange.slot)),
                EndCounters {
                    upstream_failed: cluster.body_errors.clone(),
                    abandoned: shared.abandoned_responses.clone(),
                },
            )
            .idle_timeout(cluster.body_timeout);
            if gzip {
                body.gzip()
            } else {
                body
            }
        }),
        upstream_time,
    ))
}

/// Why a small body could not be buffered.
#[derive(PartialEq, Eq)]
enum BufferError {
    /// No bytes for `limits.body_timeout`.
    TimedOut,
    /// The client's stream failed (reset, closed).
    Client,
}

/// Reads `body` whole when its length (declared or known to the protocol) is at most
/// `limits.buffer_body_bytes`, each frame within `limits.body_timeout`; other bodies are
/// returned as they are, to be streamed.
async fn buffer_small_body(
    mut body: ClientBody,
    declared_len: Option<u64>,
    limits: &LimitsConfig,
) -> Result<ClientBody, BufferError> {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    let known = declared_len.or_else(|| body.size_hint().exact());
    if body.is_end_stream() || known.is_none_or(|n| n > limits.buffer_body_bytes) {
        return Ok(body);
    }
    let mut frames = Vec::new();
    loop {
        match tokio::time::timeout(limits.body_timeout, body.frame()).await {
            Err(_) => return Err(BufferError::TimedOut),
            Ok(Some(Ok(f))) => frames.push(f),
            Ok(Some(Err(_))) => return Err(BufferError::Client),
            Ok(None) => break,
        }
    }
    let frames = futures_util::stream::iter(frames.into_iter().map(Ok::<_, crate::body::BoxError>));
    Ok(ClientBody::new(http_body_util::StreamBody::new(frames)))
}

/// The methods a 405 from the gateway offers.
const ALLOWED: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// Whether every `Transfer-Encoding` a message lists is `chunked` (or it has none).
fn only_chunked(h: &HeaderMap) -> bool {
    list_elements(h, &header::TRANSFER_ENCODING).all(|c| c.eq_ignore_ascii_case("chunked"))
}

/// Phase: the canonical target ([`crate::http::request_target`]). A malformed host or path ends the
/// request with 400 saying which ([`bad_target`]).
fn canonical_target(
    policy: &crate::http::request_target::PathPolicy,
    req: &Request<ClientBody>,
) -> Result<Target, crate::http::request_target::TargetError> {
    crate::http::request_target::normalize(req.version(), req.uri(), req.headers(), policy)
}

/// The 400 for a malformed target.
fn bad_target(e: crate::http::request_target::TargetError) -> Response<ResponseBody> {
    local(StatusCode::BAD_REQUEST, format!("bad request: {e}\n"))
}

/// The answer to a request whose body the client stalled past `limits.body_timeout` (408)
/// or broke off (400).
fn body_failed(timed_out: bool) -> Response<ResponseBody> {
    if timed_out {
        local(StatusCode::REQUEST_TIMEOUT, "request body timed out\n")
    } else {
        local(StatusCode::BAD_REQUEST, "request body ended early\n")
    }
}

/// Replaces the path of `uri` with `path`, keeping its query (and dropping any scheme and
/// authority: upstream requests are origin-form).
fn forward_path(uri: &mut http::Uri, path: &str) {
    if uri.path() == path && uri.scheme().is_none() {
        return;
    }
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    if let Ok(pq) = http::uri::PathAndQuery::try_from(pq) {
        *uri = http::Uri::from(pq);
    }
}

/// The protocol an HTTP/2 extended CONNECT names (`:protocol`, RFC 8441), if the request is
/// one. Only `websocket` is taken: it is the one such protocol an HTTP/1.1 upstream can be
/// asked for by `Upgrade`.
fn extended_connect_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    let protocol = req.extensions().get::<hyper::ext::Protocol>()?;
    (req.method() == Method::CONNECT
        && req.version() == Version::HTTP_2
        && protocol.as_str().eq_ignore_ascii_case("websocket"))
    .then(|| HeaderValue::from_static("websocket"))
}

/// A fresh `Sec-WebSocket-Key`: 16 random bytes, base64 (RFC 6455 §4.1).
fn websocket_key() -> HeaderValue {
    use base64::Engine as _;
    let mut nonce = [0u8; 16];
    fastrand::fill(&mut nonce);
    HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(nonce))
        .expect("base64 is a valid header value")
}

/// The `Sec-WebSocket-Accept` a server answers `key` with (RFC 6455 §4.2.2).
fn websocket_accept(key: &HeaderValue) -> HeaderValue {
    use base64::Engine as _;
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = boring::sha::sha1(&input);
    HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(digest))
        .expect("base64 is a valid header value")
}

/// The protocol an HTTP/1.1 request asks to switch to (`Connection: upgrade` and `Upgrade`).
fn upgrade_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    let h = req.headers();
    let asks = list_elements(h, &header::CONNECTION).any(|t| t.eq_ignore_ascii_case("upgrade"));
    (req.version() == Version::HTTP_11 && asks)
        .then(|| h.get(header::UPGRADE).cloned())
        .flatten()
}

/// Copies bytes both ways between the client's and the upstream's taken-over connections
/// until either side closes, or until nothing has moved either way for `idle` (the listener's
/// `limits.idle_timeout`, as nginx's `proxy_read_timeout` closes quiet WebSockets).
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    idle: std::time::Duration,
) {
    let (client, upstream) = match tokio::join!(client, upstream) {
        (Ok(c), Ok(u)) => (c, u),
        (c, u) => {
            tracing::debug!(
                client = c.is_ok(),
                upstream = u.is_ok(),
                "upgrade not completed"
            );
            return;
        }
    };
    let start = Instant::now();
    let last = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut client = Active::new(client, &last, start);
    let mut upstream = Active::new(upstream, &last, start);
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    tokio::pin!(copy);
    loop {
        let quiet =
            start.elapsed() - std::time::Duration::from_millis(last.load(Ordering::Relaxed));
        let left = idle.saturating_sub(quiet);
        if left.is_zero() {
            tracing::debug!(?idle, "idle upgraded connection closed");
            return;
        }
        tokio::select! {
            r = &mut copy => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "upgraded connection ended");
                }
                return;
            }
            _ = tokio::time::sleep(left) => {}
        }
    }
}

/// A taken-over connection that notes when it last read bytes (milliseconds after `start`).
struct Active {
    io: hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>,
    last: Arc<std::sync::atomic::AtomicU64>,
    start: Instant,
}

impl Active {
    fn new(
        io: hyper::upgrade::Upgraded,
        last: &Arc<std::sync::atomic::AtomicU64>,
        start: Instant,
    ) -> Self {
        Active {
            io: hyper_util::rt::TokioIo::new(io),
            last: last.clone(),
            start,
        }
    }
}

impl tokio::io::AsyncRead for Active {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            let now = self.start.elapsed().as_millis() as u64;
            self.last.store(now, Ordering::Relaxed);
        }
        r
    }
}

impl tokio::io::AsyncWrite for Active {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// `resp` for a request whose body was not read: a little of it is read and dropped first,
/// the rest held until the response is written (see [`discard_body`]).
async fn refuse_unread(
    body: ClientBody,
    progress: &Arc<BodyProgress>,
    resp: Response<ResponseBody>,
) -> Response<ResponseBody> {
    let unread = discard_body(RequestBody::new(body, u64::MAX, progress.clone())).await;
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, body.holding(unread))
}

/// Reads and drops up to 64 KiB of a request body for at most one second. Returns the body
/// if it did not end within those bounds.
async fn discard_body(mut body: RequestBody) -> Option<RequestBody> {
    use http_body_util::BodyExt;
    const MAX: usize = 64 * 1024;
    let drained = tokio::time::timeout(std::time::Duration::from_secs(1), async {
        let mut seen = 0;
        while seen <= MAX {
            match body.frame().await {
                Some(Ok(f)) => seen += f.data_ref().map_or(0, |d| d.len()),
                Some(Err(_)) | None => return true,
            }
        }
        false
    })
    .await;
    match drained {
        Ok(true) => None,
        _ => Some(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed_including_connection_named() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn te_trailers_is_recognised_among_other_codings() {
        let te = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::TE, HeaderValue::from_static(v));
            accepts_trailers(&h)
        };
        assert!(te("trailers"));
        assert!(te("gzip;q=0.5, Trailers"));
        assert!(!te("gzip"));
        assert!(!te("trailersx"));
        assert!(!accepts_trailers(&HeaderMap::new()));
    }

    #[test]
    fn request_ids_are_validated() {
        assert!(valid_request_id(&HeaderValue::from_static("abc-123")));
        assert!(!valid_request_id(&HeaderValue::from_static("")));
        assert!(!valid_request_id(&HeaderValue::from_static("has space")));
        assert_eq!(new_request_id().len(), 32);
    }
}
