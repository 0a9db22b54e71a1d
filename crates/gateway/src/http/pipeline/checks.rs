//! The phases before any upstream work: the target normalized, 0-RTT's rules, the limits,
//! the route, and the route's access list and rate limit. Each refusal is an
//! [`Outcome::Refused`] with the status that says why.

use super::forward::refuse_unread;
use super::{local, Outcome, Phase, RequestCtx};
use crate::body::ClientBody;
use crate::http::request_target::{self, Target, TargetError};
use crate::http::route_match::RequestFacts;
use crate::http::router::{Route, RouteLimit};
use crate::http::websocket;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode};
use std::ops::ControlFlow;

static EARLY_DATA: HeaderName = HeaderName::from_static("early-data");

/// The methods a 405 from the gateway offers.
const ALLOWED: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// Ends the request here, refused with `resp`.
fn refused<T>(resp: http::Response<crate::body::ResponseBody>) -> Phase<T> {
    ControlFlow::Break(Outcome::Refused(resp))
}

/// Phase: the canonical target ([`crate::http::request_target`]), first, so that every rule
/// below sees the same host and path. A malformed host or path ends the request with 400
/// saying which.
pub(super) fn canonical_target(
    ctx: &mut RequestCtx<'_>,
    req: &Request<ClientBody>,
) -> Phase<Target> {
    let target =
        request_target::normalize(req.version(), req.uri(), req.headers(), &ctx.shared.paths);
    match target {
        Ok(t) => {
            if ctx.logging() {
                ctx.rec.host = t.host.clone();
            }
            ControlFlow::Continue(t)
        }
        Err(e) => refused(bad_target(e)),
    }
}

/// Phase: a request for a host the connection may not serve is 421 Misdirected Request (RFC
/// 9110 §15.5.20), so that the client connects again naming that host. That is a host whose
/// certificate entry has other client-certificate settings (`client_auth`, `client_ca`,
/// `client_crl`) than the entry the connection's SNI chose: without this, a client that
/// connected as a name asking for no certificate could send `Host:` a name that requires one
/// and reach its routes without presenting any. Listeners whose names share one setting skip
/// it (`names` is `None`).
pub(super) fn authoritative(ctx: &mut RequestCtx<'_>, target: &Target) -> Phase<()> {
    let Some(names) = &ctx.shared.names else {
        return ControlFlow::Continue(());
    };
    let store = names.current();
    let sni = ctx.conn.sni.as_deref();
    if store.client_auth_policy(sni) == store.client_auth_policy(Some(&target.host)) {
        return ControlFlow::Continue(());
    }
    ctx.shared.metrics.misdirected_requests.inc();
    refused(local(
        StatusCode::MISDIRECTED_REQUEST,
        "misdirected request: this connection was made for a name with other \
         client-certificate settings; connect again naming this host\n",
    ))
}

/// The 400 for a malformed target.
fn bad_target(e: TargetError) -> http::Response<crate::body::ResponseBody> {
    local(StatusCode::BAD_REQUEST, format!("bad request: {e}\n"))
}

/// Whether a request may be replayed without harm (RFC 8470 §3: the methods that are safe).
fn replay_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Phase (RFC 8470): a request from early data, which an attacker can replay, that is safe to
/// replay goes upstream marked `Early-Data: 1` (counted as accepted). Returns whether the
/// request is safe to replay.
pub(super) fn mark_early_data(ctx: &mut RequestCtx<'_>, req: &mut Request<ClientBody>) -> bool {
    let safe = replay_safe(req.method());
    if ctx.early_data && safe {
        ctx.shared.metrics.early_data_accepted.inc();
        req.headers_mut()
            .insert(&EARLY_DATA, HeaderValue::from_static("1"));
    }
    safe
}

/// Phase (RFC 8470): a request from early data that is not safe to replay, or any while the
/// overload manager refuses early data, is told to retry after the handshake (425).
pub(super) fn refuse_early_data(ctx: &mut RequestCtx<'_>, replay_safe: bool) -> Phase<()> {
    let refusing = ctx
        .shared
        .overload
        .is_active(crate::policy::overload::Action::RefuseEarlyData);
    if ctx.early_data && (!replay_safe || refusing) {
        ctx.shared.metrics.early_data_rejected.inc();
        return refused(local(
            StatusCode::TOO_EARLY,
            "too early: retry after the handshake\n",
        ));
    }
    ControlFlow::Continue(())
}

/// Phase: the listener's limits and what the gateway does not pass. Headers over
/// `max_headers` or `max_header_bytes` (431), a declared body over `max_body_bytes` (413),
/// `TRACE` (405: it would echo the request, credentials included, from wherever it ends, as
/// nginx refuses it), a transfer coding other than chunked (501, RFC 9112 §6.1: hyper decodes
/// only chunked, so another would reach the upstream still applied but no longer declared),
/// and `CONNECT` other than an HTTP/2 WebSocket (405: a reverse proxy tunnels nothing else).
/// Returns the request and its declared body length.
pub(super) async fn limits(
    ctx: &mut RequestCtx<'_>,
    req: Request<ClientBody>,
) -> Phase<(Request<ClientBody>, Option<u64>)> {
    let limits = &ctx.shared.limits;
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len())
        .sum();
    if req.headers().len() > limits.max_headers || header_bytes > limits.max_header_bytes {
        return refused(local(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request headers too large\n",
        ));
    }
    let declared_len = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared_len.is_some_and(|n| n > limits.max_body_bytes) {
        let resp = local(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
        return refused(refuse_unread(req.into_body(), &ctx.progress, resp).await);
    }
    if req.method() == Method::TRACE {
        let mut resp = local(StatusCode::METHOD_NOT_ALLOWED, "TRACE is not served\n");
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOWED));
        return refused(refuse_unread(req.into_body(), &ctx.progress, resp).await);
    }
    if !only_chunked(req.headers()) {
        return refused(local(
            StatusCode::NOT_IMPLEMENTED,
            "transfer coding not supported\n",
        ));
    }
    if req.method() == Method::CONNECT && websocket::extended_connect_protocol(&req).is_none() {
        let mut resp = local(
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not served here\n",
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOWED));
        return refused(resp);
    }
    ControlFlow::Continue((req, declared_len))
}

/// Whether every `Transfer-Encoding` a message lists is `chunked` (or it has none).
pub(super) fn only_chunked(h: &HeaderMap) -> bool {
    crate::http::headers::list_elements(h, &header::TRANSFER_ENCODING)
        .all(|c| c.eq_ignore_ascii_case("chunked"))
}

/// Phase: the route for the canonical host and path and the request's method, headers,
/// query and cookies (404 when none matches).
pub(super) fn route<'a>(
    ctx: &mut RequestCtx<'a>,
    target: &Target,
    req: &Request<ClientBody>,
) -> Phase<&'a Route> {
    let routing = ctx.routing;
    let facts = RequestFacts {
        method: req.method(),
        headers: req.headers(),
        query: req.uri().query(),
        client_cert: ctx.conn.client_cert.as_deref(),
    };
    let Some(route) = routing.router.route(
        &target.host,
        &target.path,
        ctx.shared.paths.case_insensitive_routes,
        &facts,
    ) else {
        return refused(local(
            StatusCode::NOT_FOUND,
            "no route for this host and path\n",
        ));
    };
    ctx.route = Some(route);
    if ctx.logging() {
        ctx.rec.route = Some(route.name.clone());
    }
    ControlFlow::Continue(route)
}

/// Phase: the route's client-certificate requirement and access list (403), then its rate
/// limit (429 with `Retry-After`), on this gateway or across the fleet.
pub(super) async fn admit(
    ctx: &mut RequestCtx<'_>,
    route: &Route,
    req: Request<ClientBody>,
) -> Phase<Request<ClientBody>> {
    if route.client_cert_required && ctx.conn.client_cert.is_none() {
        let resp = local(
            StatusCode::FORBIDDEN,
            "a verified client certificate is required\n",
        );
        return refused(refuse_unread(req.into_body(), &ctx.progress, resp).await);
    }
    if !route.access.permits(ctx.conn.client.ip()) {
        let resp = local(StatusCode::FORBIDDEN, "forbidden\n");
        return refused(refuse_unread(req.into_body(), &ctx.progress, resp).await);
    }
    // Counted by the client's key: an IPv6 client by its prefix, not each of its addresses.
    let client = ctx.conn.client_key;
    let verdict = match &route.rate_limit {
        None => Ok(()),
        Some(RouteLimit::Node(l)) => l.take(client),
        // Boxed: only fleet-limited routes wait on it.
        Some(RouteLimit::Fleet(l)) => Box::pin(l.take(req.headers(), client)).await,
    };
    if let Err(wait) = verdict {
        let mut resp = local(StatusCode::TOO_MANY_REQUESTS, "too many requests\n");
        let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return refused(refuse_unread(req.into_body(), &ctx.progress, resp).await);
    }
    ControlFlow::Continue(req)
}

/// Phase: the cluster, when the route splits its traffic (a cohort's, else by weight; see
/// [`crate::policy::split`]); the route's own otherwise. A split route's choice is counted
/// by route and cluster; every request's is in the access log.
pub(super) fn split(ctx: &mut RequestCtx<'_>, route: &Route, req: &Request<ClientBody>) -> usize {
    let chosen = route.split.as_ref().and_then(|s| {
        s.choose(&crate::policy::split::Request {
            headers: req.headers(),
            query: req.uri().query(),
            client: ctx.conn.client.ip(),
        })
    });
    let index = chosen.unwrap_or(route.cluster);
    let cluster = &ctx.routing.clusters[index];
    if route.split.is_some() {
        ctx.shared
            .metrics
            .split_requests
            .with_label_values(&[route.name.as_str(), cluster.name.as_str()])
            .inc();
    }
    if ctx.logging() {
        ctx.rec.cluster = Some(cluster.name.clone());
    }
    index
}

#[cfg(test)]
mod tests {
    use super::super::testing::{client_request, shared, status, with_ctx};
    use super::*;
    use crate::config::{RateLimitConfig, RouteConfig};

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn limits_refuse_oversized_headers_and_bodies_and_unserved_methods() {
        let s = shared(&[]);
        let check =
            |req: Request<ClientBody>| with_ctx(&s, |ctx| status(block_on(limits(ctx, req))));
        assert_eq!(check(client_request("GET", "/", "")), None);
        let mut many = client_request("GET", "/", "");
        for i in 0..=s.limits.max_headers {
            many.headers_mut().insert(
                HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(),
                HeaderValue::from_static("1"),
            );
        }
        assert_eq!(
            check(many),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        let mut big = client_request("POST", "/", "x");
        big.headers_mut().insert(
            header::CONTENT_LENGTH,
            HeaderValue::from(s.limits.max_body_bytes + 1),
        );
        assert_eq!(check(big), Some(StatusCode::PAYLOAD_TOO_LARGE));
        assert_eq!(
            check(client_request("TRACE", "/", "")),
            Some(StatusCode::METHOD_NOT_ALLOWED)
        );
        assert_eq!(
            check(client_request("CONNECT", "www.example:443", "")),
            Some(StatusCode::METHOD_NOT_ALLOWED)
        );
        let mut gzip = client_request("POST", "/", "x");
        gzip.headers_mut().insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("gzip, chunked"),
        );
        assert_eq!(check(gzip), Some(StatusCode::NOT_IMPLEMENTED));
    }

    #[test]
    fn routes_by_canonical_host_and_path_or_answers_404() {
        let s = shared(&[RouteConfig::simple("www.example", "/admin", "c")]);
        let routed = |uri: &str| {
            let req = client_request("GET", uri, "");
            with_ctx(&s, |ctx| {
                let target = match canonical_target(ctx, &req) {
                    ControlFlow::Continue(t) => t,
                    ControlFlow::Break(_) => return Err(StatusCode::BAD_REQUEST),
                };
                match route(ctx, &target, &req) {
                    ControlFlow::Continue(r) => {
                        assert!(ctx.route.is_some());
                        Ok(r.name.clone())
                    }
                    ControlFlow::Break(o) => Err(o.into_response().0.status()),
                }
            })
        };
        assert!(routed("/admin/x").is_ok());
        // The spellings of /admin that once went around a route (issue 32) reach it.
        assert!(routed("//admin").is_ok());
        assert!(routed("/x/../admin").is_ok());
        assert!(routed("/%61dmin").is_ok());
        assert_eq!(routed("/public"), Err(StatusCode::NOT_FOUND));
        assert_eq!(routed("/a%00b"), Err(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn admit_applies_the_access_list_then_the_rate_limit() {
        let denied = RouteConfig {
            deny: vec!["192.0.2.0/24".parse().unwrap()],
            ..RouteConfig::simple("*", "/", "c")
        };
        let limited = RouteConfig {
            rate_limit: Some(RateLimitConfig {
                per_second: 0.001,
                burst: Some(1),
                scope: Default::default(),
                key: None,
            }),
            ..RouteConfig::simple("*", "/", "c")
        };
        for (cfg, want) in [
            (
                denied,
                [Some(StatusCode::FORBIDDEN), Some(StatusCode::FORBIDDEN)],
            ),
            (limited, [None, Some(StatusCode::TOO_MANY_REQUESTS)]),
        ] {
            let s = shared(&[cfg]);
            let routing = s.routing.current();
            let r = super::super::testing::plain_get_route(&routing);
            for want in want {
                let req = client_request("GET", "/", "");
                let got = with_ctx(&s, |ctx| status(block_on(admit(ctx, r, req))));
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn early_data_is_marked_when_safe_and_refused_when_not() {
        let s = shared(&[]);
        for (method, refused) in [("GET", false), ("POST", true)] {
            let mut req = client_request(method, "/", "");
            with_ctx(&s, |ctx| {
                // As `RequestCtx::new` finds for a request carrying `InEarlyData`.
                ctx.early_data = true;
                let safe = mark_early_data(ctx, &mut req);
                assert_eq!(req.headers().contains_key(&EARLY_DATA), !refused);
                let got = status(refuse_early_data(ctx, safe));
                assert_eq!(got, refused.then_some(StatusCode::TOO_EARLY), "{method}");
            });
        }
    }
}
