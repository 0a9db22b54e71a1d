//! `[[routes]]`: host and path prefix to a cluster, with the route's access list, rate
//! limit, header rewrites, compression and upgrades.

use super::{valid_server_name, At, ClusterConfig, Invalid};
use crate::http::request_target::{normalize_path, PathPolicy, SeparatorAction};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Host to match: exact, `*.example.com`, or `*` (default) for any.
    #[serde(default = "any_host")]
    pub host: String,
    /// Path prefix to match (default `/`). The longest matching prefix wins.
    #[serde(default = "root_path")]
    pub path_prefix: String,
    /// Upstream cluster name.
    pub cluster: String,
    /// Name for metrics and logs (default: `host` + `path_prefix`).
    pub name: Option<String>,
    /// Client addresses served (addresses or CIDR blocks); empty: all not denied.
    #[serde(default)]
    pub allow: Vec<crate::policy::access::Cidr>,
    /// Client addresses refused with 403, checked before `allow`.
    #[serde(default)]
    pub deny: Vec<crate::policy::access::Cidr>,
    /// Requests a client address may make; beyond it, 429.
    pub rate_limit: Option<RateLimitConfig>,
    /// Gzip text-like responses for clients that accept it.
    #[serde(default)]
    pub compress: bool,
    /// HTTP/1.1 `Upgrade` protocols passed to the upstream (which may then switch the
    /// connection to a tunnel); a request asking for any other is forwarded as a plain
    /// request without its upgrade. `h2c` is never accepted: inside its tunnel, requests would
    /// pass no rule.
    #[serde(default = "default_upgrades")]
    pub upgrade_protocols: Vec<String>,
    /// Headers removed from, then set on, requests before they go upstream.
    #[serde(default)]
    pub request_headers: HeaderRewriteConfig,
    /// Headers removed from, then set on, every response of the route (the gateway's own
    /// answers, such as 403 or 502, included).
    #[serde(default)]
    pub response_headers: HeaderRewriteConfig,
    /// Other clusters and the share of the route's requests (percent) each gets; the rest go
    /// to `cluster` (gray release: `split = [{ cluster = "canary", weight = 5 }]`).
    #[serde(default)]
    pub split: Vec<SplitConfig>,
    /// Rules checked before the split: a request with the header, cookie or query parameter
    /// (of the value, if given) goes to the rule's cluster.
    #[serde(default)]
    pub cohorts: Vec<CohortConfig>,
    /// What keeps a user on one side of the split: a header, a cookie or the client address.
    pub sticky: Option<RequestKeyConfig>,
    /// An exact path to match, instead of `path_prefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A regular expression the whole normalized path must match, instead of `path_prefix`
    /// (linear-time engine; its literal start, such as `/users/` in `/users/[0-9]+`, indexes
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// Methods matched (upper case); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// Request headers that must match (any of a header's values may).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<super::ValueMatchConfig>,
    /// Query parameters that must match (percent-decoded; any of a repeated one's values may).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query: Vec<super::ValueMatchConfig>,
    /// Cookies that must match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cookies: Vec<super::ValueMatchConfig>,
    /// Tests of the verified client certificate (`tls.client_auth`): `name` is `subject`
    /// (`O=Example,CN=alice`), `san` (`DNS:a.example, URI:spiffe://…`) or `sha256` (hex); a
    /// request without a certificate fails every test but `present = false`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_cert_match: Vec<super::ValueMatchConfig>,
    /// Where two routes of a host match a request, the higher priority wins (default 0);
    /// among equals, the more specific path (exact, then the longer literal prefix), then the
    /// one with more conditions, then the last defined.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// Retries of failed tries on other endpoints; none: a connect failure is retried once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<super::RetryConfig>,
    /// A share of the route's requests copied to a shadow cluster, its answers discarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<MirrorConfig>,
    /// `"required"`: requests without a verified client certificate (`tls.client_auth`) get
    /// 403.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<ClientCertRequirement>,
    /// Requests inspected by ModSecurity with the OWASP Core Rule Set (`[waf]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waf: Option<super::RouteWafConfig>,
}

/// A route's `client_cert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientCertRequirement {
    Required,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// A route's `mirror`: `percent` of its requests (default 100) also sent to `cluster`, whose
/// answers are read and dropped. Only requests whose body was read whole (or that have none)
/// are copied; the copy never delays or fails the original.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    pub cluster: String,
    #[serde(default = "all_percent")]
    pub percent: f64,
}

fn all_percent() -> f64 {
    100.0
}

/// One entry of a route's `split`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SplitConfig {
    pub cluster: String,
    /// Percent of the route's requests, more than 0.
    pub weight: f64,
}

/// One of a route's `cohorts`: exactly one of `header`, `cookie`, `query`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CohortConfig {
    pub header: Option<String>,
    pub cookie: Option<String>,
    pub query: Option<String>,
    /// The value it must have; none: present with any value.
    pub value: Option<String>,
    pub cluster: String,
}

/// What a request is known by for a route's `sticky` split or a cluster's `hash_key`: exactly
/// one of `header`, `cookie`, `client_address = true`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RequestKeyConfig {
    pub header: Option<String>,
    pub cookie: Option<String>,
    #[serde(default)]
    pub client_address: bool,
}

impl RequestKeyConfig {
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        let set = [
            self.header.is_some(),
            self.cookie.is_some(),
            self.client_address,
        ];
        if set.iter().filter(|s| **s).count() != 1 {
            return at.fail("exactly one of header, cookie, client_address = true");
        }
        if self
            .header
            .as_deref()
            .is_some_and(|h| http::HeaderName::from_bytes(h.as_bytes()).is_err())
        {
            return at.field("header").fail("a header name");
        }
        Ok(())
    }
}

#[cfg(test)]
impl RouteConfig {
    /// A route to `cluster` for `host` and `path_prefix`, every other option at its default.
    pub fn simple(host: &str, path_prefix: &str, cluster: &str) -> Self {
        RouteConfig {
            host: host.into(),
            path_prefix: path_prefix.into(),
            cluster: cluster.into(),
            name: None,
            allow: vec![],
            deny: vec![],
            rate_limit: None,
            request_headers: Default::default(),
            response_headers: Default::default(),
            compress: false,
            upgrade_protocols: vec!["websocket".into()],
            split: vec![],
            cohorts: vec![],
            sticky: None,
            path: None,
            path_regex: None,
            methods: vec![],
            headers: vec![],
            query: vec![],
            cookies: vec![],
            client_cert_match: vec![],
            priority: 0,
            retry: None,
            mirror: None,
            client_cert: None,
            waf: None,
        }
    }
}

/// A route's `request_headers` or `response_headers`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderRewriteConfig {
    /// Name → value, replacing any value the message had.
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, String>,
    /// Names removed.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// Header names a route may not set or remove: the connection's own (the proxy handles them).
const UNREWRITABLE: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

impl HeaderRewriteConfig {
    /// The first bad entry: (its path under `at`, what was expected).
    fn validate(&self, at: &At) -> Result<(), Invalid> {
        let name_ok = |n: &str| {
            http::HeaderName::from_bytes(n.as_bytes()).is_ok()
                && !UNREWRITABLE.contains(&n.to_ascii_lowercase().as_str())
        };
        let expected_name = "a header name (not a connection header such as connection, \
                             transfer-encoding or content-length)";
        for (k, v) in &self.set {
            if !name_ok(k) {
                return at.field("set").field(k).fail(expected_name);
            }
            if http::HeaderValue::from_str(v).is_err() {
                return at
                    .field("set")
                    .field(k)
                    .fail("a header value (visible ASCII)");
            }
        }
        for (i, n) in self.remove.iter().enumerate() {
            if !name_ok(n) {
                return at.field("remove").index(i).fail(expected_name);
            }
        }
        Ok(())
    }
}

/// A route's `rate_limit`: a token bucket per client address (or, across the fleet, per
/// `key`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Sustained requests a second per client.
    pub per_second: f64,
    /// Requests a client may make at once before the rate applies (default: `per_second`,
    /// at least 1).
    pub burst: Option<u32>,
    /// Where requests are counted: on this gateway (`node`), or across every gateway of the
    /// fleet in `[fleet] redis` (`fleet`).
    #[serde(default, skip_serializing_if = "LimitScope::is_node")]
    pub scope: LimitScope,
    /// What a client is known by in a fleet limit (default: its address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<RequestKeyConfig>,
}

/// Where a rate limit counts.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LimitScope {
    #[default]
    Node,
    Fleet,
}

impl LimitScope {
    fn is_node(&self) -> bool {
        *self == LimitScope::Node
    }
}

impl RateLimitConfig {
    /// `per_second` a number of `what` greater than zero, `burst` at least 1.
    pub(super) fn validate(&self, at: &At, what: &str) -> Result<(), Invalid> {
        if !(self.per_second.is_finite() && self.per_second > 0.0) {
            return at
                .field("per_second")
                .fail(format!("a number of {what} greater than zero"));
        }
        if self.burst == Some(0) {
            return at.field("burst").fail("at least 1");
        }
        if let Some(k) = &self.key {
            if self.scope != LimitScope::Fleet {
                return at
                    .field("key")
                    .fail("scope = \"fleet\" (a node limit counts by client address)");
            }
            k.validate(&at.field("key"))?;
        }
        Ok(())
    }

    pub fn burst(&self) -> u32 {
        self.burst
            .unwrap_or_else(|| self.per_second.ceil().clamp(1.0, u32::MAX as f64) as u32)
    }
}

impl RouteConfig {
    /// `split`, `cohorts` and `sticky`.
    fn validate_split(&self, at: &At) -> Result<(), Invalid> {
        let mut total = 0.0;
        for (i, s) in self.split.iter().enumerate() {
            let w = at.field("split").index(i).field("weight");
            if !(s.weight.is_finite() && s.weight > 0.0 && s.weight <= 100.0) {
                return w
                    .fail("a share of the route's requests in percent, more than 0, at most 100");
            }
            total += s.weight;
        }
        if total > 100.0 + 1e-9 {
            return at.field("split").fail(format!(
                "weights summing to at most 100 (percent; the rest go to `cluster`), not {total}"
            ));
        }
        let header_ok = |h: &str| http::HeaderName::from_bytes(h.as_bytes()).is_ok();
        for (i, c) in self.cohorts.iter().enumerate() {
            let at = at.field("cohorts").index(i);
            let set = [c.header.is_some(), c.cookie.is_some(), c.query.is_some()];
            if set.iter().filter(|s| **s).count() != 1 {
                return at.fail("exactly one of header, cookie, query");
            }
            if c.header.as_deref().is_some_and(|h| !header_ok(h)) {
                return at.field("header").fail("a header name");
            }
        }
        if let Some(s) = &self.sticky {
            let at = at.field("sticky");
            if self.split.is_empty() {
                return at.fail("a split to keep users on one side of (`split` is empty)");
            }
            s.validate(&at)?;
        }
        Ok(())
    }
}

fn default_upgrades() -> Vec<String> {
    vec!["websocket".to_string()]
}

fn any_host() -> String {
    "*".into()
}
fn root_path() -> String {
    "/".into()
}

impl RouteConfig {
    /// The route's own fields, and that it names one of `clusters`.
    pub(super) fn validate(&self, at: &At, clusters: &[ClusterConfig]) -> Result<(), Invalid> {
        self.validate_fields(at)?;
        for (path, name) in self.cluster_refs() {
            if !clusters.iter().any(|c| c.name == name) {
                let known: Vec<_> = clusters.iter().map(|c| c.name.as_str()).collect();
                let at = path
                    .split('.')
                    .fold(at.clone(), |a, part| match part.split_once('[') {
                        Some((f, i)) => a
                            .field(f)
                            .index(i.trim_end_matches(']').parse().unwrap_or(0)),
                        None => a.field(part),
                    });
                return at.fail(format!(
                    "no cluster named {name:?}; expected one of: {}",
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Every cluster the route names, with the field naming it (`cluster`, `split[1].cluster`,
    /// `cohorts[0].cluster`).
    pub fn cluster_refs(&self) -> Vec<(String, &str)> {
        let mut refs = vec![("cluster".to_string(), self.cluster.as_str())];
        for (i, s) in self.split.iter().enumerate() {
            refs.push((format!("split[{i}].cluster"), s.cluster.as_str()));
        }
        for (i, c) in self.cohorts.iter().enumerate() {
            refs.push((format!("cohorts[{i}].cluster"), c.cluster.as_str()));
        }
        if let Some(m) = &self.mirror {
            refs.push(("mirror.cluster".to_string(), m.cluster.as_str()));
        }
        refs
    }

    /// The name routes are known by in metrics, logs and the control plane: `name`, else
    /// `host` + the path (`path`, `~path_regex` or `path_prefix`).
    pub fn effective_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| match (&self.path, &self.path_regex) {
                (Some(p), _) => format!("{}{p}", self.host),
                (_, Some(r)) => format!("{}~{r}", self.host),
                _ => format!("{}{}", self.host, self.path_prefix),
            })
    }

    /// The route's own fields (not whether its cluster exists).
    pub(super) fn validate_fields(&self, at: &At) -> Result<(), Invalid> {
        self.validate_split(at)?;
        self.request_headers
            .validate(&at.field("request_headers"))?;
        self.response_headers
            .validate(&at.field("response_headers"))?;
        if let Some(rl) = &self.rate_limit {
            rl.validate(&at.field("rate_limit"), "requests")?;
        }
        check_normal_path(&at.field("path_prefix"), &self.path_prefix)?;
        self.validate_match(at)?;
        if let Some(r) = &self.retry {
            r.validate(&at.field("retry"))?;
        }
        if let Some(w) = &self.waf {
            w.validate(&at.field("waf"))?;
        }
        if let Some(m) = &self.mirror {
            if !(m.percent.is_finite() && m.percent > 0.0 && m.percent <= 100.0) {
                return at
                    .field("mirror")
                    .field("percent")
                    .fail("a share of the route's requests in percent, more than 0, at most 100");
            }
        }
        for (j, p) in self.upgrade_protocols.iter().enumerate() {
            let token = !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b));
            if !token || p.eq_ignore_ascii_case("h2c") {
                return at.field("upgrade_protocols").index(j).fail(format!(
                    "an upgrade protocol token other than h2c, not {p:?}"
                ));
            }
        }
        if self.host != "*" && !valid_server_name(&self.host) {
            return at.field("host").fail(format!(
                "{:?} is not a host name, *.wildcard or *",
                self.host
            ));
        }
        Ok(())
    }
}

/// `path` starts with `/` and is in normal form (requests are matched by their normalized
/// path, so a path in any other form would never match).
pub(super) fn check_normal_path(at: &At, path: &str) -> Result<(), Invalid> {
    if !path.starts_with('/') {
        return at.fail(format!("{path:?} must start with '/'"));
    }
    let keep = PathPolicy {
        encoded_slash: SeparatorAction::Keep,
        backslash: SeparatorAction::Keep,
        ..Default::default()
    };
    match normalize_path(path.as_bytes(), &keep) {
        Ok(n) if n == path => Ok(()),
        Ok(n) => at.fail(format!(
            "{path:?} in normal form, as requests are matched: {n:?}"
        )),
        Err(e) => at.fail(format!("a path ({path:?}: {e})")),
    }
}
