//! AES-GCM sealing (and opening) of one QUIC packet in a single pipelined pass.
//!
//! quiche seals every 1,350-byte packet through BoringSSL's generic AEAD: per packet it sets up
//! a GCM context, encrypts the tag mask `E(K, J0)` as a lone AES block, hashes the header and
//! the lengths block in separate calls and runs the bulk AES-GCM routine over a message a
//! twelfth the size of a TLS record. On a bulk download that set-up costs more than the bulk
//! cipher itself. [`SealKey::seal`] does the same AES-GCM (NIST SP 800-38D, 96-bit nonce,
//! 128-bit tag) with none of it: the counter blocks of the whole packet go through AES four
//! to a 512-bit register (two to a 256-bit one), eight registers per round trip, each register
//! of ciphertext is hashed as it is made or, in the AVX2 width, between the next round trip's
//! AES rounds (header, ciphertext and lengths block each multiplied by its own precomputed
//! power of H), and the packet's GHASH is reduced once. Messages longer than 128 blocks (about
//! 2 KB, more than a packet) go through in windows of 128 blocks, one reduction each.
//!
//! It takes a packet the way quiche's writer holds it after its zero-copy patch: the frame
//! headers in the output buffer and the stream data still in the send buffer (`extra_in`),
//! so the stream bytes are read once, encrypted straight into the packet.
//!
//! [`OpenKey::open`] is the receiving side, in the AVX2 width only (which CPUs with the AVX-512
//! width also run): the ciphertext is at hand before its keystream, so each round trip is hashed
//! during its own AES rounds; the tag is compared with one `ptest`, and a packet that fails is
//! zeroed, so no unauthenticated plaintext is left behind.
//!
//! Two register widths are served on x86-64 ([`Width`]): AVX-512 (F, BW, VL) with VAES and
//! VPCLMULQDQ, four blocks to a register, and AVX2 with VAES and VPCLMULQDQ, two blocks to a
//! register, for CPUs without AVX-512 (AMD Zen 3, Intel's client cores since Alder Lake).
//! [`SealKey::new`] takes the widest the CPU has and answers `None` where it has neither; the
//! caller then keeps its own AEAD. AES and carry-less multiplication in hardware take constant
//! time; nothing here branches on key or data (only on lengths). Round keys and powers of H are
//! wiped on drop and never printed.

#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(target_arch = "x86_64")]
mod x86;

/// Length of the authentication tag [`SealKey::seal`] appends.
pub const TAG_LEN: usize = 16;

/// Length of the nonce [`SealKey::seal`] takes.
pub const NONCE_LEN: usize = 12;

/// A QUIC header-protection key for AES (RFC 9001, section 5.4.3): 16 bytes for the AES-128
/// suites, 32 for AES-256. [`MaskKey::mask`] encrypts a packet's 16-byte sample with AES-NI,
/// inline; the round keys are wiped on drop.
#[derive(Clone)]
pub struct MaskKey {
    #[cfg(target_arch = "x86_64")]
    inner: x86::RoundKeys,
}

impl MaskKey {
    /// `None` where the CPU has no AES-NI, or for a key of another length.
    pub fn new(key: &[u8]) -> Option<MaskKey> {
        #[cfg(target_arch = "x86_64")]
        {
            if !is_x86_feature_detected!("aes") {
                return None;
            }
            // SAFETY: AES-NI was just detected.
            let inner = unsafe { x86::RoundKeys::new(key)? };
            Some(MaskKey { inner })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = key;
            None
        }
    }

    /// The header-protection mask for `sample`: AES-ECB of the sample under the key, whose
    /// first five bytes mask the first byte and the packet number.
    pub fn mask(&self, sample: &[u8; 16]) -> [u8; 16] {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: `new` built this key only after detecting AES-NI.
            unsafe { self.inner.encrypt(sample) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = sample;
            unreachable!("MaskKey is never built off x86-64")
        }
    }
}

/// Why a seal was refused. Nothing is written when it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealError {
    /// `buf` cannot hold the plaintext, `extra_in` and the tag.
    BufferTooSmall,
    /// The plaintext is longer than a QUIC packet can be (64 KiB).
    TooLong,
}

impl std::fmt::Display for SealError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SealError::BufferTooSmall => {
                f.write_str("output buffer too small for ciphertext and tag")
            }
            SealError::TooLong => f.write_str("plaintext longer than 65,535 bytes"),
        }
    }
}

impl std::error::Error for SealError {}

/// Longest plaintext sealed: a UDP payload's worth. Keeps the 32-bit block counter far from
/// wrapping and every length below what GHASH's lengths block could overflow.
pub const MAX_PLAINTEXT_LEN: usize = 65_535;

/// The register width a [`SealKey`] seals with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// Four AES blocks to a 512-bit register: AVX-512 F/BW/VL, VAES, VPCLMULQDQ.
    Avx512,
    /// Two AES blocks to a 256-bit register: AVX2, VAES, VPCLMULQDQ.
    Avx2,
}

impl Width {
    /// Every width, widest first.
    pub const ALL: [Width; 2] = [Width::Avx512, Width::Avx2];

    /// Whether this CPU has the instructions this width needs.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Width::Avx512 => x86::avx512::available(),
                Width::Avx2 => x86::avx2::available(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The widest width this CPU runs, if any.
    pub fn best() -> Option<Width> {
        Width::ALL.into_iter().find(|w| w.available())
    }
}

/// Whether this CPU runs [`SealKey`] at all (see [`Width`]).
pub fn available() -> bool {
    Width::best().is_some()
}

/// An AES-128-GCM or AES-256-GCM key prepared for sealing packets: round keys and the first
/// 128 powers of the hash key.
pub struct SealKey {
    #[cfg(target_arch = "x86_64")]
    inner: Inner,
}

#[cfg(target_arch = "x86_64")]
enum Inner {
    Avx512(Box<x86::avx512::Key>),
    Avx2(Box<x86::avx2::Key>),
}

impl SealKey {
    /// Prepares `key` (16 bytes for AES-128, 32 for AES-256) for the widest width the CPU runs.
    /// `None` when it runs neither (see [`available`]) or the key has another length.
    pub fn new(key: &[u8]) -> Option<SealKey> {
        SealKey::with_width(key, Width::best()?)
    }

    /// Prepares `key` for `width` (for tests and comparisons of the widths). `None` when the
    /// CPU lacks that width's instructions or the key has another length.
    pub fn with_width(key: &[u8], width: Width) -> Option<SealKey> {
        if !width.available() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let inner = match width {
                Width::Avx512 => Inner::Avx512(x86::avx512::Key::new(key)?),
                Width::Avx2 => Inner::Avx2(x86::avx2::Key::new(key)?),
            };
            Some(SealKey { inner })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = key;
            None
        }
    }

    /// The width this key seals with.
    pub fn width(&self) -> Width {
        #[cfg(target_arch = "x86_64")]
        {
            match self.inner {
                Inner::Avx512(_) => Width::Avx512,
                Inner::Avx2(_) => Width::Avx2,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            unreachable!("SealKey is never built off x86-64")
        }
    }

    /// Seals `buf[..in_len] ‖ extra_in` under `nonce` with `aad` authenticated: the ciphertext
    /// goes to `buf[..in_len + extra_in.len()]` (the first part encrypted in place) and the tag
    /// right after it. Returns the bytes written, `in_len + extra_in.len() + TAG_LEN`.
    ///
    /// The two parts are contiguous in the output only; `extra_in` is read, never written.
    /// When `in_len` is not a multiple of 16, the first 1–15 bytes of `extra_in` are copied
    /// behind the first part (where their ciphertext goes anyway) so the parts meet on a block
    /// boundary.
    pub fn seal(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        buf: &mut [u8],
        in_len: usize,
        extra_in: &[u8],
    ) -> Result<usize, SealError> {
        let total = in_len
            .checked_add(extra_in.len())
            .ok_or(SealError::TooLong)?;
        if total > MAX_PLAINTEXT_LEN || aad.len() > MAX_PLAINTEXT_LEN {
            return Err(SealError::TooLong);
        }
        if total + TAG_LEN > buf.len() {
            return Err(SealError::BufferTooSmall);
        }
        // The counter of the second part's first block must follow the first part's last:
        // a first part ending mid-block would need the keystream split across the seam, so
        // the first part is completed to a block boundary from `extra_in` (or takes all of it).
        let (in_len, extra_in) = if in_len.is_multiple_of(16) {
            (in_len, extra_in)
        } else {
            let k = (16 - in_len % 16).min(extra_in.len());
            buf[in_len..in_len + k].copy_from_slice(&extra_in[..k]);
            (in_len + k, &extra_in[k..])
        };
        #[cfg(target_arch = "x86_64")]
        {
            let (text, rest) = buf.split_at_mut(total);
            let tag: &mut [u8; TAG_LEN] = (&mut rest[..TAG_LEN]).try_into().expect("TAG_LEN bytes");
            match &self.inner {
                Inner::Avx512(k) => k.seal(nonce, aad, text, in_len, extra_in, tag),
                Inner::Avx2(k) => k.seal(nonce, aad, text, in_len, extra_in, tag),
            }
            Ok(total + TAG_LEN)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (nonce, in_len, extra_in);
            unreachable!("SealKey is never built off x86-64")
        }
    }
}

/// Why an open was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    /// The buffer is shorter than a tag.
    TooShort,
    /// The ciphertext is longer than a QUIC packet can be (64 KiB).
    TooLong,
    /// The tag does not match: the packet was not sealed under this key, nonce and header.
    /// The ciphertext's bytes have been zeroed.
    Forged,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::TooShort => f.write_str("input shorter than the tag"),
            OpenError::TooLong => f.write_str("ciphertext longer than 65,535 bytes"),
            OpenError::Forged => f.write_str("authentication tag mismatch"),
        }
    }
}

impl std::error::Error for OpenError {}

/// An AES-128-GCM or AES-256-GCM key prepared for opening packets in one pass: each round
/// trip's ciphertext is hashed during its own AES rounds, and the tag compared without
/// branching on its bytes. It uses the AVX2 width (VAES and VPCLMULQDQ on 256-bit registers),
/// which CPUs with the AVX-512 width have as well.
pub struct OpenKey {
    #[cfg(target_arch = "x86_64")]
    inner: Box<x86::avx2::Key>,
}

impl OpenKey {
    /// Prepares `key` (16 bytes for AES-128, 32 for AES-256). `None` when the CPU lacks the
    /// AVX2 width's instructions or the key has another length.
    pub fn new(key: &[u8]) -> Option<OpenKey> {
        if !Width::Avx2.available() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            Some(OpenKey {
                inner: x86::avx2::Key::new(key)?,
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = key;
            None
        }
    }

    /// Opens `buf`, a ciphertext followed by its [`TAG_LEN`]-byte tag, under `nonce` with
    /// `aad` authenticated: on success the plaintext is `buf[..n]` for the `n` returned
    /// (`buf.len() - TAG_LEN`). On [`OpenError::Forged`] that part of `buf` is zeroed, so no
    /// unauthenticated plaintext is left; on the length errors nothing is written.
    pub fn open(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<usize, OpenError> {
        let n = buf.len().checked_sub(TAG_LEN).ok_or(OpenError::TooShort)?;
        if n > MAX_PLAINTEXT_LEN || aad.len() > MAX_PLAINTEXT_LEN {
            return Err(OpenError::TooLong);
        }
        #[cfg(target_arch = "x86_64")]
        {
            let (text, tag) = buf.split_at_mut(n);
            let tag: &[u8; TAG_LEN] = (&*tag).try_into().expect("TAG_LEN bytes");
            if self.inner.open(nonce, aad, text, tag) {
                Ok(n)
            } else {
                Err(OpenError::Forged)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (nonce, n);
            unreachable!("OpenKey is never built off x86-64")
        }
    }
}

impl std::fmt::Debug for OpenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenKey { .. }")
    }
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey { .. }")
    }
}
