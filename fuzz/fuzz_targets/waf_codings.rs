//! Fuzzes what a WAF route does with a coded body (a client's request body or an upstream's
//! response body) and a client's `Accept-Encoding`: decoding gzip or deflate bytes split
//! across frames must never panic or make more than the limit (a small body cannot expand
//! into a large one), and a gzipped body comes back as its first `limit` bytes, reported cut
//! only when it was longer; narrowing any `Accept-Encoding` leaves one field naming only gzip,
//! deflate or identity.
#![no_main]

use gateway::waf_codings::{accept_readable, Coding, CodedPrefix};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let coding = match mode % 3 {
        0 => Coding::Identity,
        1 => Coding::Gzip,
        _ => Coding::Deflate,
    };
    let limit = u64::from(mode >> 2) * 64 + 1;
    let split = rest.len() / 2;
    let prefix = CodedPrefix {
        parts: vec![
            bytes::Bytes::copy_from_slice(&rest[..split]),
            bytes::Bytes::copy_from_slice(&rest[split..]),
        ],
        coding,
        limit,
    };
    let (out, cut) = prefix.decoded();
    if coding == Coding::Identity {
        assert_eq!((out.as_slice(), cut), (rest, false));
    } else {
        assert!(out.len() as u64 <= limit);
    }
    // The same bytes gzipped come back as their first `limit`, cut only when longer.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, rest).expect("in memory");
    let prefix = CodedPrefix {
        parts: vec![bytes::Bytes::from(gz.finish().expect("in memory"))],
        coding: Coding::Gzip,
        limit,
    };
    let (out, cut) = prefix.decoded();
    let keep = rest.len().min(limit as usize);
    assert_eq!((out.as_slice(), cut), (&rest[..keep], rest.len() as u64 > limit));

    let Ok(value) = http::HeaderValue::from_bytes(rest) else {
        return;
    };
    let mut h = http::HeaderMap::new();
    h.append(http::header::ACCEPT_ENCODING, value.clone());
    h.append(http::header::ACCEPT_ENCODING, value);
    accept_readable(&mut h);
    let all: Vec<_> = h.get_all(http::header::ACCEPT_ENCODING).iter().collect();
    assert_eq!(all.len(), 1);
    for element in all[0].to_str().expect("visible ASCII").split(',') {
        let name = element.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        assert!(
            matches!(name.as_str(), "gzip" | "x-gzip" | "deflate" | "identity"),
            "{all:?}"
        );
    }
});
