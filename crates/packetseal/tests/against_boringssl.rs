//! `SealKey::seal` produces exactly BoringSSL's AES-GCM ciphertext and tag, for every split of
//! the plaintext quiche can hand it, and the GCM specification's vectors.

mod common;

use common::{boring_seal, hex};
use packetseal::{SealError, SealKey, Width, TAG_LEN};

/// A key for every width this CPU runs (none, with a note, where it runs neither: the tests
/// then have nothing to check), so each check covers both widths where both exist.
fn keys_or_skip(key: &[u8]) -> Vec<SealKey> {
    let keys: Vec<SealKey> = Width::ALL
        .into_iter()
        .filter_map(|w| SealKey::with_width(key, w))
        .collect();
    for w in Width::ALL {
        assert_eq!(
            keys.iter().any(|k| k.width() == w),
            w.available(),
            "{w:?}: available() disagrees with the keys built for a {}-byte key",
            key.len()
        );
    }
    if keys.is_empty() {
        eprintln!("skipped: CPU lacks VAES/VPCLMULQDQ");
    }
    keys
}

/// Seals `plain` split at `in_len` (head in the buffer, the rest as `extra_in`), with a
/// guard byte after the tag that must survive.
fn our_seal(k: &SealKey, nonce: &[u8; 12], aad: &[u8], plain: &[u8], in_len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; plain.len() + TAG_LEN + 1];
    buf[..in_len].copy_from_slice(&plain[..in_len]);
    *buf.last_mut().unwrap() = 0xa5;
    let extra = plain[in_len..].to_vec();
    let n = k.seal(nonce, aad, &mut buf, in_len, &extra).unwrap();
    assert_eq!(n, plain.len() + TAG_LEN);
    assert_eq!(buf[n], 0xa5, "wrote past the tag");
    assert_eq!(extra, plain[in_len..], "extra_in was modified");
    buf.truncate(n);
    buf
}

// The GCM specification (McGrew and Viega), test cases 4 (AES-128) and 16 (AES-256).
#[test]
fn gcm_specification_vectors() {
    let plain = hex(
        "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
         1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
    );
    let aad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
    let nonce: [u8; 12] = hex("cafebabefacedbaddecaf888").try_into().unwrap();
    for (key, cipher, tag) in [
        (
            "feffe9928665731c6d6a8f9467308308",
            "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e\
             21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091",
            "5bc94fbc3221a5db94fae95ae7121a47",
        ),
        (
            "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308",
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
             8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
            "76fc6ece0f4e1768cddf8853bb2d551b",
        ),
    ] {
        let mut expect = hex(cipher);
        expect.extend(hex(tag));
        for k in keys_or_skip(&hex(key)) {
            for in_len in [0, 16, 32, plain.len()] {
                assert_eq!(
                    our_seal(&k, &nonce, &aad, &plain, in_len),
                    expect,
                    "{:?}: key {key} split {in_len}",
                    k.width()
                );
            }
        }
    }
}

#[test]
fn matches_boringssl_for_every_split_and_size() {
    let mut rng = fastrand::Rng::with_seed(0x5ea1);
    for key_len in [16, 32] {
        for round in 0..4000 {
            let key: Vec<u8> = (0..key_len).map(|_| rng.u8(..)).collect();
            let keys = keys_or_skip(&key);
            if keys.is_empty() {
                return;
            }
            let nonce: [u8; 12] = std::array::from_fn(|_| rng.u8(..));
            // QUIC headers: 1 + connection ID + packet number; long headers up to ~60 bytes.
            let aad: Vec<u8> = (0..rng.usize(0..80)).map(|_| rng.u8(..)).collect();
            // Small, around one packet and GSO-sized: every tail length and stride boundary.
            let len = match round % 4 {
                0 => rng.usize(0..300),
                1 => rng.usize(1200..1500),
                2 => rng.usize(0..4096),
                _ => 256 * rng.usize(0..8) + rng.usize(0..2),
            };
            let plain: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            // Splits as quiche makes them (block-aligned head), and unaligned ones (copied).
            let aligned = 16 * rng.usize(0..=len / 16);
            let any = rng.usize(0..=len);
            let expect = boring_seal(&key, &nonce, &aad, &plain);
            for k in &keys {
                for in_len in [aligned, any, 0, len] {
                    assert_eq!(
                        our_seal(k, &nonce, &aad, &plain, in_len),
                        expect,
                        "{:?}: key {key_len} B, aad {} B, text {len} B, split {in_len}",
                        k.width(),
                        aad.len()
                    );
                }
            }
        }
    }
}

#[test]
fn the_largest_packet_matches_boringssl() {
    let key = [7u8; 16];
    let plain: Vec<u8> = (0..packetseal::MAX_PLAINTEXT_LEN)
        .map(|i| i as u8)
        .collect();
    let nonce = [9u8; 12];
    let expect = boring_seal(&key, &nonce, b"hdr", &plain);
    for k in keys_or_skip(&key) {
        assert_eq!(
            our_seal(&k, &nonce, b"hdr", &plain, 4096),
            expect,
            "{:?}",
            k.width()
        );
    }
}

/// Messages past the one-reduction path (more than 128 GHASH blocks) go through in windows of
/// 2 KB: long headers, texts around window boundaries, and seams inside later windows.
#[test]
fn long_messages_match_boringssl_across_windows() {
    let mut rng = fastrand::Rng::with_seed(0x10ad);
    for key_len in [16, 32] {
        let key: Vec<u8> = (0..key_len).map(|_| rng.u8(..)).collect();
        let keys = keys_or_skip(&key);
        for aad_len in [0, 17, 2047, 2048, 2049, 5000] {
            let aad: Vec<u8> = (0..aad_len).map(|_| rng.u8(..)).collect();
            for len in [2000, 2032, 2033, 2048, 2049, 4096, 4111, 9000] {
                let plain: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                let nonce: [u8; 12] = std::array::from_fn(|_| rng.u8(..));
                let expect = boring_seal(&key, &nonce, &aad, &plain);
                for (k, in_len) in keys
                    .iter()
                    .flat_map(|k| [0, 16, 2048, 2064, len / 2, len].map(|n| (k, n.min(len))))
                {
                    assert_eq!(
                        our_seal(k, &nonce, &aad, &plain, in_len),
                        expect,
                        "{:?}: key {key_len} B, aad {aad_len} B, text {len} B, split {in_len}",
                        k.width()
                    );
                }
            }
        }
    }
}

#[test]
fn refuses_what_does_not_fit_and_writes_nothing() {
    for k in keys_or_skip(&[1u8; 16]) {
        refuses_and_writes_nothing(&k);
    }
}

fn refuses_and_writes_nothing(k: &SealKey) {
    let nonce = [0u8; 12];
    let mut buf = vec![0x11u8; 40];
    // 24 + 1 plaintext bytes and a 16-byte tag need 41.
    assert_eq!(
        k.seal(&nonce, b"", &mut buf, 24, &[0]),
        Err(SealError::BufferTooSmall)
    );
    assert!(buf.iter().all(|&b| b == 0x11));
    let mut big = vec![0u8; packetseal::MAX_PLAINTEXT_LEN + 1 + TAG_LEN];
    let len = big.len() - TAG_LEN;
    assert_eq!(
        k.seal(&nonce, b"", &mut big, len, &[]),
        Err(SealError::TooLong)
    );
}

#[test]
fn keys_of_other_lengths_are_refused() {
    for len in [0, 15, 17, 24, 31, 33] {
        assert!(
            SealKey::new(&vec![0u8; len]).is_none(),
            "{len}-byte key accepted"
        );
        for w in Width::ALL {
            assert!(
                SealKey::with_width(&vec![0u8; len], w).is_none(),
                "{w:?}: {len}-byte key accepted"
            );
        }
    }
}

#[test]
fn debug_output_shows_no_key_material() {
    for k in keys_or_skip(&[0x42u8; 16]) {
        assert_eq!(format!("{k:?}"), "SealKey { .. }");
    }
}
