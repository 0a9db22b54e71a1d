//! `[waf]` (where the OWASP Core Rule Set is, the inspection threads, the match log) and a
//! route's `waf` (mode, paranoia, threshold, body limit, exclusions).

use super::{At, Invalid};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// `[waf]`: what every route's WAF shares.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WafConfig {
    /// The Core Rule Set's `crs-setup.conf`.
    pub crs_setup: PathBuf,
    /// The folder of the Core Rule Set's `*.conf` rules.
    pub crs_rules: PathBuf,
    /// Threads that run inspections (0: one per CPU). Inspection never runs on the threads
    /// that serve connections.
    pub threads: usize,
    /// Requests waiting for an inspection thread; past it, a blocking route answers 503 and
    /// a detecting one passes the request uninspected (both counted).
    pub queue: usize,
    /// Requests of one client (by its key: an IPv6 one by its prefix) waiting for or in
    /// inspection at once; past it, a blocking route answers 429 and a detecting one passes
    /// the request uninspected (both counted), so one client cannot fill the queue for
    /// everyone. Default: a quarter of `queue`, at least 1. Read it with
    /// [`WafConfig::queue_per_client`].
    pub queue_per_client: Option<usize>,
    /// Where matches are written, one JSON line each: `stderr`, `off`, or a file path.
    pub log: String,
}

impl Default for WafConfig {
    fn default() -> Self {
        let crs = waf::CrsPaths::default();
        WafConfig {
            crs_setup: crs.setup,
            crs_rules: crs.rules,
            threads: 0,
            queue: 1024,
            queue_per_client: None,
            log: "stderr".into(),
        }
    }
}

impl WafConfig {
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if self.queue == 0 {
            return at.field("queue").fail("at least 1 waiting request");
        }
        if self.queue_per_client == Some(0) {
            return at
                .field("queue_per_client")
                .fail("at least 1 request (a share at or above the queue never binds)");
        }
        if self.log.is_empty() {
            return at.field("log").fail("stderr, off or a file path");
        }
        for (name, p) in [
            ("crs_setup", &self.crs_setup),
            ("crs_rules", &self.crs_rules),
        ] {
            if !p.to_str().is_some_and(waf::valid_file_path) {
                return at.field(name).fail(format!(
                    "a path without spaces, quotes or backslashes, not {}",
                    p.display()
                ));
            }
        }
        Ok(())
    }

    /// `queue_per_client`, or its default: a quarter of `queue`, at least 1.
    pub fn queue_per_client(&self) -> usize {
        self.queue_per_client.unwrap_or((self.queue / 4).max(1))
    }

    /// The Core Rule Set's files, for [`waf::crs_profile`].
    pub fn crs_paths(&self) -> waf::CrsPaths {
        waf::CrsPaths {
            setup: self.crs_setup.clone(),
            rules: self.crs_rules.clone(),
        }
    }

    pub(super) fn resolve_paths(&mut self, base: &std::path::Path) {
        if self.log != "stderr" && self.log != "off" {
            self.log = base.join(&self.log).to_string_lossy().into_owned();
        }
    }
}

/// Whether a route's WAF stops requests or only reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WafMode {
    Block,
    Detect,
}

/// What a blocking route's WAF does with a request body longer than its `body_limit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyPastLimit {
    /// Inspect the first `body_limit` bytes and stream the rest upstream uninspected
    /// (counted): large uploads pass, and an attack placed past the limit passes with them.
    #[default]
    InspectPrefix,
    /// Refuse the request with 413 (ModSecurity's `SecRequestBodyLimitAction Reject`): nothing
    /// reaches the upstream uninspected. A declared `Content-Length` past the limit is refused
    /// before the body is read.
    Refuse,
}

impl BodyPastLimit {
    fn is_default(&self) -> bool {
        *self == BodyPastLimit::default()
    }
}

/// A route's `waf`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct RouteWafConfig {
    /// `block`: the Core Rule Set's verdict answers 403; `detect`: matches are logged and
    /// counted, the request passes.
    pub mode: WafMode,
    /// CRS paranoia level, 1 (default, few false positives) to 4.
    #[serde(default = "one")]
    pub paranoia: u8,
    /// CRS inbound anomaly score at which a request is stopped (default 5: one critical
    /// match).
    #[serde(default = "five")]
    pub anomaly_threshold: u32,
    /// The most body bytes inspected (default 128 KiB); the rest of a larger body streams
    /// upstream uninspected, which is logged and counted.
    #[serde(default = "default_body_limit")]
    pub body_limit: u64,
    /// What a blocking route does with a body longer than `body_limit` (decoded, for a gzip or
    /// deflate body): `inspect_prefix` (default) or `refuse` (413).
    #[serde(default, skip_serializing_if = "BodyPastLimit::is_default")]
    pub body_past_limit: BodyPastLimit,
    /// Rules switched off for the whole route, by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_rules: Vec<u32>,
    /// Rules switched off for some paths, or for one argument only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclusions: Vec<WafExclusionConfig>,
    /// More ModSecurity rule files, loaded after the Core Rule Set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<PathBuf>,
    /// Also run the upstream's response status and headers through phase 3 (the route's own
    /// `rules` on `RESPONSE_HEADERS`, `RESPONSE_STATUS`), in the transaction the request
    /// opened; a blocking verdict replaces the response. Off by default: it holds each
    /// request's ModSecurity transaction across the exchange and costs a second hand-off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub response_headers: bool,
    /// Also run the response's body through phase 4 (the Core Rule Set's data-leak rules:
    /// SQL, PHP, Java and IIS errors, directory listings, source code), after its headers'
    /// phase 3 (this implies `response_headers`). The gateway holds the body's first
    /// `response_body_limit` bytes until they are inspected; only bodies of
    /// `response_body_types` in no coding, gzip or deflate are read (the upstream is asked for
    /// no other). Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub response_body: bool,
    /// The most response body bytes held and inspected (default 512 KiB, ModSecurity's
    /// default `SecResponseBodyLimit`); the rest of a larger body streams on uninspected,
    /// which is logged and counted.
    #[serde(default = "default_response_body_limit")]
    pub response_body_limit: u64,
    /// The media types whose bodies are read (default: HTML, plain text, XML, JSON).
    #[serde(default = "default_response_body_types")]
    pub response_body_types: Vec<String>,
    /// The methods the Core Rule Set lets through (911100 refuses others); empty: its own
    /// default, GET, HEAD, POST and OPTIONS. A REST API's route names its PUT, PATCH, DELETE.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_methods: Vec<String>,
}

/// One of a route's `waf.exclusions`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(deny_unknown_fields)]
pub struct WafExclusionConfig {
    /// The rules' ids.
    pub rules: Vec<u32>,
    /// Only for request paths starting with this.
    pub path_prefix: Option<String>,
    /// Only this query or form argument is exempt from the rules.
    pub argument: Option<String>,
}

fn one() -> u8 {
    1
}
fn five() -> u32 {
    5
}
fn default_body_limit() -> u64 {
    128 * 1024
}
fn default_response_body_limit() -> u64 {
    512 * 1024
}
fn default_response_body_types() -> Vec<String> {
    [
        "text/html",
        "text/plain",
        "text/xml",
        "application/json",
        "application/xml",
    ]
    .map(String::from)
    .to_vec()
}

/// The most body bytes a route may inspect (a request holds this much while it is inspected).
const MAX_BODY_LIMIT: u64 = 64 * 1024 * 1024;

impl RouteWafConfig {
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if !(1..=4).contains(&self.paranoia) {
            return at
                .field("paranoia")
                .fail("a CRS paranoia level from 1 to 4");
        }
        if self.anomaly_threshold == 0 {
            return at
                .field("anomaly_threshold")
                .fail("an anomaly score above 0 (5 stops a request at one critical match)");
        }
        if self.body_limit == 0 || self.body_limit > MAX_BODY_LIMIT {
            return at
                .field("body_limit")
                .fail(format!("bytes above 0, at most {MAX_BODY_LIMIT}"));
        }
        if self.response_body_limit == 0 || self.response_body_limit > MAX_BODY_LIMIT {
            return at
                .field("response_body_limit")
                .fail(format!("bytes above 0, at most {MAX_BODY_LIMIT}"));
        }
        if self.response_body_types.is_empty() {
            return at
                .field("response_body_types")
                .fail("at least one media type, such as \"text/html\"");
        }
        for (i, t) in self.response_body_types.iter().enumerate() {
            if !waf::valid_media_type(t) {
                return at.field("response_body_types").index(i).fail(format!(
                    "a media type in lowercase, type/subtype without parameters, not {t:?}"
                ));
            }
        }
        for (i, e) in self.exclusions.iter().enumerate() {
            let at = at.field("exclusions").index(i);
            if e.rules.is_empty() {
                return at.field("rules").fail("at least one rule id");
            }
            if let Some(p) = e
                .path_prefix
                .as_deref()
                .filter(|p| !waf::valid_path_prefix(p))
            {
                return at.field("path_prefix").fail(format!(
                    "a path starting with / without spaces, quotes, commas, semicolons or backslashes, not {p:?}"
                ));
            }
            if let Some(a) = e.argument.as_deref().filter(|a| !waf::valid_argument(a)) {
                return at.field("argument").fail(format!(
                    "an argument name of letters, digits and _-.[], not {a:?}"
                ));
            }
        }
        for (i, m) in self.allowed_methods.iter().enumerate() {
            if !waf::valid_method(m) {
                return at.field("allowed_methods").index(i).fail(format!(
                    "a method in upper case, such as \"PUT\", not {m:?}"
                ));
            }
        }
        for (i, r) in self.rules.iter().enumerate() {
            let at = at.field("rules").index(i);
            if !r.to_str().is_some_and(waf::valid_file_path) {
                return at.fail(format!(
                    "a path without spaces, quotes or backslashes, not {}",
                    r.display()
                ));
            }
            at.file_exists(r)?;
        }
        Ok(())
    }

    pub(super) fn resolve_paths(&mut self, base: &std::path::Path) {
        for r in &mut self.rules {
            *r = base.join(&*r);
        }
    }

    /// The rule set's settings, with the Core Rule Set from `[waf]`.
    pub fn profile(&self) -> waf::Profile {
        waf::Profile {
            mode: match self.mode {
                WafMode::Block => waf::Mode::Block,
                WafMode::Detect => waf::Mode::Detect,
            },
            paranoia: self.paranoia,
            anomaly_threshold: self.anomaly_threshold,
            body_limit: self.body_limit,
            exclude_rules: self.exclude_rules.clone(),
            exclusions: self
                .exclusions
                .iter()
                .map(|e| waf::Exclusion {
                    rules: e.rules.clone(),
                    path_prefix: e.path_prefix.clone(),
                    argument: e.argument.clone(),
                })
                .collect(),
            extra_rules: self.rules.clone(),
            response_bodies: self.response_body.then(|| waf::ResponseBodies {
                limit: self.response_body_limit,
                types: self.response_body_types.clone(),
            }),
            allowed_methods: self.allowed_methods.clone(),
        }
    }
}
