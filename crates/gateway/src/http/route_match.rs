//! A route's conditions beyond host and path prefix, compiled once from its validated
//! configuration: a path pattern, methods, headers, query parameters and cookies, all of
//! which a request must meet.
//!
//! Values are compared as the gateway will forward them, with one exception that keeps rules
//! from being spelled around: query parameters are percent-decoded (`?%64ebug=1` is
//! `debug=1`), and a condition on a repeated header or parameter is met by any of its values.

use crate::config::{RouteConfig, ValueMatchConfig};
use crate::http::pattern;
use crate::tls::handshake_info::ClientCert;
use http::{HeaderMap, HeaderName, Method};
use regex::Regex;
use std::borrow::Cow;
use std::sync::OnceLock;

/// What a request offers the router beyond host and path.
pub struct RequestFacts<'a> {
    pub method: &'a Method,
    pub headers: &'a HeaderMap,
    /// The raw query, without `?`.
    pub query: Option<&'a str>,
    /// The connection's verified client certificate.
    pub client_cert: Option<&'a ClientCert>,
}

/// Which part of a client certificate a `client_cert_match` test reads.
#[derive(Debug, Clone, Copy)]
enum CertField {
    Subject,
    San,
    Sha256,
}

impl CertField {
    fn of(name: &str) -> CertField {
        match name {
            "subject" => CertField::Subject,
            "san" => CertField::San,
            _ => CertField::Sha256,
        }
    }

    fn value(self, cert: &ClientCert) -> Option<&str> {
        match self {
            CertField::Subject => cert.subject.to_str().ok(),
            CertField::San => cert.san.as_ref()?.to_str().ok(),
            CertField::Sha256 => cert.sha256.to_str().ok(),
        }
    }
}

/// A compiled pattern, with its case-insensitive twin made on first use (for listeners that
/// match paths without case).
#[derive(Debug, Clone)]
struct Pattern {
    source: String,
    exact_case: Regex,
    any_case: OnceLock<Regex>,
}

impl Pattern {
    fn new(source: &str) -> Pattern {
        Pattern {
            source: source.to_string(),
            exact_case: pattern::compile(source, false).expect("validated"),
            any_case: OnceLock::new(),
        }
    }

    fn is_match(&self, value: &str, case_insensitive: bool) -> bool {
        if !case_insensitive {
            return self.exact_case.is_match(value);
        }
        self.any_case
            .get_or_init(|| pattern::compile(&self.source, true).expect("validated"))
            .is_match(value)
    }
}

/// One test of a value.
#[derive(Debug, Clone)]
enum ValueTest {
    Exact(String),
    Prefix(String),
    Regex(Pattern),
    /// Present (`true`) or absent.
    Present(bool),
}

impl ValueTest {
    fn new(cfg: &ValueMatchConfig) -> ValueTest {
        match cfg {
            ValueMatchConfig { exact: Some(v), .. } => ValueTest::Exact(v.clone()),
            ValueMatchConfig {
                prefix: Some(v), ..
            } => ValueTest::Prefix(v.clone()),
            ValueMatchConfig { regex: Some(r), .. } => ValueTest::Regex(Pattern::new(r)),
            ValueMatchConfig {
                present: Some(p), ..
            } => ValueTest::Present(*p),
            _ => unreachable!("validated: one test"),
        }
    }

    /// Whether the values found meet the test: any of them, or, for presence, whether there
    /// is one.
    fn met<'v>(&self, mut values: impl Iterator<Item = Cow<'v, str>>) -> bool {
        match self {
            ValueTest::Present(p) => values.next().is_some() == *p,
            ValueTest::Exact(e) => values.any(|v| v == e.as_str()),
            ValueTest::Prefix(p) => values.any(|v| v.starts_with(p.as_str())),
            ValueTest::Regex(r) => values.any(|v| r.is_match(&v, false)),
        }
    }
}

/// A route's conditions.
#[derive(Debug, Clone, Default)]
pub struct Conditions {
    path_regex: Option<Pattern>,
    methods: Vec<Method>,
    headers: Vec<(HeaderName, ValueTest)>,
    query: Vec<(String, ValueTest)>,
    cookies: Vec<(String, ValueTest)>,
    client_cert: Vec<(CertField, ValueTest)>,
}

impl Conditions {
    pub fn new(cfg: &RouteConfig) -> Conditions {
        let header = |m: &ValueMatchConfig| {
            (
                HeaderName::from_bytes(m.name.as_bytes()).expect("validated"),
                ValueTest::new(m),
            )
        };
        let named = |m: &ValueMatchConfig| (m.name.clone(), ValueTest::new(m));
        Conditions {
            path_regex: cfg.path_regex.as_deref().map(Pattern::new),
            methods: cfg
                .methods
                .iter()
                .map(|m| Method::from_bytes(m.as_bytes()).expect("validated"))
                .collect(),
            headers: cfg.headers.iter().map(header).collect(),
            query: cfg.query.iter().map(named).collect(),
            cookies: cfg.cookies.iter().map(named).collect(),
            client_cert: cfg
                .client_cert_match
                .iter()
                .map(|m| (CertField::of(&m.name), ValueTest::new(m)))
                .collect(),
        }
    }

    /// How many conditions: among routes equal otherwise, the one with more is tried first.
    pub fn count(&self) -> usize {
        usize::from(self.path_regex.is_some())
            + usize::from(!self.methods.is_empty())
            + self.headers.len()
            + self.query.len()
            + self.cookies.len()
            + self.client_cert.len()
    }

    pub fn has_path_regex(&self) -> bool {
        self.path_regex.is_some()
    }

    /// Whether the request at `path` meets every condition.
    pub fn met(&self, path: &str, case_insensitive: bool, req: &RequestFacts<'_>) -> bool {
        if let Some(p) = &self.path_regex {
            if !p.is_match(path, case_insensitive) {
                return false;
            }
        }
        if !self.methods.is_empty() && !self.methods.contains(req.method) {
            return false;
        }
        let headers_met = self.headers.iter().all(|(n, t)| {
            let values = req.headers.get_all(n).into_iter();
            t.met(values.filter_map(|v| v.to_str().ok()).map(Cow::Borrowed))
        });
        if !headers_met {
            return false;
        }
        let query = req.query.unwrap_or("").as_bytes();
        let query_met = self.query.iter().all(|(n, t)| {
            let params = form_urlencoded::parse(query);
            t.met(params.filter(|(k, _)| k == n).map(|(_, v)| v))
        });
        if !query_met {
            return false;
        }
        let cookies_met = self.cookies.iter().all(|(n, t)| {
            let cookies = crate::http::headers::cookies(req.headers);
            t.met(
                cookies
                    .filter(|(k, _)| k == n)
                    .map(|(_, v)| Cow::Borrowed(v)),
            )
        });
        cookies_met
            && self.client_cert.iter().all(|(f, t)| {
                let value = req.client_cert.and_then(|c| f.value(c));
                t.met(value.into_iter().map(Cow::Borrowed))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn route(toml_text: &str) -> RouteConfig {
        toml::from_str(&format!("cluster = \"c\"\n{toml_text}")).unwrap()
    }

    fn met(c: &Conditions, method: &str, headers: &[(&str, &str)], query: Option<&str>) -> bool {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let req = RequestFacts {
            method: &method,
            headers: &h,
            query,
            client_cert: None,
        };
        c.met("/users/42", false, &req)
    }

    #[test]
    fn client_certificate_fields_are_tested_and_absence_fails_them() {
        let cert = |cn: &str, san: Option<&str>| ClientCert {
            subject: HeaderValue::from_str(&format!("O=Example,CN={cn}")).unwrap(),
            san: san.map(|s| HeaderValue::from_str(s).unwrap()),
            sha256: HeaderValue::from_static("ab12"),
        };
        let facts =
            |method: &'static Method, h: &'static HeaderMap, c: Option<&'static ClientCert>| {
                RequestFacts {
                    method,
                    headers: h,
                    query: None,
                    client_cert: c,
                }
            };
        static H: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);
        let alice: &'static ClientCert =
            Box::leak(Box::new(cert("alice", Some("DNS:alice.example"))));
        let bob: &'static ClientCert = Box::leak(Box::new(cert("bob", None)));
        let c = Conditions::new(&route(
            r#"client_cert_match = [{ name = "subject", regex = "O=Example,CN=(alice|carol)" }, { name = "san", prefix = "DNS:" }]"#,
        ));
        assert_eq!(c.count(), 2);
        assert!(c.met("/", false, &facts(&Method::GET, &H, Some(alice))));
        assert!(
            !c.met("/", false, &facts(&Method::GET, &H, Some(bob))),
            "bob: subject and san"
        );
        assert!(
            !c.met("/", false, &facts(&Method::GET, &H, None)),
            "no certificate"
        );
        let none = Conditions::new(&route(
            r#"client_cert_match = [{ name = "sha256", present = false }]"#,
        ));
        assert!(none.met("/", false, &facts(&Method::GET, &H, None)));
        assert!(!none.met("/", false, &facts(&Method::GET, &H, Some(alice))));
    }

    #[test]
    fn every_condition_must_hold() {
        let c = Conditions::new(&route(
            r#"path_regex = "/users/[0-9]+"
methods = ["GET", "HEAD"]
headers = [{ name = "x-canary", exact = "1" }, { name = "authorization", present = false }]
query = [{ name = "debug", prefix = "on" }]
cookies = [{ name = "beta", regex = "yes|1" }]"#,
        ));
        assert_eq!(c.count(), 6);
        let h = [("x-canary", "1"), ("cookie", "a=b; beta=yes")];
        assert!(met(&c, "GET", &h, Some("debug=on&x=1")));
        assert!(!met(&c, "POST", &h, Some("debug=on")), "method");
        assert!(!met(&c, "GET", &h, Some("debug=off")), "query");
        assert!(!met(&c, "GET", &h, None), "query absent");
        assert!(
            !met(
                &c,
                "GET",
                &[("x-canary", "1"), ("cookie", "beta=no")],
                Some("debug=on")
            ),
            "cookie"
        );
        let with_auth = [
            ("x-canary", "1"),
            ("cookie", "beta=1"),
            ("authorization", "x"),
        ];
        assert!(
            !met(&c, "GET", &with_auth, Some("debug=on")),
            "absent header"
        );
        // A header sent twice: either value may match.
        let twice = [("x-canary", "0"), ("x-canary", "1"), ("cookie", "beta=1")];
        assert!(met(&c, "GET", &twice, Some("debug=on")));
    }

    #[test]
    fn query_parameters_are_matched_decoded() {
        let c = Conditions::new(&route(r#"query = [{ name = "debug", exact = "a b" }]"#));
        assert!(met(&c, "GET", &[], Some("debug=a+b")));
        assert!(met(&c, "GET", &[], Some("%64ebug=a%20b")));
        assert!(!met(&c, "GET", &[], Some("debugx=a+b")));
        let absent = Conditions::new(&route(r#"query = [{ name = "admin", present = false }]"#));
        assert!(absent.met(
            "/",
            false,
            &RequestFacts {
                method: &Method::GET,
                headers: &HeaderMap::new(),
                query: Some("x=1"),
                client_cert: None,
            }
        ));
        assert!(
            !met(&absent, "GET", &[], Some("%61dmin=1")),
            "spelled around"
        );
    }

    #[test]
    fn a_path_pattern_follows_the_listeners_case_rule() {
        let c = Conditions::new(&route(r#"path_regex = "/Users/[0-9]+""#));
        let h = HeaderMap::new();
        let req = RequestFacts {
            method: &Method::GET,
            headers: &h,
            query: None,
            client_cert: None,
        };
        assert!(!c.met("/users/1", false, &req));
        assert!(c.met("/users/1", true, &req));
        assert!(c.met("/Users/1", false, &req));
    }
}
