//! The timers a client connection lives under once its TLS handshake is done, kept by the
//! listener that owns the connection:
//!
//! - **first request**: a connection that sends no request within `limits.header_timeout` of
//!   its handshake is closed (nginx's `client_header_timeout`; an HTTP/1.1 connection waits in
//!   hyper's version sniff before any header timer of hyper's runs);
//! - **idle**: a connection with no request in flight for `limits.idle_timeout` is closed,
//!   whatever else arrives on it (HTTP/2 PINGs and SETTINGS keep no connection open);
//! - **under pressure**: while the listener holds more than 3/4 of its `max_connections`,
//!   idle connections are closed after `limits.idle_timeout_under_pressure` instead, so held
//!   descriptors go back to new clients.
//!
//! - **evicted at the cap**: a listener at its connection cap makes room for a newcomer by
//!   closing its oldest connection with no request in flight ([`IdleSet::evict_one`]), so
//!   clients holding idle connections cannot keep new ones out for the length of a timer.
//!
//! A request counts as in flight from its headers until its response body is finished or
//! dropped ([`Active`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// One connection's requests in flight and when it last had none.
pub struct Activity {
    in_flight: AtomicUsize,
    /// Milliseconds after `start` when the last request finished.
    idle_since_ms: AtomicU64,
    /// Whether any request has begun.
    served: AtomicBool,
    start: Instant,
    /// Set, and `evict` notified, when the listener closes this connection to admit another.
    evicted: AtomicBool,
    evict: tokio::sync::Notify,
}

/// One request in flight on a connection, until dropped.
pub struct Active(Arc<Activity>);

impl Drop for Active {
    fn drop(&mut self) {
        let a = &self.0;
        a.idle_since_ms
            .store(a.start.elapsed().as_millis() as u64, Ordering::Relaxed);
        a.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// The idle limits of one connection.
#[derive(Debug, Clone, Copy)]
pub struct IdleLimits {
    pub first_request: Duration,
    pub idle: Duration,
    pub idle_under_pressure: Duration,
}

/// Why a connection's timer ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// No request within the first-request limit.
    NoRequest,
    /// Idle past the idle limit in force.
    Idle,
}

impl Expiry {
    /// The `reason` label of `rampart_connections_closed_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Expiry::NoRequest => "no_request",
            Expiry::Idle => "idle",
        }
    }
}

impl Activity {
    /// A connection that has just finished its handshake.
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            served: AtomicBool::new(false),
            start: Instant::now(),
            evicted: AtomicBool::new(false),
            evict: tokio::sync::Notify::new(),
        })
    }

    /// Resolves when the listener evicts this connection ([`IdleSet::evict_one`]).
    pub async fn evicted(&self) {
        self.evict.notified().await
    }

    /// Counts a request in flight until the returned guard drops.
    pub fn begin(self: &Arc<Self>) -> Active {
        self.in_flight.fetch_add(1, Ordering::Acquire);
        self.served.store(true, Ordering::Relaxed);
        Active(self.clone())
    }

    /// How long the connection has been without a request in flight, with the limit that
    /// applies to it; `None` while a request is in flight.
    fn quiet(
        &self,
        limits: &IdleLimits,
        under_pressure: bool,
    ) -> Option<(Duration, Duration, Expiry)> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let now = self.start.elapsed();
        let idle_limit = if under_pressure {
            limits.idle.min(limits.idle_under_pressure)
        } else {
            limits.idle
        };
        if !self.served.load(Ordering::Relaxed) {
            return Some((now, limits.first_request.min(idle_limit), Expiry::NoRequest));
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed));
        Some((now.saturating_sub(since), idle_limit, Expiry::Idle))
    }

    /// Resolves when the connection has been quiet past its limit. Sleeps at most
    /// [`RECHECK`] at a time, so pressure (asked at each wake) takes effect within it.
    pub async fn expired(&self, limits: IdleLimits, under_pressure: impl Fn() -> bool) -> Expiry {
        loop {
            let wait = match self.quiet(&limits, under_pressure()) {
                // A quiet period can end no sooner than one limit after the request does.
                None => limits.idle.min(limits.idle_under_pressure),
                Some((quiet, limit, why)) if quiet >= limit => return why,
                Some((quiet, limit, _)) => limit - quiet,
            };
            tokio::time::sleep(wait.clamp(Duration::from_millis(10), RECHECK)).await;
        }
    }
}

/// A listener's open connections, oldest first, from which one without a request in flight
/// can be evicted to admit a new one at the cap.
#[derive(Default)]
pub struct IdleSet {
    conns: Mutex<VecDeque<Weak<Activity>>>,
}

/// How many connections one eviction looks at, at most (busy ones go to the back).
const EVICTION_SCAN: usize = 64;

impl IdleSet {
    /// Adds a connection that has just finished its handshake.
    pub fn register(&self, a: &Arc<Activity>, open: usize) {
        let mut q = self.conns.lock().expect("idle set lock");
        // Closed connections leave dead entries; drop them once they outnumber the living.
        if q.len() > 2 * open.max(512) {
            q.retain(|w| w.strong_count() > 0);
        }
        q.push_back(Arc::downgrade(a));
    }

    /// Closes the oldest connection with no request in flight; false if none was found
    /// among the oldest [`EVICTION_SCAN`].
    pub fn evict_one(&self) -> bool {
        let mut q = self.conns.lock().expect("idle set lock");
        let mut busy = 0;
        while let Some(w) = q.pop_front() {
            let Some(a) = w.upgrade() else { continue };
            if a.in_flight.load(Ordering::Acquire) == 0 && !a.evicted.swap(true, Ordering::AcqRel) {
                a.evict.notify_one();
                return true;
            }
            q.push_back(w);
            busy += 1;
            if busy >= EVICTION_SCAN.min(q.len()) {
                return false;
            }
        }
        false
    }
}

/// The longest a connection's timer sleeps: how late pressure can be noticed (one wake per
/// idle connection this often, about a microsecond each).
pub(crate) const RECHECK: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(first_ms: u64, idle_ms: u64) -> IdleLimits {
        IdleLimits {
            first_request: Duration::from_millis(first_ms),
            idle: Duration::from_millis(idle_ms),
            idle_under_pressure: Duration::from_millis(idle_ms / 10),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_request_expires_at_the_first_request_limit() {
        let a = Activity::new();
        let t = Instant::now();
        assert_eq!(
            a.expired(limits(2_000, 60_000), || false).await,
            Expiry::NoRequest
        );
        let took = t.elapsed();
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(4),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_holds_the_connection_and_idleness_counts_from_its_end() {
        let a = Activity::new();
        let req = a.begin();
        let t = Instant::now();
        let held = tokio::time::timeout(
            Duration::from_secs(30),
            a.expired(limits(1_000, 5_000), || false),
        )
        .await;
        assert!(held.is_err(), "expired with a request in flight");
        drop(req);
        let ended = t.elapsed();
        assert_eq!(
            a.expired(limits(1_000, 5_000), || false).await,
            Expiry::Idle
        );
        let idle = t.elapsed() - ended;
        assert!(
            idle >= Duration::from_secs(5) && idle < Duration::from_secs(7),
            "{idle:?}"
        );
    }

    #[tokio::test]
    async fn eviction_takes_the_oldest_connection_without_a_request_in_flight() {
        let set = IdleSet::default();
        let (old_busy, old_idle, new_idle) = (Activity::new(), Activity::new(), Activity::new());
        for a in [&old_busy, &old_idle, &new_idle] {
            set.register(a, 3);
        }
        let req = old_busy.begin();
        let gone = Activity::new();
        set.register(&gone, 4);
        drop(gone);
        assert!(set.evict_one());
        assert!(old_idle.evicted.load(Ordering::Relaxed));
        assert!(
            !old_busy.evicted.load(Ordering::Relaxed),
            "a request in flight is never evicted"
        );
        // The notification waits for the connection's task.
        tokio::time::timeout(Duration::from_secs(1), old_idle.evicted())
            .await
            .expect("notified");
        assert!(set.evict_one());
        assert!(new_idle.evicted.load(Ordering::Relaxed));
        assert!(!set.evict_one(), "only a busy connection is left");
        drop(req);
        assert!(set.evict_one());
    }

    #[tokio::test(start_paused = true)]
    async fn pressure_shortens_the_idle_limit() {
        let a = Activity::new();
        drop(a.begin());
        let t = Instant::now();
        assert_eq!(
            a.expired(limits(1_000, 60_000), || true).await,
            Expiry::Idle
        );
        assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    }
}
