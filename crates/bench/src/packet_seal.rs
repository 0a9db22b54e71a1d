//! `rampart bench packet-seal`: what sealing one QUIC packet costs, BoringSSL's AEAD (the call
//! quiche makes: `EVP_AEAD_CTX_seal_scatter` with the stream data as `extra_in`) against
//! `packetseal`'s one-pass seal, and BoringSSL sealing a 16 KB TLS record as the per-byte
//! reference HTTPS pays; then opening a packet, BoringSSL's `EVP_AEAD_CTX_open` (quiche's
//! call) against `packetseal::OpenKey`, each on a fresh copy of the sealed packet (the copy is
//! in both figures); and header protection's one AES block per packet, BoringSSL's
//! `AES_ecb_encrypt` against `packetseal::MaskKey`. In process, one thread, no sockets.

use anyhow::{anyhow, bail};
use serde::Serialize;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A 1-RTT packet of a bulk download: short header (1 + 8-byte CID + 2-byte packet number),
/// frame headers in the packet (a STREAM frame header, block-aligned as quiche's writer leaves
/// it), the stream data from the send buffer; 1,350 bytes on the wire with the tag.
const HEADER_LEN: usize = 11;
const IN_PACKET_LEN: usize = 16;
const STREAM_DATA_LEN: usize = 1_350 - HEADER_LEN - IN_PACKET_LEN - 16;
/// The largest TLS record's plaintext.
const RECORD_LEN: usize = 16_384;

#[derive(Debug, Serialize)]
pub struct SealRate {
    pub implementation: &'static str,
    pub message_bytes: usize,
    pub ns_per_message: f64,
    /// ns per 1,000 plaintext bytes: comparable across message sizes.
    pub ns_per_kb: f64,
}

struct BoringAead {
    ctx: *mut boring_sys::EVP_AEAD_CTX,
}

impl BoringAead {
    fn new(key: &[u8; 16]) -> anyhow::Result<BoringAead> {
        // SAFETY: a static AEAD descriptor and a 16-byte key; the context is freed on drop.
        let ctx = unsafe {
            boring_sys::EVP_AEAD_CTX_new(boring_sys::EVP_aead_aes_128_gcm(), key.as_ptr(), 16, 16)
        };
        if ctx.is_null() {
            bail!("EVP_AEAD_CTX_new failed");
        }
        Ok(BoringAead { ctx })
    }

    /// Seals `buf[..in_len] ‖ extra` in place / into `buf`, the tag after.
    fn seal(
        &self,
        nonce: &[u8; 12],
        ad: &[u8],
        buf: &mut [u8],
        in_len: usize,
        extra: &[u8],
    ) -> bool {
        let mut tag_len = 0usize;
        let tag_at = in_len;
        assert!(buf.len() >= in_len + extra.len() + 16);
        let out = buf.as_mut_ptr();
        // SAFETY: `out` holds in_len + extra.len() + 16 bytes; input and output alias exactly
        // (in place), as BoringSSL allows.
        let rc = unsafe {
            boring_sys::EVP_AEAD_CTX_seal_scatter(
                self.ctx,
                out,
                out.add(tag_at),
                &mut tag_len,
                extra.len() + 16,
                nonce.as_ptr(),
                nonce.len(),
                out,
                in_len,
                extra.as_ptr(),
                extra.len(),
                ad.as_ptr(),
                ad.len(),
            )
        };
        rc == 1
    }

    /// Opens `buf` (ciphertext ‖ tag) in place, as quiche does.
    fn open(&self, nonce: &[u8; 12], ad: &[u8], buf: &mut [u8]) -> bool {
        let mut out_len = 0usize;
        let max = buf.len().saturating_sub(16);
        let p = buf.as_mut_ptr();
        // SAFETY: `buf` is read whole and written up to its length less the tag; input and
        // output alias exactly (in place), as BoringSSL allows.
        let rc = unsafe {
            boring_sys::EVP_AEAD_CTX_open(
                self.ctx,
                p,
                &mut out_len,
                max,
                nonce.as_ptr(),
                nonce.len(),
                p,
                buf.len(),
                ad.as_ptr(),
                ad.len(),
            )
        };
        rc == 1
    }
}

impl Drop for BoringAead {
    fn drop(&mut self) {
        // SAFETY: allocated by EVP_AEAD_CTX_new, freed once.
        unsafe { boring_sys::EVP_AEAD_CTX_free(self.ctx) }
    }
}

/// BoringSSL's AES block cipher, as quiche's header protection calls it (`AES_ecb_encrypt`).
struct BoringAesBlock {
    key: boring_sys::AES_KEY,
}

impl BoringAesBlock {
    fn new(key: &[u8; 16]) -> anyhow::Result<BoringAesBlock> {
        // SAFETY: an AES_KEY is plain data (all zeros is a valid value) that
        // AES_set_encrypt_key fills in from the 128-bit key it is given.
        let mut aes: boring_sys::AES_KEY = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `key` holds the 128 bits passed.
        if unsafe { boring_sys::AES_set_encrypt_key(key.as_ptr(), 128, &mut aes) } != 0 {
            bail!("AES_set_encrypt_key failed");
        }
        Ok(BoringAesBlock { key: aes })
    }

    fn encrypt(&self, block: &[u8; 16]) -> [u8; 16] {
        let mut out = [0u8; 16];
        // SAFETY: one 16-byte block in, one out, under a key AES_set_encrypt_key prepared.
        unsafe { boring_sys::AES_ecb_encrypt(block.as_ptr(), out.as_mut_ptr(), &self.key, 1) };
        out
    }
}

/// A header-protection sample that changes with `n`, so no call is folded away.
fn sample_for(n: u64) -> [u8; 16] {
    let mut s = [0x5a; 16];
    s[..8].copy_from_slice(&n.to_le_bytes());
    s
}

/// Runs `seal` (one message per call, nonce advancing) for about `duration`.
fn rate(
    implementation: &'static str,
    message_bytes: usize,
    duration: Duration,
    mut seal: impl FnMut(u64) -> bool,
) -> anyhow::Result<SealRate> {
    for n in 0..2_000 {
        if !seal(n) {
            bail!("{implementation}: seal failed");
        }
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < duration {
        for _ in 0..1_000 {
            black_box(seal(n));
            n += 1;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    Ok(SealRate {
        implementation,
        message_bytes,
        ns_per_message: ns,
        ns_per_kb: ns * 1_000.0 / message_bytes as f64,
    })
}

fn nonce_for(n: u64) -> [u8; 12] {
    let mut nonce = [0x5a; 12];
    for (a, b) in nonce[4..].iter_mut().zip(n.to_be_bytes()) {
        *a ^= b;
    }
    nonce
}

/// The name a packetseal width reports under.
fn packetseal_name(width: packetseal::Width) -> &'static str {
    match width {
        packetseal::Width::Avx512 => "packetseal-avx512",
        packetseal::Width::Avx2 => "packetseal-avx2",
    }
}

/// Each implementation (BoringSSL, every packetseal width the CPU runs, the TLS record) for
/// `duration`, split over two alternating rounds so drift shows; the faster round of each is
/// kept, the other being the noise of a shared machine.
pub fn measure(duration: Duration) -> anyhow::Result<Vec<SealRate>> {
    let key = [0x3c; 16];
    let header = [0x41u8; HEADER_LEN];
    let stream: Vec<u8> = (0..STREAM_DATA_LEN).map(|i| i as u8).collect();
    let boring = BoringAead::new(&key)?;
    let fast: Vec<packetseal::SealKey> = packetseal::Width::ALL
        .into_iter()
        .filter_map(|w| packetseal::SealKey::with_width(&key, w))
        .collect();
    let opener = packetseal::OpenKey::new(&key);
    let hp_boring = BoringAesBlock::new(&key)?;
    let hp_fast = packetseal::MaskKey::new(&key);
    let mut packet = vec![0u8; IN_PACKET_LEN + STREAM_DATA_LEN + 16];
    let mut record = vec![0u8; RECORD_LEN + 16];
    let packet_len = IN_PACKET_LEN + STREAM_DATA_LEN;
    let each = duration / 2;
    let mut out: Vec<SealRate> = Vec::new();
    for _ in 0..2 {
        let mut round = vec![rate("boringssl-packet", packet_len, each, |n| {
            boring.seal(&nonce_for(n), &header, &mut packet, IN_PACKET_LEN, &stream)
        })?];
        for k in &fast {
            round.push(rate(packetseal_name(k.width()), packet_len, each, |n| {
                k.seal(&nonce_for(n), &header, &mut packet, IN_PACKET_LEN, &stream)
                    .is_ok()
            })?);
        }
        // Opening: the packet sealed once under one nonce, a copy opened each time.
        let nonce = nonce_for(1);
        let mut sealed = vec![0u8; packet_len + 16];
        sealed[..IN_PACKET_LEN].copy_from_slice(&stream[..IN_PACKET_LEN]);
        if !boring.seal(&nonce, &header, &mut sealed, IN_PACKET_LEN, &stream) {
            bail!("boringssl: seal failed");
        }
        let mut work = sealed.clone();
        round.push(rate("boringssl-packet-open", packet_len, each, |_| {
            work.copy_from_slice(&sealed);
            boring.open(&nonce, &header, &mut work)
        })?);
        if let Some(k) = &opener {
            round.push(rate("packetseal-avx2-open", packet_len, each, |_| {
                work.copy_from_slice(&sealed);
                k.open(&nonce, &header, &mut work).is_ok()
            })?);
        }
        // Header protection: one AES block per packet, over a 16-byte sample of it.
        round.push(rate("boringssl-hp-mask", 16, each, |n| {
            black_box(hp_boring.encrypt(&sample_for(n)));
            true
        })?);
        if let Some(k) = &hp_fast {
            round.push(rate("packetseal-hp-mask", 16, each, |n| {
                black_box(k.mask(&sample_for(n)));
                true
            })?);
        }
        round.push(rate("boringssl-tls-record", RECORD_LEN, each, |n| {
            boring.seal(
                &nonce_for(n),
                &[0x17, 3, 3, 0x40, 0x11],
                &mut record,
                RECORD_LEN,
                &[],
            )
        })?);
        if out.is_empty() {
            out = round;
            continue;
        }
        for (kept, new) in out.iter_mut().zip(round) {
            if kept.implementation != new.implementation {
                return Err(anyhow!("rounds measured different implementations"));
            }
            if new.ns_per_message < kept.ns_per_message {
                *kept = new;
            }
        }
    }
    Ok(out)
}

pub fn run(args: &crate::BenchArgs) -> anyhow::Result<()> {
    match packetseal::Width::best() {
        None => {
            eprintln!("packet-seal: this CPU lacks VAES/VPCLMULQDQ; packetseal is not used here")
        }
        Some(w) => eprintln!("packet-seal: quiche seals with {}", packetseal_name(w)),
    }
    let rates = measure(args.duration)?;
    for r in &rates {
        if args.json {
            println!("{}", serde_json::to_string(r)?);
        } else {
            println!(
                "{:<22} {:>6} B  {:>8.1} ns per message  {:>6.1} ns per KB",
                r.implementation, r.message_bytes, r.ns_per_message, r.ns_per_kb
            );
        }
    }
    Ok(())
}
