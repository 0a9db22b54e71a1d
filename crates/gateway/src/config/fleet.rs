//! `[fleet]`: the Redis every gateway of a fleet shares state through (fleet rate limits).

use super::{duration_text, At, Invalid};
use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// `redis://host:port/db` (or `rediss://` for TLS); none: no fleet state.
    pub redis: Option<String>,
    /// The longest a request waits on Redis; past it, the decision falls back to the node.
    #[serde(with = "duration_text")]
    pub deadline: Duration,
    /// Gateways in the fleet: while Redis cannot be reached, each enforces its share
    /// (`1 / size`) of a fleet limit on its own.
    pub size: u32,
    /// Prefix of every key the gateways write.
    pub key_prefix: String,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            redis: None,
            deadline: Duration::from_millis(2),
            size: 1,
            key_prefix: "rampart".into(),
        }
    }
}

impl FleetConfig {
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if let Some(url) = &self.redis {
            let ok = ["redis://", "rediss://", "redis+unix://", "unix://"]
                .iter()
                .any(|s| url.starts_with(s));
            if !ok {
                return at
                    .field("redis")
                    .fail(format!("a redis:// or rediss:// URL, not {url:?}"));
            }
        }
        if self.deadline.is_zero() || self.deadline > Duration::from_secs(1) {
            return at
                .field("deadline")
                .fail("a time above zero, at most 1s (a request waits this long on Redis)");
        }
        if self.size == 0 {
            return at.field("size").fail("at least 1 gateway");
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(char::is_whitespace) {
            return at.field("key_prefix").fail("a prefix without spaces");
        }
        Ok(())
    }
}
