//! Fuzzes the request-target normalizer, the first phase of every request: the path and
//! `Host` parsers must never panic; a normalized path must start with `/`, hold no
//! dot-segment, no `//` (slashes merged), no escape of an unreserved character, and must
//! normalize to itself (so what rules match is what goes upstream); a parsed authority must
//! be lowercase and parse to the same host again.
#![no_main]

use gateway::request_target::{normalize_path, parse_authority, PathPolicy, SeparatorAction};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, input)) = data.split_first() else {
        return;
    };
    let action = |bits: u8| match bits % 3 {
        0 => SeparatorAction::Reject,
        1 => SeparatorAction::Keep,
        _ => SeparatorAction::Decode,
    };
    let policy = PathPolicy {
        encoded_slash: action(mode),
        backslash: action(mode >> 2),
        merge_slashes: true,
        ..PathPolicy::default()
    };
    if let Ok(path) = normalize_path(input, &policy) {
        assert!(path.starts_with('/'), "{path:?}");
        assert!(!path.contains("//"), "{path:?}");
        for seg in path.split('/') {
            assert!(seg != "." && seg != "..", "{path:?}");
        }
        let bytes = path.as_bytes();
        for (i, _) in path.match_indices('%') {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("two hex digits");
            assert_eq!(hex, hex.to_ascii_uppercase(), "{path:?}");
            let c = u8::from_str_radix(hex, 16).expect("hex");
            let unreserved = c.is_ascii_alphanumeric() || b"-._~".contains(&c);
            assert!(!unreserved, "an unreserved character left escaped: {path:?}");
        }
        assert!(path.bytes().all(|b| b.is_ascii_graphic()), "{path:?}");
        assert_eq!(normalize_path(path.as_bytes(), &policy).as_deref(), Ok(path.as_str()));
        assert!(http::uri::PathAndQuery::try_from(path.as_str()).is_ok(), "{path:?}");
    }
    if let Ok((host, authority)) = parse_authority(input) {
        assert_eq!(host, host.to_ascii_lowercase());
        assert!(authority.starts_with(host.as_str()));
        let again = parse_authority(authority.as_bytes()).expect("an authority parses again");
        assert_eq!(again.0, host);
        assert!(http::HeaderValue::from_str(&authority).is_ok());
    }
});
