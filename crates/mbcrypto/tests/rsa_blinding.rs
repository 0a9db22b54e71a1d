//! Blinding for an exponentiation run elsewhere, against BoringSSL's raw private operation:
//! blind on the lanes, exponentiate with BoringSSL (as the GPU would), unblind and check on the
//! lanes; the signature must be exactly em^d mod n, a corrupted result is never released, and
//! no two uses share a blinding factor.

use boring::bn::{BigNum, BigNumContext};
use boring::rsa::{Padding, Rsa};
use mbcrypto::rsa::{
    blind_batch, unblind_verify_batch, BlindJob, Blinding, RsaError, RsaPublicKey, UnblindJob,
};
use mbcrypto::Backend;

struct Key {
    rsa: Rsa<boring::pkey::Private>,
    public: RsaPublicKey,
    blinding: Blinding,
}

fn key(bits: u32, slots: usize) -> Key {
    let rsa = Rsa::generate(bits).unwrap();
    let n = rsa.n().to_vec();
    let public = RsaPublicKey::new(&n, 65537).unwrap();
    let (r, r_inv) = factor(&rsa);
    let blinding = Blinding::new(&public, &r, &r_inv, slots).unwrap();
    Key {
        rsa,
        public,
        blinding,
    }
}

/// A random r below n and its inverse, both at the modulus's length.
fn factor(rsa: &Rsa<boring::pkey::Private>) -> (Vec<u8>, Vec<u8>) {
    let mut ctx = BigNumContext::new().unwrap();
    let mut r = BigNum::new().unwrap();
    rsa.n().rand_range(&mut r).unwrap();
    let mut inv = BigNum::new().unwrap();
    inv.mod_inverse(&r, rsa.n(), &mut ctx).unwrap();
    let len = rsa.size() as usize;
    (
        r.to_vec_padded(len).unwrap(),
        inv.to_vec_padded(len).unwrap(),
    )
}

/// x^d mod n by BoringSSL (no padding): what the GPU computes.
fn raw_private(rsa: &Rsa<boring::pkey::Private>, x: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; rsa.size() as usize];
    let len = rsa.private_decrypt(x, &mut out, Padding::NONE).unwrap();
    out.truncate(len);
    out
}

/// A random message below n at the modulus's length (top byte zero).
fn message(len: usize, rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
    m[0] = 0;
    m
}

#[test]
fn blinded_results_unblind_to_the_exact_signature_on_every_backend() {
    let keys = [key(2048, 4), key(3072, 4), key(2048, 1)];
    let mut rng = fastrand::Rng::with_seed(7);
    for backend in Backend::all_available() {
        // More jobs than lanes and slots, keys and sizes mixed in one batch.
        let picks: Vec<usize> = (0..2 * backend.lanes() + 3)
            .map(|i| i % keys.len())
            .collect();
        let msgs: Vec<Vec<u8>> = picks
            .iter()
            .map(|&k| message(keys[k].public.signature_len(), &mut rng))
            .collect();
        let jobs: Vec<BlindJob> = picks
            .iter()
            .zip(&msgs)
            .map(|(&k, m)| BlindJob {
                key: &keys[k].public,
                blinding: &keys[k].blinding,
                message: m,
            })
            .collect();
        let blinded: Vec<_> = blind_batch(backend, &jobs)
            .into_iter()
            .map(|b| b.expect("blinded"))
            .collect();
        for (b, m) in blinded.iter().zip(&msgs) {
            assert_ne!(&b.input[..], &m[..], "{backend}: the input must be blinded");
        }
        let outputs: Vec<Vec<u8>> = picks
            .iter()
            .zip(&blinded)
            .map(|(&k, b)| raw_private(&keys[k].rsa, &b.input))
            .collect();
        let mut corrupt = outputs.clone();
        corrupt[1][40] ^= 0x10;
        for (outs, faulty) in [(&outputs, None), (&corrupt, Some(1))] {
            let jobs: Vec<UnblindJob> = (0..picks.len())
                .map(|i| UnblindJob {
                    key: &keys[picks[i]].public,
                    output: &outs[i],
                    unblind: &blinded[i].unblind,
                    expected: &msgs[i],
                })
                .collect();
            let sigs = unblind_verify_batch(backend, &jobs);
            for (i, sig) in sigs.iter().enumerate() {
                if Some(i) == faulty {
                    assert!(sig.is_none(), "{backend}: a corrupted result was released");
                } else {
                    let want = raw_private(&keys[picks[i]].rsa, &msgs[i]);
                    assert_eq!(sig.as_deref(), Some(&want[..]), "{backend}: job {i}");
                }
            }
        }
    }
}

#[test]
fn no_two_uses_share_a_blinding_factor() {
    // Two slots: slot 0 gives r, r², r⁴, …; slot 1 must not give any of those.
    let k = key(2048, 2);
    let mut rng = fastrand::Rng::with_seed(9);
    let msg = message(256, &mut rng);
    let backend = Backend::best();
    let mut inputs = std::collections::HashSet::new();
    for _ in 0..12 {
        let jobs = [BlindJob {
            key: &k.public,
            blinding: &k.blinding,
            message: &msg,
        }];
        let b = blind_batch(backend, &jobs).pop().unwrap().unwrap();
        assert!(
            inputs.insert(b.input.to_vec()),
            "a blinding factor came back"
        );
    }
}

#[test]
fn bad_factors_and_inputs_are_refused() {
    let k = key(2048, 1);
    let (r, _) = factor(&k.rsa);
    let (_, other_inv) = factor(&k.rsa);
    assert_eq!(
        Blinding::new(&k.public, &r, &other_inv, 1).unwrap_err(),
        RsaError::Blinding
    );
    let n = k.rsa.n().to_vec();
    let short = vec![1u8; 255];
    for m in [&n[..], &short[..]] {
        let jobs = [BlindJob {
            key: &k.public,
            blinding: &k.blinding,
            message: m,
        }];
        let r = blind_batch(Backend::best(), &jobs).pop().unwrap();
        assert_eq!(r.err(), Some(RsaError::OutOfRange));
    }
    // An output not below n is not released.
    let b = blind_batch(
        Backend::best(),
        &[BlindJob {
            key: &k.public,
            blinding: &k.blinding,
            message: &[0u8; 256],
        }],
    )
    .pop()
    .unwrap()
    .unwrap();
    let job = UnblindJob {
        key: &k.public,
        output: &n,
        unblind: &b.unblind,
        expected: &n,
    };
    assert_eq!(unblind_verify_batch(Backend::best(), &[job]), vec![None]);
}
