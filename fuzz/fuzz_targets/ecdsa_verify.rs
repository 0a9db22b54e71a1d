//! Fuzzes `mbcrypto::ecdsa::P256PublicKey::verify`, the table verifier every ECDSA P-256
//! signature passes before release (signatures from key servers come off the network), against
//! aws-lc's verifier.
//!
//! Input: a flags byte, a digest, then signature bytes. The flags pick:
//! - the key: two random ones, d = 1 (Q = G, so both combs add multiples of one point) and
//!   d = n − 1 (Q = −G);
//! - the digest: SHA-256 (32 bytes), or SHA-384 / SHA-512 (48 / 64 bytes, of which ECDSA with
//!   P-256 uses the leftmost 32, as TLS 1.2 asks);
//! - whether the key signs the digest first, the rest of the input then XORed into that
//!   signature, so the fuzzer explores valid signatures and their near misses as well as
//!   garbage.
#![no_main]

use aws_lc_rs::digest::{Digest, SHA256, SHA384, SHA512};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    EcdsaKeyPair, KeyPair, ParsedPublicKey, ECDSA_P256_SHA256_ASN1, ECDSA_P256_SHA256_ASN1_SIGNING,
    ECDSA_P256_SHA384_ASN1, ECDSA_P256_SHA512_ASN1,
};
use libfuzzer_sys::fuzz_target;
use mbcrypto::ecdsa::P256PublicKey;
use std::sync::OnceLock;

struct Key {
    pair: EcdsaKeyPair,
    table: P256PublicKey,
    /// aws-lc's verifiers for SHA-256, SHA-384 and SHA-512 digests.
    parsed: [ParsedPublicKey; 3],
}

/// SEC1 ECPrivateKey { 1, d, [0] prime256v1 } for a 32-byte big-endian d.
fn sec1(d: &[u8; 32]) -> Vec<u8> {
    let mut der = vec![0x30, 0x31, 0x02, 0x01, 0x01, 0x04, 0x20];
    der.extend_from_slice(d);
    der.extend_from_slice(&[
        0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ]);
    der
}

fn key(pair: EcdsaKeyPair) -> Key {
    let point = pair.public_key().as_ref().to_vec();
    Key {
        table: P256PublicKey::from_sec1(&point).unwrap(),
        parsed: [
            &ECDSA_P256_SHA256_ASN1,
            &ECDSA_P256_SHA384_ASN1,
            &ECDSA_P256_SHA512_ASN1,
        ]
        .map(|alg| ParsedPublicKey::new(alg, &point).unwrap()),
        pair,
    }
}

fn keys() -> &'static [Key; 4] {
    static K: OnceLock<[Key; 4]> = OnceLock::new();
    K.get_or_init(|| {
        let alg = &ECDSA_P256_SHA256_ASN1_SIGNING;
        let random = || {
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &SystemRandom::new()).unwrap();
            key(EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref()).unwrap())
        };
        let mut one = [0u8; 32];
        one[31] = 1;
        // n − 1.
        let n_minus_1: [u8; 32] = [
            0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xff, 0xff, 0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2,
            0xfc, 0x63, 0x25, 0x50,
        ];
        let fixed = |d: &[u8; 32]| key(EcdsaKeyPair::from_private_key_der(alg, &sec1(d)).unwrap());
        [random(), random(), fixed(&one), fixed(&n_minus_1)]
    })
}

fuzz_target!(|data: &[u8]| {
    let [flags, rest @ ..] = data else {
        return;
    };
    let k = &keys()[usize::from(flags >> 1) & 3];
    let (hash, len, which) = match (flags >> 3) & 3 {
        1 => (&SHA384, 48, 1),
        2 => (&SHA512, 64, 2),
        _ => (&SHA256, 32, 0),
    };
    if rest.len() < len {
        return;
    }
    let (digest, tail) = rest.split_at(len);
    let sig = if flags & 1 == 1 {
        // Signed as the engines sign a P-256 digest: its leftmost 32 bytes.
        let signed = Digest::import_less_safe(&digest[..32], &SHA256).unwrap();
        let mut sig = k.pair.sign_digest(&signed).unwrap().as_ref().to_vec();
        for (s, x) in sig.iter_mut().zip(tail) {
            *s ^= x;
        }
        sig
    } else {
        tail.to_vec()
    };
    let want = k.parsed[which]
        .verify_digest_sig(&Digest::import_less_safe(digest, hash).unwrap(), &sig)
        .is_ok();
    assert_eq!(k.table.verify(digest, &sig), want);
});
