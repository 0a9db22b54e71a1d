//! The engine's CPU threads: one pool (rayon's work-stealing threads) that every stream's
//! batches share for their CPU steps (pad and blind; unblind, verify and answer). Threads are
//! started once, not per batch, and two streams preparing at once share the cores instead of
//! each starting its own set.

use rayon::prelude::*;

pub(crate) struct CpuPool {
    pool: rayon::ThreadPool,
    threads: usize,
}

impl CpuPool {
    /// A pool of `threads` threads (at least one), named `rampart-gpu-cpu-N`.
    pub(crate) fn new(threads: usize) -> Result<Self, String> {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("rampart-gpu-cpu-{i}"))
            .build()
            .map_err(|e| format!("starting the CPU threads: {e}"))?;
        Ok(CpuPool { pool, threads })
    }

    /// The size of chunks of `len` requests: whole lane groups (8, the IFMA lanes), about two
    /// chunks per thread (so a stream's chunks balance with another's), at least `min`.
    pub(crate) fn chunk(&self, len: usize, min: usize) -> usize {
        len.div_ceil(2 * self.threads).next_multiple_of(8).max(min)
    }

    /// `f` over `items` in chunks of `chunk`, the results in order. One chunk runs on the
    /// calling thread (a lone request does not wait for a pool thread to wake).
    pub(crate) fn map_chunks<T: Sync, R: Send>(
        &self,
        items: &[T],
        chunk: usize,
        f: impl Fn(&[T]) -> Vec<R> + Sync,
    ) -> Vec<R> {
        let chunk = chunk.max(1);
        if items.len() <= chunk {
            return f(items);
        }
        let parts: Vec<Vec<R>> = self
            .pool
            .install(|| items.par_chunks(chunk).map(&f).collect());
        parts.into_iter().flatten().collect()
    }

    /// `f` over each pair of `a` and `b` (moved in), `min_len` pairs or more to a task.
    /// Small inputs run on the calling thread.
    pub(crate) fn for_each_pair<A: Send, B: Send>(
        &self,
        a: Vec<A>,
        b: Vec<B>,
        min_len: usize,
        f: impl Fn(A, B) + Sync + Send,
    ) {
        if a.len() <= min_len {
            return a.into_iter().zip(b).for_each(|(a, b)| f(a, b));
        }
        self.pool.install(|| {
            a.into_par_iter()
                .zip(b)
                .with_min_len(min_len.max(1))
                .for_each(|(a, b)| f(a, b))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::CpuPool;
    use std::collections::HashSet;
    use std::sync::Mutex;

    #[test]
    fn chunks_come_back_in_order_and_run_on_the_pool() {
        let pool = CpuPool::new(3).unwrap();
        let items: Vec<u32> = (0..1000).collect();
        let names = Mutex::new(HashSet::new());
        let out = pool.map_chunks(&items, 64, |c| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            names.lock().unwrap().insert(name);
            c.iter().map(|x| x * 2).collect()
        });
        assert_eq!(out, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        let names = names.into_inner().unwrap();
        assert!(
            names.iter().all(|n| n.starts_with("rampart-gpu-cpu-")),
            "{names:?}"
        );
    }

    #[test]
    fn one_chunk_runs_on_the_caller() {
        let pool = CpuPool::new(2).unwrap();
        let caller = std::thread::current().id();
        let out = pool.map_chunks(&[1u8, 2, 3], 8, |c| {
            assert_eq!(std::thread::current().id(), caller);
            c.to_vec()
        });
        assert_eq!(out, vec![1, 2, 3]);
    }

    #[test]
    fn every_pair_is_visited_once() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let pool = CpuPool::new(2).unwrap();
        for n in [1u64, 255, 10_000] {
            let a: Vec<u64> = (0..n).collect();
            let b: Vec<u64> = (0..n).map(|x| x % 3).collect();
            let want: u64 = a.iter().zip(&b).map(|(a, b)| a * b + 1).sum();
            let got = AtomicU64::new(0);
            pool.for_each_pair(a, b, 256, |a, b| {
                got.fetch_add(a * b + 1, Ordering::Relaxed);
            });
            assert_eq!(got.into_inner(), want, "{n} pairs");
        }
    }

    #[test]
    fn chunks_are_whole_lane_groups() {
        let pool = CpuPool::new(16).unwrap();
        assert_eq!(pool.chunk(16_384, 64), 512);
        assert_eq!(pool.chunk(100, 64), 64);
        assert_eq!(pool.chunk(1000, 8) % 8, 0);
    }
}
