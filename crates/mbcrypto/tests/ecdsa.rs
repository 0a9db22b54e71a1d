//! ECDSA P-256 against BoringSSL: fixed-base multiplication equal to `EcPoint::mul_generator`,
//! signatures from the pool and from direct signing verified, on every backend this CPU runs;
//! the pool under concurrent signing and refilling never reuses a nonce.

use boring::bn::{BigNum, BigNumContext};
use boring::ec::{EcGroup, EcKey, EcPoint, PointConversionForm};
use boring::ecdsa::EcdsaSig;
use boring::nid::Nid;
use boring::pkey::PKey;
use mbcrypto::ecdsa::{base_mul, sign, sign_direct, NoncePool, P256Key, PoolConfig};
use mbcrypto::Backend;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

const N_HEX: &str = "FFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551";

fn group() -> EcGroup {
    EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()
}

fn be32(bn: &BigNum) -> [u8; 32] {
    bn.to_vec_padded(32).unwrap().try_into().unwrap()
}

fn from_hex(h: &str) -> [u8; 32] {
    be32(&BigNum::from_hex_str(h).unwrap())
}

fn boring_mul(k: &[u8; 32]) -> Vec<u8> {
    let g = group();
    let mut ctx = BigNumContext::new().unwrap();
    let mut p = EcPoint::new(&g).unwrap();
    p.mul_generator(&g, &BigNum::from_slice(k).unwrap(), &mut ctx)
        .unwrap();
    p.to_bytes(&g, PointConversionForm::UNCOMPRESSED, &mut ctx)
        .unwrap()
}

/// Every backend this CPU runs (the portable one always included).
fn backends() -> Vec<Backend> {
    let all = Backend::all_available();
    assert!(all.contains(&Backend::Portable));
    all
}

fn edge_scalars() -> Vec<[u8; 32]> {
    let n = BigNum::from_hex_str(N_HEX).unwrap();
    let mut out = Vec::new();
    for small in [1u32, 2, 3, 7, 63, 64, 65, 255, 4096, 0xFFFF_FFFF] {
        out.push(be32(&BigNum::from_u32(small).unwrap()));
    }
    for sub in [1u32, 2, 3, 64] {
        let mut v = BigNum::new().unwrap();
        v.checked_sub(&n, &BigNum::from_u32(sub).unwrap()).unwrap();
        out.push(be32(&v));
    }
    // Long runs of zero and one bits; single bits at every window boundary.
    out.push(from_hex(
        "8000000000000000000000000000000000000000000000000000000000000000",
    ));
    out.push(from_hex(
        "7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF",
    ));
    out.push(from_hex(
        "FFFFFFFF00000000000000000000000000000000000000000000000000000000",
    ));
    out.push(from_hex(
        "00000000FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF",
    ));
    out.push(from_hex(
        "FFFFFFFF00000000FFFFFFFFFFFFFFFF00000000000000000000000000000000",
    ));
    out.push(from_hex(
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ));
    for bit in (0..256).step_by(6).chain([255, 254, 253, 252]) {
        let mut b = [0u8; 32];
        b[31 - bit / 8] = 1 << (bit % 8);
        out.push(b);
    }
    out
}

fn random_scalars(rng: &mut fastrand::Rng, count: usize) -> Vec<[u8; 32]> {
    let n = BigNum::from_hex_str(N_HEX).unwrap();
    (0..count)
        .map(|_| {
            let mut b = [0u8; 32];
            rng.fill(&mut b);
            let mut v = BigNum::from_slice(&b).unwrap();
            if v >= n || v.num_bits() == 0 {
                v = BigNum::from_u32(5).unwrap();
            }
            be32(&v)
        })
        .collect()
}

#[test]
fn base_mul_matches_boringssl() {
    let mut rng = fastrand::Rng::with_seed(0x5EED);
    let mut scalars = edge_scalars();
    scalars.extend(random_scalars(&mut rng, 61));
    let expect: Vec<Vec<u8>> = scalars.iter().map(boring_mul).collect();
    for backend in backends() {
        let got = base_mul(backend, &scalars);
        assert_eq!(got.len(), scalars.len());
        for (i, (g, e)) in got.iter().zip(&expect).enumerate() {
            assert_eq!(&g[..], &e[..], "{backend}: scalar #{i} {:02x?}", scalars[i]);
        }
    }
}

struct TestKey {
    key: P256Key,
    ec: EcKey<boring::pkey::Public>,
}

fn test_key(sec1: bool) -> TestKey {
    let g = group();
    let ec = EcKey::generate(&g).unwrap();
    let der = if sec1 {
        ec.private_key_to_der().unwrap()
    } else {
        PKey::from_ec_key(ec.clone())
            .unwrap()
            .private_key_to_der_pkcs8()
            .unwrap()
    };
    let public = EcKey::from_public_key(&g, ec.public_key()).unwrap();
    TestKey {
        key: P256Key::from_der(&der).unwrap(),
        ec: public,
    }
}

fn verifies(sig: &[u8], digest: &[u8], ec: &EcKey<boring::pkey::Public>) -> bool {
    EcdsaSig::from_der(sig)
        .and_then(|s| s.verify(digest, ec))
        .unwrap_or(false)
}

fn r_of(sig: &[u8]) -> Vec<u8> {
    EcdsaSig::from_der(sig).unwrap().r().to_vec()
}

#[test]
fn pool_and_direct_signatures_verify_with_boringssl() {
    let mut rng = fastrand::Rng::with_seed(42);
    let keys: Vec<TestKey> = (0..8).map(|i| test_key(i % 2 == 0)).collect();
    for backend in backends() {
        let pool = NoncePool::new(
            PoolConfig {
                capacity: 256,
                refill_below: 64,
                batch: 32,
            },
            backend,
        );
        assert_eq!(pool.refill(200), 200);
        assert_eq!(pool.len(), 200);
        for i in 0..200 {
            let k = &keys[rng.usize(..keys.len())];
            // Digests of 32 bytes (SHA-256), longer (truncated to 256 bits) and shorter.
            let len = [32, 48, 64, 20, 32][i % 5];
            let digest: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            let sig = sign(&k.key, &pool, &digest).unwrap();
            assert!(verifies(&sig, &digest, &k.ec), "{backend}: pool sig #{i}");
            // A different digest must not verify.
            let mut other = digest.clone();
            other[0] ^= 1;
            assert!(!verifies(&sig, &other, &k.ec));
        }
        let st = pool.stats();
        assert_eq!((st.generated, st.taken, st.fallbacks), (200, 200, 0));
        assert!(pool.is_empty());
    }
    for (i, k) in keys.iter().enumerate() {
        for j in 0..4 {
            let digest = [i as u8 ^ j; 32];
            let sig = sign_direct(&k.key, &digest).unwrap();
            assert!(verifies(&sig, &digest, &k.ec), "direct sig {i}/{j}");
        }
    }
}

#[test]
fn empty_pool_falls_back_to_direct_signing() {
    let k = test_key(true);
    let pool = NoncePool::new(PoolConfig::default(), Backend::Portable);
    assert!(pool.is_empty() && pool.needs_refill());
    let digest = [7u8; 32];
    let a = sign(&k.key, &pool, &digest).unwrap();
    let b = sign(&k.key, &pool, &digest).unwrap();
    assert!(verifies(&a, &digest, &k.ec) && verifies(&b, &digest, &k.ec));
    assert_ne!(r_of(&a), r_of(&b), "fresh nonce per signature");
    let st = pool.stats();
    assert_eq!((st.generated, st.taken, st.fallbacks), (0, 0, 2));
    // With nonces ready, the pool is used and no fallback is counted.
    assert_eq!(pool.refill(3), 3);
    sign(&k.key, &pool, &digest).unwrap();
    assert_eq!(pool.stats().taken, 1);
    assert_eq!(pool.stats().fallbacks, 2);
    assert_eq!(pool.len(), 2);
}

#[test]
fn refill_respects_capacity_and_threshold() {
    let pool = NoncePool::new(
        PoolConfig {
            capacity: 20,
            refill_below: 10,
            batch: 8,
        },
        Backend::best(),
    );
    assert_eq!(pool.capacity(), 20);
    assert_eq!(pool.refill(9), 9);
    assert!(pool.needs_refill());
    assert_eq!(pool.refill(100), 11);
    assert_eq!(pool.len(), 20);
    assert!(!pool.needs_refill());
    assert_eq!(pool.refill(100), 0);
    assert_eq!(pool.stats().generated, 20);
}

#[test]
fn key_loading() {
    let k = test_key(false);
    assert_eq!(format!("{:?}", k.key), "P256Key(..)");
    assert!(P256Key::from_der(b"\x30\x03\x02\x01\x01").is_err());
    // A P-384 key is refused.
    let g384 = EcGroup::from_curve_name(Nid::SECP384R1).unwrap();
    let k384 = EcKey::generate(&g384).unwrap();
    assert!(P256Key::from_der(&k384.private_key_to_der().unwrap()).is_err());
    let pk = PKey::from_ec_key(k384).unwrap();
    assert!(P256Key::from_der(&pk.private_key_to_der_pkcs8().unwrap()).is_err());
    // An empty digest is refused.
    assert!(sign_direct(&k.key, &[]).is_err());
}

#[test]
fn concurrent_signing_and_refills_never_reuse_a_nonce() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 25_000;
    let keys: Arc<Vec<TestKey>> = Arc::new((0..4).map(|i| test_key(i % 2 == 1)).collect());
    let backend = Backend::all_available()[0];
    let pool = Arc::new(NoncePool::new(
        PoolConfig {
            capacity: 4096,
            refill_below: 2048,
            batch: 64,
        },
        backend,
    ));
    pool.refill(4096);
    let done = Arc::new(AtomicBool::new(false));
    let refillers: Vec<_> = (0..2)
        .map(|_| {
            let (pool, done) = (pool.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if pool.needs_refill() {
                        pool.refill(512);
                    } else {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let seen: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
    let signers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, keys, seen) = (pool.clone(), keys.clone(), seen.clone());
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t as u64);
                let mut rs = Vec::with_capacity(PER_THREAD);
                let mut checked = 0;
                for i in 0..PER_THREAD {
                    let k = &keys[rng.usize(..keys.len())];
                    let digest: [u8; 32] = std::array::from_fn(|_| rng.u8(..));
                    let sig = sign(&k.key, &pool, &digest).unwrap();
                    if i % 10 == 0 {
                        assert!(verifies(&sig, &digest, &k.ec), "thread {t} sig {i}");
                        checked += 1;
                    }
                    rs.push(r_of(&sig));
                }
                let mut seen = seen.lock().unwrap();
                for r in rs {
                    assert!(seen.insert(r), "an r value repeated: nonce reused");
                }
                checked
            })
        })
        .collect();
    let checked: usize = signers.into_iter().map(|h| h.join().unwrap()).sum();
    done.store(true, Ordering::Relaxed);
    for h in refillers {
        h.join().unwrap();
    }
    assert_eq!(seen.lock().unwrap().len(), THREADS * PER_THREAD);
    assert_eq!(checked, THREADS * PER_THREAD / 10);
    let st = pool.stats();
    assert_eq!(st.taken + st.fallbacks, (THREADS * PER_THREAD) as u64);
    assert!(st.taken > 0);
    assert_eq!(st.generated - st.taken, pool.len() as u64);
}
