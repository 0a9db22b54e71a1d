//! The batch RSA path against BoringSSL: PKCS#1 v1.5 signatures byte-identical, PSS signatures
//! verified, over random keys and digests, on every backend this CPU runs.

use boring::hash::MessageDigest;
use boring::pkey::PKey;
use boring::rsa::{Padding, Rsa};
use boring::sign::{RsaPssSaltlen, Signer, Verifier};
use mbcrypto::rsa::{sign_batch, RsaKey, Scheme, SignJob};
use mbcrypto::{Backend, Hash};

struct TestKey {
    boring: PKey<boring::pkey::Private>,
    key: RsaKey,
}

fn keys(bits: u32, count: usize) -> Vec<TestKey> {
    (0..count)
        .map(|_| {
            let rsa = Rsa::generate(bits).unwrap();
            let der = rsa.private_key_to_der().unwrap();
            TestKey {
                key: RsaKey::from_der(&der).unwrap(),
                boring: PKey::from_rsa(rsa).unwrap(),
            }
        })
        .collect()
}

fn md(h: Hash) -> MessageDigest {
    match h {
        Hash::Sha256 => MessageDigest::sha256(),
        Hash::Sha384 => MessageDigest::sha384(),
        Hash::Sha512 => MessageDigest::sha512(),
    }
}

fn digest(h: Hash, msg: &[u8]) -> Vec<u8> {
    boring::hash::hash(md(h), msg).unwrap().to_vec()
}

/// Signs `rounds` batches of random messages with random keys from `keys` and checks each
/// against BoringSSL. Returns how many signatures were checked.
fn check(backend: Backend, keys: &[TestKey], rounds: usize, seed: u64) -> usize {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut checked = 0;
    for round in 0..rounds {
        let hash = [Hash::Sha256, Hash::Sha384, Hash::Sha512][round % 3];
        let pss = round % 4 == 3;
        let n = rng.usize(1..=backend.lanes() * 2);
        let picks: Vec<(usize, Vec<u8>)> = (0..n)
            .map(|_| {
                let len = rng.usize(0..200);
                (
                    rng.usize(..keys.len()),
                    (0..len).map(|_| rng.u8(..)).collect(),
                )
            })
            .collect();
        let digests: Vec<Vec<u8>> = picks.iter().map(|(_, m)| digest(hash, m)).collect();
        let scheme = if pss {
            Scheme::Pss(hash)
        } else {
            Scheme::Pkcs1(hash)
        };
        let jobs: Vec<SignJob> = picks
            .iter()
            .zip(&digests)
            .map(|((k, _), d)| SignJob {
                key: &keys[*k].key,
                scheme,
                digest: d,
            })
            .collect();
        let sigs = sign_batch(backend, &jobs);
        for (((k, msg), sig), _) in picks.iter().zip(sigs).zip(&digests) {
            let sig = sig.expect("signature");
            let pkey = &keys[*k].boring;
            if pss {
                let mut v = Verifier::new(md(hash), pkey).unwrap();
                v.set_rsa_padding(Padding::PKCS1_PSS).unwrap();
                v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
                v.update(msg).unwrap();
                assert!(
                    v.verify(&sig).unwrap(),
                    "PSS signature must verify ({backend})"
                );
            } else {
                let mut s = Signer::new(md(hash), pkey).unwrap();
                s.update(msg).unwrap();
                assert_eq!(
                    s.sign_to_vec().unwrap(),
                    sig,
                    "PKCS#1 v1.5 must equal BoringSSL ({backend})"
                );
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn rsa2048_matches_boringssl_on_every_backend() {
    let keys = keys(2048, 16);
    for backend in Backend::all_available() {
        let rounds = if backend == Backend::Portable {
            24
        } else {
            120
        };
        let n = check(backend, &keys, rounds, 1);
        assert!(n >= rounds, "{backend}: {n}");
    }
}

#[test]
fn rsa3072_and_4096_match_boringssl() {
    for (bits, count) in [(3072, 2), (4096, 2)] {
        let keys = keys(bits, count);
        for backend in Backend::all_available() {
            check(backend, &keys, 6, bits as u64);
        }
    }
}

#[test]
fn a_corrupted_lane_is_caught_and_only_that_lane_fails() {
    let keys = keys(2048, 2);
    for backend in Backend::all_available() {
        let d = digest(Hash::Sha256, b"fault");
        keys[1].key.inject_fault_once();
        let jobs: Vec<SignJob> = (0..backend.lanes().max(2))
            .map(|i| SignJob {
                key: &keys[i % 2].key,
                scheme: Scheme::Pkcs1(Hash::Sha256),
                digest: &d,
            })
            .collect();
        let out = sign_batch(backend, &jobs);
        assert_eq!(
            out[1],
            Err(mbcrypto::rsa::RsaError::FaultDetected),
            "{backend}"
        );
        assert!(
            out[0].is_ok() && out.iter().filter(|r| r.is_err()).count() == 1,
            "{backend}"
        );
    }
}

#[test]
fn unsupported_keys_are_refused_clearly() {
    let rsa = Rsa::generate(1024).unwrap();
    let err = RsaKey::from_der(&rsa.private_key_to_der().unwrap()).unwrap_err();
    assert!(err.to_string().contains("RSA-1024"), "{err}");
    assert!(RsaKey::from_der(b"\x30\x03\x02\x01\x00").is_err());
}

#[test]
fn the_timing_probe_runs_both_classes() {
    // The leak check itself is a benchmark (`rampart bench ct-rsa`); this only checks that the
    // harness measures both classes and computes a statistic.
    let keys = keys(2048, 1);
    let r = mbcrypto::rsa::dudect(Backend::best(), &keys[0].key, 40, 9);
    assert_eq!(r.fixed + r.random, 40);
    assert!(r.fixed > 0 && r.random > 0);
    assert!(r.t.iter().all(|(_, t)| t.is_finite()), "{r:?}");
}

/// A 1024-bit prime whose 52-bit limbs follow `template` (`Some(v)`: fixed, `None`: random),
/// with p - 1 prime to 65537. Limb 19 holds the top 36 bits.
fn prime_with_limbs(template: &[Option<u64>; 20], rng: &mut fastrand::Rng) -> boring::bn::BigNum {
    use boring::bn::{BigNum, BigNumContext};
    let mut ctx = BigNumContext::new().unwrap();
    let e = BigNum::from_u32(65537).unwrap();
    let mask = (1u64 << 52) - 1;
    for _ in 0..200_000 {
        let mut limbs: Vec<u64> = template
            .iter()
            .map(|t| t.unwrap_or_else(|| rng.u64(..) & mask))
            .collect();
        limbs[0] |= 1;
        limbs[19] &= (1 << 36) - 1;
        limbs[19] |= 0b11 << 34; // top two bits: p·q has 2048 bits
        let mut bytes = vec![0u8; 128];
        for (i, l) in limbs.iter().enumerate() {
            for b in 0..52 {
                let bit = i * 52 + b;
                if bit < 1024 && (l >> b) & 1 == 1 {
                    bytes[127 - bit / 8] |= 1 << (bit % 8);
                }
            }
        }
        let p = BigNum::from_slice(&bytes).unwrap();
        if !p.is_prime(20, &mut ctx).unwrap() {
            continue;
        }
        let mut pm1 = BigNum::new().unwrap();
        pm1.checked_sub(&p, &BigNum::from_u32(1).unwrap()).unwrap();
        let mut r = BigNum::new().unwrap();
        r.checked_rem(&pm1, &e, &mut ctx).unwrap();
        if r.num_bits() > 0 {
            return p;
        }
    }
    panic!("no prime found for the template");
}

/// An RSA-2048 key from two primes (d from phi; CRT parameters derived), as PKCS#1 DER.
fn key_from_primes(p: &boring::bn::BigNumRef, q: &boring::bn::BigNumRef) -> Vec<u8> {
    use boring::bn::{BigNum, BigNumContext};
    let mut ctx = BigNumContext::new().unwrap();
    let one = BigNum::from_u32(1).unwrap();
    let e = BigNum::from_u32(65537).unwrap();
    let (mut n, mut pm1, mut qm1, mut phi) = (
        BigNum::new().unwrap(),
        BigNum::new().unwrap(),
        BigNum::new().unwrap(),
        BigNum::new().unwrap(),
    );
    n.checked_mul(p, q, &mut ctx).unwrap();
    pm1.checked_sub(p, &one).unwrap();
    qm1.checked_sub(q, &one).unwrap();
    phi.checked_mul(&pm1, &qm1, &mut ctx).unwrap();
    let mut d = BigNum::new().unwrap();
    d.mod_inverse(&e, &phi, &mut ctx).unwrap();
    let (mut dp, mut dq, mut qinv) = (
        BigNum::new().unwrap(),
        BigNum::new().unwrap(),
        BigNum::new().unwrap(),
    );
    dp.checked_rem(&d, &pm1, &mut ctx).unwrap();
    dq.checked_rem(&d, &qm1, &mut ctx).unwrap();
    qinv.mod_inverse(q, p, &mut ctx).unwrap();
    let rsa = Rsa::from_private_components(
        n,
        e,
        d,
        p.to_owned().unwrap(),
        q.to_owned().unwrap(),
        dp,
        dq,
        qinv,
    )
    .unwrap();
    rsa.private_key_to_der().unwrap()
}

#[test]
fn keys_whose_limbs_hit_edge_values_match_boringssl() {
    let mut rng = fastrand::Rng::with_seed(52);
    let all_ones = Some((1u64 << 52) - 1);
    let mut t_ones = [all_ones; 20];
    t_ones[3] = None; // room to search
    let mut t_zeros = [Some(0u64); 20];
    t_zeros[0] = None;
    t_zeros[7] = None;
    let mut t_mixed: [Option<u64>; 20] = [None; 20];
    t_mixed[0] = all_ones;
    t_mixed[10] = Some(0);
    t_mixed[11] = all_ones;
    t_mixed[18] = Some(0);
    let mut t_low: [Option<u64>; 20] = [None; 20];
    t_low[0] = Some(1);
    t_low[1] = Some(0);
    t_low[5..9].fill(all_ones);
    let primes: Vec<_> = [t_ones, t_zeros, t_mixed, t_low]
        .iter()
        .map(|t| prime_with_limbs(t, &mut rng))
        .collect();
    let mut keys = Vec::new();
    for (a, b) in [(0, 1), (1, 0), (2, 3), (0, 2), (3, 1)] {
        let der = key_from_primes(&primes[a], &primes[b]);
        keys.push(TestKey {
            key: RsaKey::from_der(&der).expect("edge key prepares"),
            boring: PKey::from_rsa(Rsa::private_key_from_der(&der).unwrap()).unwrap(),
        });
    }
    for backend in Backend::all_available() {
        let rounds = if backend == Backend::Portable { 8 } else { 30 };
        check(backend, &keys, rounds, 77);
    }
}

/// The batched public-exponent check against BoringSSL's private-key operation: on every
/// backend this CPU runs, with keys of all three sizes mixed in one call and more items than
/// lanes, a true result for each real (signature, encoded message) pair, and false for a flipped
/// bit, a swapped pair, a signature not below n and one of the wrong length.
#[test]
fn verify_batch_checks_each_signature_with_the_public_exponent() {
    use mbcrypto::rsa::{verify_batch, RsaPublicKey, VerifyItem};
    let mut rng = fastrand::Rng::with_seed(5);
    let mut cases = Vec::new(); // (public key, signature, encoded message)
    for bits in [2048u32, 3072, 4096] {
        let rsa = Rsa::generate(bits).unwrap();
        let n = rsa.n().to_vec();
        let e = u64::from_str_radix(&rsa.e().to_hex_str().unwrap(), 16).unwrap();
        for _ in 0..if bits == 2048 { 11 } else { 3 } {
            let mut em: Vec<u8> = (0..n.len()).map(|_| rng.u8(..)).collect();
            em[0] = 0;
            let mut sig = vec![0u8; n.len()];
            rsa.private_encrypt(&em, &mut sig, Padding::NONE).unwrap();
            cases.push((e, n.clone(), sig, em));
        }
    }
    let publics: Vec<RsaPublicKey> = cases
        .iter()
        .map(|(e, n, _, _)| RsaPublicKey::new(n, *e).unwrap())
        .collect();
    for backend in Backend::all_available() {
        let items: Vec<VerifyItem> = cases
            .iter()
            .zip(&publics)
            .map(|((_, _, sig, em), key)| VerifyItem {
                key,
                signature: sig,
                expected: em,
            })
            .collect();
        assert!(
            verify_batch(backend, &items).iter().all(|&ok| ok),
            "{backend}"
        );
        // Faults: a flipped bit, the neighbour's message, n itself, a short signature.
        let mut flipped = cases[1].2.clone();
        flipped[40] ^= 0x04;
        let n_itself = cases[2].1.clone();
        let short = cases[3].2[1..].to_vec();
        fn item<'a>(
            key: &'a RsaPublicKey,
            signature: &'a [u8],
            expected: &'a [u8],
        ) -> VerifyItem<'a> {
            VerifyItem {
                key,
                signature,
                expected,
            }
        }
        let bad = [
            item(&publics[1], &flipped, &cases[1].3),
            item(&publics[4], &cases[4].2, &cases[5].3),
            item(&publics[2], &n_itself, &cases[2].3),
            item(&publics[3], &short, &cases[3].3),
            item(&publics[0], &cases[0].2, &cases[0].3),
        ];
        assert_eq!(
            verify_batch(backend, &bad),
            [false, false, false, false, true],
            "{backend}"
        );
    }
}
