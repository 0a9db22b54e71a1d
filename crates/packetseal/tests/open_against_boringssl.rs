//! `OpenKey::open` recovers exactly what BoringSSL's AES-GCM sealed, for every size around the
//! register and window boundaries, and refuses anything altered, leaving no plaintext.

mod common;

use common::boring_seal;
use packetseal::{OpenError, OpenKey, Width, TAG_LEN};

/// The key, or `None` with a note where the CPU lacks the AVX2 width (the test then has
/// nothing to check).
fn key_or_skip(key: &[u8]) -> Option<OpenKey> {
    let k = OpenKey::new(key);
    assert_eq!(k.is_some(), Width::Avx2.available());
    if k.is_none() {
        eprintln!("skipped: CPU lacks AVX2 with VAES/VPCLMULQDQ");
    }
    k
}

/// Opens a copy of `sealed` with a guard byte after it that must survive.
fn our_open(
    k: &OpenKey,
    nonce: &[u8; 12],
    aad: &[u8],
    sealed: &[u8],
) -> (Result<usize, OpenError>, Vec<u8>) {
    let mut buf = sealed.to_vec();
    buf.push(0xa5);
    let n = sealed.len();
    let r = k.open(nonce, aad, &mut buf[..n]);
    assert_eq!(buf[n], 0xa5, "wrote past the input");
    buf.truncate(n);
    (r, buf)
}

#[test]
fn opens_what_boringssl_sealed_at_every_size() {
    let mut rng = fastrand::Rng::with_seed(0x09e7);
    for key_len in [16, 32] {
        let key: Vec<u8> = (0..key_len).map(|_| rng.u8(..)).collect();
        let Some(k) = key_or_skip(&key) else { return };
        let long = [1323, 1452, 2032, 2033, 2048, 2049, 4111, 9000, 65_535];
        for len in (0..=600).chain(long) {
            let aad_len = [0, 1, 13, 16, 17, 40][len % 6];
            let aad: Vec<u8> = (0..aad_len).map(|_| rng.u8(..)).collect();
            let plain: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            let nonce: [u8; 12] = std::array::from_fn(|_| rng.u8(..));
            let sealed = boring_seal(&key, &nonce, &aad, &plain);
            let (r, buf) = our_open(&k, &nonce, &aad, &sealed);
            assert_eq!(r, Ok(len), "key {key_len} B, aad {aad_len} B, text {len} B");
            assert_eq!(&buf[..len], &plain[..], "key {key_len} B, text {len} B");
        }
        // A header longer than a window, as in the seal's tests.
        for aad_len in [2047, 2048, 2049, 5000] {
            let aad: Vec<u8> = (0..aad_len).map(|_| rng.u8(..)).collect();
            let plain: Vec<u8> = (0..3000).map(|_| rng.u8(..)).collect();
            let nonce = [7u8; 12];
            let sealed = boring_seal(&key, &nonce, &aad, &plain);
            let (r, buf) = our_open(&k, &nonce, &aad, &sealed);
            assert_eq!(r, Ok(3000), "aad {aad_len} B");
            assert_eq!(&buf[..3000], &plain[..]);
        }
    }
}

#[test]
fn anything_altered_is_refused_and_leaves_no_plaintext() {
    let key = [0x5cu8; 16];
    let Some(k) = key_or_skip(&key) else { return };
    let nonce = [3u8; 12];
    let aad = b"a short header";
    for len in [0, 5, 16, 100, 255, 256, 257, 1323] {
        let plain = vec![0x77u8; len];
        let sealed = boring_seal(&key, &nonce, aad, &plain);
        // Each bit of the ciphertext and the tag, a bit of the header, a bit of the nonce.
        let positions = (0..sealed.len()).step_by(7).chain([sealed.len() - 1]);
        for pos in positions {
            for bit in [0, 7] {
                let mut altered = sealed.clone();
                altered[pos] ^= 1 << bit;
                let (r, buf) = our_open(&k, &nonce, aad, &altered);
                assert_eq!(
                    r,
                    Err(OpenError::Forged),
                    "len {len}, byte {pos}, bit {bit}"
                );
                assert!(
                    buf[..len].iter().all(|&b| b == 0),
                    "plaintext left, len {len}"
                );
            }
        }
        let mut other_aad = aad.to_vec();
        other_aad[0] ^= 0x80;
        assert_eq!(
            our_open(&k, &nonce, &other_aad, &sealed).0,
            Err(OpenError::Forged)
        );
        let mut other_nonce = nonce;
        other_nonce[11] ^= 1;
        assert_eq!(
            our_open(&k, &other_nonce, aad, &sealed).0,
            Err(OpenError::Forged)
        );
        // The same packet, unaltered, still opens.
        assert_eq!(our_open(&k, &nonce, aad, &sealed).0, Ok(len));
    }
}

#[test]
fn refuses_bad_lengths_and_writes_nothing() {
    let Some(k) = key_or_skip(&[1u8; 32]) else {
        return;
    };
    let mut short = vec![0x11u8; TAG_LEN - 1];
    assert_eq!(k.open(&[0; 12], b"", &mut short), Err(OpenError::TooShort));
    assert!(short.iter().all(|&b| b == 0x11));
    let mut big = vec![0x11u8; packetseal::MAX_PLAINTEXT_LEN + 1 + TAG_LEN];
    assert_eq!(k.open(&[0; 12], b"", &mut big), Err(OpenError::TooLong));
    assert!(big.iter().all(|&b| b == 0x11));
    for len in [0, 15, 17, 24, 31, 33] {
        assert!(
            OpenKey::new(&vec![0u8; len]).is_none(),
            "{len}-byte key accepted"
        );
    }
    assert_eq!(format!("{k:?}"), "OpenKey { .. }");
}
