//! The generic Montgomery kernel: almost-Montgomery multiplication, reduction, fixed-window
//! exponentiation and the RSA-CRT pipeline, over any [`Lanes`] type.
//!
//! Numbers are `L` limbs of 52 bits, limb-major across lanes. With R = 2^(52·L) > 4m, the
//! almost-Montgomery product of two values below 2m is again below 2m, so values stay
//! partially reduced until the end. Nothing here branches on or indexes by a lane value;
//! loops depend only on public sizes.
//!
//! Every function is `#[inline(always)]`: they inline into the `#[target_feature]` entry points
//! at the bottom of this file, where the lane intrinsics can inline too.

use crate::lanes::{Lanes, Scalar, MASK52};

/// Carries each limb's excess into the next, leaving 52-bit limbs. The value must fit (a carry
/// out of the top limb is dropped).
#[inline(always)]
pub(crate) unsafe fn normalize<V: Lanes>(x: &mut [V]) {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let mask = V::splat(MASK52);
        let mut c = V::zero();
        for limb in x.iter_mut() {
            let t = limb.add(c);
            c = t.shr52();
            *limb = t.and(mask);
        }
    }
}

/// Almost-Montgomery multiplication: a·b·R⁻¹ mod m, below 2m for inputs below 2m.
#[inline(always)]
pub(crate) unsafe fn amm<V: Lanes, const L: usize>(
    a: &[V; L],
    b: &[V; L],
    m: &[V; L],
    k0: V,
) -> [V; L] {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let zero = V::zero();
        let mut acc = [zero; L];
        for &bi in b.iter() {
            let mut top = zero;
            for j in 0..L {
                acc[j] = acc[j].madd_lo(a[j], bi);
            }
            for j in 0..L - 1 {
                acc[j + 1] = acc[j + 1].madd_hi(a[j], bi);
            }
            top = top.madd_hi(a[L - 1], bi);
            let q = zero.madd_lo(acc[0], k0);
            for j in 0..L {
                acc[j] = acc[j].madd_lo(m[j], q);
            }
            for j in 0..L - 1 {
                acc[j + 1] = acc[j + 1].madd_hi(m[j], q);
            }
            top = top.madd_hi(m[L - 1], q);
            // acc[0] is now a multiple of 2^52: shift one limb down, keeping its carry.
            let carry = acc[0].shr52();
            for j in 0..L - 1 {
                acc[j] = acc[j + 1];
            }
            acc[L - 1] = top;
            acc[0] = acc[0].add(carry);
        }
        normalize(&mut acc);
        acc
    }
}

/// Montgomery squaring: a²·R⁻¹ mod m. Cross products are computed once and doubled, then the
/// 2L-limb square is reduced.
#[inline(always)]
pub(crate) unsafe fn ams<V: Lanes, const L: usize, const L2: usize>(
    a: &[V; L],
    m: &[V; L],
    k0: V,
) -> [V; L] {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let zero = V::zero();
        let mut w = [zero; L2];
        // Cross products a[i]·a[j], i < j.
        for i in 0..L {
            for j in i + 1..L {
                w[i + j] = w[i + j].madd_lo(a[i], a[j]);
                w[i + j + 1] = w[i + j + 1].madd_hi(a[i], a[j]);
            }
        }
        for x in w.iter_mut() {
            *x = x.shl1();
        }
        // Squares a[i]².
        for i in 0..L {
            w[2 * i] = w[2 * i].madd_lo(a[i], a[i]);
            w[2 * i + 1] = w[2 * i + 1].madd_hi(a[i], a[i]);
        }
        reduce_wide::<V, L, L2>(&mut w, m, k0)
    }
}

/// Montgomery reduction of a 2L-limb value x (limbs may exceed 52 bits by a few bits):
/// x·R⁻¹ mod m, below 2m when x < 2m·R... in practice below m·R + x/R.
#[inline(always)]
unsafe fn reduce_wide<V: Lanes, const L: usize, const L2: usize>(
    w: &mut [V; L2],
    m: &[V; L],
    k0: V,
) -> [V; L] {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let zero = V::zero();
        for i in 0..L {
            let q = zero.madd_lo(w[i], k0);
            for j in 0..L {
                w[i + j] = w[i + j].madd_lo(m[j], q);
                w[i + j + 1] = w[i + j + 1].madd_hi(m[j], q);
            }
            let carry = w[i].shr52();
            w[i + 1] = w[i + 1].add(carry);
        }
        let mut out = [zero; L];
        out.copy_from_slice(&w[L..]);
        normalize(&mut out);
        out
    }
}

/// The full product a·b as 2L normalized limbs.
#[inline(always)]
unsafe fn mul_wide<V: Lanes, const L: usize, const L2: usize>(a: &[V; L], b: &[V; L]) -> [V; L2] {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let mut w = [V::zero(); L2];
        for i in 0..L {
            for j in 0..L {
                w[i + j] = w[i + j].madd_lo(a[j], b[i]);
                w[i + j + 1] = w[i + j + 1].madd_hi(a[j], b[i]);
            }
        }
        normalize(&mut w);
        w
    }
}

/// a - b limb by limb: the 52-bit difference limbs and the final borrow (1 where a < b).
#[inline(always)]
unsafe fn sub_borrow<V: Lanes, const L: usize>(a: &[V; L], b: &[V; L]) -> ([V; L], V) {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let mask = V::splat(MASK52);
        let mut d = [V::zero(); L];
        let mut borrow = V::zero();
        for j in 0..L {
            let t = a[j].sub(b[j]).sub(borrow);
            borrow = t.shr63();
            d[j] = t.and(mask);
        }
        (d, borrow)
    }
}

/// x mod m for x < 2m, in place.
#[inline(always)]
pub(crate) unsafe fn cond_sub<V: Lanes, const L: usize>(x: &mut [V; L], m: &[V; L]) {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let (d, borrow) = sub_borrow(x, m);
        let no_borrow = borrow.eq_mask(V::zero());
        for j in 0..L {
            x[j] = V::blend(no_borrow, x[j], d[j]);
        }
    }
}

/// (a - b) mod m for a, b < m.
#[inline(always)]
pub(crate) unsafe fn sub_mod<V: Lanes, const L: usize>(
    a: &[V; L],
    b: &[V; L],
    m: &[V; L],
) -> [V; L] {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let (mut d, borrow) = sub_borrow(a, b);
        // Add m back in the lanes that borrowed; the carry out of the top cancels the borrow.
        let negative = borrow.eq_mask(V::splat(1));
        for j in 0..L {
            d[j] = d[j].add(V::blend(negative, V::zero(), m[j]));
        }
        normalize(&mut d);
        d
    }
}

/// The table entry each lane's `idx` names, reading every entry (constant time).
#[inline(always)]
unsafe fn select<V: Lanes, const L: usize>(table: &[[V; L]], idx: V) -> [V; L] {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let mut out = [V::zero(); L];
        for (t, entry) in table.iter().enumerate() {
            let hit = idx.eq_mask(V::splat(t as u64));
            for j in 0..L {
                out[j] = V::blend(hit, out[j], entry[j]);
            }
        }
        out
    }
}

const WINDOW: usize = 5;

/// Bits `[at, at + 5)` of each lane's exponent (little-endian words, one spare zero word).
#[inline(always)]
unsafe fn window<V: Lanes>(exps: &[&[u64]], at: usize) -> V {
    let mut w = [0u64; 8];
    let (word, shift) = (at / 64, at % 64);
    for (lane, e) in exps.iter().enumerate() {
        let mut v = e[word] >> shift;
        if shift > 64 - WINDOW {
            v |= e[word + 1] << (64 - shift);
        }
        w[lane] = v & ((1 << WINDOW) - 1);
    }
    // SAFETY: `w` holds 8 >= LANES values.
    unsafe { V::load(w.as_ptr()) }
}

/// base^e with a fixed 5-bit window over `bits` exponent bits (a multiple of 5, public), in and
/// out of Montgomery form (`base` and the result are ·R).
#[inline(always)]
unsafe fn pow_window<V: Lanes, const L: usize, const L2: usize>(
    base: &[V; L],
    exps: &[&[u64]],
    bits: usize,
    m: &[V; L],
    k0: V,
    one: &[V; L],
) -> [V; L] {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let mut table = vec![[V::zero(); L]; 1 << WINDOW];
        table[0] = *one;
        table[1] = *base;
        for t in 2..table.len() {
            table[t] = amm(&table[t - 1], base, m, k0);
        }
        let mut at = bits - WINDOW;
        let mut acc = select(&table, window::<V>(exps, at));
        while at > 0 {
            at -= WINDOW;
            for _ in 0..WINDOW {
                acc = ams::<V, L, L2>(&acc, m, k0);
            }
            let t = select(&table, window::<V>(exps, at));
            acc = amm(&acc, &t, m, k0);
        }
        acc
    }
}

/// Lane-layout inputs of one RSA-CRT pass. Numbers are limb-major: limb j of lane i at
/// `[j * LANES + i]`. Per-lane constants (`*_k0`) hold one value per lane.
pub(crate) struct CrtInputs<'a> {
    /// The encoded message, `2L` limbs (below n).
    pub msg: &'a [u64],
    pub n: &'a [u64],
    pub n_k0: &'a [u64],
    /// Blinding pair in Montgomery form mod n (r^e·R, r⁻¹·R), `2L` limbs; squared in place.
    pub blind: &'a mut [u64],
    pub unblind: &'a mut [u64],
    pub p: Half<'a>,
    pub q: Half<'a>,
    /// q⁻¹·R mod p.
    pub qinv: &'a [u64],
}

/// One prime's constants.
pub(crate) struct Half<'a> {
    pub m: &'a [u64],
    pub k0: &'a [u64],
    /// R³ mod m.
    pub rrr: &'a [u64],
    /// R mod m (Montgomery one).
    pub one: &'a [u64],
    /// The CRT exponent per lane, little-endian words with a spare zero word.
    pub exp: [&'a [u64]; 8],
    pub exp_bits: usize,
}

#[inline(always)]
unsafe fn load<V: Lanes, const N: usize>(src: &[u64]) -> [V; N] {
    assert_eq!(src.len(), N * V::LANES);
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    let mut out = [unsafe { V::zero() }; N];
    for (j, o) in out.iter_mut().enumerate() {
        // SAFETY: `src` holds N·LANES values (asserted).
        *o = unsafe { V::load(src.as_ptr().add(j * V::LANES)) };
    }
    out
}

#[inline(always)]
unsafe fn store<V: Lanes>(src: &[V], dst: &mut [u64]) {
    assert_eq!(dst.len(), src.len() * V::LANES);
    for (j, v) in src.iter().enumerate() {
        // SAFETY: `dst` holds len·LANES values (asserted).
        unsafe { v.store(dst.as_mut_ptr().add(j * V::LANES)) };
    }
}

/// c^d mod m for one prime: reduce c, exponentiate, leave Montgomery form, fully reduce.
#[inline(always)]
unsafe fn crt_half<V: Lanes, const L: usize, const L2: usize>(h: &Half, c: &[V; L2]) -> [V; L] {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let m: [V; L] = load(h.m);
        let k0 = V::load(h.k0.as_ptr());
        let rrr: [V; L] = load(h.rrr);
        let one: [V; L] = load(h.one);
        // c mod m in Montgomery form: REDC(c)·R³·R⁻¹ = c·R.
        let mut wide = *c;
        let reduced = reduce_wide::<V, L, L2>(&mut wide, &m, k0);
        let base = amm(&reduced, &rrr, &m, k0);
        let x = pow_window::<V, L, L2>(&base, &h.exp[..V::LANES], h.exp_bits, &m, k0, &one);
        // Out of Montgomery form, fully reduced.
        let mut unit = [V::zero(); L];
        unit[0] = V::splat(1);
        let mut r = amm(&x, &unit, &m, k0);
        cond_sub(&mut r, &m);
        r
    }
}

/// Blind, exponentiate per prime, recombine, unblind: the signature (below n) into `out`.
#[inline(always)]
unsafe fn crt_sign<V: Lanes, const L: usize, const L2: usize>(io: &mut CrtInputs, out: &mut [u64]) {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let n: [V; L2] = load(io.n);
        let n_k0 = V::load(io.n_k0.as_ptr());
        let msg: [V; L2] = load(io.msg);
        let blind: [V; L2] = load(io.blind);
        let unblind: [V; L2] = load(io.unblind);
        // c = msg·r^e mod n (below 2n).
        let c = amm(&msg, &blind, &n, n_k0);
        let m1 = crt_half::<V, L, L2>(&io.p, &c);
        let m2 = crt_half::<V, L, L2>(&io.q, &c);
        // h = (m1 - m2 mod p)·q⁻¹ mod p; s = m2 + h·q. q < 2p, so one subtraction reduces m2.
        let p: [V; L] = load(io.p.m);
        let p_k0 = V::load(io.p.k0.as_ptr());
        let q: [V; L] = load(io.q.m);
        let qinv: [V; L] = load(io.qinv);
        let m2p = {
            let mut t = m2;
            cond_sub(&mut t, &p);
            t
        };
        let diff = sub_mod(&m1, &m2p, &p);
        let mut h = amm(&diff, &qinv, &p, p_k0);
        cond_sub(&mut h, &p);
        let hq: [V; L2] = mul_wide::<V, L, L2>(&h, &q);
        let mut s = hq;
        for j in 0..L {
            s[j] = s[j].add(m2[j]);
        }
        normalize(&mut s);
        // Unblind: s·r⁻¹ mod n.
        let mut sig = amm(&s, &unblind, &n, n_k0);
        cond_sub(&mut sig, &n);
        store(&sig, out);
        // Next blinding pair: (r²)^e and r⁻²; squares stay in Montgomery form.
        let b2 = amm(&blind, &blind, &n, n_k0);
        let u2 = amm(&unblind, &unblind, &n, n_k0);
        store(&b2, io.blind);
        store(&u2, io.unblind);
    }
}

/// sig^e mod n for each lane's public exponent `e` (variable time: everything is public).
/// `L` limbs of n, `L2` = 2·L (the squarings' double-width product).
#[inline(always)]
unsafe fn public_op<V: Lanes, const L: usize, const L2: usize>(
    sig: &[u64],
    n: &[u64],
    n_k0: &[u64],
    rr: &[u64],
    e: &[u64],
    out: &mut [u64],
) {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let n: [V; L] = load(n);
        let k0 = V::load(n_k0.as_ptr());
        let rr: [V; L] = load(rr);
        let s: [V; L] = load(sig);
        let x = amm(&s, &rr, &n, k0);
        let bits = e
            .iter()
            .map(|e| 64 - e.leading_zeros() as usize)
            .max()
            .unwrap_or(0);
        let mut y = x;
        let mut e_lanes = [0u64; 8];
        e_lanes[..e.len()].copy_from_slice(e);
        let top_set = (0..e.len()).all(|i| e[i] >> (bits - 1) & 1 == 1);
        if !top_set {
            // Rare: lanes whose exponents differ in length. Start from one instead.
            let mut unit = [V::zero(); L];
            unit[0] = V::splat(1);
            y = amm(&rr, &unit, &n, k0);
        }
        let start = if top_set { bits - 1 } else { bits };
        for bit in (0..start).rev() {
            y = ams::<V, L, L2>(&y, &n, k0);
            let mut set = [0u64; 8];
            let mut any = false;
            for (i, s) in set.iter_mut().enumerate().take(e.len()) {
                *s = e_lanes[i] >> bit & 1;
                any |= *s == 1;
            }
            if any {
                let p = amm(&y, &x, &n, k0);
                let hit = V::load(set.as_ptr()).eq_mask(V::splat(1));
                for j in 0..L {
                    y[j] = V::blend(hit, y[j], p[j]);
                }
            }
        }
        let mut unit = [V::zero(); L];
        unit[0] = V::splat(1);
        let mut r = amm(&y, &unit, &n, k0);
        cond_sub(&mut r, &n);
        store(&r, out);
    }
}

/// Blinding for a private-key operation run elsewhere (a GPU): `out` = msg·r^e mod n, fully
/// reduced, from the pair (r^e·R, r⁻¹·R); then both halves of the pair are squared in place for
/// the next use. Constant time. `L` limbs of n, `L2` = 2·L.
#[inline(always)]
unsafe fn blind_op<V: Lanes, const L: usize, const L2: usize>(
    msg: &[u64],
    n: &[u64],
    n_k0: &[u64],
    blind: &mut [u64],
    unblind: &mut [u64],
    out: &mut [u64],
) {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let n: [V; L] = load(n);
        let k0 = V::load(n_k0.as_ptr());
        let m: [V; L] = load(msg);
        let b: [V; L] = load(blind);
        let u: [V; L] = load(unblind);
        let mut c = amm(&m, &b, &n, k0);
        cond_sub(&mut c, &n);
        store(&c, out);
        store(&ams::<V, L, L2>(&b, &n, k0), blind);
        store(&ams::<V, L, L2>(&u, &n, k0), unblind);
    }
}

/// `out` = a·b·R⁻¹ mod n, fully reduced (a, b below 2n). Constant time.
#[inline(always)]
unsafe fn mul_op<V: Lanes, const L: usize, const L2: usize>(
    a: &[u64],
    b: &[u64],
    n: &[u64],
    n_k0: &[u64],
    out: &mut [u64],
) {
    // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
    unsafe {
        let n: [V; L] = load(n);
        let k0 = V::load(n_k0.as_ptr());
        let mut c = amm(&load::<V, L>(a), &load::<V, L>(b), &n, k0);
        cond_sub(&mut c, &n);
        store(&c, out);
    }
}

/// Generic single-modulus helpers for key preparation (portable lane, called rarely).
pub(crate) mod prep {
    use super::*;

    /// a·b·R⁻¹ mod m, fully reduced, for `L`-limb one-lane numbers.
    pub(crate) fn mont_mul<const L: usize>(a: &[u64], b: &[u64], m: &[u64], k0: u64) -> Vec<u64> {
        // SAFETY: the scalar lane needs no CPU feature; slices have L limbs (checked by load).
        unsafe {
            let a: [Scalar; L] = load(a);
            let b: [Scalar; L] = load(b);
            let mm: [Scalar; L] = load(m);
            let mut r = amm(&a, &b, &mm, Scalar::splat(k0));
            cond_sub(&mut r, &mm);
            let mut out = vec![0; L];
            store(&r, &mut out);
            out
        }
    }
}

/// The lane type to run a pass on.
macro_rules! dispatch {
    ($backend:expr, $l:literal, $l2:literal, $scalar:expr, $zmm:ident, $ymm:ident) => {
        match $backend {
            #[cfg(target_arch = "x86_64")]
            crate::Backend::Ifma512 => $zmm::<$l, $l2>,
            #[cfg(target_arch = "x86_64")]
            crate::Backend::Ifma256 => $ymm::<$l, $l2>,
            _ => $scalar,
        }
    };
}

type CrtFn = unsafe fn(&mut CrtInputs, &mut [u64]);
type PublicFn = unsafe fn(&[u64], &[u64], &[u64], &[u64], &[u64], &mut [u64]);
type BlindFn = unsafe fn(&[u64], &[u64], &[u64], &mut [u64], &mut [u64], &mut [u64]);
type MulFn = unsafe fn(&[u64], &[u64], &[u64], &[u64], &mut [u64]);

/// The entry points of one lane pass `$op::<V, L, L2>`: `$zmm` (8 lanes) and `$ymm` (4), compiled
/// with the IFMA lanes' CPU features so their intrinsics inline, and `$scalar` (portable).
macro_rules! lane_entries {
    ($op:ident: $zmm:ident, $ymm:ident, $scalar:ident ($($arg:ident: $ty:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512ifma,avx512vl")]
        unsafe fn $zmm<const L: usize, const L2: usize>($($arg: $ty),*) {
            // SAFETY: this `unsafe fn`'s contract holds (lane CPU features; sizes asserted).
            unsafe { $op::<crate::lanes::Zmm, L, L2>($($arg),*) }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx512ifma,avx512vl")]
        unsafe fn $ymm<const L: usize, const L2: usize>($($arg: $ty),*) {
            // SAFETY: as above.
            unsafe { $op::<crate::lanes::Ymm, L, L2>($($arg),*) }
        }

        unsafe fn $scalar<const L: usize, const L2: usize>($($arg: $ty),*) {
            // SAFETY: as above (the portable lane needs no CPU feature).
            unsafe { $op::<Scalar, L, L2>($($arg),*) }
        }
    };
}

lane_entries!(crt_sign: crt_zmm, crt_ymm, crt_scalar (io: &mut CrtInputs, out: &mut [u64]));
lane_entries!(public_op: pub_zmm, pub_ymm, pub_scalar (
    s: &[u64], n: &[u64], k0: &[u64], rr: &[u64], e: &[u64], out: &mut [u64]
));
lane_entries!(blind_op: blind_zmm, blind_ymm, blind_scalar (
    msg: &[u64], n: &[u64], k0: &[u64], blind: &mut [u64], unblind: &mut [u64], out: &mut [u64]
));
lane_entries!(mul_op: mul_zmm, mul_ymm, mul_scalar (
    a: &[u64], b: &[u64], n: &[u64], k0: &[u64], out: &mut [u64]
));

/// The CRT signing pass for a prime size of `half_limbs` limbs (20, 30 or 40).
pub(crate) fn crt_fn(backend: crate::Backend, half_limbs: usize) -> CrtFn {
    match half_limbs {
        20 => dispatch!(backend, 20, 40, crt_scalar::<20, 40>, crt_zmm, crt_ymm),
        30 => dispatch!(backend, 30, 60, crt_scalar::<30, 60>, crt_zmm, crt_ymm),
        40 => dispatch!(backend, 40, 80, crt_scalar::<40, 80>, crt_zmm, crt_ymm),
        _ => unreachable!("prime sizes are checked at key load"),
    }
}

/// A pass over the whole modulus for primes of `half_limbs` limbs: instantiated on the
/// modulus's 2·half limbs and its double width.
macro_rules! modulus_pass {
    ($backend:expr, $half:expr, $scalar:ident, $zmm:ident, $ymm:ident) => {
        match $half {
            20 => dispatch!($backend, 40, 80, $scalar::<40, 80>, $zmm, $ymm),
            30 => dispatch!($backend, 60, 120, $scalar::<60, 120>, $zmm, $ymm),
            40 => dispatch!($backend, 80, 160, $scalar::<80, 160>, $zmm, $ymm),
            _ => unreachable!("prime sizes are checked at key load"),
        }
    };
}

/// The public-exponent pass for a modulus of `2 * half_limbs` limbs.
pub(crate) fn public_fn(backend: crate::Backend, half_limbs: usize) -> PublicFn {
    modulus_pass!(backend, half_limbs, pub_scalar, pub_zmm, pub_ymm)
}

/// The blinding pass (msg·r^e, then the pair squared) for a modulus of `2 * half_limbs` limbs.
pub(crate) fn blind_fn(backend: crate::Backend, half_limbs: usize) -> BlindFn {
    modulus_pass!(backend, half_limbs, blind_scalar, blind_zmm, blind_ymm)
}

/// The Montgomery multiplication pass for a modulus of `2 * half_limbs` limbs.
pub(crate) fn mul_fn(backend: crate::Backend, half_limbs: usize) -> MulFn {
    modulus_pass!(backend, half_limbs, mul_scalar, mul_zmm, mul_ymm)
}
