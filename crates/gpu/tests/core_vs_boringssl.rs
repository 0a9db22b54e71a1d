//! The kernel's arithmetic core, built for the host, against BoringSSL: the raw CRT private-key
//! operation must equal `RSA_private_encrypt(NoPadding)` for random inputs at every size.

use boring::rsa::{Padding, Rsa};
use gpu_engine::host_core::{be_to_limbs, limbs_to_be, CrtKey, Modulus};

/// The kernel's key record for a BoringSSL key (from its CRT components).
fn crt_of(key: &Rsa<boring::pkey::Private>) -> CrtKey {
    CrtKey::from_components(
        key.size() as usize * 8,
        &key.p().unwrap().to_vec(),
        &key.q().unwrap().to_vec(),
        &key.dmp1().unwrap().to_vec(),
        &key.dmq1().unwrap().to_vec(),
        &key.iqmp().unwrap().to_vec(),
    )
    .unwrap()
}

fn check_size(bits: u32, rounds: usize) {
    let mut rng = fastrand::Rng::with_seed(bits as u64);
    let key = Rsa::generate(bits).unwrap();
    let len = key.size() as usize;
    let crt = crt_of(&key);
    let half = crt.half();
    assert_eq!(half * 64, bits as usize);
    let n = key.n().to_vec();
    let mut inputs: Vec<Vec<u8>> = vec![
        vec![0u8; len],
        {
            let mut one = vec![0u8; len];
            one[len - 1] = 1;
            one
        },
        {
            // n - 1: the largest valid input
            let mut nm1 = boring::bn::BigNum::new().unwrap();
            nm1.checked_sub(key.n(), &boring::bn::BigNum::from_u32(1).unwrap())
                .unwrap();
            nm1.to_vec_padded(len).unwrap()
        },
    ];
    for _ in 0..rounds {
        let mut m: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        m[0] = rng.u8(..n[0]); // below n
        inputs.push(m);
    }
    for m in inputs {
        let mut expect = vec![0u8; len];
        key.private_encrypt(&m, &mut expect, Padding::NONE).unwrap();
        let out = crt.crt(&be_to_limbs(&m, 2 * half).unwrap());
        assert_eq!(limbs_to_be(&out, len), expect, "RSA-{bits}");
        // And back with the public exponent through the core's Montgomery arithmetic.
        let modulus = Modulus::new(&n, 2 * half).unwrap();
        let e = u64::from_str_radix(&key.e().to_hex_str().unwrap(), 16).unwrap();
        assert_eq!(limbs_to_be(&modulus.pow_public(&out, e), len), m);
    }
}

/// Runs `launch(key table, key index, input, out)` (an emulated kernel launch) over one request
/// per entry of `index`, each a random input for `keys[index[i]]`, and checks every result
/// against BoringSSL's private-key operation, and that room for `spare` more requests past the
/// last one is left untouched (threads past the count write nothing).
fn check_launch(
    keys: &[Rsa<boring::pkey::Private>],
    index: &[u32],
    spare: usize,
    rng: &mut fastrand::Rng,
    launch: impl FnOnce(&[u32], &[u32], &[u32], &mut [u32]),
) {
    let bytes = keys[0].size() as usize;
    let half = bytes / 8; // 32-bit limbs per prime
    let table: Vec<u32> = keys
        .iter()
        .flat_map(|k| crt_of(k).record().to_vec())
        .collect();
    let msgs: Vec<Vec<u8>> = index
        .iter()
        .map(|_| {
            let mut m: Vec<u8> = (0..bytes).map(|_| rng.u8(..)).collect();
            m[0] = 0;
            m
        })
        .collect();
    let input: Vec<u32> = msgs
        .iter()
        .flat_map(|m| be_to_limbs(m, 2 * half).unwrap())
        .collect();
    let sentinel = 0xdead_beefu32;
    let mut out = vec![sentinel; (index.len() + spare) * 2 * half];
    launch(&table, index, &input, &mut out);
    for (i, m) in msgs.iter().enumerate() {
        let mut expect = vec![0u8; bytes];
        keys[index[i] as usize]
            .private_encrypt(m, &mut expect, Padding::NONE)
            .unwrap();
        assert_eq!(
            limbs_to_be(&out[i * 2 * half..(i + 1) * 2 * half], bytes),
            expect,
            "request {i}"
        );
    }
    assert!(
        out[index.len() * 2 * half..].iter().all(|&w| w == sentinel),
        "threads past count wrote"
    );
}

#[test]
fn rsa2048_matches_boringssl() {
    check_size(2048, 40);
}

#[test]
fn rsa3072_matches_boringssl() {
    check_size(3072, 12);
}

#[test]
fn rsa4096_matches_boringssl() {
    check_size(4096, 6);
}

#[test]
fn corrupted_key_record_gives_a_wrong_answer() {
    // The test above could pass vacuously if the core ignored its key; it must not.
    let key = Rsa::generate(2048).unwrap();
    let comps = |dp: &[u8]| {
        CrtKey::from_components(
            2048,
            &key.p().unwrap().to_vec(),
            &key.q().unwrap().to_vec(),
            dp,
            &key.dmq1().unwrap().to_vec(),
            &key.iqmp().unwrap().to_vec(),
        )
        .unwrap()
    };
    let good = comps(&key.dmp1().unwrap().to_vec());
    let mut dp = key.dmp1().unwrap().to_vec();
    let last = dp.len() - 1;
    dp[last] ^= 2;
    let bad = comps(&dp);
    let m = be_to_limbs(&[0x42; 200], 64).unwrap();
    assert_ne!(good.crt(&m), bad.crt(&m));
}

#[test]
fn kernel_entry_point_emulated_on_the_host_matches_boringssl_across_keys() {
    use gpu_engine::host_core::emulate_launch;
    let keys: Vec<Rsa<boring::pkey::Private>> =
        (0..2).map(|_| Rsa::generate(3072).unwrap()).collect();
    // 5 requests in blocks of 4: the second block has 3 idle threads that must write nothing.
    check_launch(
        &keys,
        &[1, 0, 0, 1, 1],
        3,
        &mut fastrand::Rng::with_seed(5),
        |table, index, input, out| emulate_launch(48, 4, table, index, input, out),
    );
}

/// Every window width the CUDA build can be given (`-DRSA_WINDOW`, measured on a device)
/// computes the same private-key operation as BoringSSL, at every key size: the width changes
/// the exponent's length in windows and the table, so an off-by-one there shows at some size.
#[test]
fn kernel_entry_point_matches_boringssl_at_every_window_width() {
    use gpu_engine::host_core::{emulate_launch_windowed, WINDOWS};
    let mut rng = fastrand::Rng::with_seed(7);
    for bits in [2048usize, 3072, 4096] {
        let key = Rsa::generate(bits as u32).unwrap();
        let crt = crt_of(&key);
        let half = bits / 64;
        let mut m: Vec<u8> = (0..bits / 8).map(|_| rng.u8(..)).collect();
        m[0] = 0;
        let input = be_to_limbs(&m, 2 * half).unwrap();
        let mut expect = vec![0u8; bits / 8];
        key.private_encrypt(&m, &mut expect, Padding::NONE).unwrap();
        for window in WINDOWS {
            let mut out = vec![0u32; 2 * half];
            emulate_launch_windowed(window, half, 1, crt.record(), &[0], &input, &mut out);
            assert_eq!(
                limbs_to_be(&out, bits / 8),
                expect,
                "RSA-{bits}, window {window}"
            );
        }
    }
}

/// The default kernel, two threads per request (the CRT halves on neighbouring threads, mq
/// handed over in shared memory past a barrier), emulated with each block's threads running
/// at once: right results for every request, keys mixed within a block, and nothing written
/// by the idle threads of the last block (which must still reach the barrier).
#[test]
fn two_threads_per_request_kernel_emulated_matches_boringssl() {
    use gpu_engine::host_core::{emulate_launch_shaped, KernelShape};
    let shape = KernelShape {
        window: 5,
        threads_per_request: 2,
        table_shared: false,
        carry_chains: false,
        fp64: false,
    };
    let keys: Vec<Rsa<boring::pkey::Private>> =
        (0..2).map(|_| Rsa::generate(2048).unwrap()).collect();
    let mut rng = fastrand::Rng::with_seed(9);
    // Blocks of 4 (2 requests) and 6 (3): the last block of each has idle threads.
    for (block, index) in [(4u32, vec![1u32, 0, 0, 1, 1]), (6, vec![0, 1, 1, 0])] {
        check_launch(
            &keys,
            &index,
            block as usize,
            &mut rng,
            |table, index, input, out| {
                emulate_launch_shaped(shape, 32, block, table, index, input, out)
            },
        );
    }
}

/// The group kernels (a CRT half's exponentiation spread over 4, 8 or 16 lanes exchanging limbs
/// by warp shuffles and carries by ballots, `kernels/rsa_group.h`), emulated with each block's
/// threads as fibers that exchange values as a warp does: right results at every key size and
/// group width, keys mixed within a block, the window table local or in shared memory, and
/// nothing written by the idle groups of the last block.
#[test]
fn group_kernels_emulated_match_boringssl() {
    use gpu_engine::host_core::{emulate_launch_shaped, KernelShape};
    let mut rng = fastrand::Rng::with_seed(11);
    let shape = |threads_per_request, table_shared| KernelShape {
        window: 5,
        threads_per_request,
        table_shared,
        carry_chains: false,
        fp64: false,
    };
    // The engine's default: 16 threads per request, shared table, 4-bit window.
    let default = KernelShape {
        window: 4,
        ..shape(16, true)
    };
    for bits in [2048u32, 3072, 4096] {
        let keys: Vec<Rsa<boring::pkey::Private>> =
            (0..2).map(|_| Rsa::generate(bits).unwrap()).collect();
        let half = bits as usize / 64;
        // Every shape at 2048 bits (three requests; the last block partly idle for 8 and 16); one
        // request of one shape at the larger sizes (the emulation is slow there).
        let runs: Vec<(KernelShape, Vec<u32>)> = match bits {
            2048 => vec![
                (shape(8, false), vec![1, 0, 1]),
                (shape(16, false), vec![0, 1, 1]),
                (shape(32, false), vec![1, 0, 0]),
                (shape(16, true), vec![1, 1, 0]),
                (default, vec![0, 1]),
            ],
            3072 => vec![(shape(16, false), vec![1]), (default, vec![0])],
            _ => vec![(shape(32, false), vec![0])],
        };
        for (shape, index) in runs {
            // Whole warps, as the device needs: several requests per block for the narrower groups.
            let block = shape.threads_per_request.max(32);
            check_launch(&keys, &index, 1, &mut rng, |table, index, input, out| {
                emulate_launch_shaped(shape, half, block, table, index, input, out)
            });
        }
    }
}

/// FP64 arithmetic (`kernels/rsa_fp64.h`: 52-bit limbs in doubles, products split exactly by a
/// round-toward-zero fma), emulated in round-toward-zero mode: one thread per CRT half with
/// windows 5 and 4, and groups of 4, 8 and 16 lanes per half (fibers exchanging values as a
/// warp does): right results at every key size, keys mixed within a block, and idle threads.
#[test]
fn fp64_kernels_emulated_match_boringssl() {
    use gpu_engine::host_core::{emulate_launch_shaped, KernelShape};
    let mut rng = fastrand::Rng::with_seed(13);
    let shape = |window, threads_per_request| KernelShape {
        window,
        threads_per_request,
        table_shared: false,
        carry_chains: false,
        fp64: true,
    };
    for bits in [2048u32, 3072, 4096] {
        let keys: Vec<Rsa<boring::pkey::Private>> =
            (0..2).map(|_| Rsa::generate(bits).unwrap()).collect();
        let half = bits as usize / 64;
        // Every shape at 2048 bits, two at each larger size (the emulation is slow there).
        // Blocks of 4 and 6 threads leave the last one partly idle; a warp of 8 threads per
        // request, its last of 4 slots.
        let one_thread = [(5, 4u32, vec![1u32, 0, 1]), (4, 6, vec![0, 1])];
        let groups = [(8u32, vec![1u32, 0, 1]), (16, vec![0]), (32, vec![1])];
        let (one_thread, groups) = match bits {
            2048 => (&one_thread[..], &groups[..]),
            3072 => (&one_thread[..1], &groups[1..2]),
            _ => (&one_thread[1..], &groups[..1]),
        };
        for (window, block, index) in one_thread {
            let (window, block) = (*window, *block);
            check_launch(
                &keys,
                index,
                block as usize,
                &mut rng,
                |table, index, input, out| {
                    emulate_launch_shaped(shape(window, 2), half, block, table, index, input, out)
                },
            );
        }
        for (tpr, index) in groups {
            check_launch(&keys, index, 1, &mut rng, |table, index, input, out| {
                emulate_launch_shaped(shape(4, *tpr), half, 32, table, index, input, out)
            });
        }
    }
    // The emulation leaves this thread's rounding mode as it found it.
    assert_eq!(
        std::hint::black_box(1.0f64) / std::hint::black_box(10.0),
        0.1
    );
}
