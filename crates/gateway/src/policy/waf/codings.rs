//! The content codings the WAF reads bodies through. A body in gzip or deflate (a request's,
//! phase 2, or a response's, phase 4) is decoded on the inspection thread, never past the
//! route's limit, so a small compressed body cannot expand into a large one
//! ([`CodedPrefix::decoded`]); a request body in another coding is refused on a blocking
//! route, since the application may decode what the WAF cannot. A route that reads response
//! bodies asks its upstream only for codings it can decode ([`accept_readable`]).

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING};
use http::{HeaderMap, HeaderValue};
use std::io::Read;

/// A content coding the WAF can read a body through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    /// `gzip` (or its alias `x-gzip`), one member or several.
    Gzip,
    /// `deflate`: zlib's format as RFC 9110 says, or raw deflate as some servers send it.
    Deflate,
}

impl Coding {
    /// The coding a `Content-Encoding` or `Accept-Encoding` name stands for, if readable.
    fn named(name: &str) -> Option<Coding> {
        match name.to_ascii_lowercase().as_str() {
            "identity" => Some(Coding::Identity),
            "gzip" | "x-gzip" => Some(Coding::Gzip),
            "deflate" => Some(Coding::Deflate),
            _ => None,
        }
    }

    /// A request's or response's coding (its `Content-Encoding`), when the WAF can read
    /// through it: `None` for one it cannot (`br`, `zstd`, an unknown one) or for codings
    /// stacked on each other.
    pub fn of_message(headers: &HeaderMap) -> Option<Coding> {
        let mut applied = crate::http::headers::list_elements(headers, &CONTENT_ENCODING)
            .filter(|c| !c.is_empty())
            .map(Coding::named)
            .filter(|c| *c != Some(Coding::Identity));
        match (applied.next(), applied.next()) {
            (None, _) => Some(Coding::Identity),
            (Some(one), None) => one,
            (Some(_), Some(_)) => None,
        }
    }
}

/// Narrows a request's `Accept-Encoding` to the codings phase 4 reads through (gzip and
/// deflate, with the client's preferences), or to `identity` when the client accepts neither:
/// the upstream then answers in a coding the WAF can read, and the client still gets one it
/// accepts. Codings the client refuses (`q=0`) are left out, so `identity` stays acceptable.
pub fn accept_readable(h: &mut HeaderMap) {
    let kept: Vec<&str> = crate::http::headers::accepted_codings(h)
        .filter(|(name, _)| Coding::named(name).is_some())
        .map(|(_, element)| element)
        .collect();
    let value = match kept.join(", ") {
        v if v.is_empty() => HeaderValue::from_static("identity"),
        v => HeaderValue::from_str(&v).unwrap_or(HeaderValue::from_static("identity")),
    };
    h.insert(ACCEPT_ENCODING, value);
}

/// A body's first bytes as they were read for inspection: at most the route's limit of them,
/// still in their coding.
pub struct CodedPrefix {
    pub parts: Vec<Bytes>,
    pub coding: Coding,
    pub limit: u64,
}

impl CodedPrefix {
    /// No body (one not read: its type, or a coding not read through).
    pub fn empty() -> Self {
        CodedPrefix {
            parts: Vec::new(),
            coding: Coding::Identity,
            limit: 0,
        }
    }

    /// What the inspection reads: the prefix decoded, at most `limit` bytes of it; and whether some
    /// of what was read went uninspected (its decoded bytes ran past the limit, or it did not
    /// decode: a corrupt body, or an encoded one cut at the limit).
    pub fn decoded(self) -> (Vec<u8>, bool) {
        let raw = self.parts.concat();
        let input = &raw[..];
        let mut decoder: Box<dyn Read + '_> = match self.coding {
            Coding::Identity => return (raw, false),
            Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
            Coding::Deflate if zlib_header(input) => {
                Box::new(flate2::read::ZlibDecoder::new(input))
            }
            Coding::Deflate => Box::new(flate2::read::DeflateDecoder::new(input)),
        };
        let limit = usize::try_from(self.limit).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        // One byte past the limit says whether there was more; never more than that is made.
        let read = (&mut decoder)
            .take(self.limit.saturating_add(1))
            .read_to_end(&mut out);
        let cut = read.is_err() || out.len() > limit;
        out.truncate(limit);
        (out, cut)
    }
}

/// Whether `b` starts with a zlib header (RFC 1950: deflate, and a check value that makes the
/// first two bytes a multiple of 31).
fn zlib_header(b: &[u8]) -> bool {
    b.len() >= 2 && b[0] & 0x0f == 8 && (u16::from(b[0]) << 8 | u16::from(b[1])) % 31 == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_response_is_read_through_one_known_coding_only() {
        let coding = |v: &[&str]| {
            let pairs: Vec<_> = v.iter().map(|v| ("content-encoding", *v)).collect();
            Coding::of_message(&headers(&pairs))
        };
        assert_eq!(coding(&[]), Some(Coding::Identity));
        assert_eq!(coding(&["identity"]), Some(Coding::Identity));
        assert_eq!(coding(&["GZIP"]), Some(Coding::Gzip));
        assert_eq!(coding(&["x-gzip"]), Some(Coding::Gzip));
        assert_eq!(coding(&["identity", "deflate"]), Some(Coding::Deflate));
        assert_eq!(coding(&["br"]), None);
        assert_eq!(coding(&["zstd"]), None);
        assert_eq!(coding(&["gzip, gzip"]), None, "stacked");
        assert_eq!(
            coding(&["deflate", "gzip"]),
            None,
            "stacked over two fields"
        );
    }

    #[test]
    fn the_upstream_is_asked_only_for_codings_the_waf_reads() {
        let narrowed = |v: Option<&str>| {
            let mut h = headers(&v.map(|v| vec![("accept-encoding", v)]).unwrap_or_default());
            accept_readable(&mut h);
            let all: Vec<_> = h.get_all(ACCEPT_ENCODING).iter().collect();
            assert_eq!(all.len(), 1, "one field");
            all[0].to_str().unwrap().to_string()
        };
        assert_eq!(narrowed(Some("gzip, deflate, br, zstd")), "gzip, deflate");
        assert_eq!(
            narrowed(Some("br;q=1.0, gzip;q=0.8, *;q=0.1")),
            "gzip;q=0.8"
        );
        assert_eq!(narrowed(Some("br")), "identity");
        assert_eq!(narrowed(Some("*")), "identity");
        assert_eq!(narrowed(None), "identity");
        // Refusing identity while accepting only what cannot be read: identity is asked for.
        assert_eq!(narrowed(Some("br, identity;q=0")), "identity");
        assert_eq!(narrowed(Some("gzip;q=0, deflate")), "deflate");
    }

    fn prefix(coding: Coding, bytes: &[u8], limit: u64) -> (Vec<u8>, bool) {
        // Split, as frames arrive.
        let (a, b) = bytes.split_at(bytes.len() / 3);
        CodedPrefix {
            parts: vec![Bytes::copy_from_slice(a), Bytes::copy_from_slice(b)],
            coding,
            limit,
        }
        .decoded()
    }

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn gzip_and_both_deflates_decode_up_to_the_limit() {
        let page = b"<html>Query failed: You have an error in your SQL syntax</html>".repeat(8);
        assert_eq!(
            prefix(Coding::Identity, &page, 1 << 20),
            (page.clone(), false)
        );
        assert_eq!(
            prefix(Coding::Gzip, &gzip(&page), 1 << 20),
            (page.clone(), false)
        );
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&page).unwrap();
        let zlib = z.finish().unwrap();
        assert_eq!(
            prefix(Coding::Deflate, &zlib, 1 << 20),
            (page.clone(), false)
        );
        let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        d.write_all(&page).unwrap();
        let raw = d.finish().unwrap();
        assert!(!zlib_header(&raw));
        assert_eq!(
            prefix(Coding::Deflate, &raw, 1 << 20),
            (page.clone(), false)
        );
        // Two gzip members are one body.
        let mut two = gzip(&page[..100]);
        two.extend(gzip(&page[100..]));
        assert_eq!(prefix(Coding::Gzip, &two, 1 << 20), (page.clone(), false));
    }

    #[test]
    fn a_small_body_that_expands_stops_at_the_limit() {
        // 64 MiB of zeros in about 64 KiB: only the limit's worth is ever made.
        let bomb = gzip(&vec![0u8; 64 << 20]);
        assert!(bomb.len() < 100 * 1024, "{}", bomb.len());
        let (out, cut) = prefix(Coding::Gzip, &bomb, 4096);
        assert_eq!((out.len(), cut), (4096, true));
        assert!(out.iter().all(|&b| b == 0));
        // Exactly the limit is not cut.
        let (out, cut) = prefix(Coding::Gzip, &gzip(&[7u8; 4096]), 4096);
        assert_eq!((out.len(), cut), (4096, false));
    }

    #[test]
    fn a_body_that_does_not_decode_keeps_what_did_and_says_so() {
        let page = b"first part of the page, then the body stops ".repeat(20);
        let gz = gzip(&page);
        let (out, cut) = prefix(Coding::Gzip, &gz[..gz.len() / 2], 1 << 20);
        assert!(cut);
        assert!(page.starts_with(&out), "a prefix of the page");
        let (out, cut) = prefix(Coding::Gzip, b"not gzip at all", 1 << 20);
        assert!(cut && out.is_empty());
    }
}
