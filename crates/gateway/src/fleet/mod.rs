//! State shared by every gateway of a fleet, kept in Redis (`[fleet] redis`): rate limits
//! counted across the fleet, 0-RTT anti-replay records, and session-ticket keys one gateway
//! rotates and all read ([`crate::tls::tickets`]).
//!
//! Redis is never in the way of traffic: a gateway starts whether or not Redis answers (each
//! worker connects in the background on its first call and keeps trying; until then its
//! decisions fall back), every call waits at most `[fleet] deadline`
//! (2 ms by default), and a decision Redis cannot make in time falls back to the node, counted
//! and logged.

pub(crate) mod anti_replay;
pub(crate) mod key_list;
pub(crate) mod rate_limit;

use crate::config::FleetConfig;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why Redis gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("not connected to Redis yet")]
    Unavailable,
    #[error("no answer from Redis within {0:?}")]
    Timeout(Duration),
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
}

impl FleetError {
    /// The `kind` label of `rampart_fleet_redis_errors_total`.
    fn kind(&self) -> &'static str {
        match self {
            FleetError::Unavailable => "unavailable",
            FleetError::Timeout(_) => "timeout",
            FleetError::Redis(_) => "error",
        }
    }
}

/// The fleet's Redis. Each worker thread has its own multiplexed connection, made on the
/// worker's runtime as the worker starts (or on a thread's first call; and remade in the
/// background), so a
/// call and its answer never cross threads; the calls of one worker's requests are pipelined
/// on it.
pub struct FleetStore {
    /// Which store this is, in the threads' connection lists.
    id: u64,
    client: redis::Client,
    deadline: Duration,
    /// Prefix of every key written.
    pub key_prefix: String,
    /// Gateways in the fleet (a limit's share per gateway while Redis is out of reach).
    pub size: u32,
    seconds: prometheus::Histogram,
    errors: prometheus::IntCounterVec,
    /// `rampart_fleet_limit_decisions_total`, for the limiters.
    pub(crate) decisions: prometheus::IntCounterVec,
    /// When a failed call was last logged (ms after `epoch`): at most one line per 10 s.
    logged_at: std::sync::atomic::AtomicU64,
    epoch: Instant,
}

/// A thread's connection to one store: filled in by its connecting task.
type Slot = Arc<Mutex<Option<ConnectionManager>>>;

thread_local! {
    /// This thread's connections, by store id.
    static CONNECTIONS: std::cell::RefCell<Vec<(u64, Slot)>> = const { std::cell::RefCell::new(Vec::new()) };
}

static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl FleetStore {
    /// The store `cfg` names (none without `redis`). Nothing connects yet: each worker
    /// connects on its first call.
    pub fn start(cfg: &FleetConfig, metrics: &crate::ops::metrics::Metrics) -> Option<Arc<Self>> {
        let url = cfg.redis.as_deref()?;
        let client = match redis::Client::open(url) {
            Ok(c) => c,
            Err(e) => {
                // Validated with the config; kept from panicking all the same.
                tracing::error!(error = %e, "fleet.redis: not a Redis URL; fleet limits count per node");
                return None;
            }
        };
        Some(Arc::new(FleetStore {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            client,
            deadline: cfg.deadline,
            key_prefix: cfg.key_prefix.clone(),
            size: cfg.size,
            seconds: metrics.fleet_redis_seconds.clone(),
            errors: metrics.fleet_redis_errors.clone(),
            decisions: metrics.fleet_limit_decisions.clone(),
            logged_at: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
        }))
    }

    /// This thread's connection, if it is made; the first call on a thread starts making it
    /// on the thread's runtime, retrying with backoff until it connects.
    fn connection(&self) -> Option<ConnectionManager> {
        let slot = CONNECTIONS.with(|c| {
            let mut list = c.borrow_mut();
            if let Some((_, slot)) = list.iter().find(|(id, _)| *id == self.id) {
                return slot.clone();
            }
            let slot = Slot::default();
            list.push((self.id, slot.clone()));
            self.connect_into(slot.clone());
            slot
        });
        let conn = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        conn
    }

    /// Starts this thread's connection, if it has none (a worker, as it starts).
    pub fn connect_this_thread(&self) {
        let _ = self.connection();
    }

    /// Connects (retrying with backoff) and puts the connection in `slot`.
    fn connect_into(&self, slot: Slot) {
        let client = self.client.clone();
        let errors = self.errors.clone();
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(100);
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Duration::from_secs(1))
                .set_number_of_retries(2)
                .set_max_delay(1000);
            loop {
                match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
                    Ok(c) => {
                        tracing::info!("fleet: connected to Redis");
                        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
                        return;
                    }
                    Err(e) => {
                        errors.with_label_values(&["connect"]).inc();
                        tracing::warn!(error = %e, retry_in = ?wait, "fleet: cannot connect to Redis");
                    }
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        });
    }

    /// Runs `script` with `keys` and `args` within `[fleet] deadline`, timed and its
    /// failures counted.
    pub(crate) async fn eval<T: redis::FromRedisValue, A: redis::ToRedisArgs>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[A],
    ) -> Result<T, FleetError> {
        self.eval_within(script, keys, args, self.deadline).await
    }

    /// [`FleetStore::eval`] within `deadline` (for work off the request path).
    pub(crate) async fn eval_within<T: redis::FromRedisValue, A: redis::ToRedisArgs>(
        &self,
        script: &redis::Script,
        keys: &[&str],
        args: &[A],
        deadline: Duration,
    ) -> Result<T, FleetError> {
        let result = match self.connection() {
            None => Err(FleetError::Unavailable),
            Some(mut conn) => {
                let mut call = script.prepare_invoke();
                for k in keys {
                    call.key(*k);
                }
                for a in args {
                    call.arg(a);
                }
                let start = Instant::now();
                let answer = tokio::time::timeout(deadline, call.invoke_async(&mut conn)).await;
                self.seconds.observe(start.elapsed().as_secs_f64());
                match answer {
                    Err(_) => Err(FleetError::Timeout(deadline)),
                    Ok(r) => r.map_err(FleetError::from),
                }
            }
        };
        if let Err(e) = &result {
            self.errors.with_label_values(&[e.kind()]).inc();
            self.log_failure(e);
        }
        result
    }

    /// Logs a failed call, at most once per 10 seconds (an outage fails every call).
    fn log_failure(&self, e: &FleetError) {
        use std::sync::atomic::Ordering;
        let now = self.epoch.elapsed().as_millis() as u64 + 10_000;
        let last = self.logged_at.load(Ordering::Relaxed);
        if now >= last + 10_000
            && self
                .logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(error = %e, "fleet: Redis gave no answer; each gateway decides alone (fleet limits: its share; 0-RTT: early data refused; shared keys: those in use kept)");
        }
    }
}
