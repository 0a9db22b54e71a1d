//! `[control]`: where routes and clusters come from besides this file (an etcd prefix every
//! gateway of a fleet watches), and the state folder that keeps a snapshot of what was last
//! applied, so a gateway starts while etcd is down.

use super::{duration, At, Invalid};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// The etcd cluster holding the fleet's objects; none: the file alone configures.
    pub etcd: Option<EtcdConfig>,
    /// Where the snapshot of the last applied objects is kept (default: `state` beside the
    /// configuration file).
    pub state_dir: Option<PathBuf>,
    /// The configuration file's folder, against which objects' relative paths resolve.
    #[serde(skip)]
    pub base: PathBuf,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// `http://host:port` or `https://host:port` of each member.
    pub endpoints: Vec<String>,
    /// The keys under it are the objects: `<prefix>routes/<name>`, `<prefix>clusters/<name>`.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// etcd authentication: the user, and a file holding its password.
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// TLS to etcd (with `https://` endpoints): the CA the members' certificates chain to,
    /// and a client certificate and key where etcd requires them.
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// How long a connection attempt may take.
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// How long one request (a read, a write) may take.
    #[serde(default = "default_timeout", deserialize_with = "duration")]
    pub request_timeout: Duration,
}

fn default_prefix() -> String {
    "/rampart/".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(2)
}

impl ControlConfig {
    /// The folder objects' relative paths resolve against (the configuration file's).
    pub fn base_dir(&self) -> PathBuf {
        self.base.clone()
    }

    /// The state folder (`state_dir`, resolved; `state` before paths are resolved).
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("state"))
    }

    /// The name errors give object `key` (`routes/api`): its etcd key.
    pub fn object_source(&self, key: &str) -> String {
        let prefix = self.etcd.as_ref().map_or("", |e| e.prefix.as_str());
        format!("{prefix}{key}")
    }

    pub(super) fn validate(&self, at: &At) -> Result<(), Invalid> {
        let Some(etcd) = &self.etcd else {
            return Ok(());
        };
        let at = at.field("etcd");
        if etcd.endpoints.is_empty() {
            return at.field("endpoints").fail("at least one endpoint");
        }
        let tls = etcd.ca.is_some() || etcd.cert.is_some();
        for (i, e) in etcd.endpoints.iter().enumerate() {
            let ok = match e.split_once("://") {
                Some(("http", rest)) => !tls && !rest.is_empty(),
                Some(("https", rest)) => !rest.is_empty(),
                _ => false,
            };
            if !ok {
                let expected = if tls {
                    "an https://host:port URL (ca or cert is set)"
                } else {
                    "an http://host:port or https://host:port URL"
                };
                return at.field("endpoints").index(i).fail(expected);
            }
        }
        if !etcd.prefix.starts_with('/') || !etcd.prefix.ends_with('/') {
            return at.field("prefix").fail(format!(
                "a key prefix starting and ending with '/', not {:?}",
                etcd.prefix
            ));
        }
        if etcd.username.is_some() != etcd.password_file.is_some() {
            return at.fail("username and password_file together");
        }
        if etcd.cert.is_some() != etcd.key.is_some() {
            return at.fail("cert and key together");
        }
        for (name, p) in [
            ("password_file", &etcd.password_file),
            ("ca", &etcd.ca),
            ("cert", &etcd.cert),
            ("key", &etcd.key),
        ] {
            if let Some(p) = p {
                at.field(name).file_exists(p)?;
            }
        }
        if etcd.connect_timeout.is_zero() || etcd.request_timeout.is_zero() {
            return at.fail("timeouts must be greater than zero");
        }
        Ok(())
    }

    /// Relative paths resolved against the config file's folder; the state folder defaults
    /// to `state` there.
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        self.base = base.to_path_buf();
        if let Some(e) = &mut self.etcd {
            for p in [&mut e.password_file, &mut e.ca, &mut e.cert, &mut e.key]
                .into_iter()
                .flatten()
            {
                *p = base.join(&*p);
            }
        }
        self.state_dir = Some(base.join(self.state_dir.as_deref().unwrap_or(Path::new("state"))));
    }
}
