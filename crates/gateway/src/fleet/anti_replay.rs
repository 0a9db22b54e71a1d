//! 0-RTT anti-replay across the fleet (RFC 8446 §8.2, RFC 9001 §9.2). Early data can be
//! replayed by anyone who captured it, to any gateway that can open the ticket. So each
//! ClientHello that offers early data is recorded in Redis (a hash of its `pre_shared_key`
//! extension, whose binder is a MAC over that ClientHello: no two clients' offers share it)
//! before its early data is accepted; a second offer of the same record, on any gateway, has
//! its early data rejected, and the handshake goes on as 1-RTT. Without an answer from Redis
//! within `[fleet] deadline` the early data is rejected too: the safe side.
//!
//! Records live for [`WINDOW`]: BoringSSL already rejects early data whose ticket age is more
//! than 60 s off the server's reckoning, so a ClientHello replayed later than that is refused
//! without a record.

use super::FleetStore;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// How long a record is kept: twice the ticket-age skew BoringSSL accepts for early data.
pub const WINDOW: Duration = Duration::from_secs(120);

/// KEYS[1]: the record; ARGV[1]: its lifetime (ms). Returns 1 the first time, 0 after.
static RECORD: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return 1 end
return 0
",
    )
});

/// One listener's anti-replay checks.
pub struct AntiReplay {
    store: Arc<FleetStore>,
    prefix: String,
    first: prometheus::IntCounter,
    replay: prometheus::IntCounter,
    unanswered: prometheus::IntCounter,
}

impl AntiReplay {
    pub fn new(
        store: Arc<FleetStore>,
        listener: &str,
        metrics: &crate::ops::metrics::Metrics,
    ) -> Arc<Self> {
        let counter = |result: &str| {
            metrics
                .early_data_checks
                .with_label_values(&[listener, result])
        };
        Arc::new(AntiReplay {
            prefix: format!("{}:0rtt:", store.key_prefix),
            first: counter("first"),
            replay: counter("replay"),
            unanswered: counter("unanswered"),
            store,
        })
    }

    /// The record of a ClientHello's `pre_shared_key` extension (its body).
    pub fn record_of(psk_extension: &[u8]) -> String {
        let digest = boring::hash::hash(boring::hash::MessageDigest::sha256(), psk_extension)
            .map(|d| d.to_vec())
            .unwrap_or_default();
        crate::config::file::to_hex(&digest[..16.min(digest.len())])
    }

    /// Whether this offer is the first of its record anywhere in the fleet within the window
    /// (its early data may be accepted). A replay, or no answer in time: `false`.
    pub async fn first_use(&self, record: &str) -> bool {
        let key = format!("{}{record}", self.prefix);
        let ttl = WINDOW.as_millis() as i64;
        match self.store.eval::<i64, i64>(&RECORD, &[&key], &[ttl]).await {
            Ok(1) => {
                self.first.inc();
                true
            }
            Ok(_) => {
                self.replay.inc();
                tracing::info!(record = %record, "0-RTT replay: early data rejected, the handshake goes on");
                false
            }
            Err(_) => {
                self.unanswered.inc();
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_short_stable_and_tell_offers_apart() {
        let a = AntiReplay::record_of(b"identity and binder A");
        assert_eq!(a.len(), 32);
        assert_eq!(a, AntiReplay::record_of(b"identity and binder A"));
        assert_ne!(a, AntiReplay::record_of(b"identity and binder B"));
    }
}
