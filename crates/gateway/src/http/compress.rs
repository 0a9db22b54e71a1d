//! Response compression (a route's `compress`): gzip for text-like responses a client accepts
//! gzip for, streamed chunk by chunk as the upstream sends them (each chunk flushed, so a
//! streamed response is not held back), level 4 (most of the ratio for a fraction of the CPU of
//! the higher levels).

use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use std::io::Write;

/// Responses shorter than this (when their length is known) are not worth compressing.
pub const MIN_LENGTH: u64 = 1024;
const LEVEL: u32 = 4;

/// Whether a request's `Accept-Encoding` takes gzip (with a non-zero q).
pub fn accepts_gzip(h: &HeaderMap) -> bool {
    crate::http::headers::accepted_codings(h)
        .any(|(name, _)| name.eq_ignore_ascii_case("gzip") || name == "*")
}

/// Whether a response (to a request with `method`) should be gzipped: a 200 with a body, a
/// text-like type, no encoding of its own, no `no-transform`, not known to be tiny.
pub fn worth_it(method: &Method, status: StatusCode, h: &HeaderMap) -> bool {
    if status != StatusCode::OK
        || method == Method::HEAD
        || h.contains_key(header::CONTENT_ENCODING)
    {
        return false;
    }
    let no_transform = h
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("no-transform"));
    let short = h
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n < MIN_LENGTH);
    let ctype = super::headers::media_type(h).unwrap_or_default();
    let text_like = ctype.starts_with("text/")
        || ctype.ends_with("+json")
        || ctype.ends_with("+xml")
        || matches!(
            ctype.as_str(),
            "application/json"
                | "application/javascript"
                | "application/xml"
                | "application/wasm"
                | "image/svg+xml"
        );
    text_like && !no_transform && !short
}

/// Marks a response as gzipped: `Content-Encoding`, `Vary`, no `Content-Length` (the length
/// changes) and no strong `ETag` (the bytes change).
pub fn mark(h: &mut HeaderMap) {
    h.remove(header::CONTENT_LENGTH);
    h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    h.append(header::VARY, HeaderValue::from_static("accept-encoding"));
    if let Some(tag) = h.get(header::ETAG).cloned() {
        if !tag.as_bytes().starts_with(b"W/") {
            let mut weak = b"W/".to_vec();
            weak.extend_from_slice(tag.as_bytes());
            match HeaderValue::from_bytes(&weak) {
                Ok(v) => h.insert(header::ETAG, v),
                Err(_) => h.remove(header::ETAG),
            };
        }
    }
}

/// A gzip stream fed a chunk at a time.
pub struct Gzip {
    enc: Option<GzEncoder<Vec<u8>>>,
}

impl Default for Gzip {
    fn default() -> Self {
        Gzip {
            enc: Some(GzEncoder::new(Vec::new(), Compression::new(LEVEL))),
        }
    }
}

impl Gzip {
    /// The compressed bytes for `data`, flushed so the client can decode them now.
    pub fn chunk(&mut self, data: &[u8]) -> Bytes {
        let Some(enc) = self.enc.as_mut() else {
            return Bytes::new();
        };
        // Writing to a Vec cannot fail.
        let _ = enc.write_all(data);
        let _ = enc.flush();
        Bytes::from(std::mem::take(enc.get_mut()))
    }

    /// The stream's last bytes (its trailer); empty once finished.
    pub fn finish(&mut self) -> Bytes {
        self.enc
            .take()
            .and_then(|e| e.finish().ok())
            .map(Bytes::from)
            .unwrap_or_default()
    }

    pub fn is_finished(&self) -> bool {
        self.enc.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn accept_encoding_is_read_with_its_weights() {
        let accepts = |v: &str| accepts_gzip(&headers(&[("accept-encoding", v)]));
        assert!(accepts("gzip"));
        assert!(accepts("br, GZIP;q=0.5"));
        assert!(accepts("*"));
        assert!(!accepts("br"));
        assert!(!accepts("gzip;q=0"));
        assert!(!accepts("gzipx"));
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    #[test]
    fn only_text_like_untransformed_bodies_are_compressed() {
        let ok = |h: &[(&str, &str)]| worth_it(&Method::GET, StatusCode::OK, &headers(h));
        assert!(ok(&[("content-type", "text/html; charset=utf-8")]));
        assert!(ok(&[("content-type", "application/json")]));
        assert!(ok(&[("content-type", "application/problem+json")]));
        assert!(!ok(&[("content-type", "image/png")]));
        assert!(!ok(&[
            ("content-type", "text/plain"),
            ("content-encoding", "br")
        ]));
        assert!(!ok(&[
            ("content-type", "text/plain"),
            ("cache-control", "public, no-transform")
        ]));
        assert!(!ok(&[
            ("content-type", "text/plain"),
            ("content-length", "100")
        ]));
        assert!(ok(&[
            ("content-type", "text/plain"),
            ("content-length", "5000")
        ]));
        let text = headers(&[("content-type", "text/plain")]);
        assert!(!worth_it(&Method::HEAD, StatusCode::OK, &text));
        assert!(!worth_it(&Method::GET, StatusCode::PARTIAL_CONTENT, &text));
    }

    #[test]
    fn marking_drops_the_length_and_weakens_the_etag() {
        let mut h = headers(&[("content-length", "5000"), ("etag", "\"abc\"")]);
        mark(&mut h);
        assert!(!h.contains_key("content-length"));
        assert_eq!(h["content-encoding"], "gzip");
        assert_eq!(h["vary"], "accept-encoding");
        assert_eq!(h["etag"], "W/\"abc\"");
    }

    #[test]
    fn chunks_decode_as_they_come_and_whole_at_the_end() {
        let mut gz = Gzip::default();
        let text = "the quick brown fox jumps over the lazy dog\n".repeat(200);
        let mut out = Vec::new();
        for part in text.as_bytes().chunks(1000) {
            out.extend_from_slice(&gz.chunk(part));
        }
        // Everything so far decodes before the end (each chunk was flushed).
        let mut partial = Vec::new();
        let _ = flate2::read::GzDecoder::new(&out[..]).read_to_end(&mut partial);
        assert_eq!(partial, text.as_bytes());
        out.extend_from_slice(&gz.finish());
        assert!(gz.is_finished() && gz.finish().is_empty());
        let mut whole = Vec::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_end(&mut whole)
            .unwrap();
        assert_eq!(whole, text.as_bytes());
        assert!(out.len() < text.len() / 10, "{} bytes", out.len());
    }
}
