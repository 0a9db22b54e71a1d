//! Configuration: TOML parsed once into typed structs, then validated. Unknown fields are
//! rejected; every error names the file, the field path and what was expected.

mod cluster;
mod control;
mod fleet;
mod key_engine;
mod listener;
mod object;
mod retry;
mod route;
mod route_match;
mod server;
mod tracing;
mod waf;

pub use cluster::*;
pub use control::*;
pub use fleet::*;
pub use key_engine::*;
pub use listener::*;
pub use object::*;
pub use retry::*;
pub use route::*;
pub use route_match::*;
pub use server::*;
pub use tracing::*;
pub use waf::*;

use file::{duration, duration_text, load_file, parse_toml};

pub mod file;

use serde::Deserialize;
use std::collections::HashSet;
use std::fmt;
use std::path::Path;

/// A configuration error: where (file, field path, line) and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if !self.path.is_empty() && self.path != "." {
            write!(f, ": field `{}`", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// An error at field `path` of `file` (empty: the whole file), with no line to point at
    /// (found after parsing: validation, reading, building).
    pub fn at(
        file: impl Into<String>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.into(),
            path: path.into(),
            line: None,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub key_engine: KeyEngineConfig,
    #[serde(default)]
    pub control: ControlConfig,
    #[serde(default)]
    pub fleet: FleetConfig,
    #[serde(default)]
    pub waf: WafConfig,
    #[serde(default)]
    pub tracing: TracingConfig,
    pub listeners: Vec<ListenerConfig>,
    /// May be empty with `[control] etcd`, whose objects add to them.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    #[serde(default)]
    pub clusters: Vec<ClusterConfig>,
}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        load_file(path, Self::parse)
    }

    /// Parses and validates config text; relative paths resolve against `base_dir`.
    pub fn parse(text: &str, file: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let mut cfg: Config = parse_toml(text, file)?;
        cfg.resolve_paths(base_dir);
        cfg.validate()
            .map_err(|(path, message)| ConfigError::at(file, path, message))?;
        Ok(cfg)
    }

    fn resolve_paths(&mut self, base: &Path) {
        self.admin.resolve_paths(base);
        self.control.resolve_paths(base);
        self.key_engine.resolve_paths(base);
        for c in &mut self.clusters {
            c.resolve_paths(base);
        }
        for l in &mut self.listeners {
            l.resolve_paths(base);
        }
        self.waf.resolve_paths(base);
        for w in self.routes.iter_mut().filter_map(|r| r.waf.as_mut()) {
            w.resolve_paths(base);
        }
    }

    /// Every section's checks, in file order, then those across sections (names unique,
    /// routes naming clusters). Returns the first failure: (field path, what was expected).
    fn validate(&self) -> Result<(), Invalid> {
        self.admin.validate(&At::root("admin"))?;
        self.server.validate(&At::root("server"))?;
        self.key_engine.validate(&At::root("key_engine"))?;
        self.control.validate(&At::root("control"))?;
        self.fleet.validate(&At::root("fleet"))?;
        self.waf.validate(&At::root("waf"))?;
        self.tracing.validate(&At::root("tracing"))?;
        let listeners = At::root("listeners");
        if self.listeners.is_empty() {
            return listeners.fail("at least one listener");
        }
        let mut names = HashSet::new();
        let mut addrs = HashSet::new();
        for (i, l) in self.listeners.iter().enumerate() {
            let at = listeners.index(i);
            if !names.insert(&l.name) {
                return at
                    .field("name")
                    .fail(format!("duplicate listener name {:?}", l.name));
            }
            if !addrs.insert(l.listen) {
                return at
                    .field("listen")
                    .fail(format!("address {} is used by another listener", l.listen));
            }
            l.validate(&at, &self.key_engine)?;
            if l.tls.fleet_ticket_keys && self.fleet.redis.is_none() {
                return at
                    .field("tls")
                    .field("fleet_ticket_keys")
                    .fail("a [fleet] redis to share the keys through");
            }
            if l.quic.fleet_stateless_reset_key && self.fleet.redis.is_none() {
                return at
                    .field("quic")
                    .field("fleet_stateless_reset_key")
                    .fail("a [fleet] redis to share the key through");
            }
            if l.quic.fleet_retry_keys && self.fleet.redis.is_none() {
                return at
                    .field("quic")
                    .field("fleet_retry_keys")
                    .fail("a [fleet] redis to share the keys through");
            }
        }
        let clusters = At::root("clusters");
        let mut cluster_names = HashSet::new();
        for (i, c) in self.clusters.iter().enumerate() {
            let at = clusters.index(i);
            if !cluster_names.insert(c.name.as_str()) {
                return at
                    .field("name")
                    .fail(format!("duplicate cluster name {:?}", c.name));
            }
            c.validate(&at)?;
        }
        let routes = At::root("routes");
        if self.routes.is_empty() && self.control.etcd.is_none() {
            return routes.fail("at least one route (or [control] etcd to bring them)");
        }
        for (i, r) in self.routes.iter().enumerate() {
            let at = routes.index(i);
            r.validate(&at, &self.clusters)?;
            let fleet = r
                .rate_limit
                .as_ref()
                .is_some_and(|l| l.scope == LimitScope::Fleet);
            if fleet && self.fleet.redis.is_none() {
                return at
                    .field("rate_limit")
                    .field("scope")
                    .fail("a [fleet] redis to count in (or scope = \"node\")");
            }
        }
        Ok(())
    }
}

/// A failed check: the field's path and what was expected.
type Invalid = (String, String);

/// Where a field sits in the file (`listeners[0].tls.versions`), for error messages.
#[derive(Clone)]
struct At(String);

impl At {
    fn root(section: &str) -> At {
        At(section.into())
    }

    fn field(&self, name: &str) -> At {
        if self.0.is_empty() {
            // The root of an object's own document.
            return At(name.into());
        }
        At(format!("{}.{name}", self.0))
    }

    fn index(&self, i: usize) -> At {
        At(format!("{}[{i}]", self.0))
    }

    /// This field fails: `expected` says what it should have been.
    fn fail<T>(&self, expected: impl Into<String>) -> Result<T, Invalid> {
        Err((self.0.clone(), expected.into()))
    }

    /// This field names a file (resolved against the config's folder) that must exist.
    fn file_exists(&self, path: &std::path::Path) -> Result<(), Invalid> {
        if path.is_file() {
            Ok(())
        } else {
            self.fail(format!("file {} does not exist", path.display()))
        }
    }
}

pub(super) fn valid_server_name(n: &str) -> bool {
    let n = n.strip_prefix("*.").unwrap_or(n);
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c.pem"), "").unwrap();
        std::fs::write(dir.path().join("k.pem"), "").unwrap();
        Config::parse(text, "test.toml", dir.path())
    }

    const MINIMAL: &str = r#"
[[listeners]]
name = "https"
listen = "127.0.0.1:8443"
[[listeners.certificates]]
server_names = ["localhost"]
ecdsa = { cert = "c.pem", key = "k.pem" }

[[routes]]
cluster = "app"

[[clusters]]
name = "app"
endpoints = ["127.0.0.1:8080"]
"#;

    #[test]
    fn unknown_field_names_path_and_line() {
        let text = MINIMAL.replace("name = \"app\"", "name = \"app\"\nlb_policy = \"x\"");
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "clusters[0].lb_policy");
        assert!(e.message.contains("unknown field"), "{e}");
        assert!(e.line.is_some());
        assert!(e.to_string().starts_with("test.toml:"), "{e}");
    }

    #[test]
    fn the_admin_listener_goes_beyond_loopback_only_with_a_token_and_tls() {
        let with = |admin: &str| format!("[admin]\n{admin}\n{MINIMAL}");
        let e = parse(&with("listen = \"0.0.0.0:9901\"")).unwrap_err();
        assert_eq!(e.path, "admin.listen");
        assert!(
            e.message.contains("needs token_file and [admin.tls]"),
            "{e}"
        );
        let e = parse(&with("listen = \"0.0.0.0:9901\"\ntoken_file = \"c.pem\"")).unwrap_err();
        assert_eq!(e.path, "admin.listen");
        let both = "listen = \"0.0.0.0:9901\"\ntoken_file = \"c.pem\"\ntls = { cert = \"c.pem\", key = \"k.pem\" }";
        assert!(parse(&with(both)).is_ok());
        let e = parse(&with("tls = { cert = \"c.pem\", key = \"none.pem\" }")).unwrap_err();
        assert_eq!(e.path, "admin.tls.key");
    }

    #[test]
    fn balancing_settings_are_validated_with_their_paths() {
        let with = |extra: &str| format!("{MINIMAL}{extra}\n");
        assert!(parse(&with(
            "lb = \"consistent_hash\"\nhash_key = { cookie = \"uid\" }"
        ))
        .is_ok());
        let e = parse(&with("lb = \"consistent_hash\"")).unwrap_err();
        assert_eq!(e.path, "clusters[0].hash_key");
        let e = parse(&with("hash_key = { cookie = \"uid\" }")).unwrap_err();
        assert_eq!(e.path, "clusters[0].hash_key");
        let e = parse(&with("lb = \"consistent_hash\"\nhash_key = {}")).unwrap_err();
        assert_eq!(e.path, "clusters[0].hash_key");
        let e = parse(&with("weights = [1, 2]")).unwrap_err();
        assert_eq!(e.path, "clusters[0].weights");
        let e = parse(&with("weights = [0]")).unwrap_err();
        assert_eq!(e.path, "clusters[0].weights[0]");
        assert!(parse(&with("weights = [3]\nlb = \"least_request\"")).is_ok());
        let od = |t: &str| with(&format!("[clusters.outlier_detection]\n{t}"));
        assert!(parse(&od("consecutive_5xx = 3")).is_ok());
        let e = parse(&od("consecutive_5xx = 0\nconsecutive_gateway_failures = 0")).unwrap_err();
        assert_eq!(e.path, "clusters[0].outlier_detection");
        let e = parse(&od("max_ejection_percent = 0")).unwrap_err();
        assert_eq!(e.path, "clusters[0].outlier_detection.max_ejection_percent");
        let e = parse(&od("base_ejection_time = \"10m\"")).unwrap_err();
        assert_eq!(e.path, "clusters[0].outlier_detection.max_ejection_time");
    }

    #[test]
    fn traffic_splits_are_validated_with_their_paths() {
        let with = |extra: &str| {
            MINIMAL.replace("cluster = \"app\"", &format!("cluster = \"app\"\n{extra}"))
                + "[[clusters]]\nname = \"canary\"\nendpoints = [\"127.0.0.1:8081\"]\n"
        };
        let ok = "split = [{ cluster = \"canary\", weight = 5 }]\nsticky = { cookie = \"uid\" }\ncohorts = [{ header = \"x-canary\", cluster = \"canary\" }]";
        assert!(parse(&with(ok)).is_ok(), "{:?}", parse(&with(ok)).err());
        let e = parse(&with("split = [{ cluster = \"canary\", weight = 0 }]")).unwrap_err();
        assert_eq!(e.path, "routes[0].split[0].weight");
        let e = parse(&with(
            "split = [{ cluster = \"canary\", weight = 60 }, { cluster = \"app\", weight = 50 }]",
        ))
        .unwrap_err();
        assert_eq!(e.path, "routes[0].split");
        let e = parse(&with("split = [{ cluster = \"nope\", weight = 5 }]")).unwrap_err();
        assert_eq!(e.path, "routes[0].split[0].cluster");
        let e = parse(&with(
            "cohorts = [{ header = \"x\", cookie = \"y\", cluster = \"canary\" }]",
        ))
        .unwrap_err();
        assert_eq!(e.path, "routes[0].cohorts[0]");
        let e = parse(&with("cohorts = [{ query = \"c\", cluster = \"nope\" }]")).unwrap_err();
        assert_eq!(e.path, "routes[0].cohorts[0].cluster");
        let e = parse(&with("sticky = { cookie = \"uid\" }")).unwrap_err();
        assert_eq!(e.path, "routes[0].sticky");
    }

    #[test]
    fn route_conditions_retries_and_mirrors_are_validated_with_their_paths() {
        let with = |extra: &str| {
            MINIMAL.replace("cluster = \"app\"", &format!("cluster = \"app\"\n{extra}"))
                + "[[clusters]]\nname = \"shadow\"\nendpoints = [\"127.0.0.1:8081\"]\n"
        };
        let ok = r#"path_regex = "/users/[0-9]+"
methods = ["GET"]
headers = [{ name = "x-beta", present = true }]
query = [{ name = "v", regex = "[0-9]+" }]
cookies = [{ name = "uid", prefix = "a" }]
priority = 5
retry = { attempts = 3, on = ["reset", "gateway_error"], statuses = [409], per_try_timeout = "1s" }
mirror = { cluster = "shadow", percent = 10 }"#;
        assert!(parse(&with(ok)).is_ok(), "{:?}", parse(&with(ok)).err());
        let fails = |extra: &str, path: &str, says: &str| {
            let e = parse(&with(extra)).unwrap_err();
            assert_eq!(e.path, path, "{extra}: {e}");
            assert!(e.message.contains(says), "{extra}: {e}");
        };
        fails(
            "path_regex = \"/users/[0-9\"",
            "routes[0].path_regex",
            "a regular expression",
        );
        fails(
            "path_regex = \"/(a)\\\\1\"",
            "routes[0].path_regex",
            "a regular expression",
        );
        fails(
            "headers = [{ name = \"x\", regex = \"(\" }]",
            "routes[0].headers[0].regex",
            "a regular expression",
        );
        fails(
            "query = [{ name = \"x\", exact = \"1\", present = true }]",
            "routes[0].query[0]",
            "exactly one of",
        );
        fails("methods = [\"get\"]", "routes[0].methods[0]", "upper case");
        fails(
            "client_cert_match = [{ name = \"issuer\", exact = \"x\" }]",
            "routes[0].client_cert_match[0].name",
            "subject, san or sha256",
        );
        fails(
            "client_cert_match = [{ name = \"subject\", regex = \"(\" }]",
            "routes[0].client_cert_match[0].regex",
            "a regular expression",
        );
        fails(
            "path = \"/a\"\npath_prefix = \"/b\"",
            "routes[0].path",
            "not both",
        );
        fails("path = \"/a/../b\"", "routes[0].path", "normal form");
        fails(
            "path = \"/a\"\npath_regex = \"/a\"",
            "routes[0]",
            "at most one",
        );
        fails(
            "retry = { attempts = 11 }",
            "routes[0].retry.attempts",
            "at most 10",
        );
        fails(
            "retry = { on = [\"sometimes\"] }",
            "routes[0].retry.on[0]",
            "unknown variant",
        );
        fails(
            "retry = { statuses = [42] }",
            "routes[0].retry.statuses[0]",
            "HTTP status",
        );
        fails(
            "mirror = { cluster = \"nope\" }",
            "routes[0].mirror.cluster",
            "no cluster named",
        );
        fails(
            "mirror = { cluster = \"shadow\", percent = 0 }",
            "routes[0].mirror.percent",
            "more than 0",
        );
    }

    #[test]
    fn fleet_limits_need_a_fleet_and_are_validated_with_their_paths() {
        let with = |fleet: &str, limit: &str| {
            format!("{fleet}\n{MINIMAL}").replace(
                "cluster = \"app\"",
                &format!("cluster = \"app\"\nrate_limit = {{ {limit} }}"),
            )
        };
        let redis = "[fleet]\nredis = \"redis://127.0.0.1:6379\"\nsize = 3";
        let fleet_limit = "per_second = 10, scope = \"fleet\", key = { header = \"x-api-key\" }";
        assert!(
            parse(&with(redis, fleet_limit)).is_ok(),
            "{:?}",
            parse(&with(redis, fleet_limit)).err()
        );
        let fails = |text: String, path: &str, says: &str| {
            let e = parse(&text).unwrap_err();
            assert_eq!(e.path, path, "{e}");
            assert!(e.message.contains(says), "{e}");
        };
        fails(
            with("", fleet_limit),
            "routes[0].rate_limit.scope",
            "[fleet] redis",
        );
        fails(
            with(redis, "per_second = 10, key = { header = \"x-api-key\" }"),
            "routes[0].rate_limit.key",
            "scope = \"fleet\"",
        );
        fails(
            with("[fleet]\nredis = \"http://x\"", "per_second = 1"),
            "fleet.redis",
            "redis://",
        );
        fails(
            with(&format!("{redis}\ndeadline = \"0s\""), "per_second = 1"),
            "fleet.deadline",
            "above zero",
        );
        fails(
            with("[fleet]\nsize = 0", "per_second = 1"),
            "fleet.size",
            "at least 1",
        );
    }

    #[test]
    fn a_bad_access_list_entry_names_its_place() {
        let text = MINIMAL.replace(
            "cluster = \"app\"",
            "cluster = \"app\"\nallow = [\"10.0.0.0/8\", \"10.0.0.0/40\"]",
        );
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "routes[0].allow[1]");
        assert!(e.message.contains("CIDR block like"), "{e}");
    }

    #[test]
    fn health_checks_are_validated_with_their_paths() {
        // MINIMAL ends with the cluster's table.
        let with = |table: &str| format!("{MINIMAL}[clusters.health_check]\n{table}\n");
        assert!(parse(&with("path = \"/healthz\"")).is_ok());
        let e = parse(&with("path = \"healthz\"")).unwrap_err();
        assert_eq!(e.path, "clusters[0].health_check.path");
        let e = parse(&with("path = \"/h\"\nhealthy_after = 0")).unwrap_err();
        assert_eq!(e.path, "clusters[0].health_check");
        let e = parse(&with("path = \"/h\"\ninterval = \"often\"")).unwrap_err();
        assert_eq!(e.path, "clusters[0].health_check.interval");
        let e = parse(&with("path = \"/h\"\nrise = 2")).unwrap_err();
        assert_eq!(e.path, "clusters[0].health_check.rise");
    }

    #[test]
    fn rate_limits_are_validated_with_their_paths() {
        let with = |rl: &str| {
            MINIMAL.replace(
                "cluster = \"app\"",
                &format!("cluster = \"app\"\nrate_limit = {{ {rl} }}"),
            )
        };
        let c = parse(&with("per_second = 2.5")).unwrap();
        assert_eq!(c.routes[0].rate_limit.as_ref().unwrap().burst(), 3);
        let e = parse(&with("per_second = 0")).unwrap_err();
        assert_eq!(e.path, "routes[0].rate_limit.per_second");
        let e = parse(&with("per_second = 5, burst = 0")).unwrap_err();
        assert_eq!(e.path, "routes[0].rate_limit.burst");
        let e = parse(&with("rps = 5")).unwrap_err();
        assert_eq!(e.path, "routes[0].rate_limit.rps");
        // The listener's per-client limits, the same way: `limits.LINE` on the listener.
        let limit = |line: &str| {
            MINIMAL.replace(
                "listen = \"127.0.0.1:8443\"",
                &format!("listen = \"127.0.0.1:8443\"\nlimits.{line}"),
            )
        };
        let e = parse(&limit("new_connections_per_address = { per_second = -1 }")).unwrap_err();
        assert_eq!(
            (e.path.as_str(), e.message.as_str()),
            (
                "listeners[0].limits.new_connections_per_address.per_second",
                "a number of connections greater than zero"
            )
        );
        let e = parse(&limit(
            "new_connections_per_address = { per_second = 5, burst = 0 }",
        ))
        .unwrap_err();
        assert_eq!(
            e.path,
            "listeners[0].limits.new_connections_per_address.burst"
        );
        // What an IPv6 client is counted by.
        let prefix_of = |text: &str| parse(text).unwrap().listeners[0].limits.client_ipv6_prefix;
        assert_eq!(prefix_of(MINIMAL), 64);
        assert_eq!(prefix_of(&limit("client_ipv6_prefix = 56")), 56);
        for bad in ["32", "129"] {
            let e = parse(&limit(&format!("client_ipv6_prefix = {bad}"))).unwrap_err();
            assert_eq!(e.path, "listeners[0].limits.client_ipv6_prefix", "{bad}");
        }
        let e = parse(&limit("max_connections_per_address = 0")).unwrap_err();
        assert_eq!(e.path, "listeners[0].limits.max_connections_per_address");
    }

    #[test]
    fn waf_response_body_settings_are_checked_with_their_paths() {
        let with = |waf: &str| {
            MINIMAL.replace(
                "cluster = \"app\"",
                &format!("cluster = \"app\"\nwaf = {{ mode = \"block\", {waf} }}"),
            )
        };
        let c = parse(&with("response_body = true")).unwrap();
        let w = c.routes[0].waf.as_ref().unwrap();
        assert_eq!(w.response_body_limit, 512 * 1024);
        assert!(w
            .response_body_types
            .iter()
            .any(|t| t == "application/json"));
        let rb = w.profile().response_bodies.expect("read");
        assert_eq!(rb.limit, 512 * 1024);
        assert!(parse(&with("response_headers = true")).unwrap().routes[0]
            .waf
            .as_ref()
            .unwrap()
            .profile()
            .response_bodies
            .is_none());
        let e = parse(&with("response_body_limit = 0")).unwrap_err();
        assert_eq!(e.path, "routes[0].waf.response_body_limit");
        let e = parse(&with("response_body_types = []")).unwrap_err();
        assert_eq!(e.path, "routes[0].waf.response_body_types");
        let e = parse(&with(
            "response_body_types = [\"text/html\", \"Text/Plain; charset=x\"]",
        ))
        .unwrap_err();
        assert_eq!(e.path, "routes[0].waf.response_body_types[1]");
        assert!(e.message.contains("media type"), "{e}");
        let w = |c: Config| c.routes[0].waf.clone().unwrap();
        assert_eq!(
            w(parse(&with("body_limit = 1024")).unwrap()).body_past_limit,
            BodyPastLimit::InspectPrefix
        );
        assert_eq!(
            w(parse(&with("body_past_limit = \"refuse\"")).unwrap()).body_past_limit,
            BodyPastLimit::Refuse
        );
        // The inspection queue's share per client.
        let waf = |extra: &str| format!("{}\n[waf]\n{extra}\n", with("response_body = true"));
        let c = parse(&waf("queue = 100")).unwrap();
        assert_eq!(c.waf.queue_per_client(), 25, "a quarter of the queue");
        let c = parse(&waf("queue = 2")).unwrap();
        assert_eq!(c.waf.queue_per_client(), 1, "at least 1");
        let e = parse(&waf("queue_per_client = 0")).unwrap_err();
        assert_eq!(e.path, "waf.queue_per_client", "{e}");
        let c = parse(&with("allowed_methods = [\"GET\", \"PUT\"]")).unwrap();
        assert_eq!(w(c).profile().allowed_methods, ["GET", "PUT"]);
        let e = parse(&with("allowed_methods = [\"GET\", \"put\"]")).unwrap_err();
        assert_eq!(e.path, "routes[0].waf.allowed_methods[1]", "{e}");
        let e = parse(&with("body_past_limit = \"reject\"")).unwrap_err();
        assert_eq!(e.path, "routes[0].waf.body_past_limit", "{e}");
        assert!(e.message.contains("refuse"), "{e}");
    }

    #[test]
    fn header_rewrites_are_validated_with_their_paths() {
        let with = |rw: &str| {
            MINIMAL.replace(
                "cluster = \"app\"",
                &format!("cluster = \"app\"\nresponse_headers = {{ {rw} }}"),
            )
        };
        assert!(parse(&with(
            "set = { \"strict-transport-security\" = \"max-age=60\" }"
        ))
        .is_ok());
        let e = parse(&with("set = { \"bad name\" = \"x\" }")).unwrap_err();
        assert_eq!(e.path, "routes[0].response_headers.set.bad name");
        let e = parse(&with("set = { \"x-ok\" = \"line\\nbreak\" }")).unwrap_err();
        assert_eq!(e.path, "routes[0].response_headers.set.x-ok");
        let e = parse(&with("remove = [\"server\", \"Transfer-Encoding\"]")).unwrap_err();
        assert_eq!(e.path, "routes[0].response_headers.remove[1]");
        let e = parse(&with("add = {}")).unwrap_err();
        assert_eq!(e.path, "routes[0].response_headers.add");
    }

    #[test]
    fn upstream_tls_and_protocol_must_agree() {
        let with = |extra: &str| format!("{MINIMAL}{extra}\n");
        let tls = "[clusters.tls]\nserver_name = \"origin.internal\"";
        let c = parse(&with(&format!("protocol = \"h2\"\n{tls}"))).unwrap();
        assert_eq!(c.clusters[0].protocol, UpstreamProtocol::H2);
        let e = parse(&with("protocol = \"h2\"")).unwrap_err();
        assert_eq!(e.path, "clusters[0].protocol");
        assert!(e.message.contains("needs [clusters.tls]"), "{e}");
        let e = parse(&with(&format!("protocol = \"h2c\"\n{tls}"))).unwrap_err();
        assert_eq!(e.path, "clusters[0].protocol");
        let e = parse(&with(&format!("{tls}\nclient_cert = \"c.pem\""))).unwrap_err();
        assert_eq!(e.path, "clusters[0].tls");
    }

    #[test]
    fn a_shared_stateless_reset_key_comes_from_one_place() {
        let quic = |extra: &str| {
            MINIMAL.replace(
                "[[listeners.certificates]]",
                &format!("[listeners.quic]\nenabled = true\n{extra}\n[[listeners.certificates]]"),
            )
        };
        let e = parse(&quic("fleet_stateless_reset_key = true")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.fleet_stateless_reset_key");
        assert!(e.message.contains("[fleet] redis"), "{e}");
        let both = quic("fleet_stateless_reset_key = true\nstateless_reset_key_file = \"r.key\"");
        let e = parse(&format!("[fleet]\nredis = \"redis://127.0.0.1\"\n{both}")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.fleet_stateless_reset_key");
        assert!(e.message.contains("not both"), "{e}");
        let c = parse(&quic("stateless_reset_key_file = \"r.key\"")).unwrap();
        assert!(c.listeners[0]
            .quic
            .stateless_reset_key_file
            .as_ref()
            .unwrap()
            .ends_with("r.key"));
    }

    #[test]
    fn a_cluster_takes_at_least_one_request() {
        let e = parse(&MINIMAL.replace("name = \"app\"", "name = \"app\"\nmax_requests = 0"))
            .unwrap_err();
        assert_eq!(e.path, "clusters[0].max_requests");
        assert!(e.message.contains("at least 1"), "{e}");
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.clusters[0].max_requests, 1024);
    }

    #[test]
    fn bad_enum_and_duration_say_what_was_expected() {
        let e = parse(&MINIMAL.replace("name = \"app\"", "name = \"app\"\nlb = \"fastest\""))
            .unwrap_err();
        assert_eq!(e.path, "clusters[0].lb");
        assert!(e.message.contains("round_robin"), "{e}");
        let e =
            parse(&MINIMAL.replace("name = \"app\"", "name = \"app\"\nread_timeout = \"soon\""))
                .unwrap_err();
        assert_eq!(e.path, "clusters[0].read_timeout");
        assert!(e.message.contains("expected e.g."), "{e}");
    }

    #[test]
    fn dangling_cluster_reference_is_rejected() {
        let e = parse(&MINIMAL.replace("cluster = \"app\"", "cluster = \"nope\"")).unwrap_err();
        assert_eq!(e.path, "routes[0].cluster");
        assert!(e.message.contains("expected one of: app"), "{e}");
    }

    #[test]
    fn admin_must_be_loopback_and_ciphers_ecdhe() {
        let e = parse(&format!("[admin]\nlisten = \"0.0.0.0:9901\"\n{MINIMAL}")).unwrap_err();
        assert_eq!(e.path, "admin.listen");
        let text = MINIMAL.replace(
            "[[listeners.certificates]]",
            "[listeners.tls]\ntls12_ciphers = [\"AES128-GCM-SHA256\"]\n[[listeners.certificates]]",
        );
        let e = parse(&text).unwrap_err();
        assert_eq!(e.path, "listeners[0].tls.tls12_ciphers[0]");
    }

    #[test]
    fn missing_certificate_file_names_the_field() {
        let e = parse(&MINIMAL.replace("k.pem", "missing.pem")).unwrap_err();
        assert_eq!(e.path, "listeners[0].certificates[0].ecdsa.key");
        assert!(e.message.contains("does not exist"), "{e}");
    }

    /// MINIMAL with a QUIC listener carrying `extra` settings.
    fn with_quic(extra: &str) -> String {
        MINIMAL.replace(
            "[[listeners.certificates]]",
            &format!("[listeners.quic]\nenabled = true\n{extra}\n[[listeners.certificates]]"),
        )
    }

    #[test]
    fn quic_transport_settings_are_range_checked() {
        let e = parse(&with_quic("initial_congestion_window = 1")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.initial_congestion_window");
        assert!(e.message.contains("2..=1000"), "{e}");
        let e = parse(&with_quic("ack_eliciting_threshold = 0")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.ack_eliciting_threshold");
        assert!(e.message.contains("1..=1000"), "{e}");
        let e = parse(&with_quic("max_udp_payload = 70000")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.max_udp_payload");
        let e = parse(&with_quic("retry = \"sometimes\"")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.retry");
        assert!(e.message.contains("when_busy"), "{e}");
        let c = parse(&with_quic(
            "retry = \"when_busy\"\nretry_pending_above = 32",
        ))
        .unwrap();
        assert_eq!(c.listeners[0].quic.retry, RetryPolicy::WhenBusy);
        assert_eq!(c.listeners[0].quic.retry_pending_above, 32);
        assert_eq!(c.listeners[0].quic.initial_congestion_window, 10);
    }

    #[test]
    fn udp_payload_ceiling_follows_pmtu_discovery() {
        let quic = |extra: &str| parse(&with_quic(extra)).unwrap().listeners[0].quic.clone();
        let q = quic("");
        assert!(q.pmtu_discovery);
        assert_eq!(q.max_udp_payload(), 1452);
        assert_eq!(quic("pmtu_discovery = false").max_udp_payload(), 1350);
        let q = quic("pmtu_discovery = false\nmax_udp_payload = 1400");
        assert_eq!(q.max_udp_payload(), 1400);
        assert_eq!(quic("max_udp_payload = 9000").max_udp_payload(), 9000);
        let e = parse(&with_quic("max_udp_payload = 1100")).unwrap_err();
        assert_eq!(e.path, "listeners[0].quic.max_udp_payload");
        assert!(e.message.contains("1200..=65527"), "{e}");
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.clusters[0].lb, LbPolicy::RoundRobin);
        assert_eq!(c.routes[0].host, "*");
        assert_eq!(
            c.listeners[0].tls.versions,
            vec![TlsVersion::Tls12, TlsVersion::Tls13]
        );
        assert_eq!(c.admin.listen, Some("127.0.0.1:9901".parse().unwrap()));
    }
}
