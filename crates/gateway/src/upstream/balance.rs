//! Choosing a cluster's endpoint for a request:
//! - `round_robin`, weighted: a smooth schedule (nginx's smooth weighted round robin, laid out
//!   once: weights 3 and 1 give a, a, b, a rather than a, a, a, b), walked by one atomic
//!   counter;
//! - `least_request`: the power of two random choices (two endpoints drawn, the one with
//!   fewer requests in flight per unit of weight taken), which keeps load even without
//!   scanning every endpoint or herding onto the one that was least loaded;
//! - `consistent_hash`: a Maglev table (each endpoint's permutation of the table's slots,
//!   filled in turns weighted by the endpoints' weights) looked up by a hash of the request's
//!   key (a header, a cookie or the client address): removing one of N endpoints remaps about
//!   1/N of the keys.
//!
//! Endpoints that may not be chosen (unhealthy, or just failed) are passed over: the next in
//! the schedule, the other choice, the next slot of the table; when none may, the cluster
//! decides.

use crate::config::{ClusterConfig, LbPolicy};
use crate::http::headers::{stable_hash as hash, RequestKey};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) enum Balancer {
    RoundRobin {
        schedule: Vec<usize>,
        next: AtomicUsize,
    },
    LeastRequest {
        weights: Vec<u32>,
    },
    ConsistentHash {
        table: Vec<u32>,
        key: RequestKey,
    },
}

/// What the balancer may look at in a request.
pub(crate) struct Pick<'a> {
    pub headers: &'a http::HeaderMap,
    pub client: IpAddr,
}

/// The longest round-robin schedule laid out; larger weights are scaled down to it.
const MAX_SCHEDULE: u64 = 4096;

impl Balancer {
    pub fn new(cfg: &ClusterConfig) -> Balancer {
        let weights = cfg.endpoint_weights();
        match cfg.lb {
            LbPolicy::RoundRobin => Balancer::RoundRobin {
                schedule: smooth_schedule(&weights),
                next: AtomicUsize::new(0),
            },
            LbPolicy::LeastRequest => Balancer::LeastRequest { weights },
            LbPolicy::ConsistentHash => {
                let names: Vec<String> = cfg.endpoints.iter().map(|a| a.to_string()).collect();
                let key = RequestKey::new(cfg.hash_key.as_ref().expect("validated"));
                Balancer::ConsistentHash {
                    table: maglev_table(&names, &weights),
                    key,
                }
            }
        }
    }

    /// An endpoint of `n` for `req`: among those the first of `tiers` allows, else the next
    /// tier's (one turn of the schedule, one draw, one hash for all), `None` when no tier
    /// allows any; `in_flight(i)` is endpoint i's requests in flight. In the usual case (the
    /// first candidate allowed) no endpoint but it is looked at.
    pub fn pick(
        &self,
        n: usize,
        req: Option<&Pick<'_>>,
        tiers: &[&dyn Fn(usize) -> bool],
        in_flight: impl Fn(usize) -> usize,
    ) -> Option<usize> {
        match self {
            Balancer::RoundRobin { schedule, next } => {
                let start = next.fetch_add(1, Ordering::Relaxed);
                tiers.iter().find_map(|usable| {
                    (0..schedule.len())
                        .map(|k| schedule[(start + k) % schedule.len()])
                        .find(|i| usable(*i))
                })
            }
            Balancer::LeastRequest { weights } => {
                let load = |i: usize| in_flight(i) as u64 * 1_000_000 / u64::from(weights[i]);
                let (a, b) = match n {
                    0..=2 => (0, n.saturating_sub(1)),
                    _ => {
                        let a = fastrand::usize(..n);
                        (a, (a + 1 + fastrand::usize(..n - 1)) % n)
                    }
                };
                tiers.iter().find_map(|usable| {
                    if n > 2 && usable(a) && usable(b) {
                        return Some(if load(b) < load(a) { b } else { a });
                    }
                    // Two endpoints at most, or a draw fell on one passed over: the least
                    // loaded of those that may be chosen.
                    (0..n).filter(|i| usable(*i)).min_by_key(|i| load(*i))
                })
            }
            Balancer::ConsistentHash { table, key } => {
                let h = match req.and_then(|r| key.of(r.headers, r.client)) {
                    Some(k) => hash(k.as_bytes(), 0),
                    // No key in this request: any endpoint.
                    None => fastrand::u64(..),
                };
                let m = table.len();
                let at = (h % m as u64) as usize;
                tiers.iter().find_map(|usable| {
                    (0..m)
                        .map(|k| table[(at + k) % m] as usize)
                        .find(|i| usable(*i))
                })
            }
        }
    }
}

/// The smooth weighted round-robin order of one cycle (weights scaled so that a cycle has at
/// most [`MAX_SCHEDULE`] picks, each weight staying at least 1).
fn smooth_schedule(weights: &[u32]) -> Vec<usize> {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    let scale = total.div_ceil(MAX_SCHEDULE).max(1);
    let w: Vec<i64> = weights
        .iter()
        .map(|w| (u64::from(*w) / scale).max(1) as i64)
        .collect();
    let sum: i64 = w.iter().sum();
    let mut current = vec![0i64; w.len()];
    (0..sum)
        .map(|_| {
            for (c, w) in current.iter_mut().zip(&w) {
                *c += w;
            }
            let best = (0..w.len())
                .max_by_key(|i| (current[*i], -(*i as i64)))
                .unwrap_or(0);
            current[best] -= sum;
            best
        })
        .collect()
}

/// A Maglev lookup table for endpoints `names` with `weights`: its size the first prime of a
/// list at least 100 times the endpoints' count (at most 65,521).
fn maglev_table(names: &[String], weights: &[u32]) -> Vec<u32> {
    const PRIMES: [u64; 9] = [251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521];
    let want = 100 * names.len() as u64;
    let m = PRIMES.into_iter().find(|p| *p >= want).unwrap_or(65521);
    let perm: Vec<(u64, u64)> = names
        .iter()
        .map(|n| {
            let offset = hash(n.as_bytes(), 1) % m;
            let skip = hash(n.as_bytes(), 2) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; names.len()];
    let mut table = vec![u32::MAX; m as usize];
    let mut filled = 0u64;
    let max_w = weights.iter().copied().max().unwrap_or(1);
    'fill: loop {
        for round in 0..max_w {
            for (i, (offset, skip)) in perm.iter().enumerate() {
                if weights[i] <= round {
                    continue;
                }
                let slot = loop {
                    let c = (offset + next[i] * skip) % m;
                    next[i] += 1;
                    if table[c as usize] == u32::MAX {
                        break c;
                    }
                };
                table[slot as usize] = i as u32;
                filled += 1;
                if filled == m {
                    break 'fill;
                }
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_round_robin_is_smooth_and_proportional() {
        assert_eq!(smooth_schedule(&[3, 1]), vec![0, 0, 1, 0]);
        assert_eq!(smooth_schedule(&[1, 1, 1]), vec![0, 1, 2]);
        let s = smooth_schedule(&[5, 3, 2]);
        assert_eq!(s.iter().filter(|i| **i == 0).count(), 5);
        assert_eq!(s.iter().filter(|i| **i == 2).count(), 2);
        // Huge weights are scaled to a bounded cycle with their proportions.
        let s = smooth_schedule(&[1_000_000, 3_000_000]);
        assert!(s.len() <= MAX_SCHEDULE as usize + 2, "{}", s.len());
        let share = s.iter().filter(|i| **i == 1).count() as f64 / s.len() as f64;
        assert!((0.74..0.76).contains(&share), "{share}");
    }

    #[test]
    fn removing_one_of_ten_endpoints_remaps_about_a_tenth_of_the_keys() {
        let names: Vec<String> = (0..10).map(|i| format!("10.0.0.{i}:80")).collect();
        let before = maglev_table(&names, &[1; 10]);
        let after = maglev_table(&names[..9], &[1; 9]);
        let owner = |t: &[u32], name: &[String], key: u32| {
            let h = hash(key.to_string().as_bytes(), 0);
            name[t[(h % t.len() as u64) as usize] as usize].clone()
        };
        let moved = (0..10_000)
            .filter(|k| owner(&before, &names, *k) != owner(&after, &names[..9], *k))
            .count();
        assert!(moved <= 1_500, "{moved} of 10,000 keys remapped");
        // Every endpoint owns about its share of the table.
        for i in 0..10 {
            let owned = before.iter().filter(|e| **e == i).count() as f64 / before.len() as f64;
            assert!((0.07..0.13).contains(&owned), "endpoint {i} owns {owned}");
        }
    }

    #[test]
    fn least_request_takes_the_less_loaded_of_two_and_passes_over_the_unusable() {
        let b = Balancer::LeastRequest {
            weights: vec![1; 4],
        };
        let load = [10, 0, 10, 10];
        let picks: Vec<usize> = (0..400)
            .map(|_| b.pick(4, None, &[&|_| true], |i| load[i]).unwrap())
            .collect();
        // Endpoint 1 wins every draw it is in: about half of them (2 of 4 choose 2 pairs).
        let ones = picks.iter().filter(|p| **p == 1).count();
        assert!((120..=280).contains(&ones), "{ones}");
        assert!((0..100).all(|_| b
            .pick(4, None, &[&|i| i != 1], |i| load[i])
            .is_some_and(|p| p != 1)));
        let rr = Balancer::RoundRobin {
            schedule: vec![0, 1, 2],
            next: AtomicUsize::new(0),
        };
        assert!((0..30).all(|_| rr
            .pick(3, None, &[&|i| i != 1], |_| 0)
            .is_some_and(|p| p != 1)));
        // None usable: the caller decides (a cluster then tries every endpoint it allows,
        // asserted by `unhealthy_endpoints_are_passed_over_unless_all_are`).
        assert_eq!(rr.pick(3, None, &[&|_| false], |_| 0), None);
    }
}
