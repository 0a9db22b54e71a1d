//! Reads what certificate selection needs from a ClientHello's raw fields. Pure functions over
//! bytes from the network: bounds-checked, never panic.

/// ecdsa_secp256r1_sha256 (RFC 8446 §4.2.3).
const ECDSA_P256_SHA256: u16 = 0x0403;
/// In TLS 1.2, ECDSA with SHA-256, SHA-384 or SHA-512 on any curve (RFC 5246 §7.4.1.4.1): the
/// hash does not bind the curve there, so a P-256 key serves all three.
const TLS12_ECDSA: [u16; 3] = [0x0403, 0x0503, 0x0603];
/// TLS 1.2 ECDHE_ECDSA suites rampart can negotiate (AES-GCM, ChaCha20).
const ECDHE_ECDSA_SUITES: [u16; 3] = [0xC02B, 0xC02C, 0xCCA9];
const TLS13: u16 = 0x0304;

fn u16_list(data: &[u8], len_bytes: usize) -> impl Iterator<Item = u16> + '_ {
    let body: &[u8] = match len_bytes {
        1 => data
            .get(1..1 + *data.first().unwrap_or(&0) as usize)
            .unwrap_or(&[]),
        _ => data
            .get(..2)
            .map(|l| u16::from_be_bytes([l[0], l[1]]) as usize)
            .and_then(|n| data.get(2..2 + n))
            .unwrap_or(&[]),
    };
    body.chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
}

/// Whether the `signature_algorithms` extension body offers ECDSA P-256 with SHA-256.
pub fn offers_ecdsa_p256(sigalgs_ext: Option<&[u8]>) -> bool {
    sigalgs_ext.is_some_and(|e| u16_list(e, 2).any(|a| a == ECDSA_P256_SHA256))
}

/// Whether the `supported_versions` extension body offers TLS 1.3.
pub fn offers_tls13(supported_versions_ext: Option<&[u8]>) -> bool {
    supported_versions_ext.is_some_and(|e| u16_list(e, 1).any(|v| v == TLS13))
}

/// Whether the raw cipher-suite list (pairs of bytes) has a TLS 1.2 ECDHE_ECDSA suite.
pub fn offers_ecdhe_ecdsa_suite(ciphers: &[u8]) -> bool {
    ciphers
        .chunks_exact(2)
        .any(|c| ECDHE_ECDSA_SUITES.contains(&u16::from_be_bytes([c[0], c[1]])))
}

/// Whether the `signature_algorithms` extension body offers ECDSA with a hash rampart signs
/// with, as TLS 1.2 reads it.
pub fn offers_tls12_ecdsa(sigalgs_ext: Option<&[u8]>) -> bool {
    sigalgs_ext.is_some_and(|e| u16_list(e, 2).any(|a| TLS12_ECDSA.contains(&a)))
}

/// Whether an ECDSA P-256 certificate can serve this client. Over TLS 1.3 it must accept
/// ecdsa_secp256r1_sha256; over TLS 1.2, ECDSA with SHA-256, SHA-384 or SHA-512 and a suite
/// that authenticates with ECDSA.
pub fn can_use_ecdsa(
    sigalgs_ext: Option<&[u8]>,
    supported_versions_ext: Option<&[u8]>,
    ciphers: &[u8],
    tls13_enabled: bool,
) -> bool {
    if tls13_enabled && offers_tls13(supported_versions_ext) {
        return offers_ecdsa_p256(sigalgs_ext);
    }
    offers_tls12_ecdsa(sigalgs_ext) && offers_ecdhe_ecdsa_suite(ciphers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_signature_algorithms() {
        let ext = [0x00, 0x04, 0x08, 0x04, 0x04, 0x03];
        assert!(offers_ecdsa_p256(Some(&ext)));
        let rsa_only = [0x00, 0x04, 0x08, 0x04, 0x04, 0x01];
        assert!(!offers_ecdsa_p256(Some(&rsa_only)));
        assert!(!offers_ecdsa_p256(None));
    }

    #[test]
    fn truncated_or_lying_lengths_are_safe() {
        assert!(!offers_ecdsa_p256(Some(&[0x00])));
        assert!(!offers_ecdsa_p256(Some(&[0xff, 0xff, 0x04, 0x03])));
        assert!(!offers_tls13(Some(&[0x09, 0x03, 0x04])));
        assert!(!offers_ecdhe_ecdsa_suite(&[0xC0]));
    }

    #[test]
    fn tls12_client_needs_an_ecdsa_suite() {
        let sig = [0x00, 0x02, 0x04, 0x03];
        let v12 = [0x02, 0x03, 0x03];
        let v13 = [0x04, 0x03, 0x04, 0x03, 0x03];
        let rsa_suites = [0xC0, 0x2F, 0xC0, 0x30];
        assert!(!can_use_ecdsa(Some(&sig), Some(&v12), &rsa_suites, true));
        assert!(can_use_ecdsa(Some(&sig), Some(&v13), &rsa_suites, true));
        assert!(!can_use_ecdsa(Some(&sig), Some(&v13), &rsa_suites, false));
        assert!(can_use_ecdsa(Some(&sig), None, &[0xC0, 0x2B], false));
    }

    #[test]
    fn tls12_takes_ecdsa_with_any_hash_and_tls13_only_the_p256_scheme() {
        let sha384_only = [0x00, 0x02, 0x05, 0x03];
        let sha512_only = [0x00, 0x02, 0x06, 0x03];
        let v12 = [0x02, 0x03, 0x03];
        let v13 = [0x04, 0x03, 0x04, 0x03, 0x03];
        let ecdsa_suite = [0xC0, 0x2B];
        for sig in [&sha384_only, &sha512_only] {
            assert!(can_use_ecdsa(Some(sig), Some(&v12), &ecdsa_suite, true));
            assert!(can_use_ecdsa(Some(sig), None, &ecdsa_suite, true));
            assert!(!can_use_ecdsa(Some(sig), Some(&v13), &ecdsa_suite, true));
            assert!(can_use_ecdsa(Some(sig), Some(&v13), &ecdsa_suite, false));
        }
    }

    /// Deterministic random inputs through every parser (the cargo-fuzz target
    /// `fuzz/fuzz_targets/client_hello.rs` explores further): no input may panic.
    #[test]
    fn random_inputs_never_panic() {
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let cut = (next() as usize) % (len + 1);
            let (a, b) = bytes.split_at(cut);
            let _ = can_use_ecdsa(Some(a), Some(b), &bytes, true);
            let _ = offers_ecdhe_ecdsa_suite(a);
        }
    }
}
