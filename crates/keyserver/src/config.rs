//! A key server's configuration file (`rampart keyserver --config FILE`).

use gateway::config::file::{duration, load_file, parse_toml};
use gateway::config::{AdminConfig, ConfigError, EngineKind, KeyEngineConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A key server's configuration (`rampart keyserver --config FILE`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyServerConfig {
    pub keyserver: KeyServerSection,
    #[serde(default = "keyserver_admin")]
    pub admin: AdminConfig,
    #[serde(default)]
    pub key_engine: KeyEngineConfig,
}

fn keyserver_admin() -> AdminConfig {
    AdminConfig {
        listen: Some(SocketAddr::from(([127, 0, 0, 1], 9902))),
        token_file: None,
        tls: None,
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyServerSection {
    /// Where gateways connect (mutual TLS).
    pub listen: SocketAddr,
    /// This key server's certificate chain and its (transport) key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA bundle that gateways' client certificates must chain to.
    pub client_ca: PathBuf,
    /// Private keys served, as PEM files; requests name them by SKI.
    pub keys: Vec<PathBuf>,
    /// Requests one connection may have in flight; reading pauses beyond it.
    #[serde(default = "default_in_flight")]
    pub max_in_flight_per_connection: usize,
    #[serde(default = "default_ks_handshake", deserialize_with = "duration")]
    pub handshake_timeout: Duration,
    /// After SIGTERM, how long in-flight requests may finish.
    #[serde(default = "default_ks_grace", deserialize_with = "duration")]
    pub shutdown_grace: Duration,
}

fn default_in_flight() -> usize {
    1024
}
fn default_ks_handshake() -> Duration {
    Duration::from_secs(10)
}
fn default_ks_grace() -> Duration {
    Duration::from_secs(10)
}

impl KeyServerConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        load_file(path, Self::parse)
    }

    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Self, ConfigError> {
        let mut cfg: KeyServerConfig = parse_toml(text, file)?;
        let k = &mut cfg.keyserver;
        for p in [&mut k.cert, &mut k.key, &mut k.client_ca]
            .into_iter()
            .chain(k.keys.iter_mut())
        {
            *p = base.join(&*p);
        }
        let fail = |path: String, message: String| ConfigError::at(file, path, message);
        let k = &cfg.keyserver;
        for (f, p) in [
            ("cert", &k.cert),
            ("key", &k.key),
            ("client_ca", &k.client_ca),
        ] {
            if !p.is_file() {
                return Err(fail(
                    format!("keyserver.{f}"),
                    format!("file {} does not exist", p.display()),
                ));
            }
        }
        if k.keys.is_empty() {
            return Err(fail(
                "keyserver.keys".into(),
                "at least one private key file".into(),
            ));
        }
        for (i, p) in k.keys.iter().enumerate() {
            if !p.is_file() {
                return Err(fail(
                    format!("keyserver.keys[{i}]"),
                    format!("file {} does not exist", p.display()),
                ));
            }
        }
        if cfg.key_engine.engines.contains(&EngineKind::Remote) || cfg.key_engine.engines.is_empty()
        {
            return Err(fail(
                "key_engine.engines".into(),
                "local engines only (\"inline\", \"threads\", \"batch\")".into(),
            ));
        }
        if let Some(a) = cfg.admin.listen {
            if !a.ip().is_loopback() {
                return Err(fail(
                    "admin.listen".into(),
                    format!("{a} is not a loopback address"),
                ));
            }
        }
        if cfg.admin.token_file.is_some() || cfg.admin.tls.is_some() {
            return Err(fail(
                "admin.token_file".into(),
                "absent: the key server's admin listener serves only /healthz and /metrics".into(),
            ));
        }
        Ok(cfg)
    }
}
