//! Fuzzes the ClientHello field parsers that certificate selection runs on bytes from the
//! network (signature_algorithms, supported_versions, cipher suites).
#![no_main]

use gateway::tls::client_hello::{
    can_use_ecdsa, offers_ecdhe_ecdsa_suite, offers_ecdsa_p256, offers_tls13,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Split the input into the three fields at two positions taken from its first bytes.
    let (a, b) = match data {
        [x, y, rest @ ..] => (
            *x as usize % (rest.len() + 1),
            *y as usize % (rest.len() + 1),
        ),
        _ => return,
    };
    let rest = &data[2..];
    let (lo, hi) = (a.min(b), a.max(b));
    let (sig, vers, ciphers) = (&rest[..lo], &rest[lo..hi], &rest[hi..]);
    let _ = offers_ecdsa_p256(Some(sig));
    let _ = offers_tls13(Some(vers));
    let _ = offers_ecdhe_ecdsa_suite(ciphers);
    let _ = can_use_ecdsa(Some(sig), Some(vers), ciphers, data.len() % 2 == 0);
});
