//! Fuzzes `mbcrypto::ecdsa::P256PublicKey::verify`, the table verifier every ECDSA P-256
//! signature passes before release (signatures from key servers come off the network), against
//! aws-lc's verifier. Input: a flags byte, a 32-byte digest, then signature bytes. With the
//! flags' low bit set, the key signs the digest and the rest of the input is XORed into that
//! signature, so the fuzzer explores valid signatures and their near misses as well as garbage.
#![no_main]

use aws_lc_rs::digest::{Digest, SHA256};
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{
    EcdsaKeyPair, KeyPair, ParsedPublicKey, ECDSA_P256_SHA256_ASN1,
    ECDSA_P256_SHA256_ASN1_SIGNING,
};
use libfuzzer_sys::fuzz_target;
use mbcrypto::ecdsa::P256PublicKey;
use std::sync::OnceLock;

struct Fixture {
    pair: EcdsaKeyPair,
    table: P256PublicKey,
    parsed: ParsedPublicKey,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &SystemRandom::new())
                .unwrap();
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).unwrap();
        let point = pair.public_key().as_ref();
        Fixture {
            table: P256PublicKey::from_sec1(point).unwrap(),
            parsed: ParsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, point).unwrap(),
            pair,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let [flags, rest @ ..] = data else {
        return;
    };
    if rest.len() < 32 {
        return;
    }
    let (digest, tail) = rest.split_at(32);
    let sig = if flags & 1 == 1 {
        let mut sig = f
            .pair
            .sign_digest(&Digest::import_less_safe(digest, &SHA256).unwrap())
            .unwrap()
            .as_ref()
            .to_vec();
        for (s, x) in sig.iter_mut().zip(tail) {
            *s ^= x;
        }
        sig
    } else {
        tail.to_vec()
    };
    let want = f
        .parsed
        .verify_digest_sig(&Digest::import_less_safe(digest, &SHA256).unwrap(), &sig)
        .is_ok();
    assert_eq!(f.table.verify(digest, &sig), want);
});
