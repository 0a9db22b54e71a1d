//! What a route matches besides host and path prefix: an exact path or a path pattern,
//! methods, headers, query parameters and cookies (all of them, AND), and the route's
//! priority where two match.

use super::{At, Invalid, RouteConfig};
use crate::http::pattern;
use serde::{Deserialize, Serialize};

/// One of a route's `headers`, `query` or `cookies` conditions: `name` and exactly one of
/// `exact`, `prefix`, `regex` (the whole value) or `present` (`true`: there with any value;
/// `false`: absent).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ValueMatchConfig {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub present: Option<bool>,
}

impl ValueMatchConfig {
    /// Exactly one test, a name `valid_name` accepts, and a pattern that compiles.
    fn validate(&self, at: &At, valid_name: impl Fn(&str) -> bool) -> Result<(), Invalid> {
        if !valid_name(&self.name) {
            return at
                .field("name")
                .fail(format!("a name, not {:?}", self.name));
        }
        let set = [
            self.exact.is_some(),
            self.prefix.is_some(),
            self.regex.is_some(),
            self.present.is_some(),
        ];
        if set.iter().filter(|s| **s).count() != 1 {
            return at.fail("exactly one of exact, prefix, regex, present");
        }
        if let Some(r) = &self.regex {
            if let Err(why) = pattern::compile(r, false) {
                return at.field("regex").fail(why);
            }
        }
        Ok(())
    }
}

impl RouteConfig {
    /// `path`, `path_regex`, `methods`, `headers`, `query`, `cookies`.
    pub(super) fn validate_match(&self, at: &At) -> Result<(), Invalid> {
        let custom_prefix = self.path_prefix != "/";
        if self.path.is_some() && self.path_regex.is_some() {
            return at.fail("at most one of path, path_regex");
        }
        if let Some(p) = &self.path {
            if custom_prefix {
                return at.field("path").fail("path or path_prefix, not both");
            }
            super::route::check_normal_path(&at.field("path"), p)?;
        }
        if let Some(r) = &self.path_regex {
            if custom_prefix {
                return at.field("path_regex").fail(
                    "path_regex or path_prefix, not both (a pattern's literal start indexes it)",
                );
            }
            if let Err(why) = pattern::compile(r, false) {
                return at.field("path_regex").fail(why);
            }
        }
        for (i, m) in self.methods.iter().enumerate() {
            let token = !m.is_empty() && http::Method::from_bytes(m.as_bytes()).is_ok();
            if !token || m.bytes().any(|b| b.is_ascii_lowercase()) {
                return at
                    .field("methods")
                    .index(i)
                    .fail(format!("a method in upper case, such as GET, not {m:?}"));
            }
        }
        let header_name = |n: &str| http::HeaderName::from_bytes(n.as_bytes()).is_ok();
        let param_name = |n: &str| !n.is_empty();
        for (i, m) in self.headers.iter().enumerate() {
            m.validate(&at.field("headers").index(i), header_name)?;
        }
        for (i, m) in self.query.iter().enumerate() {
            m.validate(&at.field("query").index(i), param_name)?;
        }
        let cookie_name = |n: &str| {
            !n.is_empty()
                && !n
                    .bytes()
                    .any(|b| b"=; \t,".contains(&b) || b.is_ascii_control())
        };
        for (i, m) in self.cookies.iter().enumerate() {
            m.validate(&at.field("cookies").index(i), cookie_name)?;
        }
        for (i, m) in self.client_cert_match.iter().enumerate() {
            let at = at.field("client_cert_match").index(i);
            if !["subject", "san", "sha256"].contains(&m.name.as_str()) {
                return at
                    .field("name")
                    .fail(format!("subject, san or sha256, not {:?}", m.name));
            }
            m.validate(&at, |_| true)?;
        }
        Ok(())
    }

    /// The literal path every request of the route starts with: `path_prefix`, or a
    /// `path_regex`'s literal start, or the exact `path`.
    pub fn index_prefix(&self) -> String {
        match (&self.path, &self.path_regex) {
            (Some(p), _) => p.clone(),
            (_, Some(r)) => {
                let lit = pattern::literal_prefix(r);
                if lit.starts_with('/') {
                    lit
                } else {
                    "/".into()
                }
            }
            _ => self.path_prefix.clone(),
        }
    }
}
