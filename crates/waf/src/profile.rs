//! The directives of one WAF profile: ModSecurity's settings, the OWASP Core Rule Set at a
//! paranoia level and anomaly threshold, and a route's exclusions.

use std::fmt::Write as _;
use std::path::PathBuf;

/// Whether matches stop requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `SecRuleEngine On`: the Core Rule Set's anomaly evaluation denies with 403.
    Block,
    /// `SecRuleEngine DetectionOnly`: matches are logged and counted, nothing is stopped.
    Detect,
}

/// A rule switched off for part of a route's traffic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Exclusion {
    /// The rules' ids.
    pub rules: Vec<u32>,
    /// Only for request paths that start with this (all of the route's when `None`).
    pub path_prefix: Option<String>,
    /// Only this argument (query or form field) is exempt, not the whole rule.
    pub argument: Option<String>,
}

/// Where the Core Rule Set is installed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CrsPaths {
    /// `crs-setup.conf` (Debian: `/etc/modsecurity/crs/crs-setup.conf`).
    pub setup: PathBuf,
    /// The folder of `REQUEST-*.conf` and `RESPONSE-*.conf` (Debian:
    /// `/usr/share/modsecurity-crs/rules`).
    pub rules: PathBuf,
}

impl Default for CrsPaths {
    fn default() -> Self {
        CrsPaths {
            setup: "/etc/modsecurity/crs/crs-setup.conf".into(),
            rules: "/usr/share/modsecurity-crs/rules".into(),
        }
    }
}

/// One rule set's settings: routes with equal profiles share one compiled [`crate::RuleSet`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Profile {
    pub mode: Mode,
    /// CRS paranoia level, 1–4.
    pub paranoia: u8,
    /// CRS inbound anomaly score threshold (5 = one critical match).
    pub anomaly_threshold: u32,
    /// The most body bytes inspected (`SecRequestBodyLimit`, processed partially past it).
    pub body_limit: u64,
    /// Rules removed for the route (`SecRuleRemoveById`).
    pub exclude_rules: Vec<u32>,
    /// Rules removed for some paths or arguments, at run time (`ctl:ruleRemove…`).
    pub exclusions: Vec<Exclusion>,
    /// More rule files, loaded after the Core Rule Set.
    pub extra_rules: Vec<PathBuf>,
    /// Response bodies read by phase 4 (`SecResponseBodyAccess On`); `None`: not read.
    pub response_bodies: Option<ResponseBodies>,
    /// The methods the Core Rule Set allows (`tx.allowed_methods`, 911100 refuses others),
    /// as [`valid_method`] accepts them; empty: the rule set's own (GET, HEAD, POST, OPTIONS).
    pub allowed_methods: Vec<String>,
}

/// Which response bodies phase 4 reads, and how much of each.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResponseBodies {
    /// The most bytes inspected (`SecResponseBodyLimit`, processed partially past it).
    pub limit: u64,
    /// The media types read (`SecResponseBodyMimeType`), as [`valid_media_type`] accepts them.
    pub types: Vec<String>,
}

/// First id of the rules rampart writes for exclusions (CRS leaves 1–99,999 to the user).
const EXCLUSION_IDS: u32 = 10_000;

/// Whether `s` can go into a directive as a path prefix: it starts with `/` and holds none of
/// the characters that end or split a ModSecurity argument.
pub fn valid_path_prefix(s: &str) -> bool {
    s.starts_with('/')
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !b"\"'\\,;|".contains(&b))
}

/// Whether `s` can go into a directive as a media type: `type/subtype` in lowercase token
/// characters (RFC 9110 §8.3.1), no parameters.
pub fn valid_media_type(s: &str) -> bool {
    let token = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase() || b"!#$&^_.+-".contains(&b))
    };
    s.split_once('/')
        .is_some_and(|(t, sub)| token(t) && token(sub))
}

/// Whether `s` can go into a directive as an HTTP method: upper-case letters, up to 32.
pub fn valid_method(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_uppercase())
}

/// Whether `s` can go into a directive as an argument name.
pub fn valid_argument(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.[]".contains(&b))
}

/// A request header the inspection adds (after dropping any the client sent) when the body
/// it was given is only the first part: a body parser's error then says the body was cut,
/// not that it was malformed.
pub const PARTIAL_BODY_HEADER: &str = "x-rampart-body-partial";

/// ModSecurity's recommended body handling (its `modsecurity.conf-recommended`, ids 200000 to
/// 200004), without which the Core Rule Set reads no JSON or XML body: their fields are not
/// `ARGS`, so an attack in a JSON API's body passes unseen. JSON (`application/json`, any
/// `+json`) and XML bodies go to their parsers; a body that does not parse, or a multipart body
/// that fails strict validation, is refused with 400 (unless it was cut at the limit, which
/// [`PARTIAL_BODY_HEADER`] says, or is empty: an XML type named over no body hides nothing):
/// what the WAF cannot parse, it cannot have inspected.
const BODY_PROCESSORS: &str = r#"SecRule REQUEST_HEADERS:Content-Type "@rx ^(?:application(?:/soap\+|/)|text/)xml" "id:200000,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=XML"
SecRule REQUEST_HEADERS:Content-Type "@rx ^application/(?:[a-z0-9.-]+\+)?json" "id:200001,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=JSON"
SecRule REQBODY_ERROR "!@eq 0" "id:200002,phase:2,t:none,log,deny,status:400,msg:'Failed to parse request body',severity:2,chain"
  SecRule &REQUEST_HEADERS:x-rampart-body-partial "@eq 0" "t:none,chain"
  SecRule REQUEST_BODY_LENGTH "!@eq 0" "t:none"
SecRule MULTIPART_STRICT_ERROR "!@eq 0" "id:200003,phase:2,t:none,log,deny,status:400,msg:'Multipart request body failed strict validation',severity:2,chain"
  SecRule &REQUEST_HEADERS:x-rampart-body-partial "@eq 0" "t:none"
SecRule MULTIPART_UNMATCHED_BOUNDARY "@eq 1" "id:200004,phase:2,t:none,log,deny,status:400,msg:'Multipart parser detected a possible unmatched boundary',severity:2,chain"
  SecRule &REQUEST_HEADERS:x-rampart-body-partial "@eq 0" "t:none"
"#;

/// The directives of `profile` with the Core Rule Set from `crs`. Path prefixes and argument
/// names must pass [`valid_path_prefix`] and [`valid_argument`] (the configuration checks
/// them); one that does not is an error here too, never spliced into a directive.
pub fn crs_profile(profile: &Profile, crs: &CrsPaths) -> Result<String, String> {
    let mut d = String::new();
    let engine = match profile.mode {
        Mode::Block => "On",
        Mode::Detect => "DetectionOnly",
    };
    let limit = profile.body_limit.max(1);
    // The body limit is what is appended (the gateway reads no more than this); bodies past it
    // are processed partially, and multipart files count against the same limit.
    let _ = writeln!(
        d,
        "SecRuleEngine {engine}\nSecRequestBodyAccess On\nSecRequestBodyLimit {limit}\n\
         SecRequestBodyNoFilesLimit {limit}\n\
         SecRequestBodyLimitAction ProcessPartial\n\
         SecAuditEngine Off\nSecDebugLogLevel 0\nSecArgumentSeparator &\nSecCookieFormat 0"
    );
    match &profile.response_bodies {
        None => d.push_str("SecResponseBodyAccess Off\n"),
        Some(rb) => {
            if let Some(t) = rb.types.iter().find(|t| !valid_media_type(t)) {
                return Err(format!("response body type {t:?} is not a media type"));
            }
            // What is appended is what the gateway read (at most the limit); past it the
            // body is processed partially and the rest streams on uninspected.
            let _ = writeln!(
                d,
                "SecResponseBodyAccess On\nSecResponseBodyLimit {}\n\
                 SecResponseBodyLimitAction ProcessPartial\nSecResponseBodyMimeType {}",
                rb.limit.max(1),
                rb.types.join(" ")
            );
        }
    }
    d.push_str(BODY_PROCESSORS);
    let _ = writeln!(d, "Include {}", include_path(&crs.setup)?);
    let _ = writeln!(
        d,
        "SecAction \"id:900000,phase:1,nolog,pass,t:none,setvar:tx.paranoia_level={}\"",
        profile.paranoia
    );
    let _ = writeln!(
        d,
        "SecAction \"id:900110,phase:1,nolog,pass,t:none,\
         setvar:tx.inbound_anomaly_score_threshold={},setvar:tx.outbound_anomaly_score_threshold=4\"",
        profile.anomaly_threshold
    );
    if !profile.allowed_methods.is_empty() {
        if let Some(m) = profile.allowed_methods.iter().find(|m| !valid_method(m)) {
            return Err(format!("method {m:?} cannot be allowed"));
        }
        let _ = writeln!(
            d,
            "SecAction \"id:900200,phase:1,nolog,pass,t:none,setvar:'tx.allowed_methods={}'\"",
            profile.allowed_methods.join(" ")
        );
    }
    // CRS 3.3's default policy (920430) knows HTTP/1.0, 1.1 and 2 only: every HTTP/3 request
    // would score as a protocol violation and be blocked. The gateway speaks HTTP/3.
    let _ = writeln!(
        d,
        "SecAction \"id:900230,phase:1,nolog,pass,t:none,\
         setvar:'tx.allowed_http_versions=HTTP/1.0 HTTP/1.1 HTTP/2 HTTP/2.0 HTTP/3 HTTP/3.0'\""
    );
    for (i, ex) in profile.exclusions.iter().enumerate() {
        let id = EXCLUSION_IDS + i as u32;
        let ctl: Vec<String> = match &ex.argument {
            Some(arg) if valid_argument(arg) => ex
                .rules
                .iter()
                .map(|r| format!("ctl:ruleRemoveTargetById={r};ARGS:{arg}"))
                .collect(),
            Some(arg) => return Err(format!("argument {arg:?} cannot be excluded")),
            None => ex
                .rules
                .iter()
                .map(|r| format!("ctl:ruleRemoveById={r}"))
                .collect(),
        };
        let actions = format!("id:{id},phase:1,pass,nolog,t:none,{}", ctl.join(","));
        match &ex.path_prefix {
            Some(p) if valid_path_prefix(p) => {
                let _ = writeln!(
                    d,
                    "SecRule REQUEST_FILENAME \"@beginsWith {p}\" \"{actions}\""
                );
            }
            Some(p) => return Err(format!("path prefix {p:?} cannot be excluded")),
            None => {
                let _ = writeln!(d, "SecAction \"{actions}\"");
            }
        }
    }
    let _ = writeln!(d, "Include {}/*.conf", include_path(&crs.rules)?);
    if !profile.exclude_rules.is_empty() {
        let ids: Vec<String> = profile.exclude_rules.iter().map(u32::to_string).collect();
        let _ = writeln!(d, "SecRuleRemoveById {}", ids.join(" "));
    }
    for f in &profile.extra_rules {
        let _ = writeln!(d, "Include {}", include_path(f)?);
    }
    Ok(d)
}

/// A file path as `Include` takes it (ModSecurity 3 reads a quoted path with its quotes).
fn include_path(p: &std::path::Path) -> Result<String, String> {
    let s = p
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))?;
    if !valid_file_path(s) {
        return Err(format!(
            "{s:?}: a rule file's path cannot hold spaces, quotes, backslashes or control characters"
        ));
    }
    Ok(s.to_string())
}

/// Whether `s` can be a rule file's path in an `Include` directive.
pub fn valid_file_path(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "\"'\\".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        Profile {
            mode: Mode::Block,
            paranoia: 2,
            anomaly_threshold: 7,
            body_limit: 4096,
            exclude_rules: vec![920350],
            exclusions: vec![
                Exclusion {
                    rules: vec![942100, 942200],
                    path_prefix: Some("/api/search".into()),
                    argument: Some("q".into()),
                },
                Exclusion {
                    rules: vec![941100],
                    path_prefix: None,
                    argument: None,
                },
            ],
            extra_rules: vec!["/etc/rampart/extra.conf".into()],
            response_bodies: None,
            allowed_methods: vec!["GET".into(), "POST".into(), "PUT".into()],
        }
    }

    #[test]
    fn directives_say_what_the_profile_says() {
        let d = crs_profile(&profile(), &CrsPaths::default()).unwrap();
        assert!(d.contains("SecRuleEngine On\n"));
        assert!(d.contains("setvar:tx.paranoia_level=2\""));
        assert!(d.contains("inbound_anomaly_score_threshold=7,"));
        assert!(d.contains("SecRequestBodyLimit 4096\n"));
        assert!(d.contains(
            "tx.allowed_http_versions=HTTP/1.0 HTTP/1.1 HTTP/2 HTTP/2.0 HTTP/3 HTTP/3.0'"
        ));
        assert!(d.contains(
            "SecRule REQUEST_FILENAME \"@beginsWith /api/search\" \"id:10000,phase:1,pass,nolog,t:none,\
             ctl:ruleRemoveTargetById=942100;ARGS:q,ctl:ruleRemoveTargetById=942200;ARGS:q\""
        ));
        assert!(d.contains(
            "SecAction \"id:10001,phase:1,pass,nolog,t:none,ctl:ruleRemoveById=941100\""
        ));
        // Exclusions at run time come before the rules they exempt; removals by id after.
        let crs = d
            .find("Include /usr/share/modsecurity-crs/rules/*.conf\n")
            .unwrap();
        assert!(d.find("id:10000").unwrap() < crs);
        assert!(d.find("SecRuleRemoveById 920350").unwrap() > crs);
        assert!(d.ends_with("Include /etc/rampart/extra.conf\n"));
        let detect = Profile {
            mode: Mode::Detect,
            ..profile()
        };
        assert!(crs_profile(&detect, &CrsPaths::default())
            .unwrap()
            .contains("SecRuleEngine DetectionOnly\n"));
        assert!(d.contains("SecResponseBodyAccess Off\n"));
        assert!(d.contains("setvar:'tx.allowed_methods=GET POST PUT'\""));
        // Before the rules that read it; and nothing that could end the directive.
        assert!(d.find("tx.allowed_methods").unwrap() < crs);
        let mut bad = profile();
        bad.allowed_methods = vec!["GET'\"".into()];
        assert!(crs_profile(&bad, &CrsPaths::default()).is_err());
        assert!(valid_method("PATCH") && !valid_method("get") && !valid_method(""));
    }

    #[test]
    fn response_bodies_are_read_only_when_asked_and_as_far_as_asked() {
        let mut p = profile();
        p.response_bodies = Some(ResponseBodies {
            limit: 65_536,
            types: vec!["text/html".into(), "application/json".into()],
        });
        let d = crs_profile(&p, &CrsPaths::default()).unwrap();
        assert!(d.contains(
            "SecResponseBodyAccess On\nSecResponseBodyLimit 65536\n\
             SecResponseBodyLimitAction ProcessPartial\n\
             SecResponseBodyMimeType text/html application/json\n"
        ));
        assert!(!d.contains("SecResponseBodyAccess Off"));
        for bad in [
            "text/html\nSecRuleEngine Off",
            "text/html; charset=utf-8",
            "Text/HTML",
            "text",
            "/x",
            "a/",
        ] {
            assert!(!valid_media_type(bad), "{bad:?}");
            p.response_bodies.as_mut().unwrap().types = vec![bad.into()];
            assert!(crs_profile(&p, &CrsPaths::default()).is_err(), "{bad:?}");
        }
        assert!(valid_media_type("application/vnd.api+json") && valid_media_type("text/x-c"));
    }

    #[test]
    fn what_could_break_out_of_a_directive_is_refused() {
        for bad in ["/a\" \"id:1,deny", "/a b", "api", "/a;b"] {
            assert!(!valid_path_prefix(bad), "{bad}");
            let mut p = profile();
            p.exclusions[0].path_prefix = Some(bad.into());
            assert!(crs_profile(&p, &CrsPaths::default()).is_err(), "{bad}");
        }
        for bad in ["", "q;deny", "a b", "x\""] {
            assert!(!valid_argument(bad), "{bad}");
        }
        assert!(valid_argument("user[name]") && valid_path_prefix("/api/v1/search"));
        let mut p = profile();
        p.extra_rules = vec!["/tmp/a b.conf".into()];
        assert!(crs_profile(&p, &CrsPaths::default()).is_err());
    }
}
