//! Helpers over header fields shared by the pipeline's phases, the traffic split, load
//! balancing, compression and the WAF: comma-separated lists, media types, cookies, and what a
//! request is known by (a request key) with the stable hash both spread users by.

use http::{HeaderMap, HeaderName};

/// The elements of a comma-separated header list, over all of its fields, trimmed (their
/// parameters, after `;`, kept).
pub(crate) fn list_elements<'a>(
    h: &'a HeaderMap,
    name: &HeaderName,
) -> impl Iterator<Item = &'a str> {
    h.get_all(name)
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// The content codings a request's `Accept-Encoding` accepts: each element's coding name
/// (as sent) and the element whole (its parameters kept), those with `q=0` left out.
pub(crate) fn accepted_codings(h: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    list_elements(h, &http::header::ACCEPT_ENCODING).filter_map(|element| {
        let mut parts = element.split(';');
        let name = parts.next().unwrap_or("").trim();
        let refused = parts.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .and_then(|q| q.trim().parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        (!name.is_empty() && !refused).then_some((name, element))
    })
}

/// The media type of `h`'s `Content-Type` (`type/subtype`, lowercase, its parameters
/// dropped); `None` without one, or when its value is not visible ASCII.
pub(crate) fn media_type(h: &HeaderMap) -> Option<String> {
    h.get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
}

/// The (name, value) pairs of `h`'s `Cookie` headers, as sent.
pub(crate) fn cookies(h: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    h.get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
}

/// The value of cookie `name` in `h`'s `Cookie` headers (the first, as sent).
pub(crate) fn cookie<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    cookies(h).find(|(k, _)| *k == name).map(|(_, v)| v)
}

/// What a request is known by (a route's `sticky` split, a cluster's `hash_key`), built from a
/// validated [`crate::config::RequestKeyConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RequestKey {
    Header(HeaderName),
    Cookie(String),
    ClientAddress,
}

impl RequestKey {
    pub fn new(cfg: &crate::config::RequestKeyConfig) -> RequestKey {
        match (&cfg.header, &cfg.cookie) {
            (Some(h), _) => {
                RequestKey::Header(HeaderName::from_bytes(h.as_bytes()).expect("validated"))
            }
            (_, Some(c)) => RequestKey::Cookie(c.clone()),
            _ => RequestKey::ClientAddress,
        }
    }

    /// The request's key, if it has one.
    pub fn of<'h>(
        &self,
        headers: &'h HeaderMap,
        client: std::net::IpAddr,
    ) -> Option<std::borrow::Cow<'h, str>> {
        match self {
            RequestKey::Header(h) => headers.get(h).and_then(|v| v.to_str().ok()).map(Into::into),
            RequestKey::Cookie(name) => cookie(headers, name).map(Into::into),
            RequestKey::ClientAddress => Some(client.to_string().into()),
        }
    }
}

/// FNV-1a from `seed`, then a 64-bit finalizer (so close keys spread): the same on every
/// gateway and release, so a fleet agrees on where each user goes.
pub(crate) fn stable_hash(data: &[u8], seed: u64) -> u64 {
    let mut h = data.iter().fold(0xcbf2_9ce4_8422_2325u64 ^ seed, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}
