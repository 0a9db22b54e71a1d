//! Batch-level measurements for `rampart bench engine`: throughput and latency of batches of a
//! given size on a backend (every stream busy), and the crossover batch size where the GPU
//! beats the CPU engines.

use crate::backend::{BackendError, BatchBackend};
use crate::error::GpuError;
use crate::host_core::be_to_limbs;
use crate::key::GpuKey;
use std::time::{Duration, Instant};

/// One batch size's result.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchBench {
    pub batch: usize,
    /// Private-key operations per second, all streams together.
    pub signs_per_sec: f64,
    /// Batch latency (copy in, compute, copy out): what each request in the batch waits on the
    /// device, beyond CPU-side padding, blinding and verification.
    pub p50: Duration,
    pub p99: Duration,
    pub batches: usize,
}

/// Error from [`bench_batch`].
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Results of a batch checked against the CPU build of the core: all of a small batch; of a
/// large one (whose every result would take the single-threaded C core minutes) 256 spread
/// evenly from the first to the last, so every block and both ends of the grid are sampled.
fn checked_items(batch: usize) -> impl Iterator<Item = usize> {
    const MOST: usize = 256;
    let n = batch.min(MOST);
    (0..n).map(move |k| if n < 2 { 0 } else { k * (batch - 1) / (n - 1) })
}

/// Runs batches of `batch` operations with `key` back to back on every stream of `backend` for
/// about `duration`. The first batch is checked against the CPU build of the core (every
/// result of a small batch, 256 spread over a large one), so a miscompiled or faulty kernel
/// fails the bench instead of reporting a number. The check runs after the timed window: on
/// the single-threaded C core 256 RSA-4096 results take about 10 s, and while stream 0 checked
/// inside the window the others ran alone and the wall time it added was counted against the
/// device (RSA-4096 read 13–18 k/s where the device did 91–96 k/s).
pub fn bench_batch(
    backend: &dyn BatchBackend,
    key: &GpuKey,
    batch: usize,
    duration: Duration,
) -> Result<BatchBench, BenchError> {
    let batch = batch.clamp(1, backend.max_batch());
    let half = key.half();
    let mut rng_state = 0x9e37_79b9_7f4a_7c15u64;
    let mut input = Vec::with_capacity(batch * 2 * half);
    for _ in 0..batch {
        // Public random inputs below n: one byte shorter than the modulus.
        let mut bytes = vec![0u8; key.bits() / 8];
        for b in bytes[1..].iter_mut() {
            rng_state ^= rng_state << 13;
            rng_state ^= rng_state >> 7;
            rng_state ^= rng_state << 17;
            *b = rng_state as u8;
        }
        input.extend(be_to_limbs(&bytes, 2 * half).expect("fits"));
    }
    let deadline = Duration::from_secs(10);
    let start = Instant::now();
    type StreamRun = (Vec<Duration>, usize, Option<Vec<u32>>);
    let per_stream: Vec<Result<StreamRun, BenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..backend.streams())
            .map(|i| {
                let input = &input;
                s.spawn(move || -> Result<StreamRun, BenchError> {
                    let mut r = backend.open_stream(i)?;
                    let mut lat = Vec::new();
                    let mut done = 0;
                    let mut first = None;
                    while lat.is_empty() || start.elapsed() < duration {
                        let st = r.stage(half, 1, batch)?;
                        st.keys.copy_from_slice(key.record());
                        st.key_index.fill(0);
                        st.input.copy_from_slice(input);
                        let t = Instant::now();
                        let out = r.run(deadline)?;
                        lat.push(t.elapsed());
                        if i == 0 && first.is_none() {
                            first = Some(out.to_vec()); // checked after the window
                        }
                        done += batch;
                    }
                    Ok((lat, done, first))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect()
    });
    let elapsed = start.elapsed();
    let mut lat = Vec::new();
    let mut done = 0;
    let mut first = None;
    for r in per_stream {
        let (l, d, f) = r?;
        lat.extend(l);
        done += d;
        first = first.or(f);
    }
    let first = first.expect("stream 0 ran a batch");
    // On every core: 256 RSA-4096 results take the C core ~10 s on one, device time idle.
    let items: Vec<usize> = checked_items(batch).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let all_match = std::thread::scope(|s| {
        let checks: Vec<_> = items
            .chunks(items.len().div_ceil(threads).max(1))
            .map(|chunk| {
                let (first, input) = (&first, &input);
                s.spawn(move || {
                    chunk.iter().all(|&j| {
                        let at = j * 2 * half..(j + 1) * 2 * half;
                        first[at.clone()] == *key.crt().crt(&input[at])
                    })
                })
            })
            .collect();
        checks
            .into_iter()
            .all(|h| h.join().expect("check thread panicked"))
    });
    if !all_match {
        return Err(GpuError::SelfTest.into());
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    Ok(BatchBench {
        batch,
        signs_per_sec: done as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        batches: lat.len(),
    })
}

/// The CPU's share of one GPU signature, measured without a device: encoding and blinding
/// (`prepare`), then unblinding and verifying with the public key (`finish`), each in chunks of
/// 64 as the engine's CPU threads take a batch, over `count` requests per thread (rounded up to
/// whole chunks) with `alg`, on `threads` threads at once (the engine runs both steps on every
/// core; a core loaded beside others may be slower than one alone). Each step runs once untimed
/// (allocator and caches warm), then `ROUNDS` times, each timed from a barrier that starts every
/// thread to the last thread's end; the finishing rounds reuse one round's results. Returns the
/// median round of (prepare, finish) as CPU time per signature: wall time × threads /
/// signatures.
pub fn bench_cpu_side(
    key: &GpuKey,
    alg: keyengine::SignatureAlgorithm,
    count: usize,
    threads: usize,
) -> (Duration, Duration) {
    const ROUNDS: usize = 5;
    let (count, threads) = (count.max(1).next_multiple_of(64), threads.max(1));
    let digest = alg.hash().digest(b"rampart bench cpu side");
    let barrier = std::sync::Barrier::new(threads + 1);
    let unverified = std::sync::atomic::AtomicBool::new(false);
    let (prepare, finish) = std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let items: Vec<crate::key::PrepareItem> = (0..64)
                    .map(|_| crate::key::PrepareItem {
                        key,
                        alg,
                        digest: &digest,
                    })
                    .collect();
                let prepare = || -> Vec<crate::key::Prepared> {
                    (0..count / 64)
                        .flat_map(|_| crate::key::prepare_batch(&items))
                        .map(|p| p.expect("encodes"))
                        .collect()
                };
                let mut prepared = prepare();
                for _ in 0..ROUNDS {
                    // The last round's requests are dropped (zeroized) outside the timed window.
                    drop(std::mem::take(&mut prepared));
                    barrier.wait();
                    prepared = prepare();
                    barrier.wait();
                }
                // What the device would return, computed here (not timed).
                let raw: Vec<Vec<u32>> = prepared.iter().map(|p| key.crt().crt(&p.input)).collect();
                let items: Vec<crate::key::Finish> = prepared
                    .iter()
                    .zip(&raw)
                    .map(|(p, r)| crate::key::Finish {
                        key,
                        prepared: p,
                        raw: r,
                        alg,
                        digest: &digest,
                    })
                    .collect();
                // A failed check is recorded, not a panic here: the other threads and the timer
                // wait on the barrier for this one.
                let finish = || {
                    for chunk in items.chunks(64) {
                        let sigs = crate::key::finish_batch(chunk);
                        if !sigs.iter().all(Option::is_some) {
                            unverified.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                };
                finish();
                for _ in 0..ROUNDS {
                    barrier.wait();
                    finish();
                    barrier.wait();
                }
            });
        }
        let median_round = || {
            let mut walls: Vec<Duration> = (0..ROUNDS)
                .map(|_| {
                    barrier.wait();
                    let t = Instant::now();
                    barrier.wait();
                    t.elapsed()
                })
                .collect();
            walls.sort();
            walls[ROUNDS / 2]
        };
        let prepare = median_round();
        let finish = median_round();
        (prepare, finish)
    });
    assert!(
        !unverified.load(std::sync::atomic::Ordering::Relaxed),
        "every signature verifies"
    );
    let per = |wall: Duration| wall / count as u32;
    (per(prepare), per(finish))
}

/// The smallest measured batch size at which the GPU finishes a queue of that many requests
/// sooner than CPU engines with `cpu_parallelism` workers taking `cpu_latency` per operation:
/// GPU p50(b) < ceil(b / cpu_parallelism) × cpu_latency. `None` if the GPU never wins.
pub fn crossover(
    gpu: &[BatchBench],
    cpu_latency: Duration,
    cpu_parallelism: usize,
) -> Option<usize> {
    let mut sizes: Vec<&BatchBench> = gpu.iter().collect();
    sizes.sort_by_key(|b| b.batch);
    sizes
        .into_iter()
        .find(|b| {
            let cpu = cpu_latency * (b.batch.div_ceil(cpu_parallelism.max(1)) as u32);
            b.p50 < cpu
        })
        .map(|b| b.batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{CostModel, SimulatedGpu};
    use crate::testkeys::rsa_der;

    #[test]
    fn bench_on_the_simulated_gpu_reports_its_cost_model() {
        let cost = CostModel {
            launch: Duration::from_millis(2),
            per_item: Duration::from_micros(100),
        };
        let sim = SimulatedGpu::new(cost, 2, 1024);
        let key = GpuKey::from_der(&rsa_der(2048)).unwrap();
        let b = bench_batch(&sim, &key, 20, Duration::from_millis(100)).unwrap();
        assert_eq!(b.batch, 20);
        // 2 ms + 20 × 0.1 ms = 4 ms per batch (the host core's own time may add to it).
        assert!(b.p50 >= Duration::from_millis(4), "{b:?}");
        assert!(b.p99 >= b.p50);
        assert!(b.signs_per_sec > 0.0 && b.batches >= 2, "{b:?}");
    }

    /// The check of the first batch, moved after the timed window, still fails a bench whose
    /// device returns a wrong result.
    #[test]
    fn a_wrong_result_in_the_first_batch_fails_the_bench() {
        let cost = CostModel {
            launch: Duration::from_millis(1),
            per_item: Duration::ZERO,
        };
        let sim = SimulatedGpu::new(cost, 1, 1024);
        sim.control()
            .corrupt_batches
            .store(1, std::sync::atomic::Ordering::Relaxed);
        let key = GpuKey::from_der(&rsa_der(2048)).unwrap();
        let e = bench_batch(&sim, &key, 8, Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, BenchError::Gpu(GpuError::SelfTest)), "{e:?}");
        // Without the fault it passes.
        bench_batch(&sim, &key, 8, Duration::from_millis(20)).unwrap();
    }

    #[test]
    fn a_large_batch_is_checked_from_its_first_to_its_last_item() {
        assert_eq!(checked_items(1).collect::<Vec<_>>(), [0]);
        assert_eq!(checked_items(5).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        let big: Vec<usize> = checked_items(65_536).collect();
        assert_eq!(big.len(), 256);
        assert_eq!((big[0], big[255]), (0, 65_535));
        assert!(big.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn crossover_is_the_first_size_where_the_gpu_wins() {
        let ms = Duration::from_millis;
        let at = |batch, p50| BatchBench {
            batch,
            signs_per_sec: 0.0,
            p50,
            p99: p50,
            batches: 1,
        };
        // CPU: 4 workers at 1 ms. GPU: 5 ms + 0.01 ms per request.
        let gpu = [at(1, ms(5)), at(16, ms(5)), at(64, ms(6)), at(4096, ms(46))];
        // b=16: CPU 4 ms < 5 ms; b=64: CPU 16 ms > 6 ms.
        assert_eq!(crossover(&gpu, ms(1), 4), Some(64));
        assert_eq!(crossover(&gpu[..2], ms(1), 4), None);
    }
}
