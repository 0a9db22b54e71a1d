//! `[server]` and `[admin]`: the process's workers, shutdown, overload actions, and the admin
//! listener.

use super::{duration, At, Invalid};
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Event-loop threads; 0 means one per CPU.
    pub worker_threads: usize,
    /// How long in-flight requests may run after SIGTERM.
    #[serde(deserialize_with = "duration")]
    pub shutdown_grace: Duration,
    /// `stdout`, `off`, or a file path to append JSON lines to.
    pub access_log: String,
    /// Memory-aware overload actions (`[server.overload]`).
    pub overload: OverloadConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            worker_threads: 0,
            shutdown_grace: Duration::from_secs(30),
            access_log: "stdout".into(),
            overload: OverloadConfig::default(),
        }
    }
}

/// `[server.overload]`: actions taken as the process's memory nears a limit (see
/// `gateway::overload`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OverloadConfig {
    /// Resident memory the gateway should stay under; none: no overload actions.
    pub memory_limit_bytes: Option<u64>,
    /// How often memory is read.
    #[serde(deserialize_with = "duration")]
    pub check_interval: Duration,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            memory_limit_bytes: None,
            check_interval: Duration::from_millis(250),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Address of the admin listener (`/healthz`, `/metrics`, the API); must be loopback.
    pub listen: Option<SocketAddr>,
    /// A file holding the API's bearer token: when set, every API call but `/healthz` and
    /// `/metrics` needs `Authorization: Bearer <token>`.
    pub token_file: Option<std::path::PathBuf>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9901))),
            token_file: None,
        }
    }
}

impl AdminConfig {
    pub(super) fn resolve_paths(&mut self, base: &std::path::Path) {
        if let Some(p) = &mut self.token_file {
            *p = base.join(&*p);
        }
    }

    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if let Some(p) = &self.token_file {
            at.field("token_file").file_exists(p)?;
        }
        if let Some(a) = self.listen {
            if !a.ip().is_loopback() {
                return at.field("listen").fail(format!("{a} is not a loopback address; the admin listener must stay on 127.0.0.0/8 or ::1"));
            }
        }
        Ok(())
    }
}

impl ServerConfig {
    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        let overload = at.field("overload");
        if self
            .overload
            .memory_limit_bytes
            .is_some_and(|b| b < 16 << 20)
        {
            return overload
                .field("memory_limit_bytes")
                .fail("at least 16777216 (16 MiB), or absent for no overload actions");
        }
        if self.overload.check_interval < Duration::from_millis(10) {
            return overload.field("check_interval").fail("at least 10ms");
        }
        Ok(())
    }
}
