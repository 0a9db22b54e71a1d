//! Routes: host, path and conditions → cluster. The most specific host class that has a
//! matching route wins (exact, then `*.wildcard`, then `*`); within it, the matching route of
//! the highest `priority`, then of the most specific path (an exact `path`, then the longest
//! literal prefix: `path_prefix`, or a `path_regex`'s literal start), then with the most
//! conditions (methods, headers, query, cookies, a path pattern), then the last defined.
//!
//! The lookup does not look at every route: routes are indexed by host (a hash map per host
//! class) and, within a host, by exact path and by literal prefix (a hash map per prefix,
//! probed once per distinct prefix length, longest first), each key holding its routes in
//! the order above. Its cost grows with the number of distinct prefix lengths and of the
//! routes sharing a key, not of routes: 10,000 routes cost about what 10 do. Conditions are
//! checked only on the routes of keys the path reaches, and the walk stops at the first
//! route that matches unless a route of higher priority remains in the table.

use crate::config::{HeaderRewriteConfig, RouteConfig};
use crate::http::route_match::{Conditions, RequestFacts};
use crate::policy::access::AccessList;
use http::{HeaderMap, HeaderName, HeaderValue};
use std::collections::HashMap;

/// Headers a route removes, then sets (replacing any value), on its requests or responses.
#[derive(Debug, Clone, Default)]
pub struct HeaderRewrite {
    set: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

impl HeaderRewrite {
    /// From a validated config.
    fn new(cfg: &HeaderRewriteConfig) -> Self {
        let name = |n: &str| HeaderName::from_bytes(n.as_bytes()).expect("validated");
        HeaderRewrite {
            set: cfg
                .set
                .iter()
                .map(|(k, v)| (name(k), HeaderValue::from_str(v).expect("validated")))
                .collect(),
            remove: cfg.remove.iter().map(|n| name(n)).collect(),
        }
    }

    pub fn apply(&self, h: &mut HeaderMap) {
        for n in &self.remove {
            h.remove(n);
        }
        for (n, v) in &self.set {
            h.insert(n.clone(), v.clone());
        }
    }
}

#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub cluster: usize,
    /// Which clients the route serves; the others get 403.
    pub access: AccessList,
    /// Requests per client (on this gateway, or across the fleet); beyond it, 429.
    pub rate_limit: Option<RouteLimit>,
    pub request_headers: HeaderRewrite,
    pub response_headers: HeaderRewrite,
    /// Gzip text-like responses for clients that accept it.
    pub compress: bool,
    /// `Upgrade` protocols passed upstream (lowercase).
    upgrades: Vec<String>,
    /// Other clusters the route's requests may go to (gray release).
    pub split: Option<crate::policy::split::TrafficSplit>,
    /// What the route's failed tries are retried on.
    pub retry: crate::policy::retry::RetryPolicy,
    /// The shadow cluster a share of the route's requests is copied to.
    pub mirror: Option<Mirror>,
    /// Requests without a verified client certificate get 403.
    pub client_cert_required: bool,
    /// The route's web application firewall ([`Router::with_wafs`]).
    pub waf: Option<std::sync::Arc<crate::policy::waf::RouteWaf>>,
    /// What a request must meet besides host and path prefix.
    conditions: Conditions,
    priority: i32,
}

/// A route's rate limit: counted by this gateway (shared by its workers), or across the fleet.
#[derive(Debug, Clone)]
pub enum RouteLimit {
    Node(std::sync::Arc<crate::policy::ratelimit::RateLimiter>),
    Fleet(std::sync::Arc<crate::fleet::rate_limit::FleetLimiter>),
}

impl RouteLimit {
    /// The limit `cfg` asks for on route `name`; a fleet one only with a `fleet` store (a
    /// config without one is refused at load), else counted on this gateway.
    fn new(
        cfg: &crate::config::RateLimitConfig,
        name: &str,
        fleet: Option<&std::sync::Arc<crate::fleet::FleetStore>>,
    ) -> RouteLimit {
        match (cfg.scope, fleet) {
            (crate::config::LimitScope::Fleet, Some(store)) => RouteLimit::Fleet(
                std::sync::Arc::new(crate::fleet::rate_limit::FleetLimiter::new(
                    store.clone(),
                    name,
                    cfg.per_second,
                    cfg.burst(),
                    limit_key(cfg),
                )),
            ),
            _ => RouteLimit::Node(std::sync::Arc::new(
                crate::policy::ratelimit::RateLimiter::new(cfg.per_second, cfg.burst()),
            )),
        }
    }

    /// Whether this limit enforces `cfg` as it is (a reload keeps such a one, its counts
    /// and all).
    fn enforces(&self, cfg: &crate::config::RateLimitConfig) -> bool {
        match self {
            RouteLimit::Node(l) => {
                cfg.scope == crate::config::LimitScope::Node
                    && l.enforces(cfg.per_second, cfg.burst())
            }
            RouteLimit::Fleet(l) => {
                cfg.scope == crate::config::LimitScope::Fleet
                    && l.enforces(cfg.per_second, cfg.burst(), &limit_key(cfg))
            }
        }
    }
}

/// What a rate limit counts by: its `key`, else the client address.
fn limit_key(cfg: &crate::config::RateLimitConfig) -> crate::http::headers::RequestKey {
    cfg.key.as_ref().map_or(
        crate::http::headers::RequestKey::ClientAddress,
        crate::http::headers::RequestKey::new,
    )
}

/// A route's mirror: the shadow cluster and the share of requests copied to it.
#[derive(Debug, Clone, Copy)]
pub struct Mirror {
    pub cluster: usize,
    /// Percent of the route's requests.
    pub percent: f64,
}

impl Route {
    /// Whether a request's `Upgrade` names exactly one protocol this route passes upstream.
    pub fn upgrades(&self, protocol: &HeaderValue) -> bool {
        let Ok(p) = protocol.to_str() else {
            return false;
        };
        let p = p.trim();
        !p.contains(',') && self.upgrades.iter().any(|u| u.eq_ignore_ascii_case(p))
    }
}

/// The routes of one host (or host class), by exact path and by literal prefix, each key's
/// routes best first.
#[derive(Default)]
struct PathTable {
    exact: HashMap<String, Vec<usize>>,
    /// The same, paths lowercased, for listeners that match paths without case.
    exact_lower: HashMap<String, Vec<usize>>,
    prefix: HashMap<String, Vec<usize>>,
    prefix_lower: HashMap<String, Vec<usize>>,
    /// The distinct prefix lengths, longest first.
    lengths: Vec<usize>,
    /// The highest priority of any route in the table: a walk that found a route of it can
    /// stop.
    top_priority: i32,
    routes: usize,
}

impl PathTable {
    fn insert(&mut self, r: &RouteConfig, route: usize, priority: i32) {
        let (key, exact, lower) = match &r.path {
            Some(p) => (p.clone(), &mut self.exact, &mut self.exact_lower),
            None => {
                let p = r.index_prefix();
                if let Err(at) = self.lengths.binary_search_by(|l| p.len().cmp(l)) {
                    self.lengths.insert(at, p.len());
                }
                (p, &mut self.prefix, &mut self.prefix_lower)
            }
        };
        lower
            .entry(key.to_ascii_lowercase())
            .or_default()
            .push(route);
        exact.entry(key).or_default().push(route);
        self.top_priority = if self.routes == 0 {
            priority
        } else {
            self.top_priority.max(priority)
        };
        self.routes += 1;
    }

    /// Orders each key's routes best first (see the module's documentation).
    fn sort(&mut self, routes: &[Route]) {
        let rank = |&i: &usize| {
            let r = &routes[i];
            std::cmp::Reverse((
                r.priority,
                r.conditions.has_path_regex(),
                r.conditions.count(),
                i,
            ))
        };
        for map in [
            &mut self.exact,
            &mut self.exact_lower,
            &mut self.prefix,
            &mut self.prefix_lower,
        ] {
            for list in map.values_mut() {
                list.sort_by_key(rank);
            }
        }
    }

    /// The best route for `path` and `req` (see the module's documentation).
    fn find(
        &self,
        routes: &[Route],
        path: &str,
        case_insensitive: bool,
        req: &RequestFacts<'_>,
    ) -> Option<usize> {
        let lowered;
        let (exact, prefix, key) = if case_insensitive {
            lowered = path.to_ascii_lowercase();
            (&self.exact_lower, &self.prefix_lower, lowered.as_str())
        } else {
            (&self.exact, &self.prefix, path)
        };
        let mut best: Option<(i32, usize)> = None;
        // The keys the path reaches, most specific first: a later one's route wins only with
        // a higher priority.
        let exact = (!exact.is_empty()).then(|| exact.get(key)).flatten();
        let keys = std::iter::once(exact).chain(
            self.lengths
                .iter()
                .filter(|&&n| n <= key.len() && key.is_char_boundary(n))
                .map(|&n| prefix.get(&key[..n])),
        );
        for list in keys.flatten() {
            for &i in list {
                let r = &routes[i];
                if best.is_some_and(|(p, _)| r.priority <= p) {
                    break;
                }
                if r.conditions.met(path, case_insensitive, req) {
                    best = Some((r.priority, i));
                    break;
                }
            }
            if best.is_some_and(|(p, _)| p >= self.top_priority) {
                break;
            }
        }
        best.map(|(_, i)| i)
    }
}

pub struct Router {
    routes: Vec<Route>,
    /// Routes of exact hosts, by host.
    exact: HashMap<String, PathTable>,
    /// Routes of `*.parent`, by parent.
    suffix: HashMap<String, PathTable>,
    /// Routes of `*`.
    any: PathTable,
}

impl Router {
    /// `cluster_index` maps a cluster name to its index (validated by config loading).
    #[cfg(test)]
    pub fn new(routes: &[RouteConfig], cluster_index: impl Fn(&str) -> usize) -> Self {
        Self::after(routes, cluster_index, None, None)
    }

    /// A router for `routes` replacing `previous` (a reload): a route of the same name whose rate
    /// limit is unchanged keeps its limiter, so its clients' buckets are not refilled. Fleet
    /// limits count in `fleet`.
    pub fn after(
        routes: &[RouteConfig],
        cluster_index: impl Fn(&str) -> usize,
        previous: Option<&Router>,
        fleet: Option<&std::sync::Arc<crate::fleet::FleetStore>>,
    ) -> Self {
        let kept: HashMap<&str, &Route> = previous
            .map(|p| p.routes.iter().map(|r| (r.name.as_str(), r)).collect())
            .unwrap_or_default();
        let mut router = Router {
            routes: Vec::with_capacity(routes.len()),
            exact: HashMap::new(),
            suffix: HashMap::new(),
            any: PathTable::default(),
        };
        for (i, r) in routes.iter().enumerate() {
            let host = r.host.to_ascii_lowercase();
            let name = r.effective_name();
            let kept_limiter = |rl: &crate::config::RateLimitConfig| {
                kept.get(name.as_str())?
                    .rate_limit
                    .clone()
                    .filter(|l| l.enforces(rl))
            };
            let table = if host == "*" {
                &mut router.any
            } else if let Some(s) = host.strip_prefix("*.") {
                router.suffix.entry(s.to_string()).or_default()
            } else {
                router.exact.entry(host).or_default()
            };
            table.insert(r, i, r.priority);
            let split: Vec<(String, f64)> = r
                .split
                .iter()
                .map(|s| (s.cluster.clone(), s.weight))
                .collect();
            let split = crate::policy::split::TrafficSplit::new(
                &split,
                &r.cohorts,
                r.sticky.as_ref(),
                &cluster_index,
            );
            router.routes.push(Route {
                split,
                rate_limit: r.rate_limit.as_ref().map(|rl| {
                    kept_limiter(rl).unwrap_or_else(|| RouteLimit::new(rl, &name, fleet))
                }),
                name,
                cluster: cluster_index(&r.cluster),
                access: AccessList::new(&r.allow, &r.deny),
                request_headers: HeaderRewrite::new(&r.request_headers),
                response_headers: HeaderRewrite::new(&r.response_headers),
                compress: r.compress,
                upgrades: r.upgrade_protocols.clone(),
                retry: match &r.retry {
                    Some(cfg) => crate::policy::retry::RetryPolicy::new(cfg),
                    None => crate::policy::retry::RetryPolicy::new(
                        &crate::config::RetryConfig::connect_only(),
                    ),
                },
                mirror: r.mirror.as_ref().map(|m| Mirror {
                    cluster: cluster_index(&m.cluster),
                    percent: m.percent,
                }),
                conditions: Conditions::new(r),
                client_cert_required: r.client_cert.is_some(),
                waf: None,
                priority: r.priority,
            });
        }
        let routes = &router.routes;
        for t in router
            .exact
            .values_mut()
            .chain(router.suffix.values_mut())
            .chain(std::iter::once(&mut router.any))
        {
            t.sort(routes);
        }
        router
    }

    /// The routes' web application firewalls, by route index (as
    /// [`crate::policy::waf::Inspector::route_wafs`] builds them for the same routes).
    pub fn with_wafs(
        mut self,
        wafs: Vec<Option<std::sync::Arc<crate::policy::waf::RouteWaf>>>,
    ) -> Self {
        for (r, w) in self.routes.iter_mut().zip(wafs) {
            r.waf = w;
        }
        self
    }

    /// The route for a request to `host` (without port, any case) and `path` (normalized, see
    /// [`crate::http::request_target`]) whose other facts are `req`.
    pub fn route(
        &self,
        host: &str,
        path: &str,
        case_insensitive: bool,
        req: &RequestFacts<'_>,
    ) -> Option<&Route> {
        let host = host.trim_end_matches('.');
        // The pipeline's host is lowercase already: no copy for it.
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            std::borrow::Cow::Owned(host.to_ascii_lowercase())
        } else {
            std::borrow::Cow::Borrowed(host)
        };
        let in_table = |t: &PathTable| t.find(&self.routes, path, case_insensitive, req);
        let found = self
            .exact
            .get(host.as_ref())
            .and_then(in_table)
            .or_else(|| {
                let (_, parent) = host.split_once('.')?;
                self.suffix.get(parent).and_then(in_table)
            })
            .or_else(|| in_table(&self.any));
        found.map(|i| &self.routes[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The route for a plain GET.
    fn get<'r>(router: &'r Router, host: &str, path: &str, ci: bool) -> Option<&'r Route> {
        let headers = HeaderMap::new();
        let facts = RequestFacts {
            method: &http::Method::GET,
            headers: &headers,
            query: None,
            client_cert: None,
        };
        router.route(host, path, ci, &facts)
    }

    /// How specifically a route's `route_host` names `host`, for the scans the index is
    /// checked against: `*` 0, a matching `*.parent` 1, the host itself 2; `None` otherwise.
    fn host_class(route_host: &str, host: &str) -> Option<u8> {
        match route_host {
            "*" => Some(0),
            h if h.starts_with("*.") => host
                .split_once('.')
                .is_some_and(|(_, p)| p == &h[2..])
                .then_some(1),
            h => (h == host).then_some(2),
        }
    }

    fn r(host: &str, prefix: &str, cluster: &str) -> RouteConfig {
        RouteConfig::simple(host, prefix, cluster)
    }

    #[test]
    fn a_reload_keeps_an_unchanged_rate_limiter_and_replaces_a_changed_one() {
        use crate::config::RateLimitConfig;
        let limited = |name: &str, per_second: f64| RouteConfig {
            name: Some(name.into()),
            rate_limit: Some(RateLimitConfig {
                per_second,
                burst: Some(2),
                scope: Default::default(),
                key: None,
            }),
            ..r("*", "/", "c")
        };
        let first = Router::new(&[limited("api", 5.0)], |_| 0);
        let limiter = |router: &Router| match router.routes[0].rate_limit.clone().unwrap() {
            RouteLimit::Node(l) => l,
            RouteLimit::Fleet(_) => panic!("a node limit"),
        };
        let same = Router::after(&[limited("api", 5.0)], |_| 0, Some(&first), None);
        assert!(std::sync::Arc::ptr_eq(&limiter(&same), &limiter(&first)));
        let faster = Router::after(&[limited("api", 10.0)], |_| 0, Some(&same), None);
        assert!(!std::sync::Arc::ptr_eq(&limiter(&faster), &limiter(&first)));
        let renamed = Router::after(&[limited("web", 10.0)], |_| 0, Some(&faster), None);
        assert!(!std::sync::Arc::ptr_eq(
            &limiter(&renamed),
            &limiter(&faster)
        ));
    }

    #[test]
    fn most_specific_host_then_longest_prefix() {
        let routes = [
            r("*", "/", "a"),
            r("*.example.com", "/", "b"),
            r("api.example.com", "/", "c"),
            r("api.example.com", "/v2/", "d"),
        ];
        let idx = |n: &str| ["a", "b", "c", "d"].iter().position(|x| *x == n).unwrap();
        let router = Router::new(&routes, idx);
        let c = |h, p| get(&router, h, p, false).map(|r| r.cluster);
        assert_eq!(c("API.example.com", "/v2/x"), Some(3));
        assert_eq!(c("api.example.com", "/v1"), Some(2));
        assert_eq!(c("www.example.com", "/v2/x"), Some(1));
        assert_eq!(c("example.com", "/"), Some(0), "wildcard needs a label");
        assert_eq!(c("other", "/"), Some(0));
    }

    #[test]
    fn prefixes_match_without_case_when_asked() {
        let router = Router::new(&[r("*", "/Admin", "a")], |_| 0);
        assert!(get(&router, "x", "/admin/1", false).is_none());
        assert!(get(&router, "x", "/ADMIN/1", true).is_some());
        assert!(get(&router, "x", "/Admin/1", false).is_some());
        assert!(get(&router, "x", "/Adm", true).is_none());
    }

    #[test]
    fn only_listed_upgrades_pass() {
        let router = Router::new(&[r("*", "/", "a")], |_| 0);
        let route = get(&router, "x", "/", false).unwrap();
        let up = |v: &'static str| route.upgrades(&HeaderValue::from_static(v));
        assert!(up("websocket"));
        assert!(up("WebSocket"));
        assert!(!up("h2c"));
        assert!(!up("websocket, h2c"));
        assert!(!up("foo"));
    }

    /// The index answers as a scan of every route would (most specific host class, then the
    /// longest prefix, the last defined among equals), over 10,000 routes.
    #[test]
    fn the_index_agrees_with_a_scan_of_every_route() {
        let mut rng = fastrand::Rng::with_seed(7);
        let hosts = [
            "*", "*.a.test", "*.b.test", "x.a.test", "y.a.test", "z.b.test", "c.test",
        ];
        let segments = ["", "api", "v1", "v2", "static", "img", "x"];
        let prefix = |rng: &mut fastrand::Rng| {
            let mut p = String::from("/");
            for _ in 0..rng.usize(0..4) {
                p.push_str(segments[rng.usize(..segments.len())]);
                if rng.bool() {
                    p.push('/');
                }
            }
            p
        };
        let routes: Vec<RouteConfig> = (0..10_000)
            .map(|i| RouteConfig {
                name: Some(format!("r{i}")),
                ..r(hosts[rng.usize(..hosts.len())], &prefix(&mut rng), "c")
            })
            .collect();
        let router = Router::new(&routes, |_| 0);
        let scan = |host: &str, path: &str| {
            let score = |h: &str| host_class(h, host);
            routes
                .iter()
                .enumerate()
                .filter(|(_, r)| path.starts_with(&r.path_prefix))
                .filter_map(|(i, r)| score(&r.host).map(|s| ((s, r.path_prefix.len()), i)))
                .max_by_key(|(k, _)| *k)
                .map(|(_, i)| format!("r{i}"))
        };
        for _ in 0..2_000 {
            let host = ["x.a.test", "q.a.test", "z.b.test", "c.test", "other"][rng.usize(..5)];
            let path = prefix(&mut rng) + "tail";
            assert_eq!(
                get(&router, host, &path, false).map(|r| r.name.clone()),
                scan(host, &path),
                "{host} {path}"
            );
        }
    }

    /// With conditions and priorities, the index answers as a scan of every route would by the
    /// documented order: the most specific host class with a match, then priority, then the
    /// most specific path (exact, then the longest literal prefix), then more conditions,
    /// then the last defined.
    #[test]
    fn conditions_and_priorities_agree_with_a_scan_of_every_route() {
        let mut rng = fastrand::Rng::with_seed(11);
        let hosts = ["*", "*.a.test", "x.a.test"];
        let segments = ["api", "v1", "users", "7"];
        let path = |rng: &mut fastrand::Rng| {
            let mut p = String::new();
            for _ in 0..rng.usize(1..4) {
                p.push('/');
                p.push_str(segments[rng.usize(..segments.len())]);
            }
            p
        };
        let routes: Vec<RouteConfig> = (0..3_000)
            .map(|i| {
                let mut cfg = RouteConfig {
                    name: Some(format!("r{i}")),
                    priority: rng.i32(-1..=1),
                    ..r(hosts[rng.usize(..hosts.len())], "/", "c")
                };
                match rng.usize(..3) {
                    0 => cfg.path = Some(path(&mut rng)),
                    1 => cfg.path_prefix = path(&mut rng),
                    _ => cfg.path_regex = Some(format!("{}/[0-9]+", path(&mut rng))),
                }
                if rng.bool() {
                    cfg.methods = vec!["POST".into()];
                }
                if rng.u8(..4) == 0 {
                    cfg.headers = vec![crate::config::ValueMatchConfig {
                        name: "x-beta".into(),
                        present: Some(rng.bool()),
                        ..Default::default()
                    }];
                }
                cfg
            })
            .collect();
        let router = Router::new(&routes, |_| 0);
        let conditions: Vec<Conditions> = routes.iter().map(Conditions::new).collect();
        let prefixes: Vec<String> = routes.iter().map(RouteConfig::index_prefix).collect();
        let scan = |host: &str, path: &str, facts: &RequestFacts<'_>| {
            let class = |h: &str| host_class(h, host);
            let matching = routes.iter().enumerate().filter_map(|(i, r)| {
                let specific = match &r.path {
                    Some(p) if p == path => usize::MAX,
                    Some(_) => return None,
                    None if path.starts_with(&prefixes[i]) => prefixes[i].len(),
                    None => return None,
                };
                if !conditions[i].met(path, false, facts) {
                    return None;
                }
                let c = &conditions[i];
                Some((
                    (
                        class(&r.host)?,
                        r.priority,
                        specific,
                        c.has_path_regex(),
                        c.count(),
                        i,
                    ),
                    i,
                ))
            });
            matching
                .max_by_key(|(k, _)| *k)
                .map(|(_, i)| format!("r{i}"))
        };
        for _ in 0..3_000 {
            let host = ["x.a.test", "q.a.test", "other"][rng.usize(..3)];
            let p = path(&mut rng);
            let mut headers = HeaderMap::new();
            if rng.bool() {
                headers.insert("x-beta", HeaderValue::from_static("1"));
            }
            let method = if rng.bool() {
                http::Method::GET
            } else {
                http::Method::POST
            };
            let facts = RequestFacts {
                method: &method,
                headers: &headers,
                query: None,
                client_cert: None,
            };
            assert_eq!(
                router
                    .route(host, &p, false, &facts)
                    .map(|r| r.name.clone()),
                scan(host, &p, &facts),
                "{host} {p} {method}"
            );
        }
    }

    #[test]
    fn a_priority_overrides_a_longer_prefix_and_conditions_pick_among_equals() {
        let canary = RouteConfig {
            name: Some("canary".into()),
            headers: vec![crate::config::ValueMatchConfig {
                name: "x-canary".into(),
                exact: Some("1".into()),
                ..Default::default()
            }],
            ..r("*", "/api/", "c")
        };
        let plain = RouteConfig {
            name: Some("plain".into()),
            ..r("*", "/api/", "c")
        };
        let urgent = RouteConfig {
            name: Some("urgent".into()),
            priority: 10,
            methods: vec!["DELETE".into()],
            ..r("*", "/", "c")
        };
        let router = Router::new(&[canary, plain, urgent], |_| 0);
        let name = |method: http::Method, canary: bool| {
            let mut headers = HeaderMap::new();
            if canary {
                headers.insert("x-canary", HeaderValue::from_static("1"));
            }
            let facts = RequestFacts {
                method: &method,
                headers: &headers,
                query: None,
                client_cert: None,
            };
            router
                .route("h", "/api/x", false, &facts)
                .map(|r| r.name.clone())
        };
        assert_eq!(name(http::Method::GET, true).as_deref(), Some("canary"));
        assert_eq!(name(http::Method::GET, false).as_deref(), Some("plain"));
        assert_eq!(name(http::Method::DELETE, true).as_deref(), Some("urgent"));
    }

    #[test]
    fn no_match_is_none() {
        let router = Router::new(&[r("a.test", "/x", "a")], |_| 0);
        assert!(get(&router, "a.test", "/y", false).is_none());
        assert!(get(&router, "b.test", "/x", false).is_none());
    }
}
