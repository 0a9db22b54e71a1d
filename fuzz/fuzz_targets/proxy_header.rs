//! Fuzzes the PROXY protocol header parser, which reads the first bytes of every TCP
//! connection on a listener with `proxy_protocol = true`: it must never panic, never claim a
//! header longer than its input or than the limits (107 bytes for version 1, `V2_MAX` for
//! version 2), and must answer the same for every prefix of a complete header that it
//! answers `Incomplete` for (so reading more never turns a header into an error).
#![no_main]

use gateway::proxy_protocol::{parse, Parsed, V2_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Parsed::Header { len, .. }) => {
            assert!(len <= data.len());
            assert!(len <= V2_MAX);
            // The header alone parses the same, and every shorter prefix is incomplete.
            assert_eq!(parse(&data[..len]), parse(data));
            for n in 0..len {
                assert_eq!(parse(&data[..n]), Ok(Parsed::Incomplete), "prefix of {n}");
            }
        }
        Ok(Parsed::Incomplete) => assert!(data.len() <= V2_MAX),
        Err(_) => {}
    }
});
