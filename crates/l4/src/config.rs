//! The balancer's configuration file (`rampart l4 --config FILE`): typed, and checked once at
//! load so that every error names the file, the field path and what was expected.

use gateway::config::file::{duration, hex, load_file, parse_toml};
use gateway::config::{AdminConfig, ConfigError};
use serde::Deserialize;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L4Config {
    pub l4: L4Section,
    #[serde(default = "l4_admin")]
    pub admin: AdminConfig,
}

fn l4_admin() -> AdminConfig {
    AdminConfig {
        listen: Some(SocketAddr::from(([127, 0, 0, 1], 9903))),
        token_file: None,
        tls: None,
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct L4Section {
    /// The virtual address clients send to (IPv4): this node must own it (or allow
    /// non-local binds), and so must every gateway, which answers from it.
    pub listen: SocketAddr,
    /// Receiving threads, each with its own `SO_REUSEPORT` socket; default: one per core.
    #[serde(default)]
    pub workers: Option<usize>,
    /// How a datagram's gateway is chosen: `quic_lb` (the server ID in its connection ID;
    /// connections survive a client's address change) or `four_tuple` (a hash of the client's
    /// address and port, as a plain UDP balancer does: a client that moves lands elsewhere).
    #[serde(default)]
    pub routing: Routing,
    /// The gateways' QUIC-LB configuration (their `[listeners.quic.lb]` without `server_id`).
    pub lb: LbSection,
    /// Connection-ID length hashed for short-header packets whose ID the configuration cannot
    /// read (the gateways' length: rampart pads its IDs to 20 bytes).
    #[serde(default = "default_cid_len")]
    pub cid_len: usize,
    /// Datagrams received (and sent) per system call, at most.
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// Receive buffer of each worker's socket (bytes).
    #[serde(default = "default_buffer")]
    pub udp_buffer_bytes: usize,
    pub backends: Vec<BackendConfig>,
    #[serde(default)]
    pub health: HealthConfig,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    #[default]
    QuicLb,
    FourTuple,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LbSection {
    #[serde(default)]
    pub rotation: u8,
    pub nonce_len: usize,
    /// AES-128 key, 32 hex digits; absent: plaintext server IDs.
    pub key: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// The gateway's QUIC-LB server ID, hex (its `[listeners.quic.lb] server_id`).
    pub server_id: String,
    /// The gateway's own address on this node's link (datagrams go to its MAC address).
    pub address: Ipv4Addr,
    /// Where health probes go; default: `address` and the VIP's port.
    #[serde(default)]
    pub health: Option<SocketAddr>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// Time a probe's answer may take.
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// Consecutive answered probes before a gateway that is down takes traffic.
    pub rise: u32,
    /// Consecutive unanswered probes before a gateway that is up is taken out.
    pub fall: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            rise: 2,
            fall: 2,
        }
    }
}

fn default_cid_len() -> usize {
    quiclb::MAX_CID_LEN
}
fn default_batch() -> usize {
    32
}
fn default_buffer() -> usize {
    4 << 20
}

/// A backend ready to route to: the checked form of [`BackendConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub server_id: Vec<u8>,
    pub address: Ipv4Addr,
    pub health: SocketAddr,
}

impl L4Config {
    pub fn load(path: &Path) -> Result<L4Config, ConfigError> {
        load_file(path, |text, file, _| Self::parse(text, file))
    }

    pub fn parse(text: &str, file: &str) -> Result<L4Config, ConfigError> {
        let cfg: L4Config = parse_toml(text, file)?;
        cfg.validate()
            .map_err(|(path, message)| ConfigError::at(file, path, message))?;
        Ok(cfg)
    }

    /// The VIP as an IPv4 socket address (checked at load).
    pub fn vip(&self) -> SocketAddrV4 {
        match self.l4.listen {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!("validated: l4.listen is IPv4"),
        }
    }

    /// The decoder's configuration and the backends, checked.
    pub fn build(&self) -> Result<(quiclb::Config, Vec<Backend>), (String, String)> {
        let l4 = &self.l4;
        let mut backends = Vec::with_capacity(l4.backends.len());
        for (i, b) in l4.backends.iter().enumerate() {
            let field = |f: &str| format!("l4.backends[{i}].{f}");
            let sid = hex(&b.server_id).ok_or_else(|| {
                (
                    field("server_id"),
                    format!("{:?}: expected hex digits", b.server_id),
                )
            })?;
            if sid.is_empty() {
                return Err((field("server_id"), "expected at least one byte".into()));
            }
            if let Some(first) = backends.first().map(|f: &Backend| f.server_id.len()) {
                if sid.len() != first {
                    return Err((
                        field("server_id"),
                        format!(
                            "{} bytes, but l4.backends[0].server_id has {first}: one QUIC-LB \
                             configuration has one server-ID length",
                            sid.len()
                        ),
                    ));
                }
            }
            if let Some(j) = backends.iter().position(|o: &Backend| o.server_id == sid) {
                return Err((
                    field("server_id"),
                    format!("the same as l4.backends[{j}].server_id"),
                ));
            }
            let health = b
                .health
                .unwrap_or_else(|| SocketAddr::from((b.address, l4.listen.port())));
            backends.push(Backend {
                server_id: sid,
                address: b.address,
                health,
            });
        }
        let key = match &l4.lb.key {
            Some(k) => Some(
                hex(k)
                    .and_then(|b| <[u8; 16]>::try_from(b).ok())
                    .ok_or_else(|| {
                        (
                            "l4.lb.key".to_string(),
                            "expected 32 hex digits (AES-128)".to_string(),
                        )
                    })?,
            ),
            None => None,
        };
        let cfg = quiclb::Config {
            rotation: l4.lb.rotation,
            server_id_len: backends.first().map_or(1, |b| b.server_id.len()),
            nonce_len: l4.lb.nonce_len,
            key,
            self_encode_length: true,
        };
        cfg.validate()
            .map_err(|e| ("l4.lb".to_string(), e.to_string()))?;
        Ok((cfg, backends))
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let l4 = &self.l4;
        let err = |p: &str, m: &str| Err((p.to_string(), m.to_string()));
        if !l4.listen.is_ipv4() {
            return err(
                "l4.listen",
                "expected an IPv4 address: direct server return is IPv4 only in this version",
            );
        }
        if l4.backends.is_empty() {
            return err("l4.backends", "expected at least one backend");
        }
        if l4.workers == Some(0) {
            return err("l4.workers", "expected at least 1");
        }
        if !(1..=1024).contains(&l4.batch) {
            return err("l4.batch", "expected 1 to 1024");
        }
        if !(1..=quiclb::MAX_CID_LEN).contains(&l4.cid_len) {
            return err("l4.cid_len", "expected 1 to 20");
        }
        let h = &l4.health;
        if h.interval.is_zero() || h.timeout.is_zero() {
            return err("l4.health", "interval and timeout must be above zero");
        }
        if h.timeout > h.interval {
            return err("l4.health.timeout", "expected at most l4.health.interval");
        }
        if h.rise == 0 || h.fall == 0 {
            return err("l4.health", "rise and fall must be at least 1");
        }
        self.build().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[l4]
listen = "10.77.1.1:443"
[l4.lb]
nonce_len = 8
key = "000102030405060708090a0b0c0d0e0f"
[[l4.backends]]
server_id = "01"
address = "10.77.0.21"
[[l4.backends]]
server_id = "02"
address = "10.77.0.22"
health = "10.77.0.22:8443"
"#;

    fn err(text: &str) -> String {
        L4Config::parse(text, "l4.toml").unwrap_err().to_string()
    }

    #[test]
    fn a_good_file_loads_with_defaults() {
        let c = L4Config::parse(GOOD, "l4.toml").unwrap();
        let (lb, backends) = c.build().unwrap();
        assert_eq!(lb.server_id_len, 1);
        assert_eq!(backends[0].health, "10.77.0.21:443".parse().unwrap());
        assert_eq!(backends[1].health, "10.77.0.22:8443".parse().unwrap());
        assert_eq!(c.l4.routing, Routing::QuicLb);
        assert_eq!(c.l4.health.rise, 2);
        assert_eq!(c.admin.listen, Some("127.0.0.1:9903".parse().unwrap()));
    }

    #[test]
    fn bad_fields_are_named() {
        let e = err(&GOOD.replace("server_id = \"02\"", "server_id = \"0g\""));
        assert!(
            e.contains("l4.backends[1].server_id") && e.contains("hex"),
            "{e}"
        );
        let e = err(&GOOD.replace("server_id = \"02\"", "server_id = \"0102\""));
        assert!(
            e.contains("l4.backends[1].server_id") && e.contains("length"),
            "{e}"
        );
        let e = err(&GOOD.replace("server_id = \"02\"", "server_id = \"01\""));
        assert!(e.contains("l4.backends[0].server_id"), "{e}");
        let e = err(&GOOD.replace("0e0f\"", "0e\""));
        assert!(e.contains("l4.lb.key"), "{e}");
        let e = err(&GOOD.replace("nonce_len = 8", "nonce_len = 2"));
        assert!(e.contains("l4.lb") && e.contains("nonce"), "{e}");
        let e = err(&GOOD.replace("10.77.1.1:443", "[::1]:443"));
        assert!(e.contains("l4.listen") && e.contains("IPv4"), "{e}");
        let e = err(&GOOD.replace("address = \"10.77.0.21\"", "address = \"fe80::1\""));
        assert!(e.contains("l4.backends[0].address"), "{e}");
        let e = err(&GOOD.replace("[l4.lb]", "routing = \"hash\"\n[l4.lb]"));
        assert!(e.contains("l4.routing"), "{e}");
        let e = err(&format!(
            "{GOOD}\n[l4.health]\ninterval = \"100ms\"\ntimeout = \"1s\"\n"
        ));
        assert!(e.contains("l4.health.timeout"), "{e}");
    }
}
