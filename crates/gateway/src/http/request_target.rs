//! The request's target, made canonical before any rule looks at it: one host and one path
//! that routing, access lists, rate limits and the upstream all see alike.
//!
//! - **Host** (RFC 9112 §3.2, RFC 9113 §8.3.1, RFC 9114 §4.3.1): the authority of an
//!   absolute-form target or of `:authority` replaces `Host`; a `Host` that disagrees with
//!   `:authority`, a duplicate or a malformed one, or none on HTTP/1.1 makes the request
//!   malformed (400). The host is lowercased and loses a trailing dot.
//! - **Path** (RFC 3986 §6.2.2): percent-encoded unreserved characters are decoded, other
//!   escapes get uppercase hex, dot-segments are removed and repeated slashes merged, so
//!   `//admin`, `/./admin`, `/x/../admin` and `/%61dmin` are all `/admin`. An encoded slash
//!   (`%2F`) and a backslash (`\` or `%5C`), which some servers take as separators, are
//!   refused, kept or decoded as [`PathPolicy`] says. `%00` is always refused.
//!
//! Pure functions over bytes: fuzzed (`fuzz/fuzz_targets/request_target.rs`).

use http::header::{self, HeaderMap};
use http::{Uri, Version};

/// What to do with a path character that some servers treat as a separator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeparatorAction {
    /// 400: the request is refused.
    Reject,
    /// Left as it is (`%2F` stays encoded, so it separates nothing for routing).
    Keep,
    /// Decoded to `/`, then normalized with the rest of the path.
    Decode,
}

/// How paths are normalized on a listener (`[listeners.paths]`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PathPolicy {
    /// `%2F` in a path.
    pub encoded_slash: SeparatorAction,
    /// `\` or `%5C` in a path.
    pub backslash: SeparatorAction,
    /// `//` becomes `/`.
    pub merge_slashes: bool,
    /// Send the normalized path upstream (default); `false` sends the client's own path,
    /// while routing and rules still see the normalized one.
    pub forward_normalized: bool,
    /// Match route path prefixes without regard to ASCII case.
    pub case_insensitive_routes: bool,
}

impl Default for PathPolicy {
    fn default() -> Self {
        PathPolicy {
            encoded_slash: SeparatorAction::Reject,
            backslash: SeparatorAction::Reject,
            merge_slashes: true,
            forward_normalized: true,
            case_insensitive_routes: false,
        }
    }
}

/// Why a request's target is malformed; each is answered 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("missing Host")]
    MissingHost,
    #[error("more than one Host")]
    DuplicateHost,
    #[error("invalid Host")]
    InvalidHost,
    #[error("Host differs from the request's authority")]
    HostMismatch,
    #[error("invalid request target")]
    InvalidTarget,
    #[error("invalid percent-encoding in the path")]
    BadEscape,
    #[error("encoded slash in the path")]
    EncodedSlash,
    #[error("backslash in the path")]
    Backslash,
    #[error("NUL in the path")]
    Nul,
}

/// A request's canonical target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Lowercase, without port or trailing dot: what routes and rules match (empty only for
    /// an HTTP/1.0 request without `Host`).
    pub host: String,
    /// `host[:port]`, lowercase: the `Host` that goes upstream.
    pub authority: String,
    /// The normalized path (no query).
    pub path: String,
}

/// Host and path of a request, checked and normalized. `uri` carries the authority for an
/// absolute-form HTTP/1.1 target and for every HTTP/2 and HTTP/3 request.
pub fn normalize(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
    policy: &PathPolicy,
) -> Result<Target, TargetError> {
    let (host, authority) = host_of(version, uri, headers)?;
    let path = match uri.path() {
        // OPTIONS * (asterisk-form) and CONNECT (authority-form) have no path to route by.
        "*" => "*".to_string(),
        "" => "/".to_string(),
        p => normalize_path(p.as_bytes(), policy)?,
    };
    Ok(Target {
        host,
        authority,
        path,
    })
}

/// The request's host (for routing) and authority (for `Host` upstream).
fn host_of(
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(String, String), TargetError> {
    let mut host_fields = headers.get_all(header::HOST).into_iter();
    let host_field = host_fields.next();
    if host_fields.next().is_some() {
        return Err(TargetError::DuplicateHost);
    }
    let from_field = host_field
        .map(|v| parse_authority(v.as_bytes()))
        .transpose()?;
    let from_target = match uri.authority() {
        Some(a) => {
            if a.as_str().contains('@') {
                // Userinfo has no place in an http(s) target (RFC 9110 §4.2.4).
                return Err(TargetError::InvalidHost);
            }
            Some(parse_authority(a.as_str().as_bytes())?)
        }
        None => None,
    };
    match (from_target, from_field) {
        (Some(t), Some(f)) if version >= Version::HTTP_2 && t != f => {
            Err(TargetError::HostMismatch)
        }
        // HTTP/1.1 absolute form: the target's authority wins and `Host` is ignored
        // (RFC 9112 §3.2.2), but it must still be a valid field.
        (Some(t), _) => Ok(t),
        (None, Some(f)) => Ok(f),
        (None, None) if version == Version::HTTP_10 || version == Version::HTTP_09 => {
            Ok((String::new(), String::new()))
        }
        (None, None) => Err(TargetError::MissingHost),
    }
}

/// `host[:port]` → (host without port or trailing dot, `host[:port]`), both lowercase. The
/// host is a registered name (letters, digits, `-`, `.`, `_`), an IPv4 address, or an IPv6
/// literal in brackets; the port, if present, is 1 to 5 digits and at most 65535.
pub fn parse_authority(raw: &[u8]) -> Result<(String, String), TargetError> {
    let (host, port) = if raw.first() == Some(&b'[') {
        let close = raw
            .iter()
            .position(|&b| b == b']')
            .ok_or(TargetError::InvalidHost)?;
        let inside = &raw[1..close];
        if inside.is_empty()
            || !inside
                .iter()
                .all(|b| b.is_ascii_hexdigit() || *b == b':' || *b == b'.')
            || std::str::from_utf8(inside)
                .ok()
                .and_then(|s| s.parse::<std::net::Ipv6Addr>().ok())
                .is_none()
        {
            return Err(TargetError::InvalidHost);
        }
        let rest = &raw[close + 1..];
        let port = match rest {
            [] => None,
            [b':', p @ ..] => Some(p),
            _ => return Err(TargetError::InvalidHost),
        };
        (&raw[..=close], port)
    } else {
        match raw.iter().position(|&b| b == b':') {
            Some(i) => (&raw[..i], Some(&raw[i + 1..])),
            None => (raw, None),
        }
    };
    if let Some(p) = port {
        let valid = !p.is_empty()
            && p.len() <= 5
            && p.iter().all(u8::is_ascii_digit)
            && std::str::from_utf8(p)
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
                .is_some();
        if !valid {
            return Err(TargetError::InvalidHost);
        }
    }
    if host.first() != Some(&b'[') {
        let name_ok = !host.is_empty()
            && host.len() <= 253 + 1
            && host
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
            && !host.starts_with(b".")
            && !host.windows(2).any(|w| w == b"..");
        if !name_ok {
            return Err(TargetError::InvalidHost);
        }
    }
    let host =
        String::from_utf8(host.to_ascii_lowercase()).map_err(|_| TargetError::InvalidHost)?;
    let authority = match port {
        Some(p) => format!("{host}:{}", std::str::from_utf8(p).unwrap_or_default()),
        None => host.clone(),
    };
    let host = host.strip_suffix('.').map(str::to_string).unwrap_or(host);
    Ok((host, authority))
}

/// RFC 3986 unreserved characters: an escape of one of these means the character itself.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters a path keeps literally (RFC 3986 `pchar` less `%`, plus `/`); any other byte
/// is written as an escape.
fn path_literal(b: u8) -> bool {
    unreserved(b)
        || matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
        )
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// One unit of a path after decoding: a byte that stands for itself, a separator, or an
/// escape kept encoded (its byte value).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unit {
    Char(u8),
    Slash,
    Escaped(u8),
}

/// Normalizes an origin-form path (without its query): see the module doc.
pub fn normalize_path(raw: &[u8], policy: &PathPolicy) -> Result<String, TargetError> {
    if raw.first() != Some(&b'/') {
        return Err(TargetError::InvalidTarget);
    }
    let mut units = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        let unit = match b {
            b'%' => {
                let hi = raw.get(i + 1).copied().and_then(hex_value);
                let lo = raw.get(i + 2).copied().and_then(hex_value);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(TargetError::BadEscape);
                };
                i += 2;
                match hi << 4 | lo {
                    0 => return Err(TargetError::Nul),
                    b'/' => separator(policy.encoded_slash, b'/', TargetError::EncodedSlash)?,
                    b'\\' => separator(policy.backslash, b'\\', TargetError::Backslash)?,
                    d if unreserved(d) => Unit::Char(d),
                    d => Unit::Escaped(d),
                }
            }
            b'/' => Unit::Slash,
            b'\\' => separator(policy.backslash, b'\\', TargetError::Backslash)?,
            0 => return Err(TargetError::Nul),
            b if path_literal(b) => Unit::Char(b),
            b => Unit::Escaped(b),
        };
        units.push(unit);
        i += 1;
    }
    // Segments between separators; dot-segments removed (RFC 3986 §5.2.4), empty ones merged.
    let mut segments: Vec<&[Unit]> = Vec::new();
    let parts: Vec<&[Unit]> = units[1..].split(|u| *u == Unit::Slash).collect();
    let last = parts.len() - 1;
    for (n, seg) in parts.iter().enumerate() {
        let is_last = n == last;
        match *seg {
            [Unit::Char(b'.')] => {
                if is_last {
                    segments.push(&[]);
                }
            }
            [Unit::Char(b'.'), Unit::Char(b'.')] => {
                segments.pop();
                if is_last {
                    segments.push(&[]);
                }
            }
            [] if policy.merge_slashes && !is_last => {}
            seg => segments.push(seg),
        }
    }
    let mut out = String::with_capacity(raw.len());
    if segments.is_empty() {
        out.push('/');
    }
    for seg in segments {
        out.push('/');
        for u in seg {
            match *u {
                Unit::Char(c) => out.push(c as char),
                Unit::Escaped(c) => {
                    const HEX: &[u8; 16] = b"0123456789ABCDEF";
                    out.push('%');
                    out.push(HEX[(c >> 4) as usize] as char);
                    out.push(HEX[(c & 15) as usize] as char);
                }
                Unit::Slash => unreachable!("segments hold no separators"),
            }
        }
    }
    Ok(out)
}

/// The unit an encoded slash or a backslash becomes under `action`.
fn separator(action: SeparatorAction, byte: u8, refused: TargetError) -> Result<Unit, TargetError> {
    match action {
        SeparatorAction::Reject => Err(refused),
        SeparatorAction::Keep => Ok(Unit::Escaped(byte)),
        SeparatorAction::Decode => Ok(Unit::Slash),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn path(p: &str) -> Result<String, TargetError> {
        normalize_path(p.as_bytes(), &PathPolicy::default())
    }

    #[test]
    fn spellings_of_one_path_become_that_path() {
        for p in [
            "/admin",
            "//admin",
            "///admin",
            "/./admin",
            "/x/../admin",
            "/x/y/../../admin",
            "/%61dmin",
            "/%61%64%6D%69%6E",
            "/%2e/admin",
            "/%2E%2E/admin",
            "/x/%2e%2e/admin",
            "/../admin",
            "/admin/.",
            "/admin/x/..",
        ] {
            let want = if p.ends_with('.') {
                "/admin/"
            } else {
                "/admin"
            };
            assert_eq!(path(p).as_deref(), Ok(want), "{p}");
        }
    }

    #[test]
    fn other_escapes_stay_encoded_with_uppercase_hex() {
        assert_eq!(path("/a%20b").as_deref(), Ok("/a%20b"));
        assert_eq!(path("/a%3fb").as_deref(), Ok("/a%3Fb"));
        assert_eq!(path("/caf%c3%a9").as_deref(), Ok("/caf%C3%A9"));
        assert_eq!(path("/a:b@c;d=e").as_deref(), Ok("/a:b@c;d=e"));
        assert_eq!(path("/").as_deref(), Ok("/"));
        assert_eq!(path("/a/").as_deref(), Ok("/a/"));
        assert_eq!(path("/a//").as_deref(), Ok("/a/"));
    }

    #[test]
    fn bad_escapes_nul_and_relative_paths_are_refused() {
        assert_eq!(path("/a%"), Err(TargetError::BadEscape));
        assert_eq!(path("/a%4"), Err(TargetError::BadEscape));
        assert_eq!(path("/a%zz"), Err(TargetError::BadEscape));
        assert_eq!(path("/a%00"), Err(TargetError::Nul));
        assert_eq!(path("a"), Err(TargetError::InvalidTarget));
    }

    #[test]
    fn separators_follow_the_policy() {
        let with = |slash, back| PathPolicy {
            encoded_slash: slash,
            backslash: back,
            ..PathPolicy::default()
        };
        use SeparatorAction::*;
        assert_eq!(path("/a%2Fb"), Err(TargetError::EncodedSlash));
        assert_eq!(path("/a\\b"), Err(TargetError::Backslash));
        assert_eq!(path("/a%5cb"), Err(TargetError::Backslash));
        let keep = with(Keep, Keep);
        assert_eq!(normalize_path(b"/a%2fb", &keep).as_deref(), Ok("/a%2Fb"));
        assert_eq!(normalize_path(b"/a\\b", &keep).as_deref(), Ok("/a%5Cb"));
        let decode = with(Decode, Decode);
        assert_eq!(
            normalize_path(b"/x%2F..%2Fadmin", &decode).as_deref(),
            Ok("/admin")
        );
        assert_eq!(
            normalize_path(b"/x\\..\\admin", &decode).as_deref(),
            Ok("/admin")
        );
    }

    #[test]
    fn slashes_are_kept_when_merging_is_off() {
        let keep = PathPolicy {
            merge_slashes: false,
            ..PathPolicy::default()
        };
        assert_eq!(normalize_path(b"//a//b", &keep).as_deref(), Ok("//a//b"));
        assert_eq!(normalize_path(b"/a/./b", &keep).as_deref(), Ok("/a/b"));
    }

    #[test]
    fn normalizing_twice_changes_nothing() {
        for p in ["/a/../b//c/%7euser/./x%2a", "/%41%42/..%2f", "/q/%e2%82%ac"] {
            let policy = PathPolicy {
                encoded_slash: SeparatorAction::Keep,
                ..PathPolicy::default()
            };
            let once = normalize_path(p.as_bytes(), &policy).unwrap();
            assert_eq!(
                normalize_path(once.as_bytes(), &policy).unwrap(),
                once,
                "{p}"
            );
        }
    }

    /// The fuzz target's properties over seeded random inputs drawn from path-like bytes.
    #[test]
    fn random_paths_normalize_to_fixed_points() {
        let mut rng = fastrand::Rng::with_seed(32);
        let alphabet = b"/./%2e%2E%2f%5c\\aZ09-_~%41%7e?#@:; \x00\xff";
        let policies = [
            SeparatorAction::Reject,
            SeparatorAction::Keep,
            SeparatorAction::Decode,
        ];
        for _ in 0..50_000 {
            let len = rng.usize(0..24);
            let mut input = vec![b'/'];
            input.extend((0..len).map(|_| alphabet[rng.usize(..alphabet.len())]));
            let policy = PathPolicy {
                encoded_slash: policies[rng.usize(..3)],
                backslash: policies[rng.usize(..3)],
                merge_slashes: rng.bool(),
                ..PathPolicy::default()
            };
            let Ok(path) = normalize_path(&input, &policy) else {
                continue;
            };
            assert!(path.starts_with('/'), "{input:?} → {path:?}");
            assert!(
                path.split('/').all(|seg| seg != "." && seg != ".."),
                "{path:?}"
            );
            assert!(!policy.merge_slashes || !path.contains("//"), "{path:?}");
            assert_eq!(
                normalize_path(path.as_bytes(), &policy).as_deref(),
                Ok(path.as_str())
            );
            assert!(
                http::uri::PathAndQuery::try_from(path.as_str()).is_ok(),
                "{path:?}"
            );
        }
    }

    fn headers(hosts: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in hosts {
            h.append(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn host(version: Version, uri: &str, hosts: &[&str]) -> Result<(String, String), TargetError> {
        host_of(version, &uri.parse().unwrap(), &headers(hosts))
    }

    #[test]
    fn host_rules_of_http_1_1() {
        use Version as V;
        let ok = |h: &str, a: &str| Ok((h.to_string(), a.to_string()));
        assert_eq!(
            host(V::HTTP_11, "/", &["WWW.Example.:8443"]),
            ok("www.example", "www.example.:8443")
        );
        assert_eq!(host(V::HTTP_11, "/", &[]), Err(TargetError::MissingHost));
        assert_eq!(host(V::HTTP_10, "/", &[]), ok("", ""));
        assert_eq!(
            host(V::HTTP_11, "/", &["a", "b"]),
            Err(TargetError::DuplicateHost)
        );
        assert_eq!(
            host(V::HTTP_11, "/", &["a", "a"]),
            Err(TargetError::DuplicateHost)
        );
        for bad in [
            "name:abc", "name:", "a:99999", "a b", "", "[::1", "[zz]", "a..b", "x@y", ".a",
        ] {
            assert_eq!(
                host(V::HTTP_11, "/", &[bad]),
                Err(TargetError::InvalidHost),
                "{bad:?}"
            );
        }
        assert_eq!(
            host(V::HTTP_11, "/", &["[::1]:443"]),
            ok("[::1]", "[::1]:443")
        );
        assert_eq!(
            host(V::HTTP_11, "/", &["10.0.0.1"]),
            ok("10.0.0.1", "10.0.0.1")
        );
        // Absolute form: the target's authority replaces Host.
        assert_eq!(
            host(V::HTTP_11, "http://www.example/x", &["admin.example"]),
            ok("www.example", "www.example")
        );
        assert_eq!(
            host(V::HTTP_11, "http://u@www.example/x", &["www.example"]),
            Err(TargetError::InvalidHost)
        );
    }

    #[test]
    fn host_must_agree_with_authority_on_http_2_and_3() {
        for v in [Version::HTTP_2, Version::HTTP_3] {
            assert_eq!(
                host(v, "https://www.example/", &["admin.example"]),
                Err(TargetError::HostMismatch)
            );
            assert_eq!(
                host(v, "https://www.example/", &["WWW.example"]),
                Ok(("www.example".into(), "www.example".into()))
            );
            assert_eq!(
                host(v, "https://www.example/", &[]),
                Ok(("www.example".into(), "www.example".into()))
            );
            assert_eq!(
                host(v, "https://www.example:1/", &["www.example:2"]),
                Err(TargetError::HostMismatch)
            );
        }
    }
}
