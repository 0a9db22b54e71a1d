// rampart: receive buffers handed from the router to connections and back.
//
// The router receives into one 64 KiB buffer. A GRO train fills most of it; it
// used to be copied into a new `Vec` of its size for the connection, which on a
// bulk upload is a second copy of every byte and an allocation of 64 KiB per
// `recvmsg` (the allocator purging and faulting those pages back in, up to
// zeroing a whole huge page). Now a large receive hands the buffer itself to the
// connection, the router goes on with a buffer from this pool, and the
// connection's worker gives the buffer back once quiche has read it. Small
// receives (ACKs, single datagrams) are still copied: the copy is cheaper than
// the pool's round trip, and a queued small datagram should not hold 64 KiB.

use std::sync::Mutex;

use crate::buf_factory::BufFactory;

/// The router's buffer size: the largest UDP payload, or a GRO train.
pub(crate) const RECV_BUF_SIZE: usize = BufFactory::MAX_BUF_SIZE;

/// A receive at least this large hands its buffer over instead of copying it.
/// Below it, copying the datagram costs less than zeroing the rest of a pooled
/// buffer when it is taken again.
pub(crate) const HANDOVER_MIN: usize = RECV_BUF_SIZE / 2;

/// Buffers kept for reuse; more are freed. 32 × 64 KiB bounds what an idle
/// process keeps at 2 MiB.
const MAX_POOLED: usize = 32;

/// Buffers given back, bounded by `MAX_POOLED`.
struct Pool(Mutex<Vec<Vec<u8>>>);

static POOL: Pool = Pool::new();

impl Pool {
    const fn new() -> Self {
        Pool(Mutex::new(Vec::new()))
    }

    fn bufs(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A buffer of `RECV_BUF_SIZE` initialized bytes, reused when one is
    /// pooled.
    fn take(&self) -> Vec<u8> {
        let mut buf = self.bufs().pop().unwrap_or_default();
        // A pooled buffer comes back truncated to what it carried; only the
        // rest is written here.
        buf.resize(RECV_BUF_SIZE, 0);
        buf
    }

    /// Keeps a received packet's buffer for reuse. Only buffers of the
    /// router's size are kept, so a small copied datagram is simply freed.
    fn give_back(&self, buf: Vec<u8>) {
        if buf.capacity() < RECV_BUF_SIZE || buf.capacity() > 2 * RECV_BUF_SIZE {
            return;
        }
        let mut bufs = self.bufs();
        if bufs.len() < MAX_POOLED {
            bufs.push(buf);
        }
    }
}

/// A buffer of `RECV_BUF_SIZE` initialized bytes, from the pool when it has
/// one.
pub(crate) fn take() -> Vec<u8> {
    POOL.take()
}

/// Returns a received packet's buffer once quiche has read it.
pub(crate) fn give_back(buf: Vec<u8>) {
    POOL.give_back(buf)
}

/// What a receive of `n` bytes into `buf` gives the connection: `buf` itself
/// (replaced by a pooled buffer) when the receive was large, else a copy.
pub(crate) fn hand_over(buf: &mut Vec<u8>, n: usize) -> Vec<u8> {
    if n >= HANDOVER_MIN && buf.len() == RECV_BUF_SIZE {
        let mut filled = std::mem::replace(buf, take());
        filled.truncate(n);
        filled
    } else {
        buf[..n].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_receives_are_handed_over_and_small_ones_copied() {
        let mut buf = take();
        assert_eq!(buf.len(), RECV_BUF_SIZE);

        buf[..3].copy_from_slice(b"abc");
        let small = hand_over(&mut buf, 3);
        assert_eq!(small, b"abc");
        assert!(small.capacity() < RECV_BUF_SIZE);
        assert_eq!(buf.len(), RECV_BUF_SIZE, "the router keeps its buffer");

        let before = buf.as_ptr();
        buf[..HANDOVER_MIN].fill(7);
        let large = hand_over(&mut buf, HANDOVER_MIN);
        assert_eq!(large.as_ptr(), before, "the buffer itself, not a copy");
        assert_eq!(large.len(), HANDOVER_MIN);
        assert!(large.iter().all(|&b| b == 7));
        assert_ne!(buf.as_ptr(), before);
        assert_eq!(buf.len(), RECV_BUF_SIZE);
    }

    #[test]
    fn given_back_buffers_are_reused_and_the_pool_is_bounded() {
        let pool = Pool::new();
        for _ in 0..MAX_POOLED + 8 {
            pool.give_back(vec![1; RECV_BUF_SIZE]);
        }
        assert_eq!(pool.bufs().len(), MAX_POOLED);
        pool.bufs().clear();

        let mut buf = pool.take();
        assert_eq!(buf.len(), RECV_BUF_SIZE);
        buf.truncate(10);
        let ptr = buf.as_ptr();
        pool.give_back(buf);
        let again = pool.take();
        assert_eq!(again.len(), RECV_BUF_SIZE);
        assert_eq!(again.as_ptr(), ptr, "the buffer given back is taken again");
        assert!(again[10..].iter().all(|&b| b == 0));

        // A copied datagram is not pooled.
        pool.give_back(vec![0; 100]);
        assert!(pool.bufs().is_empty());
    }
}
