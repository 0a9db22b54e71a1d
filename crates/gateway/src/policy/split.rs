//! Traffic split (gray release): a route's requests divided between its cluster and others by
//! weight, after cohort rules (a header, cookie or query value that sends a request to a named
//! cluster). With a sticky key (a cookie, a header or the client's address), a stable hash of
//! it places each user in one of 10,000 buckets, and the buckets are cut by the weights in
//! order: the same user stays on the same side while the weights are unchanged, and raising a
//! weight from 5% to 10% moves only the users in buckets 500-999. Without a key (or when the
//! request lacks it) each request draws a bucket at random.
//!
//! The hash is [`stable_hash`], the same on every gateway and release, so a fleet agrees on
//! every user's side.

use crate::config::{CohortConfig, RequestKeyConfig};
use crate::http::headers::{cookie, stable_hash, RequestKey};
use http::HeaderMap;
use std::net::IpAddr;

/// Buckets a weight of 100% covers.
const BUCKETS: u64 = 10_000;

/// What a cohort rule looks at.
#[derive(Debug, Clone)]
enum Source {
    Header(http::HeaderName),
    Cookie(String),
    Query(String),
}

/// A route's split, built from its validated configuration, clusters as indices.
#[derive(Debug, Clone)]
pub struct TrafficSplit {
    /// (first bucket past the entry, cluster), in order; buckets past the last go to the
    /// route's own cluster.
    weighted: Vec<(u64, usize)>,
    cohorts: Vec<(Source, Option<String>, usize)>,
    sticky: Option<RequestKey>,
}

/// What a request offers the split to decide by.
pub struct Request<'a> {
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
    pub client: IpAddr,
}

impl TrafficSplit {
    /// From a route's `split` (cluster, weight in percent), `cohorts` and `sticky`, with
    /// `cluster_index` mapping names to indices. `None` when the route splits nothing.
    pub fn new(
        split: &[(String, f64)],
        cohorts: &[CohortConfig],
        sticky: Option<&RequestKeyConfig>,
        cluster_index: impl Fn(&str) -> usize,
    ) -> Option<TrafficSplit> {
        if split.is_empty() && cohorts.is_empty() {
            return None;
        }
        let mut edge = 0u64;
        let weighted = split
            .iter()
            .map(|(c, w)| {
                edge += (w * (BUCKETS as f64 / 100.0)).round() as u64;
                (edge.min(BUCKETS), cluster_index(c))
            })
            .collect();
        let cohorts = cohorts
            .iter()
            .map(|c| {
                let source = match (&c.header, &c.cookie, &c.query) {
                    (Some(h), _, _) => Source::Header(
                        http::HeaderName::from_bytes(h.as_bytes()).expect("validated"),
                    ),
                    (_, Some(k), _) => Source::Cookie(k.clone()),
                    (_, _, Some(q)) => Source::Query(q.clone()),
                    _ => unreachable!("validated: one of header, cookie, query"),
                };
                (source, c.value.clone(), cluster_index(&c.cluster))
            })
            .collect();
        let sticky = sticky.map(RequestKey::new);
        Some(TrafficSplit {
            weighted,
            cohorts,
            sticky,
        })
    }

    /// The cluster for `req`: a cohort's, else the weighted pick; `None` for the route's own.
    pub fn choose(&self, req: &Request<'_>) -> Option<usize> {
        for (source, value, cluster) in &self.cohorts {
            let found = match source {
                Source::Header(h) => req.headers.get(h).and_then(|v| v.to_str().ok()),
                Source::Cookie(name) => cookie(req.headers, name),
                Source::Query(name) => query_param(req.query, name),
            };
            if found.is_some_and(|f| value.as_deref().is_none_or(|v| v == f)) {
                return Some(*cluster);
            }
        }
        if self.weighted.is_empty() {
            return None;
        }
        let key = self
            .sticky
            .as_ref()
            .and_then(|k| k.of(req.headers, req.client));
        let bucket = match key {
            Some(key) => bucket_of(key.as_bytes()),
            None => fastrand::u64(..BUCKETS),
        };
        self.weighted
            .iter()
            .find(|(edge, _)| bucket < *edge)
            .map(|(_, c)| *c)
    }
}

/// A user's bucket.
fn bucket_of(key: &[u8]) -> u64 {
    stable_hash(key, 0) % BUCKETS
}

/// The value of query parameter `name` (not percent-decoded).
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?
        .split('&')
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(weight: f64, sticky: Option<RequestKeyConfig>) -> TrafficSplit {
        let cohorts = [
            CohortConfig {
                header: Some("x-canary".into()),
                cookie: None,
                query: None,
                value: Some("1".into()),
                cluster: "canary".into(),
            },
            CohortConfig {
                header: None,
                cookie: Some("beta".into()),
                query: None,
                value: None,
                cluster: "canary".into(),
            },
        ];
        TrafficSplit::new(
            &[("canary".into(), weight)],
            &cohorts,
            sticky.as_ref(),
            |c| usize::from(c == "canary"),
        )
        .unwrap()
    }

    fn request(headers: &HeaderMap) -> Request<'_> {
        Request {
            headers,
            query: None,
            client: [192, 0, 2, 1].into(),
        }
    }

    #[test]
    fn the_canary_gets_its_share_and_cohorts_always_land_on_it() {
        let s = split(5.0, None);
        let empty = HeaderMap::new();
        let canary = (0..20_000)
            .filter(|_| s.choose(&request(&empty)) == Some(1))
            .count();
        let share = canary as f64 / 20_000.0;
        assert!((0.043..=0.057).contains(&share), "{share}");
        let mut h = HeaderMap::new();
        h.insert("x-canary", "1".parse().unwrap());
        assert!((0..100).all(|_| s.choose(&request(&h)) == Some(1)));
        h.insert("x-canary", "0".parse().unwrap());
        h.insert(http::header::COOKIE, "a=b; beta=yes".parse().unwrap());
        assert!(
            (0..100).all(|_| s.choose(&request(&h)) == Some(1)),
            "cookie present"
        );
    }

    #[test]
    fn sticky_users_stay_on_their_side_and_a_raised_weight_moves_only_the_next_buckets() {
        let sticky = || {
            Some(RequestKeyConfig {
                header: Some("x-user".into()),
                cookie: None,
                client_address: false,
            })
        };
        let (at5, at10) = (split(5.0, sticky()), split(10.0, sticky()));
        let side = |s: &TrafficSplit, user: u32| {
            let mut h = HeaderMap::new();
            h.insert("x-user", user.to_string().parse().unwrap());
            s.choose(&request(&h))
        };
        let mut moved = 0;
        for user in 0..1_000 {
            let first = side(&at5, user);
            assert!(
                (0..20).all(|_| side(&at5, user) == first),
                "user {user} moved"
            );
            let later = side(&at10, user);
            if later != first {
                // Only from the route's cluster to the canary, and only buckets 500-999.
                assert_eq!((first, later), (None, Some(1)), "user {user}");
                let b = bucket_of(user.to_string().as_bytes());
                assert!((500..1000).contains(&b), "user {user} in bucket {b}");
                moved += 1;
            }
        }
        assert!(
            (20..=80).contains(&moved),
            "{moved} of 1,000 moved; expected about 50"
        );
    }

    #[test]
    fn cookies_and_query_parameters_are_found_by_name() {
        let mut h = HeaderMap::new();
        h.append(http::header::COOKIE, "a=1; uid=42".parse().unwrap());
        assert_eq!(cookie(&h, "uid"), Some("42"));
        assert_eq!(cookie(&h, "id"), None);
        assert_eq!(query_param(Some("x=1&canary&y=2"), "canary"), Some(""));
        assert_eq!(query_param(Some("x=1&y=2"), "y"), Some("2"));
        assert_eq!(query_param(None, "y"), None);
    }
}
