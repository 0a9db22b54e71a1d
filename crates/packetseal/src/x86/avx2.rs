//! The AVX2 width, for CPUs with VAES and VPCLMULQDQ but no AVX-512 (AMD Zen 3, Intel client
//! cores since Alder Lake): AES-CTR two blocks to a `ymm` register, eight registers (sixteen
//! blocks) in flight; GHASH with 256-bit VPCLMULQDQ, one reduction per packet (per 128-block
//! window for longer messages). Software-pipelined: each round trip's ciphertext is hashed
//! between the next round trip's AES rounds, as BoringSSL's AVX2 AES-GCM does, and in
//! Karatsuba's form, three carry-less multiplications per block instead of four. On AMD Zen 3,
//! per 1,323-byte packet: 276 ns unpipelined, 243 pipelined, 228 with Karatsuba, about 210
//! without staging the last block (docs/benchmarks-history.md). Karatsuba alone, before the
//! pipelining, measured slower (283–299 against 270–285 ns): while the hashing waited for each
//! round trip's AES rounds, the halves' extra shuffle and XOR were on the critical path.
//!
//! AVX2 has no byte-masked loads and stores. Every whole register is read from and written to
//! the packet directly; a message's final partial block is read with the 16-byte load that
//! ends where it ends and written with the 16-byte store that ends there (`seal_partial`),
//! and only a message, or a second part, shorter than 16 bytes is staged on the stack.
//!
//! The seal's driver, the GCM framing and the windows of long messages, is shared with the
//! AVX-512 width (`super::seal`, through [`Lanes`]); `seal_with` compiles it with this
//! width's instructions, so that every helper inlines into it.

use std::arch::x86_64::*;

use super::{byte_reverse_mask, reduce, Lanes, Parts, Schedule, POWERS, WINDOW};

/// Bytes of one `ymm` register: two AES blocks.
const REG: usize = 32;

/// Registers of keystream made per round trip: eight (sixteen blocks), enough to keep the AES
/// units busy through the rounds' latency on the cores this width serves.
const WIDE: usize = 8;
const _: () = assert!(WINDOW.is_multiple_of(WIDE * REG));

pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2") && super::shared_instructions()
}

#[repr(C, align(64))]
pub(crate) struct Key {
    schedule: Schedule,
    /// For each entry of `schedule.h_powers`, the XOR of its two 64-bit halves in both halves:
    /// the second factor of Karatsuba's middle product. An entry's is [`HALVES`] blocks after
    /// it (`repr(C)`; see [`Key::powers`]).
    h_halves: [__m128i; POWERS + 3],
    /// The round keys, each in both lanes of a 256-bit register.
    wide_round_keys: [__m256i; 15],
}

/// The distance, in blocks, from an entry of `schedule.h_powers` to its entry in `h_halves`.
const HALVES: usize = (std::mem::offset_of!(Key, h_halves)
    - std::mem::offset_of!(Key, schedule)
    - std::mem::offset_of!(Schedule, h_powers))
    / std::mem::size_of::<__m128i>();
const _: () = assert!((std::mem::offset_of!(Key, h_halves)
    - std::mem::offset_of!(Key, schedule)
    - std::mem::offset_of!(Schedule, h_powers))
.is_multiple_of(std::mem::size_of::<__m128i>()));

impl Key {
    /// Callers have checked [`available`].
    pub(crate) fn new(key: &[u8]) -> Option<Box<Key>> {
        // SAFETY: `available()` held (SealKey checks it first), so AES-NI, PCLMULQDQ, SSSE3
        // and AVX2 exist.
        unsafe {
            let schedule = Schedule::new(key)?;
            let wide_round_keys = broadcast_round_keys(&schedule.aes.round_keys);
            let h_halves = schedule
                .h_powers
                .map(|h| _mm_xor_si128(h, _mm_shuffle_epi32::<0x4e>(h)));
            Some(Box::new(Key {
                schedule,
                h_halves,
                wide_round_keys,
            }))
        }
    }

    /// As the AVX-512 width's `Key::seal`: `text[..in_len]` is encrypted in place and `extra`
    /// into `text[in_len..]`; `in_len` is a multiple of 16 or `extra` is empty, and
    /// `text.len() == in_len + extra.len()` (checked by `SealKey::seal`).
    pub(crate) fn seal(
        &self,
        nonce: &[u8; 12],
        aad: &[u8],
        text: &mut [u8],
        in_len: usize,
        extra: &[u8],
        tag: &mut [u8; 16],
    ) {
        debug_assert!(in_len.is_multiple_of(16) || extra.is_empty());
        debug_assert_eq!(text.len(), in_len + extra.len());
        // SAFETY: a Key is only built where `available()` held; lengths as documented above.
        unsafe {
            if self.schedule.aes.rounds == 10 {
                seal_with::<10>(self, nonce, aad, text, in_len, extra, tag)
            } else {
                seal_with::<14>(self, nonce, aad, text, in_len, extra, tag)
            }
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        super::wipe(&mut self.h_halves);
        super::wipe(&mut self.wide_round_keys);
    }
}

#[target_feature(enable = "avx2")]
fn broadcast_round_keys(rk: &[__m128i; 15]) -> [__m256i; 15] {
    rk.map(|k| _mm256_broadcastsi128_si256(k))
}

// ---- GHASH ----

/// GHASH products not yet reduced: two lanes each of the low, middle and high parts.
#[derive(Clone, Copy)]
pub(crate) struct Products {
    lo: __m256i,
    mi: __m256i,
    hi: __m256i,
}

impl Products {
    #[target_feature(enable = "avx2")]
    fn new() -> Products {
        Products {
            lo: _mm256_setzero_si256(),
            mi: _mm256_setzero_si256(),
            hi: _mm256_setzero_si256(),
        }
    }

    /// Adds the two products `d[i] * h[i]` (`d` byte-reflected), `h` the two powers at
    /// `powers`, in Karatsuba's form: three carry-less multiplications per block, the middle
    /// one of the halves' XORs (the powers' precomputed in `Key::h_halves`); `reduce` adds the
    /// low and high products back into the middle.
    ///
    /// # Safety
    /// `powers` points into a key's `h_powers`, with one more entry after it, and was taken
    /// with [`Key::powers`].
    #[inline(always)]
    unsafe fn add_at(&mut self, d: __m256i, powers: *const __m128i) {
        // SAFETY: the CPU has AVX2 and VPCLMULQDQ (every caller is compiled with them); two
        // entries of `h_powers` and the same two of `h_halves`, HALVES blocks on in the
        // `repr(C)` Key, through a pointer that may reach both, as the caller promised.
        unsafe {
            let h = _mm256_loadu_si256(powers.cast());
            let hk = _mm256_loadu_si256(powers.add(HALVES).cast());
            let dk = _mm256_xor_si256(d, _mm256_shuffle_epi32::<0x4e>(d));
            self.lo = _mm256_xor_si256(self.lo, _mm256_clmulepi64_epi128::<0x00>(d, h));
            self.mi = _mm256_xor_si256(self.mi, _mm256_clmulepi64_epi128::<0x00>(dk, hk));
            self.hi = _mm256_xor_si256(self.hi, _mm256_clmulepi64_epi128::<0x11>(d, h));
        }
    }

    /// Adds `acc * H^n`, the running hash carried into a window of `n` blocks, where `powers`
    /// points at H^n in `h_powers`.
    ///
    /// # Safety
    /// `powers` has one more entry after it (true for any H^n, n ≥ 1).
    #[target_feature(enable = "avx2,vpclmulqdq")]
    unsafe fn add_carry(&mut self, acc: __m128i, powers: *const __m128i) {
        // SAFETY: two entries from H^n, as the caller promised; the data's second lane is
        // zero, so only acc * H^n is added.
        unsafe { self.add_at(_mm256_zextsi128_si256(acc), powers) };
    }

    /// The sum of everything added, reduced to one field element.
    #[target_feature(enable = "avx2,pclmulqdq")]
    fn reduce(&self) -> __m128i {
        let mi = _mm256_xor_si256(self.mi, _mm256_xor_si256(self.lo, self.hi));
        reduce(fold_lanes(self.lo), fold_lanes(mi), fold_lanes(self.hi))
    }
}

/// The two lanes of a 256-bit register XORed into one block.
#[target_feature(enable = "avx2")]
fn fold_lanes(y: __m256i) -> __m128i {
    _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256::<1>(y))
}

// ---- AES-CTR ----

/// Counter blocks for GCM's `inc32`: each lane holds the nonce and its counter in native
/// order in the last dword; `to_block` swaps that dword to big-endian.
pub(crate) struct Counter {
    lanes: __m256i,
    to_block: __m256i,
    step: __m256i,
}

impl Counter {
    #[target_feature(enable = "avx2")]
    fn new(nonce: __m128i, first: u32) -> Counter {
        // Lane 0 counts `first`, lane 1 `first + 1`.
        let first = first as i32;
        let start = _mm256_set_epi32(first + 1, 0, 0, 0, first, 0, 0, 0);
        Counter {
            lanes: _mm256_add_epi32(_mm256_broadcastsi128_si256(nonce), start),
            to_block: _mm256_broadcastsi128_si256(_mm_set_epi64x(
                0x0c0d_0e0f_0b0a_0908,
                0x0706_0504_0302_0100,
            )),
            step: _mm256_set_epi32(2, 0, 0, 0, 2, 0, 0, 0),
        }
    }

    /// The next two counter blocks.
    #[target_feature(enable = "avx2")]
    fn next(&mut self) -> __m256i {
        let blocks = _mm256_shuffle_epi8(self.lanes, self.to_block);
        self.lanes = _mm256_add_epi32(self.lanes, self.step);
        blocks
    }
}

// ---- the seal ----

/// Shuffle controls and masks for a message's final partial block of `r` bytes (1..=15), each
/// the 16 bytes at an offset that depends on `r`:
/// - at `r`: 16 - r zeroing indices, then 0..r (moves the low r bytes to the top);
/// - at `32 - r`: 16 - r..16, then zeroing indices (moves the top r bytes to the bottom);
/// - at `64 - r`: r bytes of 0xff, then zeros (keeps the low r bytes);
/// - at `64 + r`: 16 - r zeros, then r bytes of 0xff (selects the top r bytes).
static TAIL_TABLE: [u8; 96] = {
    let mut t = [0u8; 96];
    let mut i = 0;
    while i < 16 {
        t[i] = 0x80;
        t[16 + i] = i as u8;
        t[32 + i] = 0x80;
        t[48 + i] = 0xff;
        t[80 + i] = 0xff;
        i += 1;
    }
    t
};

/// The plaintext of one packet as quiche's writer holds it: `in_len` bytes already in the output
/// buffer (encrypted in place), then the stream data still in the send buffer.
#[derive(Clone, Copy)]
struct Plaintext {
    /// The output buffer; its first `in_len` bytes are plaintext.
    out: *mut u8,
    in_len: usize,
    extra: *const u8,
    total: usize,
}

impl Plaintext {
    /// The 32 bytes of plaintext at `off` (`off + 32 <= total`, `off` a multiple of 32).
    ///
    /// # Safety
    /// `out..out + in_len` and `extra..extra + total - in_len` readable; `in_len` is a multiple
    /// of 16 or `in_len == total`; the CPU has AVX2.
    #[inline(always)]
    unsafe fn load(&self, off: usize) -> __m256i {
        // SAFETY (all three): the 32 bytes lie inside the two parts as each branch says. With
        // both parts present the seam is block-aligned, so a register that straddles it has
        // one block on each side.
        unsafe {
            if off + REG <= self.in_len {
                _mm256_loadu_si256(self.out.add(off).cast())
            } else if off >= self.in_len {
                _mm256_loadu_si256(self.extra.add(off - self.in_len).cast())
            } else {
                debug_assert_eq!(off + 16, self.in_len);
                _mm256_set_m128i(
                    _mm_loadu_si128(self.extra.cast()),
                    _mm_loadu_si128(self.out.add(off).cast()),
                )
            }
        }
    }

    /// Encrypts the message's last, partial register (`len` < 32 bytes at `off`, the end of
    /// the plaintext) with keystream `k` without staging it on the stack: a whole first block
    /// is loaded and stored directly; the final partial block (r < 16 bytes) is read with the
    /// 16-byte load that ends where it ends and shifted down, and written with the 16-byte
    /// store that ends there, its first 16 - r bytes the ciphertext already written before
    /// it. Returns the ciphertext zero-padded for GHASH, or `None` (nothing written) where a
    /// 16-byte window would start before the part it reads or the message: a message or a
    /// second part shorter than 16 bytes, which the caller stages instead.
    ///
    /// # Safety
    /// As [`Plaintext::gather`], `out..out + total` writable, everything below `off` already
    /// written, and the CPU has AVX2.
    #[inline(always)]
    unsafe fn seal_partial(&self, off: usize, len: usize, k: __m256i) -> Option<__m256i> {
        debug_assert!(len < REG && off + len == self.total && off.is_multiple_of(16));
        let whole = len & !15;
        let r = len - whole;
        let q = off + whole;
        // The final partial block lies in one part: with a second part the seam is
        // block-aligned, so a block starting below `in_len` ends at or below it.
        let (src, before) = if q >= self.in_len {
            // SAFETY: `q - in_len` is inside the second part (or at its end when r == 0).
            (unsafe { self.extra.add(q - self.in_len) }, q - self.in_len)
        } else {
            // SAFETY: `q` is inside the first part.
            (unsafe { self.out.add(q).cast_const() }, q)
        };
        if r > 0 && before + r < 16 {
            return None;
        }
        // SAFETY: every load reads inside one part, below `total`; every store writes inside
        // `out..out + total`, bytes below `q` only with the ciphertext already there.
        unsafe {
            let k_lo = _mm256_castsi256_si128(k);
            let k_hi = _mm256_extracti128_si256::<1>(k);
            let first = if whole == 16 {
                let p = if off + 16 <= self.in_len {
                    _mm_loadu_si128(self.out.add(off).cast())
                } else {
                    _mm_loadu_si128(self.extra.add(off - self.in_len).cast())
                };
                let c = _mm_xor_si128(p, k_lo);
                _mm_storeu_si128(self.out.add(off).cast(), c);
                Some(c)
            } else {
                None
            };
            let last = if r > 0 {
                let kr = if whole == 16 { k_hi } else { k_lo };
                // The r plaintext bytes, moved to the bottom, zeros above.
                let window = _mm_loadu_si128(src.add(r).sub(16).cast());
                let down = _mm_loadu_si128(TAIL_TABLE.as_ptr().add(32 - r).cast());
                let p = _mm_shuffle_epi8(window, down);
                let keep = _mm_loadu_si128(TAIL_TABLE.as_ptr().add(64 - r).cast());
                let c = _mm_and_si128(_mm_xor_si128(p, kr), keep);
                // Written as the 16 bytes ending at the message's end.
                let dst = self.out.add(q + r).sub(16);
                let up = _mm_loadu_si128(TAIL_TABLE.as_ptr().add(r).cast());
                let new = _mm_loadu_si128(TAIL_TABLE.as_ptr().add(64 + r).cast());
                let merged =
                    _mm_blendv_epi8(_mm_loadu_si128(dst.cast()), _mm_shuffle_epi8(c, up), new);
                _mm_storeu_si128(dst.cast(), merged);
                Some(c)
            } else {
                None
            };
            Some(match (first, last) {
                (Some(a), Some(b)) => _mm256_set_m128i(b, a),
                (Some(a), None) => _mm256_zextsi128_si256(a),
                (None, Some(b)) => _mm256_zextsi128_si256(b),
                (None, None) => unreachable!("len > 0"),
            })
        }
    }

    /// Copies the `len` (< 32) plaintext bytes at `off` to the front of `dst`.
    ///
    /// # Safety
    /// As [`Plaintext::load`], with `off + len <= total`.
    #[inline(always)]
    unsafe fn gather(&self, off: usize, len: usize, dst: &mut [u8; REG]) {
        let head = self.in_len.saturating_sub(off).min(len);
        // SAFETY: `head` bytes from the first part and `len - head` from the second, each
        // inside its part; `dst` holds 32 > len bytes and overlaps neither.
        unsafe {
            std::ptr::copy_nonoverlapping(self.out.add(off), dst.as_mut_ptr(), head);
            if len > head {
                // Here `off + head >= in_len`: the bytes before it are the first part's.
                std::ptr::copy_nonoverlapping(
                    self.extra.add(off + head - self.in_len),
                    dst.as_mut_ptr().add(head),
                    len - head,
                );
            }
        }
    }
}

/// One round trip's ciphertext, waiting to be hashed while the next round trip's AES rounds run.
struct Pending {
    /// `WIDE` registers of ciphertext, in message order.
    c: [__m256i; WIDE],
    /// The power of H for the first block; the others follow.
    powers: *const __m128i,
}

/// Encrypts `K` registers of counter blocks with `NR` rounds, all rounds interleaved.
#[target_feature(enable = "avx2,vaes")]
fn encrypt_2x<const NR: usize, const K: usize>(
    rk: &[__m256i; 15],
    mut x: [__m256i; K],
) -> [__m256i; K] {
    for v in x.iter_mut() {
        *v = _mm256_xor_si256(*v, rk[0]);
    }
    for key in &rk[1..NR] {
        for v in x.iter_mut() {
            *v = _mm256_aesenc_epi128(*v, *key);
        }
    }
    for v in x.iter_mut() {
        *v = _mm256_aesenclast_epi128(*v, rk[NR]);
    }
    x
}

/// [`encrypt_2x`], adding the GHASH products of `pending` to `sum`, one register of it between
/// each two rounds: the products depend only on ciphertext already made, so the carry-less
/// multiplications and the AES rounds run side by side instead of the multiplications waiting
/// at the end of each round trip for the rounds they do not depend on.
///
/// Always inlined, without target features of its own, so that it inlines into its caller:
/// a call would pass the registers through memory.
///
/// # Safety
/// `pending.powers` has `2 * WIDE` powers (then, for the last, one more entry); the CPU has
/// AVX2, VAES and VPCLMULQDQ.
#[inline(always)]
unsafe fn encrypt_2x_hashing<const NR: usize, const K: usize>(
    rk: &[__m256i; 15],
    mut x: [__m256i; K],
    pending: &Pending,
    sum: &mut Products,
    reverse: __m256i,
) -> [__m256i; K] {
    // Rounds 1..NR leave NR - 1 gaps, one for each of the WIDE registers.
    const { assert!(WIDE < NR) };
    // SAFETY: the CPU has the instructions, as the caller promised; register `r`'s two powers
    // are readable, as the caller promised.
    unsafe {
        for v in x.iter_mut() {
            *v = _mm256_xor_si256(*v, rk[0]);
        }
        for (r, key) in rk[1..NR].iter().enumerate() {
            for v in x.iter_mut() {
                *v = _mm256_aesenc_epi128(*v, *key);
            }
            if r < WIDE {
                sum.add_at(
                    _mm256_shuffle_epi8(pending.c[r], reverse),
                    pending.powers.add(2 * r),
                );
            }
        }
        for v in x.iter_mut() {
            *v = _mm256_aesenclast_epi128(*v, rk[NR]);
        }
    }
    x
}

/// The next `K` registers of keystream, hashing `pending` meanwhile if there is one.
///
/// # Safety
/// As [`encrypt_2x_hashing`].
#[inline(always)]
unsafe fn encrypt_2x_maybe_hashing<const NR: usize, const K: usize>(
    rk: &[__m256i; 15],
    ctr: &mut Counter,
    pending: Option<&Pending>,
    sum: &mut Products,
    reverse: __m256i,
) -> [__m256i; K] {
    // SAFETY: the CPU has the instructions and `pending`'s powers are readable, as the caller
    // promised.
    unsafe {
        let blocks = std::array::from_fn(|_| ctr.next());
        match pending {
            Some(p) => encrypt_2x_hashing::<NR, K>(rk, blocks, p, sum, reverse),
            None => encrypt_2x::<NR, K>(rk, blocks),
        }
    }
}

/// Encrypts the whole plaintext into `text.out` and adds every ciphertext block's GHASH product
/// to `sum`, block `j` times the power at `powers + j`. Software-pipelined: each round trip's
/// ciphertext is hashed during the next round trip's AES rounds (the last one during the
/// rest's), with no dependence between products.
///
/// # Safety
/// As [`Plaintext::load`], and `out..out + total` writable; `powers` points into `h_powers` with
/// `total.div_ceil(16)` powers and then at least one more entry after it; the CPU has the
/// features named.
#[target_feature(enable = "avx2,vaes,vpclmulqdq")]
unsafe fn encrypt_and_hash<const NR: usize>(
    rk: &[__m256i; 15],
    ctr: &mut Counter,
    text: Plaintext,
    mut powers: *const __m128i,
    products: &mut Products,
) {
    // Summed in registers and stored once: through the reference, each product would be
    // stored as it is added.
    let mut sum = *products;
    let reverse = _mm256_broadcastsi128_si256(byte_reverse_mask());
    let mut off = 0;
    let mut pending: Option<Pending> = None;
    while text.total - off >= WIDE * REG {
        let blocks = std::array::from_fn(|_| ctr.next());
        let ks = match &pending {
            // SAFETY: the pending round trip's powers are the 2 * WIDE before `powers`.
            Some(p) => unsafe { encrypt_2x_hashing::<NR, WIDE>(rk, blocks, p, &mut sum, reverse) },
            None => encrypt_2x::<NR, WIDE>(rk, blocks),
        };
        let mut c = ks;
        for (i, k) in ks.iter().enumerate() {
            // SAFETY: off + 32 * i + 32 <= total.
            unsafe {
                c[i] = _mm256_xor_si256(text.load(off + REG * i), *k);
                _mm256_storeu_si256(text.out.add(off + REG * i).cast(), c[i]);
            }
        }
        pending = Some(Pending { c, powers });
        // SAFETY: stays within `h_powers` (the packet has 2 * WIDE more blocks).
        powers = unsafe { powers.add(2 * WIDE) };
        off += WIDE * REG;
    }
    if off == text.total {
        if let Some(p) = &pending {
            for i in 0..WIDE {
                // SAFETY: the pending round trip's two powers for register `i`.
                unsafe { sum.add_at(_mm256_shuffle_epi8(p.c[i], reverse), p.powers.add(2 * i)) };
            }
        }
        *products = sum;
        return;
    }
    // The rest, at most WIDE registers, encrypted together: two, four or eight at once,
    // whichever covers it (a spare register's rounds cost less than a second pass's latency),
    // while the last whole round trip is hashed.
    let mut ks = [_mm256_setzero_si256(); WIDE];
    let rest = text.total - off;
    // SAFETY: as for the loop above.
    unsafe {
        if rest <= 2 * REG {
            ks[..2].copy_from_slice(&encrypt_2x_maybe_hashing::<NR, 2>(
                rk,
                ctr,
                pending.as_ref(),
                &mut sum,
                reverse,
            ));
        } else if rest <= 4 * REG {
            ks[..4].copy_from_slice(&encrypt_2x_maybe_hashing::<NR, 4>(
                rk,
                ctr,
                pending.as_ref(),
                &mut sum,
                reverse,
            ));
        } else {
            ks = encrypt_2x_maybe_hashing::<NR, WIDE>(rk, ctr, pending.as_ref(), &mut sum, reverse);
        }
    }
    for k in ks.iter() {
        if off >= text.total {
            break;
        }
        // SAFETY: a whole register lies below `total`; the last, partial one goes through
        // `seal_partial` (everything below `off` is written by now) or is staged on the stack,
        // and only its bytes below `total` are written to the packet. The two powers
        // loaded start at a block of this packet; past its last block they run into the
        // lengths block's power or the zero padding, multiplied by a zeroed lane.
        unsafe {
            let c = if text.total - off >= REG {
                let c = _mm256_xor_si256(text.load(off), *k);
                _mm256_storeu_si256(text.out.add(off).cast(), c);
                c
            } else if let Some(c) = text.seal_partial(off, text.total - off, *k) {
                c
            } else {
                let len = text.total - off;
                let mut staged = [0u8; REG];
                text.gather(off, len, &mut staged);
                let c = _mm256_xor_si256(_mm256_loadu_si256(staged.as_ptr().cast()), *k);
                _mm256_storeu_si256(staged.as_mut_ptr().cast(), c);
                std::ptr::copy_nonoverlapping(staged.as_ptr(), text.out.add(off), len);
                // GHASH pads the last block with zeros, not with keystream.
                staged[len..].fill(0);
                _mm256_loadu_si256(staged.as_ptr().cast())
            };
            sum.add_at(_mm256_shuffle_epi8(c, reverse), powers);
            powers = powers.add(2);
        }
        off += REG;
    }
    *products = sum;
}

/// Adds the GHASH products of `len` bytes at `data` (the last block zero-padded), block `j`
/// times the power at `powers + j`.
///
/// # Safety
/// `data..data + len` readable; `powers` as for [`encrypt_and_hash`].
#[target_feature(enable = "avx2,vpclmulqdq")]
unsafe fn hash_into(sum: &mut Products, data: *const u8, len: usize, powers: *const __m128i) {
    let reverse = _mm256_broadcastsi128_si256(byte_reverse_mask());
    let mut off = 0;
    while off < len {
        // SAFETY: a whole register below `len` is read directly, the last partial one through
        // a zero-padded copy; two powers from a block of this message.
        unsafe {
            let d = if len - off >= REG {
                _mm256_loadu_si256(data.add(off).cast())
            } else {
                let mut staged = [0u8; REG];
                std::ptr::copy_nonoverlapping(data.add(off), staged.as_mut_ptr(), len - off);
                _mm256_loadu_si256(staged.as_ptr().cast())
            };
            sum.add_at(_mm256_shuffle_epi8(d, reverse), powers.add(off / 16));
        }
        off += REG;
    }
}

/// The seal with `NR` rounds: the shared driver, compiled with this width's instructions so
/// that its helpers inline into it.
///
/// # Safety
/// The CPU has the features named; `text.len() == in_len + extra.len()`, and `in_len % 16 == 0`
/// or `extra` is empty.
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,pclmulqdq")]
unsafe fn seal_with<const NR: usize>(
    key: &Key,
    nonce: &[u8; 12],
    aad: &[u8],
    text: &mut [u8],
    in_len: usize,
    extra: &[u8],
    tag: &mut [u8; 16],
) {
    // SAFETY: as the caller promised.
    unsafe { super::seal::<Key, NR>(key, nonce, aad, text, in_len, extra, tag) }
}

impl Lanes for Key {
    type Sum = Products;
    type Counter = Counter;

    fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// A pointer to `schedule.h_powers[0]` that may reach every entry of `h_powers` and of
    /// `h_halves` ([`HALVES`] blocks on): taken from a pointer to the whole key, not from a
    /// borrow of one array.
    fn powers(&self) -> *const __m128i {
        let key: *const Key = self;
        // SAFETY: a field of a valid Key; no reference is made.
        unsafe { std::ptr::addr_of!((*key).schedule.h_powers).cast() }
    }

    #[inline(always)]
    unsafe fn sum() -> Products {
        // SAFETY: the CPU has the instructions, as the caller promised.
        unsafe { Products::new() }
    }

    #[inline(always)]
    unsafe fn counter(nonce: __m128i, first: u32) -> Counter {
        // SAFETY: as for `sum`.
        unsafe { Counter::new(nonce, first) }
    }

    #[inline(always)]
    unsafe fn add_carry(sum: &mut Products, acc: __m128i, powers: *const __m128i) {
        // SAFETY: as the caller promised.
        unsafe { sum.add_carry(acc, powers) }
    }

    #[inline(always)]
    unsafe fn hash_into(sum: &mut Products, data: *const u8, len: usize, powers: *const __m128i) {
        // SAFETY: as the caller promised.
        unsafe { hash_into(sum, data, len, powers) }
    }

    #[inline(always)]
    unsafe fn encrypt_and_hash<const NR: usize>(
        &self,
        ctr: &mut Counter,
        text: Parts,
        powers: *const __m128i,
        sum: &mut Products,
    ) {
        let text = Plaintext {
            out: text.out,
            in_len: text.in_len,
            extra: text.extra,
            total: text.total,
        };
        // SAFETY: as the caller promised.
        unsafe { encrypt_and_hash::<NR>(&self.wide_round_keys, ctr, text, powers, sum) }
    }

    #[inline(always)]
    unsafe fn reduce(sum: &Products) -> __m128i {
        // SAFETY: as for `sum`.
        unsafe { sum.reduce() }
    }
}

// ---- the open ----

impl Key {
    /// Opens `text` (the ciphertext) in place under `nonce` with `aad` authenticated, against
    /// `tag`: the plaintext replaces the ciphertext when the tag matches. When it does not,
    /// `text` is zeroed and `false` returned. `text` is at most `MAX_PLAINTEXT_LEN` bytes
    /// (checked by `OpenKey::open`).
    pub(crate) fn open(
        &self,
        nonce: &[u8; 12],
        aad: &[u8],
        text: &mut [u8],
        tag: &[u8; 16],
    ) -> bool {
        // SAFETY: a Key is only built where `available()` held.
        let authentic = unsafe {
            if self.schedule.aes.rounds == 10 {
                open_with::<10>(self, nonce, aad, text, tag)
            } else {
                open_with::<14>(self, nonce, aad, text, tag)
            }
        };
        if !authentic {
            // What was decrypted is not authenticated: nothing of it is left.
            text.fill(0);
        }
        authentic
    }
}

/// Decrypts the `len` bytes at `data` in place and adds every ciphertext block's GHASH product
/// to `products`, block `j` times the power at `powers + j`. The ciphertext is at hand before
/// its keystream, so each round trip's registers are hashed during its own AES rounds.
///
/// # Safety
/// `data..data + len` readable and writable; `powers` points into `h_powers` with
/// `len.div_ceil(16)` powers and then at least one more entry after it; the CPU has the
/// features named.
#[target_feature(enable = "avx2,vaes,vpclmulqdq")]
unsafe fn decrypt_and_hash<const NR: usize>(
    rk: &[__m256i; 15],
    ctr: &mut Counter,
    data: *mut u8,
    len: usize,
    mut powers: *const __m128i,
    products: &mut Products,
) {
    let mut sum = *products;
    let reverse = _mm256_broadcastsi128_si256(byte_reverse_mask());
    let mut off = 0;
    while len - off >= WIDE * REG {
        // SAFETY: WIDE whole registers lie below `len`; the round trip's 2 * WIDE powers follow
        // `powers` (the message has that many more blocks).
        unsafe {
            let c: [__m256i; WIDE] =
                std::array::from_fn(|i| _mm256_loadu_si256(data.add(off + REG * i).cast()));
            let blocks = std::array::from_fn(|_| ctr.next());
            let pending = Pending { c, powers };
            let ks = encrypt_2x_hashing::<NR, WIDE>(rk, blocks, &pending, &mut sum, reverse);
            for (i, k) in ks.iter().enumerate() {
                _mm256_storeu_si256(data.add(off + REG * i).cast(), _mm256_xor_si256(c[i], *k));
            }
            powers = powers.add(2 * WIDE);
        }
        off += WIDE * REG;
    }
    let rest = len - off;
    if rest > 0 {
        // The rest, fewer than WIDE registers, staged on the stack (one copy in, one out,
        // measured cheaper than reading its whole registers in place and staging only the
        // last), its keystream in one pass of 2, 4, 6 or 8 registers, whichever covers it.
        let mut staged = [0u8; WIDE * REG];
        // SAFETY: `rest` bytes at `off` are the message's last; `staged` holds more and
        // overlaps nothing.
        unsafe { std::ptr::copy_nonoverlapping(data.add(off), staged.as_mut_ptr(), rest) };
        let used = rest.div_ceil(REG);
        let mut ks = [_mm256_setzero_si256(); WIDE];
        if used <= 2 {
            ks[..2].copy_from_slice(&encrypt_2x::<NR, 2>(
                rk,
                std::array::from_fn(|_| ctr.next()),
            ));
        } else if used <= 4 {
            ks[..4].copy_from_slice(&encrypt_2x::<NR, 4>(
                rk,
                std::array::from_fn(|_| ctr.next()),
            ));
        } else if used <= 6 {
            ks[..6].copy_from_slice(&encrypt_2x::<NR, 6>(
                rk,
                std::array::from_fn(|_| ctr.next()),
            ));
        } else {
            ks = encrypt_2x::<NR, WIDE>(rk, std::array::from_fn(|_| ctr.next()));
        }
        for (i, k) in ks.iter().enumerate().take(used) {
            // SAFETY: register `i` lies in `staged`; its first power is the power of a block
            // of this message, and a second lane past the message's last block is zero, so
            // the entry after it (the lengths block's power or the zero padding) adds nothing.
            unsafe {
                let c = _mm256_loadu_si256(staged.as_ptr().add(REG * i).cast());
                sum.add_at(_mm256_shuffle_epi8(c, reverse), powers.add(2 * i));
                _mm256_storeu_si256(
                    staged.as_mut_ptr().add(REG * i).cast(),
                    _mm256_xor_si256(c, *k),
                );
            }
        }
        // SAFETY: back to where the `rest` bytes came from.
        unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), data.add(off), rest) };
    }
    *products = sum;
}

/// AES-GCM opening with `NR` rounds: `text` decrypted in place within the shared GCM framing
/// (`super::gcm`, as the seal's), and the tag it computes over `aad` and the ciphertext
/// compared with `tag` without branching on their contents. True when they match.
///
/// # Safety
/// The CPU has the features named.
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,pclmulqdq")]
unsafe fn open_with<const NR: usize>(
    key: &Key,
    nonce: &[u8; 12],
    aad: &[u8],
    text: &mut [u8],
    tag: &[u8; 16],
) -> bool {
    let rk = &key.wide_round_keys;
    let data = text.as_mut_ptr();
    // SAFETY: the CPU has the instructions, as the caller promised; each window
    // `base..base + len` lies inside `text`, with its powers from `key`.
    unsafe {
        let expected = super::gcm::<Key, NR>(
            key,
            nonce,
            aad,
            text.len(),
            |ctr, base, len, powers, sum| {
                decrypt_and_hash::<NR>(rk, ctr, data.add(base), len, powers, sum)
            },
        );
        let diff = _mm_xor_si128(expected, _mm_loadu_si128(tag.as_ptr().cast()));
        _mm_testz_si128(diff, diff) == 1
    }
}
