//! Routes: (host, path prefix) → cluster. The most specific host class wins (exact, then
//! `*.wildcard`, then `*`), then the longest path prefix.

use crate::config::{HeaderRewriteConfig, RouteConfig};
use crate::policy::access::AccessList;
use http::{HeaderMap, HeaderName, HeaderValue};

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
    host: HostMatch,
    prefix: String,
    pub cluster: usize,
    /// Which clients the route serves; the others get 403.
    pub access: AccessList,
    /// Requests per client address, shared by every worker; beyond it, 429.
    pub rate_limit: Option<std::sync::Arc<crate::policy::ratelimit::RateLimiter>>,
    pub request_headers: HeaderRewrite,
    pub response_headers: HeaderRewrite,
    /// Gzip text-like responses for clients that accept it.
    pub compress: bool,
    /// `Upgrade` protocols passed upstream (lowercase).
    upgrades: Vec<String>,
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

    fn matches_path(&self, path: &str, case_insensitive: bool) -> bool {
        let n = self.prefix.len();
        path.len() >= n
            && if case_insensitive {
                path.as_bytes()[..n].eq_ignore_ascii_case(self.prefix.as_bytes())
            } else {
                path.as_bytes()[..n] == *self.prefix.as_bytes()
            }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostMatch {
    Exact(String),
    Suffix(String),
    Any,
}

impl HostMatch {
    fn score(&self, host: &str) -> Option<u8> {
        match self {
            HostMatch::Exact(h) => (h == host).then_some(2),
            HostMatch::Suffix(s) => host
                .split_once('.')
                .is_some_and(|(_, parent)| parent == s)
                .then_some(1),
            HostMatch::Any => Some(0),
        }
    }
}

pub struct Router {
    routes: Vec<Route>,
}

impl Router {
    /// `cluster_index` maps a cluster name to its index (validated by config loading).
    #[cfg(test)]
    pub fn new(routes: &[RouteConfig], cluster_index: impl Fn(&str) -> usize) -> Self {
        Self::after(routes, cluster_index, None)
    }

    /// A router for `routes` replacing `previous` (a reload): a route of the same name whose rate
    /// limit is unchanged keeps its limiter, so its clients' buckets are not refilled.
    pub fn after(
        routes: &[RouteConfig],
        cluster_index: impl Fn(&str) -> usize,
        previous: Option<&Router>,
    ) -> Self {
        let routes = routes
            .iter()
            .map(|r| {
                let host = r.host.to_ascii_lowercase();
                let name = r.effective_name();
                let kept_limiter = |rl: &crate::config::RateLimitConfig| {
                    previous?
                        .routes
                        .iter()
                        .find(|p| p.name == name)?
                        .rate_limit
                        .clone()
                        .filter(|l| l.enforces(rl.per_second, rl.burst()))
                };
                Route {
                    rate_limit: r.rate_limit.map(|rl| {
                        kept_limiter(&rl).unwrap_or_else(|| {
                            std::sync::Arc::new(crate::policy::ratelimit::RateLimiter::new(
                                rl.per_second,
                                rl.burst(),
                            ))
                        })
                    }),
                    name,
                    host: if host == "*" {
                        HostMatch::Any
                    } else if let Some(s) = host.strip_prefix("*.") {
                        HostMatch::Suffix(s.to_string())
                    } else {
                        HostMatch::Exact(host)
                    },
                    prefix: r.path_prefix.clone(),
                    cluster: cluster_index(&r.cluster),
                    access: AccessList::new(&r.allow, &r.deny),
                    request_headers: HeaderRewrite::new(&r.request_headers),
                    response_headers: HeaderRewrite::new(&r.response_headers),
                    compress: r.compress,
                    upgrades: r.upgrade_protocols.clone(),
                }
            })
            .collect();
        Router { routes }
    }

    /// `host` without port, any case; `path` normalized (see [`crate::http::request_target`]).
    pub fn route(&self, host: &str, path: &str, case_insensitive: bool) -> Option<&Route> {
        let host = host.trim_end_matches('.');
        // The pipeline's host is lowercase already: no copy for it.
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            std::borrow::Cow::Owned(host.to_ascii_lowercase())
        } else {
            std::borrow::Cow::Borrowed(host)
        };
        self.routes
            .iter()
            .filter(|r| r.matches_path(path, case_insensitive))
            .filter_map(|r| r.host.score(&host).map(|s| ((s, r.prefix.len()), r)))
            .max_by_key(|(k, _)| *k)
            .map(|(_, r)| r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            }),
            ..r("*", "/", "c")
        };
        let first = Router::new(&[limited("api", 5.0)], |_| 0);
        let limiter = |router: &Router| router.routes[0].rate_limit.clone().unwrap();
        let same = Router::after(&[limited("api", 5.0)], |_| 0, Some(&first));
        assert!(std::sync::Arc::ptr_eq(&limiter(&same), &limiter(&first)));
        let faster = Router::after(&[limited("api", 10.0)], |_| 0, Some(&same));
        assert!(!std::sync::Arc::ptr_eq(&limiter(&faster), &limiter(&first)));
        let renamed = Router::after(&[limited("web", 10.0)], |_| 0, Some(&faster));
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
        let c = |h, p| router.route(h, p, false).map(|r| r.cluster);
        assert_eq!(c("API.example.com", "/v2/x"), Some(3));
        assert_eq!(c("api.example.com", "/v1"), Some(2));
        assert_eq!(c("www.example.com", "/v2/x"), Some(1));
        assert_eq!(c("example.com", "/"), Some(0), "wildcard needs a label");
        assert_eq!(c("other", "/"), Some(0));
    }

    #[test]
    fn prefixes_match_without_case_when_asked() {
        let router = Router::new(&[r("*", "/Admin", "a")], |_| 0);
        assert!(router.route("x", "/admin/1", false).is_none());
        assert!(router.route("x", "/ADMIN/1", true).is_some());
        assert!(router.route("x", "/Admin/1", false).is_some());
        assert!(router.route("x", "/Adm", true).is_none());
    }

    #[test]
    fn only_listed_upgrades_pass() {
        let router = Router::new(&[r("*", "/", "a")], |_| 0);
        let route = router.route("x", "/", false).unwrap();
        let up = |v: &'static str| route.upgrades(&HeaderValue::from_static(v));
        assert!(up("websocket"));
        assert!(up("WebSocket"));
        assert!(!up("h2c"));
        assert!(!up("websocket, h2c"));
        assert!(!up("foo"));
    }

    #[test]
    fn no_match_is_none() {
        let router = Router::new(&[r("a.test", "/x", "a")], |_| 0);
        assert!(router.route("a.test", "/y", false).is_none());
        assert!(router.route("b.test", "/x", false).is_none());
    }
}
