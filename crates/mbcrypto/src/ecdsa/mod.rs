//! ECDSA P-256 signing from a pool of precomputed nonces.
//!
//! A signature needs a fresh nonce k, the point k·G and k⁻¹ mod n; only the last step,
//! s = k⁻¹·(z + r·d) mod n, involves the key and the message. [`NoncePool`] precomputes
//! (k⁻¹, r = x(k·G) mod n) pairs in batches, off the request path: [`NoncePool::refill`] is
//! meant for idle-time threads. A batch runs the fixed-base comb over the backend's lanes
//! (8 nonces at once with AVX-512 IFMA), then pays one field inversion for every affine x and
//! one scalar inversion for every k⁻¹ (Montgomery's trick). [`sign`] takes a pair, uses it
//! once and wipes it; with the pool empty it signs directly ([`sign_direct`]) and counts a
//! fallback. The pool does not depend on the key, so one pool serves every P-256 key.
//!
//! Secrets (d, k, k⁻¹) are handled in constant time: no branch or memory index depends on
//! them, table lookups scan every entry with masks, and buffers holding them are wiped.

mod kernel;
mod verify;

pub use verify::P256PublicKey;

use crate::bignum::{bytes_to_limbs, limbs_to_bytes};
use crate::Backend;
use kernel::{consts, NL, NW};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use zeroize::{Zeroize, Zeroizing};

/// Why a key was not loaded or a signature not produced. Never carries key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EcdsaError {
    #[error("not a P-256 private key (SEC1 or PKCS#8 DER)")]
    NotP256,
    #[error("the digest is empty")]
    EmptyDigest,
    #[error("system randomness failed")]
    Randomness,
}

/// A P-256 private key. `Debug` prints no key material; the scalar is wiped on drop.
pub struct P256Key {
    /// d·R mod n (Montgomery form, so one multiplication gives r·d).
    d_m: [u64; NL],
}

impl fmt::Debug for P256Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("P256Key(..)")
    }
}

impl Drop for P256Key {
    fn drop(&mut self) {
        self.d_m.zeroize();
    }
}

/// The DER of the prime256v1 OID's value, and the prefix of the SEC 2 curve OIDs (P-384,
/// P-521, secp256k1...).
const P256_OID: &[u8] = &[0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07];
const SECG_CURVE_OID: &[u8] = &[0x06, 0x05, 0x2B, 0x81, 0x04, 0x00];

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

impl P256Key {
    /// Loads a SEC1 ECPrivateKey or PKCS#8 PrivateKeyInfo (DER). A key naming another curve,
    /// or whose scalar is not in [1, n−1], is refused.
    pub fn from_der(der: &[u8]) -> Result<Self, EcdsaError> {
        if !contains(der, P256_OID) && contains(der, SECG_CURVE_OID) {
            return Err(EcdsaError::NotP256);
        }
        let raw = crate::der::ec_private_scalar(der).ok_or(EcdsaError::NotP256)?;
        // Up to 32 bytes, or more with leading zeros; checked without branching on the bytes.
        let extra = raw.len().saturating_sub(32);
        let high = raw[..extra].iter().fold(0u8, |acc, b| acc | b);
        let tail = &raw[extra..];
        let mut be = Zeroizing::new([0u8; 32]);
        be[32 - tail.len()..].copy_from_slice(tail);
        let mut words = Zeroizing::new(be_to_words(&be));
        let valid = scalar_in_range(&words) & (std::hint::black_box(high) == 0);
        let mut d = Zeroizing::new(kernel::words_to_limbs(*words));
        words.zeroize();
        if !valid {
            return Err(EcdsaError::NotP256);
        }
        let d_m = kernel::mul_n(&d, &consts().rr_n);
        d.zeroize();
        Ok(P256Key { d_m })
    }
}

fn be_to_words(be: &[u8; 32]) -> [u64; 4] {
    let mut w = [0u64; 4];
    for (i, chunk) in be.rchunks_exact(8).enumerate() {
        w[i] = u64::from_be_bytes(chunk.try_into().expect("8 bytes"));
    }
    w
}

/// 1 ≤ k < n, computed without branches on k (the caller may branch on the answer).
fn scalar_in_range(k: &[u64; 4]) -> bool {
    let mut borrow = 0u64;
    for (a, b) in k.iter().zip(kernel::N_WORDS) {
        let (t, b1) = a.overflowing_sub(b);
        let (_, b2) = t.overflowing_sub(borrow);
        borrow = (b1 | b2) as u64;
    }
    let nonzero = k.iter().fold(0, |acc, w| acc | w) != 0;
    std::hint::black_box(borrow) == 1 && nonzero
}

/// Pool sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Most nonces held.
    pub capacity: usize,
    /// [`NoncePool::needs_refill`] answers true below this many.
    pub refill_below: usize,
    /// Nonces computed per kernel batch (rounded up to the backend's lanes). Larger batches
    /// spread the two inversions further (with 8 lanes: 5.3 µs per nonce at 32, 4.9 at 64,
    /// 4.7 at 128, see `examples/ecdsa_rate.rs`), at the cost of a longer refill call.
    pub batch: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            capacity: 8192,
            refill_below: 4096,
            batch: 128,
        }
    }
}

/// Pool counters since creation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Nonces added to the pool.
    pub generated: u64,
    /// Nonces taken by [`sign`].
    pub taken: u64,
    /// Signatures [`sign`] made directly because the pool was empty (or disabled).
    pub fallbacks: u64,
    /// Fresh nonces whose r repeated one already made: a broken random source or kernel.
    /// The first disables the pool for good ([`NoncePool::is_disabled`]).
    pub repeated_r: u64,
}

/// How many recent r values a refill's fresh ones are checked against (two pools' worth at
/// the default capacity). With a working random source a repeat has probability ~2⁻²⁵⁶.
const RECENT_R: usize = 16_384;

/// The r values of recent nonces, by fingerprint (their limbs hashed), oldest first.
#[derive(Default)]
struct RecentR {
    order: std::collections::VecDeque<u64>,
    seen: std::collections::HashSet<u64>,
}

impl RecentR {
    /// Records `r`; false if it was already among the recent ones.
    fn admit(&mut self, r: &[u64; NL]) -> bool {
        use std::hash::{BuildHasher, Hasher};
        // A keyed hash: an r chosen to collide with another would first have to be an r.
        let mut h = self.hasher().build_hasher();
        for limb in r {
            h.write_u64(*limb);
        }
        let fp = h.finish();
        if !self.seen.insert(fp) {
            return false;
        }
        self.order.push_back(fp);
        if self.order.len() > RECENT_R {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }

    fn hasher(&self) -> &std::collections::hash_map::RandomState {
        self.seen.hasher()
    }
}

/// One precomputed pair: r = x(k·G) mod n and k⁻¹·R mod n, both fully reduced limbs.
#[derive(Clone, Copy)]
struct Nonce {
    r: [u64; NL],
    kinv_m: [u64; NL],
}

impl Nonce {
    fn wipe(&mut self) {
        self.r.zeroize();
        self.kinv_m.zeroize();
    }
}

struct Slots {
    buf: Vec<Nonce>,
    len: usize,
}

impl Drop for Slots {
    fn drop(&mut self) {
        for n in self.buf.iter_mut() {
            n.wipe();
        }
    }
}

/// Precomputed nonces shared by every P-256 key and thread. Each pair is handed out once and
/// its slot wiped as it leaves.
pub struct NoncePool {
    config: PoolConfig,
    backend: Backend,
    slots: Mutex<Slots>,
    generated: AtomicU64,
    taken: AtomicU64,
    fallbacks: AtomicU64,
    /// The health check: fresh r values against recent ones.
    recent: Mutex<RecentR>,
    repeated_r: AtomicU64,
    /// Set at the first repeated r: the pool serves no nonce again.
    disabled: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for NoncePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NoncePool")
            .field("config", &self.config)
            .field("backend", &self.backend)
            .field("len", &self.len())
            .finish()
    }
}

impl NoncePool {
    /// An empty pool computing with `backend`. Panics if the CPU cannot run `backend` or
    /// `config.batch` is 0.
    pub fn new(config: PoolConfig, backend: Backend) -> Self {
        assert!(
            backend.available(),
            "backend {backend} is not available on this CPU"
        );
        assert!(config.batch > 0, "batch must be at least 1");
        let empty = Nonce {
            r: [0; NL],
            kinv_m: [0; NL],
        };
        NoncePool {
            config,
            backend,
            slots: Mutex::new(Slots {
                buf: vec![empty; config.capacity],
                len: 0,
            }),
            generated: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            recent: Mutex::new(RecentR::default()),
            repeated_r: AtomicU64::new(0),
            disabled: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether a repeated r has disabled the pool: every signature is then made with a
    /// nonce computed on the spot, and the operator should be alerted (a repeated nonce
    /// across two signatures reveals the private key).
    pub fn is_disabled(&self) -> bool {
        self.disabled.load(Ordering::Relaxed)
    }

    /// The health check of fresh nonces: false (and the pool disabled, its nonces wiped) if
    /// any r repeats one of the batch or of the recent ones.
    fn healthy(&self, fresh: &[Nonce]) -> bool {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let repeats = fresh.iter().filter(|n| !recent.admit(&n.r)).count();
        drop(recent);
        if repeats == 0 {
            return true;
        }
        self.repeated_r.fetch_add(repeats as u64, Ordering::Relaxed);
        self.disabled.store(true, Ordering::Relaxed);
        let mut s = self.lock();
        let len = s.len;
        for n in s.buf[..len].iter_mut() {
            n.wipe();
        }
        s.len = 0;
        false
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        // A panic while holding the lock leaves the slots consistent (len moves last).
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nonces ready.
    pub fn len(&self) -> usize {
        self.lock().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.config.capacity
    }

    pub fn config(&self) -> PoolConfig {
        self.config
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether the pool has fallen below `refill_below`.
    pub fn needs_refill(&self) -> bool {
        self.len() < self.config.refill_below
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            generated: self.generated.load(Ordering::Relaxed),
            taken: self.taken.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            repeated_r: self.repeated_r.load(Ordering::Relaxed),
        }
    }

    /// Computes up to `max` nonces (fewer when the pool fills), in batches of
    /// `config.batch`, computing outside the lock. Returns how many were added. Meant for
    /// idle-time threads; several may refill at once. Stops early (returning what it added) if
    /// system randomness fails.
    pub fn refill(&self, max: usize) -> usize {
        if self.is_disabled() {
            return 0;
        }
        let lanes = kernel::group_lanes(self.backend);
        let mut added = 0;
        while added < max {
            let free = self.capacity() - self.len();
            let want = (max - added).min(free).min(self.config.batch);
            if want == 0 {
                break;
            }
            let kind = Kernel::Batch(self.backend);
            let Ok(mut fresh) = generate(kind, want.div_ceil(lanes) * lanes) else {
                break;
            };
            if self.is_disabled() || !self.healthy(&fresh) {
                for n in fresh.iter_mut() {
                    n.wipe();
                }
                break;
            }
            let pushed = {
                let mut s = self.lock();
                let room = s.buf.len() - s.len;
                let count = room.min(want);
                for n in fresh.iter().take(count) {
                    let at = s.len;
                    s.buf[at] = *n;
                    s.len += 1;
                }
                count
            };
            for n in fresh.iter_mut() {
                n.wipe();
            }
            self.generated.fetch_add(pushed as u64, Ordering::Relaxed);
            added += pushed;
            if pushed < want {
                break; // another thread filled the pool
            }
        }
        added
    }

    fn take(&self) -> Option<Nonce> {
        let mut s = self.lock();
        if s.len == 0 || self.is_disabled() {
            return None;
        }
        s.len -= 1;
        let at = s.len;
        let n = s.buf[at];
        s.buf[at].wipe();
        drop(s);
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(n)
    }
}

/// Which nonce kernel runs: a backend's batch kernel, or the one-nonce portable one.
#[derive(Clone, Copy)]
enum Kernel {
    Batch(Backend),
    Single,
}

impl Kernel {
    fn lanes(self) -> usize {
        match self {
            Kernel::Batch(b) => kernel::group_lanes(b),
            Kernel::Single => 1,
        }
    }
}

/// `count` fresh nonce pairs (a multiple of the kernel's lanes).
fn generate(kind: Kernel, count: usize) -> Result<Vec<Nonce>, EcdsaError> {
    let lanes = kind.lanes();
    debug_assert_eq!(count % lanes, 0);
    let groups = count / lanes;
    let fe = NL * lanes;
    let mut ks = Zeroizing::new(vec![0u64; groups * fe]);
    let mut digits = Zeroizing::new(vec![0u64; groups * NW * lanes]);
    let mut bytes = Zeroizing::new([0u8; 32]);
    for i in 0..count {
        let (g, lane) = (i / lanes, i % lanes);
        let k = loop {
            aws_lc_rs::rand::fill(&mut bytes[..]).map_err(|_| EcdsaError::Randomness)?;
            let w = Zeroizing::new(be_to_words(&bytes));
            // Rejection sampling: reveals only that a discarded candidate was out of range.
            if scalar_in_range(&w) {
                break w;
            }
        };
        let limbs = Zeroizing::new(kernel::words_to_limbs(*k));
        for j in 0..NL {
            ks[g * fe + j * lanes + lane] = limbs[j];
        }
        let d = Zeroizing::new(kernel::digits_of(&k));
        for w in 0..NW {
            digits[(g * NW + w) * lanes + lane] = d[w];
        }
    }
    let mut r = vec![0u64; groups * fe];
    let mut kinv = Zeroizing::new(vec![0u64; groups * fe]);
    let f = match kind {
        Kernel::Batch(b) => kernel::nonce_fn(b),
        Kernel::Single => kernel::nonce_single,
    };
    // SAFETY: callers only pass backends whose `available()` is true (checked when the pool
    // is built, or `Portable`); the buffers hold `groups` groups in the layout the kernel
    // documents.
    unsafe { f(consts(), kernel::table(), &digits, &ks, &mut r, &mut kinv) };
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let (g, lane) = (i / lanes, i % lanes);
        let mut n = Nonce {
            r: [0; NL],
            kinv_m: [0; NL],
        };
        for j in 0..NL {
            n.r[j] = r[g * fe + j * lanes + lane];
            n.kinv_m[j] = kinv[g * fe + j * lanes + lane];
        }
        out.push(n);
    }
    Ok(out)
}

/// z: the leftmost 256 bits of the digest, reduced mod n.
fn digest_scalar(digest: &[u8]) -> [u64; NL] {
    let take = digest.len().min(32);
    let z = bytes_to_limbs(&digest[..take], NL);
    kernel::reduce_n(&z.try_into().expect("5 limbs"))
}

/// s = k⁻¹·(z + r·d) mod n and the DER signature, or `None` when r or s is 0.
fn finish(key: &P256Key, nonce: &Nonce, z: &[u64; NL]) -> Option<Vec<u8>> {
    if nonce.r == [0; NL] {
        return None; // r is public
    }
    let mut rd = Zeroizing::new(kernel::mul_n(&nonce.r, &key.d_m));
    let mut t = Zeroizing::new(kernel::add_n(z, &rd));
    let s = kernel::mul_n(&t, &nonce.kinv_m);
    rd.zeroize();
    t.zeroize();
    if s == [0; NL] {
        return None; // s is public
    }
    Some(der_signature(
        &limbs_to_bytes(&nonce.r, 32),
        &limbs_to_bytes(&s, 32),
    ))
}

/// ECDSA-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }.
fn der_signature(r: &[u8], s: &[u8]) -> Vec<u8> {
    fn integer(out: &mut Vec<u8>, be: &[u8]) {
        let start = be.iter().position(|&b| b != 0).unwrap_or(be.len() - 1);
        let v = &be[start..];
        let pad = v[0] & 0x80 != 0;
        out.push(0x02);
        out.push((v.len() + pad as usize) as u8);
        if pad {
            out.push(0);
        }
        out.extend_from_slice(v);
    }
    let mut body = Vec::with_capacity(72);
    integer(&mut body, r);
    integer(&mut body, s);
    let mut out = Vec::with_capacity(body.len() + 2);
    out.push(0x30);
    out.push(body.len() as u8);
    out.extend_from_slice(&body);
    out
}

/// Signs `digest` with a nonce from `pool`; with the pool empty, signs directly and counts a
/// fallback. Returns a DER ECDSA-Sig-Value.
pub fn sign(key: &P256Key, pool: &NoncePool, digest: &[u8]) -> Result<Vec<u8>, EcdsaError> {
    if digest.is_empty() {
        return Err(EcdsaError::EmptyDigest);
    }
    let z = digest_scalar(digest);
    loop {
        let Some(mut nonce) = pool.take() else {
            pool.fallbacks.fetch_add(1, Ordering::Relaxed);
            return sign_direct(key, digest);
        };
        let sig = finish(key, &nonce, &z);
        nonce.wipe();
        if let Some(sig) = sig {
            return Ok(sig);
        }
    }
}

/// Signs `digest` with a nonce computed on the spot (no pool).
pub fn sign_direct(key: &P256Key, digest: &[u8]) -> Result<Vec<u8>, EcdsaError> {
    if digest.is_empty() {
        return Err(EcdsaError::EmptyDigest);
    }
    let z = digest_scalar(digest);
    loop {
        // One nonce on the portable lane: a vector pass costs about as much for one nonce as
        // for a full register (see examples/ecdsa_rate.rs).
        let mut nonces = generate(Kernel::Single, 1)?;
        let sig = finish(key, &nonces[0], &z);
        for n in nonces.iter_mut() {
            n.wipe();
        }
        if let Some(sig) = sig {
            return Ok(sig);
        }
    }
}

/// Fixed-base scalar multiplication k·G for each 32-byte big-endian scalar (nonzero mod n),
/// as uncompressed SEC1 points (0x04 ‖ x ‖ y). Exposed for tests against other libraries;
/// not constant time in its output handling.
#[doc(hidden)]
pub fn base_mul(backend: Backend, scalars: &[[u8; 32]]) -> Vec<[u8; 65]> {
    assert!(backend.available());
    let lanes = kernel::group_lanes(backend);
    let groups = scalars.len().div_ceil(lanes);
    let mut digits = vec![0u64; groups * NW * lanes];
    for g in 0..groups {
        for lane in 0..lanes {
            // Spare lanes repeat the last scalar.
            let k = be_to_words(&scalars[(g * lanes + lane).min(scalars.len() - 1)]);
            let d = kernel::digits_of(&k);
            for w in 0..NW {
                digits[(g * NW + w) * lanes + lane] = d[w];
            }
        }
    }
    let fe = NL * lanes;
    let mut xyz = vec![0u64; groups * 3 * fe];
    // SAFETY: `backend.available()` is asserted; buffers follow the kernel's layout.
    unsafe { kernel::comb_fn(backend)(consts(), kernel::table(), &digits, &mut xyz) };
    (0..scalars.len())
        .map(|i| {
            let (g, lane) = (i / lanes, i % lanes);
            let coord = |c: usize| {
                let mut v = [0u64; NL];
                for (j, x) in v.iter_mut().enumerate() {
                    *x = xyz[(g * 3 + c) * fe + j * lanes + lane];
                }
                v
            };
            let (x, y) = kernel::to_affine(&coord(0), &coord(1), &coord(2));
            let mut out = [0u8; 65];
            out[0] = 4;
            out[1..33].copy_from_slice(&limbs_to_bytes(&x, 32));
            out[33..].copy_from_slice(&limbs_to_bytes(&y, 32));
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_r_disables_the_pool_for_good() {
        let pool = NoncePool::new(
            PoolConfig {
                capacity: 64,
                refill_below: 16,
                batch: 8,
            },
            Backend::Portable,
        );
        assert_eq!(pool.refill(16), 16);
        assert!(!pool.is_disabled());
        // A batch whose r repeats one already handed to the pool, as a broken random source
        // would make.
        let fresh = generate(Kernel::Single, 1).unwrap();
        assert!(pool.healthy(&fresh), "a fresh nonce is healthy");
        assert!(!pool.healthy(&fresh), "the same r again is not");
        assert!(pool.is_disabled());
        assert_eq!(pool.stats().repeated_r, 1);
        assert_eq!(pool.len(), 0, "the pool's nonces are wiped");
        assert_eq!(pool.refill(16), 0, "a disabled pool takes no more");
        // Signing goes on, each with a nonce made on the spot.
        let key_der = aws_lc_rs::signature::EcdsaKeyPair::generate_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &aws_lc_rs::rand::SystemRandom::new(),
        )
        .unwrap();
        let key = P256Key::from_der(key_der.as_ref()).unwrap();
        sign(&key, &pool, &[7u8; 32]).unwrap();
        assert_eq!(pool.stats().fallbacks, 1);
    }

    #[test]
    fn recent_r_forgets_the_oldest_past_its_window() {
        let mut recent = RecentR::default();
        let r = |i: u64| [i, 0, 0, 0, 0];
        for i in 0..RECENT_R as u64 + 1 {
            assert!(recent.admit(&r(i)));
        }
        assert!(recent.admit(&r(0)), "the oldest was forgotten");
        assert!(!recent.admit(&r(RECENT_R as u64)), "a recent one was not");
        assert_eq!(recent.order.len(), RECENT_R);
    }
}
