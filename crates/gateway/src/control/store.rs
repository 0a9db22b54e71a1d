//! The etcd side of the control plane: a connection to the cluster, the objects under the
//! prefix read at one revision, a watch from a revision, and writes that succeed only if the
//! object is at the revision the writer last saw (compare-and-swap).

use crate::config::EtcdConfig;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Txn, TxnOp, WatchOptions,
    WatchStream,
};
use std::time::Duration;

/// An etcd failure: unreachable, timed out, refused.
#[derive(Debug, thiserror::Error)]
#[error("etcd: {0}")]
pub struct StoreError(String);

impl StoreError {
    pub(crate) fn from_message(m: String) -> StoreError {
        StoreError(m)
    }
}

impl From<etcd_client::Error> for StoreError {
    fn from(e: etcd_client::Error) -> Self {
        StoreError(e.to_string())
    }
}

/// One key's value as etcd holds it, its key relative to the prefix (`routes/api`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub doc: String,
    pub mod_revision: i64,
}

/// A change seen by a watch: a key put (with its new value) or deleted.
#[derive(Debug, Clone)]
pub enum Change {
    Put(Entry),
    Delete(String),
}

/// What a write expects of the key before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The key must not exist (a create).
    Absent,
    /// The key must be at this modification revision (a replace or delete of what was read).
    Revision(i64),
}

/// A write refused because the key was not as expected: its revision now (none: absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conflict {
    pub current: Option<i64>,
}

#[derive(Clone)]
pub struct Store {
    client: Client,
    prefix: String,
    request_timeout: Duration,
}

impl Store {
    /// Connects to the cluster (within `connect_timeout`).
    pub async fn connect(cfg: &EtcdConfig) -> Result<Store, StoreError> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            .with_timeout(cfg.request_timeout)
            .with_keep_alive(Duration::from_secs(5), cfg.request_timeout)
            .with_keep_alive_while_idle(true);
        if let (Some(user), Some(file)) = (&cfg.username, &cfg.password_file) {
            let password = std::fs::read_to_string(file)
                .map_err(|e| StoreError(format!("{}: {e}", file.display())))?;
            opts = opts.with_user(user.clone(), password.trim_end_matches(['\r', '\n']));
        }
        if cfg.ca.is_some() || cfg.cert.is_some() {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|e| StoreError(format!("{}: {e}", p.display())))
            };
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &cfg.ca {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&cfg.cert, &cfg.key) {
                tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
            }
            opts = opts.with_tls(tls);
        }
        let connect = Client::connect(cfg.endpoints.clone(), Some(opts));
        let client = tokio::time::timeout(cfg.connect_timeout, connect)
            .await
            .map_err(|_| StoreError(format!("no connection within {:?}", cfg.connect_timeout)))??;
        Ok(Store {
            client,
            prefix: cfg.prefix.clone(),
            request_timeout: cfg.request_timeout,
        })
    }

    /// Every object under the prefix, at one revision (returned with them).
    pub async fn load(&self) -> Result<(i64, Vec<Entry>), StoreError> {
        let mut c = self.client.clone();
        let get = c.get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()));
        let resp = self.timed(get).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let entries = resp.kvs().iter().filter_map(|kv| self.entry(kv)).collect();
        Ok((revision, entries))
    }

    /// One object, if it exists.
    pub async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let mut c = self.client.clone();
        let resp = self.timed(c.get(self.full(key), None)).await?;
        Ok(resp.kvs().first().and_then(|kv| self.entry(kv)))
    }

    /// Changes under the prefix after `revision` (the first message is the watch's creation).
    pub async fn watch(&self, after: i64) -> Result<WatchStream, StoreError> {
        let mut c = self.client.clone();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(after + 1)
            .with_progress_notify();
        self.timed(c.watch(self.prefix.as_str(), Some(opts))).await
    }

    /// Writes `doc` at `key` if the key is as `expect`ed; the new revision, or the conflict.
    pub async fn put(
        &self,
        key: &str,
        doc: &str,
        expect: Expect,
    ) -> Result<Result<i64, Conflict>, StoreError> {
        let put = TxnOp::put(self.full(key), doc, None);
        self.swap(key, expect, put).await
    }

    /// Deletes `key` if it is as `expect`ed; the new revision, or the conflict.
    pub async fn delete(
        &self,
        key: &str,
        expect: Expect,
    ) -> Result<Result<i64, Conflict>, StoreError> {
        let delete = TxnOp::delete(self.full(key), None);
        self.swap(key, expect, delete).await
    }

    async fn swap(
        &self,
        key: &str,
        expect: Expect,
        op: TxnOp,
    ) -> Result<Result<i64, Conflict>, StoreError> {
        let full = self.full(key);
        let compare = match expect {
            Expect::Absent => Compare::create_revision(full.clone(), CompareOp::Equal, 0),
            Expect::Revision(r) => Compare::mod_revision(full.clone(), CompareOp::Equal, r),
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([op])
            .or_else([TxnOp::get(full, None)]);
        let mut c = self.client.clone();
        let resp = self.timed(c.txn(txn)).await?;
        if resp.succeeded() {
            return Ok(Ok(resp.header().map_or(0, |h| h.revision())));
        }
        let current = resp.op_responses().into_iter().find_map(|r| match r {
            etcd_client::TxnOpResponse::Get(g) => Some(g.kvs().first().map(|kv| kv.mod_revision())),
            _ => None,
        });
        Ok(Err(Conflict {
            current: current.flatten(),
        }))
    }

    /// The changes a watch message carries, keys made relative.
    pub fn changes(&self, events: &[etcd_client::Event]) -> Vec<Change> {
        events
            .iter()
            .filter_map(|ev| {
                let kv = ev.kv()?;
                match ev.event_type() {
                    EventType::Put => self.entry(kv).map(Change::Put),
                    EventType::Delete => {
                        let key = kv.key_str().ok()?.strip_prefix(&self.prefix)?;
                        Some(Change::Delete(key.to_string()))
                    }
                }
            })
            .collect()
    }

    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn entry(&self, kv: &etcd_client::KeyValue) -> Option<Entry> {
        let key = kv.key_str().ok()?.strip_prefix(&self.prefix)?.to_string();
        // A value that is not UTF-8 still becomes an entry: the object is refused with a
        // message rather than silently ignored.
        let doc = String::from_utf8_lossy(kv.value()).into_owned();
        Some(Entry {
            key,
            doc,
            mod_revision: kv.mod_revision(),
        })
    }

    async fn timed<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.request_timeout, f).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(StoreError(format!(
                "no answer within {:?}",
                self.request_timeout
            ))),
        }
    }
}
