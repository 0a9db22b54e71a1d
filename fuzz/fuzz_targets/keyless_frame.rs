//! Fuzzes the keyless frame and item parser (bytes a key server reads from the network):
//! decoding never panics, and whatever decodes re-encodes to a frame that decodes the same.
#![no_main]

use keyless::codec::{decode, encode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok(Some((msg, used))) = decode(rest) {
        let again = encode(&msg, false).expect("decoded messages re-encode");
        let (back, _) = decode(&again)
            .expect("re-encoded frame decodes")
            .expect("complete");
        assert_eq!(back, msg);
        rest = &rest[used..];
    }
});
