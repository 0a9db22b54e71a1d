//! Request rate limits per client (its address, an IPv6 one cut to its prefix by
//! [`crate::policy::client_key`]; or per key, for a fleet limit counting locally
//! while the fleet's store is out of reach): a token bucket for each client of a route, shared
//! by every worker (a limit per worker would multiply the rate by the worker count). A bucket
//! holds up to `burst` tokens and gains `per_second` a second; each request takes one, and a
//! request that finds none is answered 429 with `Retry-After`.
//!
//! Memory is bounded: buckets live in [`SHARDS`] maps of at most [`MAX_PER_SHARD`] clients.
//! A full map first drops the buckets that have refilled (those clients are indistinguishable
//! from new ones); if every tracked client is still limited, a new client is let through
//! untracked rather than refused for an attacker's spread of addresses.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Maps a client's bucket may live in (spreading the lock).
pub const SHARDS: usize = 64;
/// Clients tracked per map.
pub const MAX_PER_SHARD: usize = 4096;
/// A full map is swept for refilled buckets at most this often (seconds), so a flood of new
/// addresses costs one sweep per interval, not one per request.
const SWEEP_INTERVAL: f64 = 0.1;

struct Shard<K> {
    buckets: HashMap<K, Bucket>,
    swept_at: f64,
}

/// What a limiter counts by: a client address (mapped IPv4 counted as IPv4), or a key a fleet
/// limit falls back to counting locally.
pub trait LimitKey: std::hash::Hash + Eq + Clone {
    /// The one form of equal keys.
    fn canonical(self) -> Self {
        self
    }
}

impl LimitKey for IpAddr {
    fn canonical(self) -> Self {
        self.to_canonical()
    }
}

impl LimitKey for String {}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    /// When `tokens` was last brought up to date, in seconds after the limiter's epoch.
    at: f64,
}

pub struct RateLimiter<K = IpAddr> {
    per_second: f64,
    burst: f64,
    shards: Vec<Mutex<Shard<K>>>,
    hasher: std::collections::hash_map::RandomState,
    epoch: Instant,
}

impl<K> std::fmt::Debug for RateLimiter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("per_second", &self.per_second)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl<K: LimitKey> RateLimiter<K> {
    /// `per_second` > 0 and `burst` ≥ 1 (validated with the config).
    pub fn new(per_second: f64, burst: u32) -> Self {
        RateLimiter {
            per_second,
            burst: f64::from(burst),
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        buckets: HashMap::new(),
                        swept_at: f64::NEG_INFINITY,
                    })
                })
                .collect(),
            hasher: Default::default(),
            epoch: Instant::now(),
        }
    }

    /// Whether this limiter enforces `per_second` and `burst` (a reload keeps such a one,
    /// buckets and all).
    pub fn enforces(&self, per_second: f64, burst: u32) -> bool {
        self.per_second == per_second && self.burst == f64::from(burst)
    }

    /// Takes a token for a request from `client`: `Ok`, or `Err` with how long until the
    /// next token.
    pub fn take(&self, client: K) -> Result<(), Duration> {
        self.take_at(client, self.epoch.elapsed().as_secs_f64())
    }

    fn take_at(&self, client: K, now: f64) -> Result<(), Duration> {
        let client = client.canonical();
        let mut shard = self.shards[self.hasher.hash_one(&client) as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let shard = &mut *shard;
        if !shard.buckets.contains_key(&client) && shard.buckets.len() >= MAX_PER_SHARD {
            if now - shard.swept_at >= SWEEP_INTERVAL {
                shard.swept_at = now;
                shard
                    .buckets
                    .retain(|_, b| self.refilled(b, now) < self.burst);
            }
            if shard.buckets.len() >= MAX_PER_SHARD {
                return Ok(());
            }
        }
        let b = shard.buckets.entry(client).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        b.tokens = self.refilled(b, now);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.per_second))
        }
    }

    fn refilled(&self, b: &Bucket, now: f64) -> f64 {
        (b.tokens + (now - b.at).max(0.0) * self.per_second).min(self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_burst_then_the_rate() {
        let rl: RateLimiter = RateLimiter::new(2.0, 3);
        let a = ip("192.0.2.1");
        for _ in 0..3 {
            assert!(rl.take_at(a, 0.0).is_ok());
        }
        let wait = rl.take_at(a, 0.0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        assert!(rl.take_at(a, 0.25).is_err(), "half a token");
        assert!(rl.take_at(a, 0.5).is_ok(), "one token after 1/rate");
        assert!(rl.take_at(a, 0.5).is_err());
        // Idle long enough, the bucket is full again, never fuller.
        for _ in 0..3 {
            assert!(rl.take_at(a, 100.0).is_ok());
        }
        assert!(rl.take_at(a, 100.0).is_err());
    }

    #[test]
    fn clients_have_their_own_buckets_and_mapped_ipv4_is_ipv4() {
        let rl: RateLimiter = RateLimiter::new(1.0, 1);
        assert!(rl.take_at(ip("192.0.2.1"), 0.0).is_ok());
        assert!(
            rl.take_at(ip("::ffff:192.0.2.1"), 0.0).is_err(),
            "the same client"
        );
        assert!(rl.take_at(ip("192.0.2.2"), 0.0).is_ok());
        assert!(rl.take_at(ip("2001:db8::1"), 0.0).is_ok());
    }

    #[test]
    fn tracked_clients_are_bounded() {
        let rl: RateLimiter = RateLimiter::new(1.0, 1);
        // Far more limited clients than can be tracked: memory stays bounded, and clients
        // beyond the bound are let through untracked.
        let n = (SHARDS * MAX_PER_SHARD * 2) as u32;
        for i in 0..n {
            let _ = rl.take_at(IpAddr::from(i.to_be_bytes()), 0.0);
        }
        let tracked: usize = rl
            .shards
            .iter()
            .map(|s| s.lock().unwrap().buckets.len())
            .sum();
        assert!(tracked <= SHARDS * MAX_PER_SHARD, "{tracked}");
        // Once their buckets refill, old clients make room for new ones.
        let fresh = IpAddr::from([10, 0, 0, 1]);
        assert!(rl.take_at(fresh, 10.0).is_ok());
        assert!(
            rl.take_at(fresh, 10.0).is_err(),
            "tracked again, so limited"
        );
    }
}
