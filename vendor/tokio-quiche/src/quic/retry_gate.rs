// rampart: address validation (Retry) decided per Initial from the number of pending handshakes.

//! Retry only under load: a [`RetryGate`] counts the handshakes a listener has accepted and
//! not yet completed, and asks clients to prove their address with a Retry round trip only
//! while more than a threshold of them are pending.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// When a server listener answers an Initial without a token with a Retry.
#[derive(Debug)]
pub struct RetryGate {
    /// `None`: always; `Some(n)`: while more than `n` handshakes are pending.
    above: Option<usize>,
    pending: AtomicUsize,
    retries: AtomicU64,
    /// Retry every Initial without a token while set, whatever `above` says (an overload
    /// action of the application's).
    forced: AtomicBool,
}

impl RetryGate {
    /// Retry every Initial that carries no token.
    pub fn always() -> Arc<Self> {
        Arc::new(Self {
            above: None,
            pending: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
            forced: AtomicBool::new(false),
        })
    }

    /// Retry only while more than `n` handshakes are pending.
    pub fn when_pending_above(n: usize) -> Arc<Self> {
        Arc::new(Self {
            above: Some(n),
            pending: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
            forced: AtomicBool::new(false),
        })
    }

    /// Handshakes accepted and not yet complete or abandoned.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Retry packets sent so far.
    pub fn retries_sent(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Retries every Initial without a token while `on`, whatever the threshold.
    pub fn force_retry(&self, on: bool) {
        self.forced.store(on, Ordering::Relaxed);
    }

    /// Whether this Initial (without a token) gets a Retry; counts it when it does.
    pub fn take_retry(&self) -> bool {
        let retry = self.forced.load(Ordering::Relaxed)
            || match self.above {
                None => true,
                Some(n) => self.pending() > n,
            };
        if retry {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
        retry
    }

    /// Counts one handshake as pending until the returned guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> PendingHandshake {
        self.pending.fetch_add(1, Ordering::Relaxed);
        PendingHandshake(Arc::clone(self))
    }
}

/// One pending handshake; dropped when the handshake completes or the connection ends.
#[derive(Debug)]
pub(crate) struct PendingHandshake(Arc<RetryGate>);

impl Drop for PendingHandshake {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_pending_and_retries_above_the_threshold() {
        let gate = RetryGate::when_pending_above(1);
        assert!(!gate.take_retry());
        let a = gate.enter();
        assert!(!gate.take_retry());
        let b = gate.enter();
        assert_eq!(gate.pending(), 2);
        assert!(gate.take_retry());
        drop(a);
        assert!(!gate.take_retry());
        drop(b);
        assert_eq!((gate.pending(), gate.retries_sent()), (0, 1));
        assert!(RetryGate::always().take_retry());
    }

    #[test]
    fn a_forced_gate_retries_until_released() {
        let gate = RetryGate::when_pending_above(usize::MAX);
        assert!(!gate.take_retry());
        gate.force_retry(true);
        assert!(gate.take_retry());
        gate.force_retry(false);
        assert!(!gate.take_retry());
        assert_eq!(gate.retries_sent(), 1);
    }
}
