use super::*;

use std::convert::TryFrom;

use std::mem::MaybeUninit;

use std::ptr::NonNull;

use libc::c_int;
use libc::c_uint;
use libc::c_void;

#[allow(non_camel_case_types)]
#[repr(transparent)]
struct EVP_AEAD_CTX {
    _unused: c_void,
}

#[derive(Clone)]
#[repr(C)]
pub(crate) struct AES_KEY {
    rd_key: [u32; 4 * (14 + 1)],
    rounds: c_int,
}

impl Algorithm {
    fn get_evp_aead(self) -> *const EVP_AEAD {
        match self {
            Algorithm::AES128_GCM => unsafe { EVP_aead_aes_128_gcm_tls13() },
            Algorithm::AES256_GCM => unsafe { EVP_aead_aes_256_gcm_tls13() },
            Algorithm::ChaCha20_Poly1305 => unsafe {
                EVP_aead_chacha20_poly1305()
            },
        }
    }
}

pub(crate) struct PacketKey {
    alg: Algorithm,

    ctx: NonNull<EVP_AEAD_CTX>,

    nonce: Vec<u8>,

    // rampart: an AES-GCM sealing key that seals a packet in one pipelined pass
    // (`packetseal`), for encrypting keys on CPUs with VAES and VPCLMULQDQ (with AVX-512 or
    // AVX2); `None` elsewhere, for decrypting keys and for ChaCha20-Poly1305, which seal
    // through `ctx`.
    fast_seal: Option<packetseal::SealKey>,

    // rampart: the lowest counter `fast_seal` may use next. A repeated GCM nonce gives away
    // the XOR of two plaintexts and the hash key, so the one-pass path refuses a counter
    // that does not increase (packet numbers always do), as BoringSSL's TLS 1.3 AEAD refuses
    // a repeated one.
    fast_seal_next_counter: u64,

    // rampart: an AES-GCM opening key that opens a packet in one pass (`packetseal::OpenKey`,
    // the AVX2 width), for decrypting keys on CPUs with AVX2, VAES and VPCLMULQDQ; `None`
    // elsewhere, for encrypting keys and for ChaCha20-Poly1305, which open through `ctx`.
    fast_open: Option<packetseal::OpenKey>,
}

impl PacketKey {
    pub fn new(
        alg: Algorithm, key: Vec<u8>, iv: Vec<u8>, enc: u32,
    ) -> Result<Self> {
        let fast_seal = match alg {
            Algorithm::AES128_GCM | Algorithm::AES256_GCM
                if enc == Seal::ENCRYPT =>
                fast_seal_width()
                    .and_then(|width| packetseal::SealKey::with_width(&key, width)),
            _ => None,
        };
        let fast_open = match alg {
            Algorithm::AES128_GCM | Algorithm::AES256_GCM
                if enc == Open::DECRYPT && fast_seal_width().is_some() =>
                packetseal::OpenKey::new(&key),
            _ => None,
        };

        Ok(Self {
            alg,
            ctx: make_aead_ctx(alg, &key)?,
            nonce: iv,
            fast_seal,
            fast_seal_next_counter: 0,
            fast_open,
        })
    }

    pub fn from_secret(aead: Algorithm, secret: &[u8], enc: u32) -> Result<Self> {
        let key_len = aead.key_len();
        let nonce_len = aead.nonce_len();

        let mut key = vec![0; key_len];
        let mut iv = vec![0; nonce_len];

        derive_pkt_key(aead, secret, &mut key)?;
        derive_pkt_iv(aead, secret, &mut iv)?;

        let mut pkt_key = Self::new(aead, key, iv, enc)?;

        // Dummy seal operation to prime the AEAD context with the nonce mask.
        //
        // This is needed because BoringCrypto requires the first counter (i.e.
        // packet number) to be zero, which would not be the case for packet
        // number spaces after Initial as the same packet number sequence is
        // shared.
        let _ = pkt_key.seal_with_u64_counter(0, b"", &mut [0_u8; 16], 0, None);

        Ok(pkt_key)
    }

    pub fn open_with_u64_counter(
        &self, counter: u64, ad: &[u8], buf: &mut [u8],
    ) -> Result<usize> {
        let tag_len = self.alg.tag_len();

        let mut out_len = match buf.len().checked_sub(tag_len) {
            Some(n) => n,
            None => return Err(Error::CryptoFail),
        };

        let max_out_len = out_len;

        let nonce = make_nonce(&self.nonce, counter);

        // rampart: the one-pass opener, where this key has one. The same AES-GCM (packetseal's
        // tests open what BoringSSL sealed and refuse every altered bit); a packet that fails
        // is left zeroed rather than holding unauthenticated plaintext.
        if let Some(fast) = &self.fast_open {
            return fast
                .open(&nonce, ad, buf)
                .map_err(|_| Error::CryptoFail);
        }

        let rc = unsafe {
            EVP_AEAD_CTX_open(
                self.ctx.as_ptr(),  // ctx
                buf.as_mut_ptr(),   // out
                &mut out_len,       // out_len
                max_out_len,        // max_out_len
                nonce[..].as_ptr(), // nonce
                nonce.len(),        // nonce_len
                buf.as_ptr(),       // inp
                buf.len(),          // in_len
                ad.as_ptr(),        // ad
                ad.len(),           // ad_len
            )
        };

        if rc != 1 {
            return Err(Error::CryptoFail);
        }

        Ok(out_len)
    }

    pub fn seal_with_u64_counter(
        &mut self, counter: u64, ad: &[u8], buf: &mut [u8], in_len: usize,
        extra_in: Option<&[u8]>,
    ) -> Result<usize> {
        let tag_len = self.alg.tag_len();

        let mut out_tag_len = tag_len;

        let (extra_in_ptr, extra_in_len) = match extra_in {
            Some(v) => (v.as_ptr(), v.len()),

            None => (std::ptr::null(), 0),
        };

        // Make sure all the outputs combined fit in the buffer.
        if in_len + tag_len + extra_in_len > buf.len() {
            return Err(Error::CryptoFail);
        }

        // rampart: `extra_in`'s ciphertext lands right after `in`'s, so moving its first bytes
        // into `buf` changes nothing in the output. Moving enough of them to end `in` on a
        // 16-byte boundary spares the cipher a partial block where the two meet (one more
        // AES block and GHASH multiplication per packet).
        let (in_len, extra_tail) = match extra_in {
            Some(extra) if in_len % 16 != 0 => {
                let k = (16 - in_len % 16).min(extra.len());
                buf[in_len..in_len + k].copy_from_slice(&extra[..k]);
                (in_len + k, &extra[k..])
            },
            Some(extra) => (in_len, extra),
            None => (in_len, &[][..]),
        };
        let (extra_in_ptr, extra_in_len) = if extra_tail.is_empty() {
            (extra_in_ptr, 0)
        } else {
            (extra_tail.as_ptr(), extra_tail.len())
        };

        let nonce = make_nonce(&self.nonce, counter);

        // rampart: the one-pass sealer, where this key has one. Same AES-GCM output
        // (packetseal's tests compare it with BoringSSL's byte for byte).
        if let Some(fast) = &self.fast_seal {
            if counter < self.fast_seal_next_counter {
                return Err(Error::CryptoFail);
            }
            let next = counter.checked_add(1).ok_or(Error::CryptoFail)?;
            let written = fast
                .seal(&nonce, ad, buf, in_len, extra_tail)
                .map_err(|_| Error::CryptoFail)?;
            self.fast_seal_next_counter = next;
            return Ok(written);
        }

        let rc = unsafe {
            EVP_AEAD_CTX_seal_scatter(
                self.ctx.as_ptr(),          // ctx
                buf.as_mut_ptr(),           // out
                buf[in_len..].as_mut_ptr(), // out_tag
                &mut out_tag_len,           // out_tag_len
                tag_len + extra_in_len,     // max_out_tag_len
                nonce[..].as_ptr(),         // nonce
                nonce.len(),                // nonce_len
                buf.as_ptr(),               // inp
                in_len,                     // in_len
                extra_in_ptr,               // extra_in
                extra_in_len,               // extra_in_len
                ad.as_ptr(),                // ad
                ad.len(),                   // ad_len
            )
        };

        if rc != 1 {
            return Err(Error::CryptoFail);
        }

        Ok(in_len + out_tag_len)
    }
}

// PacketKey uniquely owns the context. Its API requires exclusive access for
// stateful seal operations, while open operations support shared access.
unsafe impl Send for PacketKey {}
unsafe impl Sync for PacketKey {}

impl Drop for PacketKey {
    fn drop(&mut self) {
        unsafe { EVP_AEAD_CTX_free(self.ctx.as_ptr()) }
    }
}

#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum HeaderProtectionKey {
    Aes(AES_KEY),

    // rampart: AES header protection with AES-NI inline (`packetseal::MaskKey`,
    // unless `RAMPART_QUIC_SEAL=boringssl`), where BoringSSL's `AES_ecb_encrypt` went through
    // a call chain and a CPU dispatch for every packet's one block.
    FastAes(packetseal::MaskKey),

    ChaCha(Vec<u8>),
}

impl HeaderProtectionKey {
    pub fn new(alg: Algorithm, hp_key: Vec<u8>) -> Result<Self> {
        match alg {
            Algorithm::AES128_GCM | Algorithm::AES256_GCM => {
                if seal_setting() != SealSetting::BoringSsl {
                    if let Some(key) = packetseal::MaskKey::new(&hp_key) {
                        return Ok(Self::FastAes(key));
                    }
                }

                Self::boringssl_aes(&hp_key, alg.key_len() as u32 * 8)
            },

            Algorithm::ChaCha20_Poly1305 => Ok(Self::ChaCha(hp_key)),
        }
    }

    /// BoringSSL's AES key for header protection (`AES_ecb_encrypt` per mask).
    fn boringssl_aes(hp_key: &[u8], key_len_bits: u32) -> Result<Self> {
        unsafe {
            let mut aes_key = MaybeUninit::<AES_KEY>::uninit();

            let rc = AES_set_encrypt_key(
                hp_key.as_ptr(),
                key_len_bits,
                aes_key.as_mut_ptr(),
            );

            if rc != 0 {
                return Err(Error::CryptoFail);
            }

            let aes_key = aes_key.assume_init();
            Ok(Self::Aes(aes_key))
        }
    }

    pub fn new_mask(&self, sample: &[u8]) -> Result<HeaderProtectionMask> {
        match self {
            Self::FastAes(key) => {
                let sample: &[u8; 16] = sample
                    .get(..16)
                    .and_then(|s| s.try_into().ok())
                    .ok_or(Error::CryptoFail)?;
                let block = key.mask(sample);
                let new_mask =
                    HeaderProtectionMask::try_from(&block[..HP_MASK_LEN])
                        .unwrap();
                Ok(new_mask)
            },

            Self::Aes(aes_key) => {
                let mut block = [0_u8; 16];

                unsafe {
                    AES_ecb_encrypt(
                        sample.as_ptr(),
                        block.as_mut_ptr(),
                        aes_key as _,
                        1,
                    )
                };

                // Downsize the encrypted block to the size of the header
                // protection mask.
                //
                // The length of the slice will always match the size of
                // `HeaderProtectionMask` so the `unwrap()` is safe.
                let new_mask =
                    HeaderProtectionMask::try_from(&block[..HP_MASK_LEN])
                        .unwrap();
                Ok(new_mask)
            },

            Self::ChaCha(key) => {
                const PLAINTEXT: &[u8; HP_MASK_LEN] = &[0_u8; HP_MASK_LEN];

                let mut new_mask = HeaderProtectionMask::default();

                let counter = u32::from_le_bytes([
                    sample[0], sample[1], sample[2], sample[3],
                ]);

                unsafe {
                    CRYPTO_chacha_20(
                        new_mask.as_mut_ptr(),
                        PLAINTEXT.as_ptr(),
                        PLAINTEXT.len(),
                        key.as_ptr(),
                        sample[size_of::<u32>()..].as_ptr(),
                        counter,
                    );
                };

                Ok(new_mask)
            },
        }
    }
}

/// rampart: `RAMPART_QUIC_SEAL` in the environment (read once), for comparing
/// QUIC's packet protection: `boringssl` keeps BoringSSL for all of it (sealing,
/// opening and header protection), `avx2` seals with packetseal's 256-bit width
/// where the CPU runs it; unset (or anything else), the fastest the CPU runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SealSetting {
    BoringSsl,
    Avx2,
    Best,
}

fn seal_setting() -> SealSetting {
    static SETTING: std::sync::OnceLock<SealSetting> = std::sync::OnceLock::new();
    *SETTING.get_or_init(|| match std::env::var("RAMPART_QUIC_SEAL").as_deref() {
        Ok("boringssl") => SealSetting::BoringSsl,
        Ok("avx2") => SealSetting::Avx2,
        _ => SealSetting::Best,
    })
}

/// rampart: the `packetseal` width encrypting packet keys use: the widest the
/// CPU runs, unless `seal_setting` says otherwise. Decrypting keys open with the
/// AVX2 width whenever this is `Some`. AES header protection uses
/// `packetseal::MaskKey` (AES-NI) unless the setting is `boringssl`.
fn fast_seal_width() -> Option<packetseal::Width> {
    static WIDTH: std::sync::OnceLock<Option<packetseal::Width>> =
        std::sync::OnceLock::new();
    *WIDTH.get_or_init(|| match seal_setting() {
        SealSetting::BoringSsl => None,
        SealSetting::Avx2 => Some(packetseal::Width::Avx2),
        SealSetting::Best => packetseal::Width::best(),
    })
}

fn make_aead_ctx(alg: Algorithm, key: &[u8]) -> Result<NonNull<EVP_AEAD_CTX>> {
    let ctx = unsafe {
        let aead = alg.get_evp_aead();

        EVP_AEAD_CTX_new(aead, key.as_ptr(), alg.key_len(), alg.tag_len())
    };

    NonNull::new(ctx).ok_or(Error::CryptoFail)
}

pub(crate) fn hkdf_extract(
    alg: Algorithm, out: &mut [u8], secret: &[u8], salt: &[u8],
) -> Result<()> {
    let mut out_len = out.len();

    let rc = unsafe {
        HKDF_extract(
            out.as_mut_ptr(),
            &mut out_len,
            alg.get_evp_digest(),
            secret.as_ptr(),
            secret.len(),
            salt.as_ptr(),
            salt.len(),
        )
    };

    if rc != 1 {
        return Err(Error::CryptoFail);
    }

    Ok(())
}

pub(crate) fn hkdf_expand(
    alg: Algorithm, out: &mut [u8], secret: &[u8], info: &[u8],
) -> Result<()> {
    let rc = unsafe {
        HKDF_expand(
            out.as_mut_ptr(),
            out.len(),
            alg.get_evp_digest(),
            secret.as_ptr(),
            secret.len(),
            info.as_ptr(),
            info.len(),
        )
    };

    if rc != 1 {
        return Err(Error::CryptoFail);
    }

    Ok(())
}

extern "C" {
    fn EVP_aead_aes_128_gcm_tls13() -> *const EVP_AEAD;

    fn EVP_aead_aes_256_gcm_tls13() -> *const EVP_AEAD;

    fn EVP_aead_chacha20_poly1305() -> *const EVP_AEAD;

    // HKDF
    fn HKDF_extract(
        out_key: *mut u8, out_len: *mut usize, digest: *const EVP_MD,
        secret: *const u8, secret_len: usize, salt: *const u8, salt_len: usize,
    ) -> c_int;

    fn HKDF_expand(
        out_key: *mut u8, out_len: usize, digest: *const EVP_MD, prk: *const u8,
        prk_len: usize, info: *const u8, info_len: usize,
    ) -> c_int;

    // EVP_AEAD_CTX
    fn EVP_AEAD_CTX_new(
        aead: *const EVP_AEAD, key: *const u8, key_len: usize, tag_len: usize,
    ) -> *mut EVP_AEAD_CTX;

    fn EVP_AEAD_CTX_free(ctx: *mut EVP_AEAD_CTX);

    fn EVP_AEAD_CTX_open(
        ctx: *const EVP_AEAD_CTX, out: *mut u8, out_len: *mut usize,
        max_out_len: usize, nonce: *const u8, nonce_len: usize, inp: *const u8,
        in_len: usize, ad: *const u8, ad_len: usize,
    ) -> c_int;

    fn EVP_AEAD_CTX_seal_scatter(
        ctx: *mut EVP_AEAD_CTX, out: *mut u8, out_tag: *mut u8,
        out_tag_len: *mut usize, max_out_tag_len: usize, nonce: *const u8,
        nonce_len: usize, inp: *const u8, in_len: usize, extra_in: *const u8,
        extra_in_len: usize, ad: *const u8, ad_len: usize,
    ) -> c_int;

    // AES
    fn AES_set_encrypt_key(
        key: *const u8, bits: c_uint, aeskey: *mut AES_KEY,
    ) -> c_int;

    fn AES_ecb_encrypt(
        inp: *const u8, out: *mut u8, key: *const AES_KEY, enc: c_int,
    );

    // ChaCha20
    fn CRYPTO_chacha_20(
        out: *mut u8, inp: *const u8, in_len: usize, key: *const u8,
        nonce: *const u8, counter: u32,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An AES-GCM sealing key, sealing through packetseal (`fast`) or BoringSSL; None when
    /// `fast` is asked for and this CPU has no one-pass sealer.
    fn key(alg: Algorithm, fast: bool) -> Option<PacketKey> {
        let key = vec![0x3c; alg.key_len()];
        let iv = vec![0x5a; alg.nonce_len()];
        let mut k = PacketKey::new(alg, key, iv, Seal::ENCRYPT).unwrap();
        if !fast {
            k.fast_seal = None;
        }
        (k.fast_seal.is_some() == fast).then_some(k)
    }

    /// Seals `plain`: the first `split` bytes in `buf` and the rest as `extra_in`, or all of
    /// it in `buf` when `split` is None; one spare byte after the tag.
    fn seal(
        key: &mut PacketKey, counter: u64, plain: &[u8], split: Option<usize>,
    ) -> Result<(usize, Vec<u8>)> {
        let mut buf = vec![0xee; plain.len() + 16 + 1];
        let in_len = split.unwrap_or(plain.len());
        buf[..in_len].copy_from_slice(&plain[..in_len]);
        let extra_in = split.map(|s| &plain[s..]);
        let n = key.seal_with_u64_counter(
            counter, b"header", &mut buf, in_len, extra_in,
        )?;
        Ok((n, buf))
    }

    /// rampart: where the CPU has the instructions, encrypting AES-GCM keys seal through
    /// packetseal (patch 10). The packet and the length returned are BoringSSL's, for packet
    /// sizes around every block boundary and every split between the bytes in `buf` and
    /// `extra_in` (including patch 6's block-aligning copy).
    #[test]
    fn one_pass_seal_matches_boringssl() {
        for alg in [Algorithm::AES128_GCM, Algorithm::AES256_GCM] {
            let Some(mut fast_whole) = key(alg, true) else {
                eprintln!("skipped: no one-pass sealer on this CPU");
                return;
            };
            let mut fast_split = key(alg, true).unwrap();
            let mut boring_whole = key(alg, false).unwrap();
            let mut boring_split = key(alg, false).unwrap();
            let plain: Vec<u8> = (0..1400u32).map(|i| (i * 13 + 1) as u8).collect();
            // Every key sees increasing counters, as packet numbers are.
            let mut counter = 0;
            for len in [1, 15, 16, 17, 63, 64, 65, 100, 1200, 1307, 1339, 1400] {
                // At least one byte in `buf`: quiche writes the frame headers there, and
                // BoringSSL's AEAD refuses an empty `in` with `extra_in`.
                for split in [1, 3, 16, 17, 32, len / 2, len] {
                    let split = split.clamp(1, len);
                    let p = &plain[..len];
                    let expect = seal(&mut boring_whole, counter, p, None).unwrap();
                    assert_eq!(expect.0, len + 16);
                    for (key, split) in [
                        (&mut boring_split, Some(split)),
                        (&mut fast_whole, None),
                        (&mut fast_split, Some(split)),
                    ] {
                        let got = seal(key, counter, p, split).unwrap();
                        assert_eq!(got, expect, "{alg:?} {len} {split:?}");
                    }
                    counter += 1;
                }
            }
        }
    }

    /// rampart: the one-pass sealer refuses a counter that does not increase, so a packet
    /// number is never sealed twice under one key; BoringSSL refuses at least a repeat.
    #[test]
    fn one_pass_seal_refuses_a_counter_that_does_not_increase() {
        let plain = [7u8; 100];
        let mut boring = key(Algorithm::AES128_GCM, false).unwrap();
        assert!(seal(&mut boring, 5, &plain, Some(16)).is_ok());
        assert!(seal(&mut boring, 5, &plain, Some(16)).is_err());
        let Some(mut fast) = key(Algorithm::AES128_GCM, true) else {
            eprintln!("skipped: no one-pass sealer on this CPU");
            return;
        };
        assert!(seal(&mut fast, 5, &plain, Some(16)).is_ok());
        assert!(seal(&mut fast, 5, &plain, Some(16)).is_err());
        assert!(seal(&mut fast, 4, &plain, None).is_err());
        assert!(seal(&mut fast, 6, &plain, Some(16)).is_ok());
        assert!(seal(&mut fast, 9, &plain, None).is_ok());
        assert!(seal(&mut fast, 7, &plain, None).is_err());
        assert!(seal(&mut fast, u64::MAX, &plain, None).is_err());
    }

    /// rampart: where the CPU has the instructions, decrypting AES-GCM keys open through
    /// packetseal's `OpenKey`. What BoringSSL sealed opens to the same plaintext and length as
    /// through BoringSSL's open, at sizes around every block and register boundary; a packet
    /// with any bit changed, or opened under another counter, fails both ways.
    #[test]
    fn one_pass_open_matches_boringssl() {
        for alg in [Algorithm::AES128_GCM, Algorithm::AES256_GCM] {
            let opener = |fast: bool| {
                let key = vec![0x3c; alg.key_len()];
                let iv = vec![0x5a; alg.nonce_len()];
                let mut k = PacketKey::new(alg, key, iv, Open::DECRYPT).unwrap();
                if !fast {
                    k.fast_open = None;
                }
                (k.fast_open.is_some() == fast).then_some(k)
            };
            let Some(fast) = opener(true) else {
                eprintln!("skipped: no one-pass opener on this CPU");
                return;
            };
            let boring = opener(false).unwrap();
            let mut sealer = key(alg, false).unwrap();
            let plain: Vec<u8> = (0..1500u32).map(|i| (i * 7 + 3) as u8).collect();
            for (counter, len) in
                [0, 1, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1323, 1452, 1500]
                    .into_iter()
                    .enumerate()
            {
                let counter = counter as u64;
                let (n, sealed) =
                    seal(&mut sealer, counter, &plain[..len], None).unwrap();
                let sealed = &sealed[..n];
                for k in [&fast, &boring] {
                    let mut buf = sealed.to_vec();
                    let got = k.open_with_u64_counter(counter, b"header", &mut buf);
                    assert_eq!(got, Ok(len), "{alg:?} {len}");
                    assert_eq!(&buf[..len], &plain[..len], "{alg:?} {len}");
                    let mut buf = sealed.to_vec();
                    assert!(k
                        .open_with_u64_counter(counter + 1, b"header", &mut buf)
                        .is_err());
                    for pos in [0, n / 2, n - 1] {
                        let mut buf = sealed.to_vec();
                        buf[pos] ^= 0x10;
                        assert!(k
                            .open_with_u64_counter(counter, b"header", &mut buf)
                            .is_err());
                    }
                }
            }
        }
    }
}
