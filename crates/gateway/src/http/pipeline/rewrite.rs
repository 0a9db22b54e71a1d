//! Phase: the request rewritten for the upstream. Hop-by-hop headers out; one canonical
//! `Host`; `X-Forwarded-*`, `Via` and the request id in; the route's own header rules, then
//! (on a route whose WAF reads response bodies) `Accept-Encoding` narrowed to what it reads;
//! and an upgrade (an HTTP/1.1 `Upgrade` the route allows, or an HTTP/2 WebSocket) set up to
//! become a tunnel once the upstream agrees.

use super::{RequestCtx, X_REQUEST_ID};
use crate::body::ClientBody;
use crate::http::compress;
use crate::http::headers::list_elements;
use crate::http::request_target::Target;
use crate::http::router::Route;
use crate::http::websocket;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Version};
use std::sync::Arc;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// What the phases after the rewrite need to know about the exchange.
pub(super) struct ExchangePlan {
    /// The protocol the upstream is asked to switch to.
    pub upgrade: Option<HeaderValue>,
    /// The client's side of an upgrade, taken over once the upstream switches.
    pub client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// An HTTP/2 stream turned tunnel keeps its connection busy for the connection's idle
    /// timer (an HTTP/1.1 connection is handed over whole instead).
    pub tunnel_active: Option<crate::listener::conn_timers::Active>,
    /// The request's method, when the route compresses and the client accepts gzip.
    pub gzip_for: Option<Method>,
    /// The `Sec-WebSocket-Key` the gateway sent for an HTTP/2 WebSocket (RFC 8441), which only
    /// it can check the upstream's answer against.
    pub websocket_key: Option<HeaderValue>,
    /// The `Via` entry added both ways.
    pub via: HeaderValue,
}

/// The rewritten request head, its body still as the client sends it, and the plan.
pub(super) struct Prepared {
    pub parts: http::request::Parts,
    pub body: ClientBody,
    pub plan: ExchangePlan,
}

/// The verified client certificate's headers: whatever the client sent in them is removed
/// first, so an upstream that trusts them trusts only the gateway.
fn client_cert_headers(
    h: &mut http::HeaderMap,
    names: &super::ClientCertHeaders,
    cert: Option<&crate::tls::handshake_info::ClientCert>,
) {
    h.remove(&names.subject);
    h.remove(&names.san);
    h.remove(&names.sha256);
    if let Some(c) = cert {
        h.insert(names.subject.clone(), c.subject.clone());
        if let Some(san) = &c.san {
            h.insert(names.san.clone(), san.clone());
        }
        h.insert(names.sha256.clone(), c.sha256.clone());
    }
}

/// Phase: rewrites the request for the upstream (see the module's documentation).
pub(super) fn request(
    ctx: &RequestCtx<'_>,
    route: &Route,
    target: &Target,
    mut req: Request<ClientBody>,
) -> Prepared {
    let h2_websocket = websocket::extended_connect_protocol(&req);
    let gzip_for =
        (route.compress && compress::accepts_gzip(req.headers())).then(|| req.method().clone());
    let upgrade = websocket::upgrade_protocol(&req)
        .filter(|p| route.upgrades(p))
        .or_else(|| h2_websocket.clone());
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let tunnel_active = h2_websocket.as_ref().and_then(|_| {
        req.extensions()
            .get::<Arc<crate::listener::conn_timers::Activity>>()
            .map(|a| a.begin())
    });
    let (mut parts, body) = req.into_parts();
    let via = via_for(parts.version);
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
        let key = websocket::new_key();
        h.insert(header::SEC_WEBSOCKET_KEY, key.clone());
        key
    });
    // One Host upstream, the canonical one (replacing the client's, which may have named
    // something else in an absolute-form request or been listed in `Connection`).
    if let Ok(v) = HeaderValue::from_str(&target.authority) {
        h.insert(header::HOST, v);
    }
    if ctx.shared.replace_forwarded_for {
        h.remove(&X_FORWARDED_FOR);
    }
    forwarding_headers(h, ctx.conn.client.ip(), &target.host, &via, &ctx.request_id);
    // With tracing, the upstream's parent is this request's span (each try's own, once the
    // cluster sends it); `tracestate` passes as the client sent it.
    if let Some(t) = &ctx.trace {
        h.insert(&crate::trace::TRACEPARENT, t.context.traceparent());
    }
    if let Some(names) = &ctx.shared.client_cert_headers {
        client_cert_headers(h, names, ctx.conn.client_cert.as_deref());
    }
    route.request_headers.apply(h);
    // After the route's own rules, which cannot take it back: a route that inspects response
    // bodies gets them in a coding the inspection reads through.
    if route
        .waf
        .as_ref()
        .is_some_and(|w| w.reads_response_bodies())
    {
        crate::policy::waf::accept_readable(h);
    }
    if ctx.shared.paths.forward_normalized {
        forward_path(&mut parts.uri, &target.path);
    }
    Prepared {
        parts,
        body,
        plan: ExchangePlan {
            upgrade,
            client_upgrade,
            tunnel_active,
            gzip_for,
            websocket_key,
            via,
        },
    }
}

/// `X-Forwarded-For` (the client appended to any the request still carries: the caller drops
/// the client's own with `forwarded_for = "replace"`), `X-Forwarded-Proto`,
/// `X-Forwarded-Host`, `Via` and `X-Request-Id`.
fn forwarding_headers(
    h: &mut HeaderMap,
    client: std::net::IpAddr,
    host: &str,
    via: &HeaderValue,
    request_id: &str,
) {
    let client_ip = client.to_string();
    let xff = match h.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {client_ip}"),
        None => client_ip,
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        h.insert(&X_FORWARDED_FOR, v);
    }
    h.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("https"));
    if let Ok(v) = HeaderValue::from_str(host) {
        h.insert(&X_FORWARDED_HOST, v);
    }
    h.append(header::VIA, via.clone());
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert(&X_REQUEST_ID, v);
    }
}

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
    // Most messages carry none: one pass over the names costs less than nine removals.
    if !h.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = list_elements(h, &header::CONNECTION)
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in &HOP_BY_HOP {
        h.remove(*n);
    }
}

/// The hop-by-hop fields every message loses, `Connection` and those it names aside.
static HOP_BY_HOP: [&HeaderName; 9] = [
    &header::CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &header::TE,
    &header::TRAILER,
    &header::TRANSFER_ENCODING,
    &header::UPGRADE,
    &header::PROXY_AUTHENTICATE,
    &header::PROXY_AUTHORIZATION,
];

/// Whether `n` is one of [`HOP_BY_HOP`] (`Connection` lists the others).
fn is_hop_by_hop(n: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&n)
}

pub(super) fn valid_request_id(v: &HeaderValue) -> bool {
    let b = v.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
}

pub(super) fn new_request_id() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

/// The `Via` entry the gateway adds for a request of version `v` (RFC 9110 §7.6.3), and to
/// its response. Static: no allocation per request.
fn via_for(v: Version) -> HeaderValue {
    HeaderValue::from_static(match v {
        Version::HTTP_2 => "2 rampart",
        Version::HTTP_10 => "1.0 rampart",
        Version::HTTP_3 => "3 rampart",
        _ => "1.1 rampart",
    })
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

#[cfg(test)]
mod tests {
    use super::super::testing::{client_request, shared, with_ctx};
    use super::*;
    use crate::config::RouteConfig;

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
        // Without `Connection`, each of the others alone is still found (by the one pass
        // that decides whether anything is to be removed).
        for name in HOP_BY_HOP.iter().skip(1) {
            let mut h = HeaderMap::new();
            h.insert("x-kept", HeaderValue::from_static("1"));
            h.insert(*name, HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.len(), 1, "{name} kept");
        }
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

    #[test]
    fn the_upstream_sees_one_canonical_host_and_the_forwarding_headers() {
        let s = shared(&[RouteConfig::simple("*", "/", "c")]);
        let routing = s.routing.current();
        let route = super::super::testing::plain_get_route(&routing);
        let mut req = client_request("GET", "http://www.example/a/../b?q=1", "");
        let h = req.headers_mut();
        h.insert(header::HOST, HeaderValue::from_static("admin.example"));
        h.insert(&X_FORWARDED_FOR, HeaderValue::from_static("198.51.100.1"));
        h.insert(header::CONNECTION, HeaderValue::from_static("x-drop"));
        h.insert("x-drop", HeaderValue::from_static("1"));
        h.insert(header::EXPECT, HeaderValue::from_static("100-continue"));
        let target = crate::http::request_target::normalize(
            req.version(),
            req.uri(),
            req.headers(),
            &s.paths,
        );
        // An absolute-form target names the host; the client's Host header does not count.
        let target = target.unwrap();
        let p = with_ctx(&s, |ctx| request(ctx, route, &target, req));
        let h = &p.parts.headers;
        assert_eq!(h[header::HOST], "www.example");
        assert_eq!(h[&X_FORWARDED_FOR], "198.51.100.1, 192.0.2.7");
        assert_eq!(h[&X_FORWARDED_PROTO], "https");
        assert_eq!(h[&X_FORWARDED_HOST], "www.example");
        assert_eq!(h[header::VIA], "1.1 rampart");
        assert!(h.contains_key(&X_REQUEST_ID));
        assert!(!h.contains_key("x-drop") && !h.contains_key(header::EXPECT));
        assert_eq!(p.parts.uri, "/b?q=1", "the normalized path goes upstream");
        assert!(p.plan.upgrade.is_none() && p.plan.gzip_for.is_none());
    }

    #[test]
    fn only_upgrades_the_route_lists_are_passed() {
        let s = shared(&[RouteConfig::simple("*", "/", "c")]);
        let routing = s.routing.current();
        let route = super::super::testing::plain_get_route(&routing);
        for (protocol, passed) in [("websocket", true), ("h2c", false)] {
            let mut req = client_request("GET", "/", "");
            req.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            req.headers_mut()
                .insert(header::UPGRADE, HeaderValue::from_str(protocol).unwrap());
            let target = crate::http::request_target::normalize(
                req.version(),
                req.uri(),
                req.headers(),
                &s.paths,
            )
            .unwrap();
            let p = with_ctx(&s, |ctx| request(ctx, route, &target, req));
            assert_eq!(p.plan.upgrade.is_some(), passed, "{protocol}");
            assert_eq!(p.parts.headers.contains_key(header::UPGRADE), passed);
        }
    }
}
