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
    /// `/metrics` (from loopback) needs `Authorization: Bearer <token>`.
    pub token_file: Option<std::path::PathBuf>,
    /// TLS for the admin listener: needed (with `token_file`) to listen beyond loopback.
    pub tls: Option<AdminTlsConfig>,
}

/// `[admin.tls]`: the admin listener's certificate chain and key (PEM files). The key is the
/// admin listener's own, loaded in process (not a key-engine key).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdminTlsConfig {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 9901))),
            token_file: None,
            tls: None,
        }
    }
}

impl AdminConfig {
    pub(super) fn resolve_paths(&mut self, base: &std::path::Path) {
        let tls = self.tls.iter_mut().flat_map(|t| [&mut t.cert, &mut t.key]);
        for p in self.token_file.iter_mut().chain(tls) {
            *p = base.join(&*p);
        }
    }

    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        if let Some(p) = &self.token_file {
            at.field("token_file").file_exists(p)?;
        }
        if let Some(t) = &self.tls {
            at.field("tls").field("cert").file_exists(&t.cert)?;
            at.field("tls").field("key").file_exists(&t.key)?;
        }
        if let Some(a) = self.listen {
            if !a.ip().is_loopback() && (self.token_file.is_none() || self.tls.is_none()) {
                return at.field("listen").fail(format!(
                    "{a} is not a loopback address: beyond 127.0.0.0/8 and ::1 the admin listener needs token_file and [admin.tls]"
                ));
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
