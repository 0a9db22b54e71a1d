//! Blinding for an RSA private-key exponentiation that runs elsewhere (the GPU engine's
//! kernel), on the lanes: [`blind_batch`] turns each encoded message into em·r^e mod n, the
//! value to raise to d, and an [`Unblinder`]; [`unblind_verify_batch`] multiplies each result
//! by r⁻¹ and releases it only if it raised to e gives the encoded message back.
//!
//! A [`Blinding`] holds one key's pairs (r^e·R, r⁻¹·R) in the lanes' Montgomery form; a pair
//! is squared after every use. Slot i starts at r^(2i+1), so a slot's factors are
//! r^((2i+1)·2^k) and no two uses of any slots share a factor (their odd parts differ).

use super::{
    interleave_lanes, lane_of, public_pass, take_slots, BlindPair, RsaError, RsaPublicKey, Slots,
};
use crate::bignum::{bytes_to_limbs, limbs_to_bytes};
use crate::{mont, Backend};
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use zeroize::{Zeroize, Zeroizing};

/// One key's blinding pairs for [`blind_batch`]. `Debug` shows only the slot count.
pub struct Blinding {
    half: usize,
    slots: Vec<Mutex<BlindPair>>,
    next: AtomicUsize,
}

impl std::fmt::Debug for Blinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blinding({} slots)", self.slots.len())
    }
}

/// r⁻¹·R mod n for one blinded request, in the lanes' limbs; zeroized on drop.
pub struct Unblinder(Vec<u64>);

impl Drop for Unblinder {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// What [`blind_batch`] made of one message.
pub struct Blinded {
    /// em·r^e mod n, big-endian, the modulus's length: what the private exponent is applied to.
    pub input: Zeroizing<Vec<u8>>,
    /// The factor that turns the exponentiation's result into the signature.
    pub unblind: Unblinder,
}

impl Blinding {
    /// `slots` pairs (at least one) from a secret r below n and its inverse r⁻¹ mod n (both
    /// big-endian), which the caller computed with the private key. Refused unless r·r⁻¹ is 1.
    pub fn new(key: &RsaPublicKey, r: &[u8], r_inv: &[u8], slots: usize) -> Result<Self, RsaError> {
        let wide = 2 * key.half;
        let (n, k0) = (&key.n, key.n_k0);
        let r = Zeroizing::new(bytes_to_limbs(r, wide));
        let r_inv = Zeroizing::new(bytes_to_limbs(r_inv, wide));
        let mut unit = vec![0u64; wide];
        unit[0] = 1;
        if super::mont_mul(&r, &r_inv, n, k0) != super::mont_mul(&unit, &unit, n, k0) {
            // r·r⁻¹·R⁻¹ must equal 1·1·R⁻¹.
            return Err(RsaError::Blinding);
        }
        let mut r_e = Zeroizing::new(vec![0u64; wide]);
        // SAFETY: the portable backend needs no CPU feature; every buffer has one lane of the
        // limb counts the pass expects for this key size.
        unsafe {
            mont::public_fn(Backend::Portable, key.half)(
                &r,
                n,
                &[k0],
                &key.n_rr,
                &[key.e],
                &mut r_e,
            )
        };
        let to_mont = |x: &[u64]| super::mont_mul(x, &key.n_rr, n, k0);
        let mut cur = BlindPair {
            blind: to_mont(&r_e),
            unblind: to_mont(&r_inv),
        };
        let step = BlindPair {
            blind: super::mont_mul(&cur.blind, &cur.blind, n, k0),
            unblind: super::mont_mul(&cur.unblind, &cur.unblind, n, k0),
        };
        let mut pairs = Vec::with_capacity(slots.max(1));
        for _ in 0..slots.max(1) {
            let next = BlindPair {
                blind: super::mont_mul(&cur.blind, &step.blind, n, k0),
                unblind: super::mont_mul(&cur.unblind, &step.unblind, n, k0),
            };
            pairs.push(Mutex::new(std::mem::replace(&mut cur, next)));
        }
        Ok(Blinding {
            half: key.half,
            slots: pairs,
            next: AtomicUsize::new(0),
        })
    }

    fn slots(&self) -> Slots<'_> {
        Slots {
            pairs: &self.slots,
            next: &self.next,
        }
    }
}

/// One message to blind with `key`'s pairs in `blinding`: `message` is the encoded message,
/// big-endian, the modulus's length, below n.
pub struct BlindJob<'a> {
    pub key: &'a RsaPublicKey,
    pub blinding: &'a Blinding,
    pub message: &'a [u8],
}

/// Blinds every message, `backend.lanes()` at a time (jobs may mix keys and sizes), each with
/// its own pair, and squares the pairs used. A message of the wrong length, not below n, or
/// with a blinding made for another size is refused.
pub fn blind_batch(backend: Backend, jobs: &[BlindJob]) -> Vec<Result<Blinded, RsaError>> {
    assert!(
        backend.available(),
        "backend {backend} is not available on this CPU"
    );
    let lanes = backend.lanes();
    let mut results: Vec<Option<Result<Blinded, RsaError>>> = Vec::with_capacity(jobs.len());
    results.resize_with(jobs.len(), || None);
    for half in [20, 30, 40] {
        let wide = 2 * half;
        let same: Vec<usize> = (0..jobs.len())
            .filter(|&i| jobs[i].key.half == half)
            .filter(|&i| {
                let j = &jobs[i];
                let ok = j.blinding.half == half
                    && j.message.len() == j.key.len
                    && super::below(j.message, &j.key.n_be);
                if !ok {
                    results[i] = Some(Err(RsaError::OutOfRange));
                }
                ok
            })
            .collect();
        let mut rest = &same[..];
        while !rest.is_empty() {
            // As many of the next lane group as there are free slots for (at least one).
            let owners: Vec<Slots> = rest[..rest.len().min(lanes)]
                .iter()
                .map(|&i| jobs[i].blinding.slots())
                .collect();
            let mut slots = take_slots(&owners);
            let (chunk, tail) = rest.split_at(slots.len());
            rest = tail;
            let pick = |l: usize| &jobs[chunk[l.min(chunk.len() - 1)]];
            let msgs: Vec<Zeroizing<Vec<u64>>> = (0..lanes)
                .map(|l| Zeroizing::new(bytes_to_limbs(pick(l).message, wide)))
                .collect();
            let msg = Zeroizing::new(interleave_lanes(lanes, wide, |l| msgs[l].as_slice()));
            let n = interleave_lanes(lanes, wide, |l| pick(l).key.n.as_slice());
            let k0: Vec<u64> = (0..lanes).map(|l| pick(l).key.n_k0).collect();
            // Spare lanes repeat the last job's pair (their results are not kept).
            let lane_slot = |l: usize| l.min(chunk.len() - 1);
            let mut blind = Zeroizing::new(interleave_lanes(lanes, wide, |l| {
                slots[lane_slot(l)].blind.as_slice()
            }));
            let mut unblind = Zeroizing::new(interleave_lanes(lanes, wide, |l| {
                slots[lane_slot(l)].unblind.as_slice()
            }));
            let factors: Vec<Unblinder> = (0..chunk.len())
                .map(|l| Unblinder(lane_of(&unblind, lanes, l)))
                .collect();
            let mut out = Zeroizing::new(vec![0u64; wide * lanes]);
            // SAFETY: the backend's availability was asserted above; every buffer holds
            // `lanes` lanes of `wide` limbs for this size, messages are below their moduli and
            // the pairs below twice theirs.
            unsafe {
                mont::blind_fn(backend, half)(&msg, &n, &k0, &mut blind, &mut unblind, &mut out)
            };
            for (l, slot) in slots.iter_mut().enumerate() {
                slot.blind.zeroize();
                slot.unblind.zeroize();
                slot.blind = lane_of(&blind, lanes, l);
                slot.unblind = lane_of(&unblind, lanes, l);
            }
            drop(slots);
            for ((l, &i), unblind) in chunk.iter().enumerate().zip(factors) {
                let mut limbs = lane_of(&out, lanes, l);
                let input = Zeroizing::new(limbs_to_bytes(&limbs, jobs[i].key.len));
                limbs.zeroize();
                results[i] = Some(Ok(Blinded { input, unblind }));
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every job answered"))
        .collect()
}

/// One result to unblind and check: `output` (big-endian, the modulus's length) is what the
/// exponentiation returned for a [`Blinded`] input, `expected` the encoded message it was made
/// from.
pub struct UnblindJob<'a> {
    pub key: &'a RsaPublicKey,
    pub output: &'a [u8],
    pub unblind: &'a Unblinder,
    pub expected: &'a [u8],
}

/// For each job, the signature s = output·r⁻¹ mod n, released only if s^e mod n is exactly
/// `expected`; `None` for one that is not (a fault), or whose output is not below n.
/// `backend.lanes()` at a time; jobs may mix keys and sizes.
pub fn unblind_verify_batch(backend: Backend, jobs: &[UnblindJob]) -> Vec<Option<Vec<u8>>> {
    assert!(
        backend.available(),
        "backend {backend} is not available on this CPU"
    );
    let lanes = backend.lanes();
    let mut results: Vec<Option<Vec<u8>>> = vec![None; jobs.len()];
    for half in [20, 30, 40] {
        let wide = 2 * half;
        let same: Vec<usize> = (0..jobs.len())
            .filter(|&i| {
                let j = &jobs[i];
                j.key.half == half
                    && j.unblind.0.len() == wide
                    && j.output.len() == j.key.len
                    && j.expected.len() == j.key.len
                    && super::below(j.output, &j.key.n_be)
            })
            .collect();
        for chunk in same.chunks(lanes) {
            let pick = |l: usize| &jobs[chunk[l.min(chunk.len() - 1)]];
            let outputs: Vec<Vec<u64>> = (0..lanes)
                .map(|l| bytes_to_limbs(pick(l).output, wide))
                .collect();
            let output = interleave_lanes(lanes, wide, |l| outputs[l].as_slice());
            let unblind = Zeroizing::new(interleave_lanes(lanes, wide, |l| &pick(l).unblind.0));
            let keys: Vec<&RsaPublicKey> = (0..lanes).map(|l| pick(l).key).collect();
            let n = interleave_lanes(lanes, wide, |l| &keys[l].n);
            let k0: Vec<u64> = keys.iter().map(|k| k.n_k0).collect();
            // A lane that fails its check holds a faulty signature here, from which n could be
            // factored: wiped on drop like the factors.
            let mut sig = Zeroizing::new(vec![0u64; wide * lanes]);
            // SAFETY: the backend's availability was asserted above; every buffer holds
            // `lanes` lanes of `wide` limbs for this size.
            unsafe { mont::mul_fn(backend, half)(&output, &unblind, &n, &k0, &mut sig) };
            // Outputs are below their moduli, so the signatures (fully reduced) are too.
            let check = public_pass(backend, half, &keys, &sig);
            for (l, &i) in chunk.iter().enumerate() {
                if lane_of(&check, lanes, l) == bytes_to_limbs(jobs[i].expected, wide) {
                    results[i] = Some(limbs_to_bytes(&lane_of(&sig, lanes, l), jobs[i].key.len));
                }
            }
        }
    }
    results
}
