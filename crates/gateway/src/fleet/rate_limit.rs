//! A route's rate limit counted across the fleet: GCRA (the generic cell rate algorithm: one
//! "theoretical arrival time" per key) in one Lua script per decision, on Redis's clock, so
//! every gateway shares one count per client. While Redis cannot decide within the deadline,
//! each gateway enforces its share of the limit (`1 / [fleet] size`) on its own.

use super::FleetStore;
use crate::http::headers::{stable_hash, RequestKey};
use crate::policy::ratelimit::RateLimiter;
use http::HeaderMap;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// KEYS[1]: the client's key. ARGV[1]: microseconds between requests at the rate;
/// ARGV[2]: how far ahead of now the arrival time may run (a burst's worth, less one).
/// Returns {1, 0} when the request is allowed, {0, µs until it would be}.
static GCRA: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if tat - tolerance > now then
  return {0, tat - tolerance - now}
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.floor((new_tat - now) / 1000) + 1)
return {1, 0}
",
    )
});

/// Keys longer than this (a header a client chose) are hashed.
const MAX_KEY: usize = 128;

pub struct FleetLimiter {
    store: Arc<FleetStore>,
    /// `{prefix}:rl:{route}:`.
    key_prefix: String,
    interval_us: i64,
    tolerance_us: i64,
    per_second: f64,
    burst: u32,
    key: RequestKey,
    /// This gateway's share, counted here while Redis is out of reach.
    fallback: RateLimiter<String>,
    decisions: prometheus::IntCounterVec,
    route: String,
}

impl std::fmt::Debug for FleetLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetLimiter")
            .field("route", &self.route)
            .field("per_second", &self.per_second)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl FleetLimiter {
    /// Route `route`'s limit of `per_second` with `burst`, by `key`, counted in `store`.
    pub fn new(
        store: Arc<FleetStore>,
        route: &str,
        per_second: f64,
        burst: u32,
        key: RequestKey,
    ) -> Self {
        let interval_us = (1e6 / per_second).round().max(1.0) as i64;
        let size = f64::from(store.size.max(1));
        FleetLimiter {
            key_prefix: format!("{}:rl:{route}:", store.key_prefix),
            interval_us,
            tolerance_us: interval_us * i64::from(burst.saturating_sub(1)),
            per_second,
            burst,
            key,
            fallback: RateLimiter::new(
                per_second / size,
                (f64::from(burst) / size).ceil().max(1.0) as u32,
            ),
            decisions: store.decisions.clone(),
            route: route.to_string(),
            store,
        }
    }

    /// Whether this limiter enforces these settings (a reload keeps such a one).
    pub fn enforces(&self, per_second: f64, burst: u32, key: &RequestKey) -> bool {
        self.per_second == per_second && self.burst == burst && self.key == *key
    }

    /// Takes a request of the client (`headers`, `client`): `Ok`, or `Err` with how long
    /// until the next would be allowed. A request without the configured key counts by its
    /// address.
    pub async fn take(&self, headers: &HeaderMap, client: IpAddr) -> Result<(), Duration> {
        let id = self
            .key
            .of(headers, client)
            .map_or_else(|| client.to_canonical().to_string(), |k| k.into_owned());
        let id = if id.len() > MAX_KEY {
            format!("#{:016x}", stable_hash(id.as_bytes(), 0))
        } else {
            id
        };
        let full = format!("{}{id}", self.key_prefix);
        let answer: Result<(i64, i64), _> = self
            .store
            .eval(&GCRA, &[&full], &[self.interval_us, self.tolerance_us])
            .await;
        let (decision, result) = match answer {
            Ok((1, _)) => ("allowed", Ok(())),
            Ok((_, wait_us)) => ("limited", Err(Duration::from_micros(wait_us.max(0) as u64))),
            Err(e) => {
                tracing::debug!(route = %self.route, error = %e, "fleet limit decided by this gateway");
                match self.fallback.take(id) {
                    Ok(()) => ("fallback_allowed", Ok(())),
                    Err(wait) => ("fallback_limited", Err(wait)),
                }
            }
        };
        self.decisions
            .with_label_values(&[self.route.as_str(), decision])
            .inc();
        result
    }
}
