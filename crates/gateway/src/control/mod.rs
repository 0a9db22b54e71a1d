//! The fleet control plane: routes and clusters kept in etcd, one key per object, which every
//! gateway watches and puts in force through the same build-check-swap path as SIGHUP.
//!
//! - [`store`]: etcd (connect, read the prefix at a revision, watch from one, compare-and-swap
//!   writes).
//! - [`compose`]: which version of each object goes in force with the file, and why any is
//!   refused (the refused object's last good version stays).
//! - [`snapshot`]: the objects last applied, kept in the state folder, so that a gateway that
//!   starts while etcd is down serves what it served before.
//! - [`Plane`]: the state (objects desired and in force, refusals, the applied revision, the
//!   connection), the watch loop with its reconnects, and the operations the admin API offers.
//!
//! etcd being unreachable never stops traffic: the configuration in force stays, the loop
//! reconnects with backoff and resumes the watch from the applied revision (or reads the whole
//! prefix again when that revision was compacted).

pub mod compose;
pub mod snapshot;
pub mod store;

use crate::bootstrap::Applier;
use crate::config::{parse_object, Config, ConfigError, EtcdConfig, ObjectKind};
use crate::ops::metrics::ControlMetrics;
use compose::{compose, split_key, InForce};
use snapshot::Snapshot;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use store::{Change, Conflict, Entry, Expect, Store, StoreError};
use tokio::sync::watch;

/// Where the objects in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Read from etcd (and watched since).
    Etcd,
    /// The local snapshot: etcd was unreachable at start and has not been reached since.
    Snapshot,
    /// Nothing: etcd unreachable at start and no snapshot.
    None,
}

/// The control plane's state.
struct State {
    /// The configuration file's part.
    file: Config,
    /// The objects as etcd holds them (as last read or watched).
    desired: BTreeMap<String, Entry>,
    /// The objects in force, and those refused with why.
    in_force: BTreeMap<String, InForce>,
    errors: BTreeMap<String, ConfigError>,
    /// The etcd revision the objects in force were read at.
    revision: i64,
    source: Source,
    /// Why etcd cannot be reached, while it cannot.
    etcd_error: Option<String>,
}

impl State {
    /// Objects of `kind` in force.
    fn count(&self, kind: ObjectKind) -> usize {
        self.in_force
            .keys()
            .filter(|k| split_key(k).is_some_and(|(k, _)| k == kind))
            .count()
    }
}

/// What start-up reads before the listeners are built: the objects (from etcd, else from the
/// snapshot), and the configuration to build the listeners from (the file's).
pub struct Initial {
    state: State,
    store: Option<Store>,
    pub config: Config,
}

impl Initial {
    /// Reads the objects for a gateway starting with `file` (which has `[control] etcd`).
    pub async fn load(file: Config) -> Initial {
        let etcd = file.control.etcd.clone().expect("[control] etcd");
        let state_dir = file.control.state_dir();
        let (store, loaded) = match Store::connect(&etcd).await {
            Ok(s) => {
                let loaded = s.load().await;
                (Some(s), loaded)
            }
            Err(e) => (None, Err(e)),
        };
        let (desired, revision, source, etcd_error) = match loaded {
            Ok((rev, entries)) => (by_key(entries), rev, Source::Etcd, None),
            Err(e) => match Snapshot::read(&state_dir) {
                Ok(Some(s)) => {
                    tracing::warn!(error = %e, revision = s.revision, snapshot = %Snapshot::path(&state_dir).display(),
                        "etcd unreachable at start: serving the objects of the local snapshot");
                    {
                        let revision = s.revision;
                        (
                            by_key(s.entries()),
                            revision,
                            Source::Snapshot,
                            Some(e.to_string()),
                        )
                    }
                }
                Ok(None) => {
                    tracing::warn!(error = %e, "etcd unreachable at start and no snapshot: serving the file's objects only");
                    (BTreeMap::new(), 0, Source::None, Some(e.to_string()))
                }
                Err(bad) => {
                    tracing::error!(error = %e, snapshot = %bad, "etcd unreachable at start and the snapshot unreadable: serving the file's objects only");
                    (BTreeMap::new(), 0, Source::None, Some(e.to_string()))
                }
            },
        };
        // The listeners are built from the file alone; [`Plane::new`] then puts the objects in
        // force through the reload path, so one that does not build (a certificate whose key
        // does not match, a cluster's missing CA file) is refused there instead of stopping
        // the start.
        Initial {
            store: store.filter(|_| source == Source::Etcd),
            config: file.clone(),
            state: State {
                file,
                desired,
                in_force: BTreeMap::new(),
                errors: BTreeMap::new(),
                revision,
                source,
                etcd_error,
            },
        }
    }
}

fn by_key(entries: Vec<Entry>) -> BTreeMap<String, Entry> {
    entries.into_iter().map(|e| (e.key.clone(), e)).collect()
}

/// A refused write through the API.
#[derive(Debug)]
pub enum WriteError {
    /// The object does not parse or check (400): where and what was expected.
    Invalid(ConfigError),
    /// Not as the writer expected (409): another writer got there first, or a cluster is in use.
    Conflict(String),
    /// No such object (404).
    NotFound,
    /// etcd is unreachable or failed (503).
    Unavailable(String),
}

/// The fleet control plane of one gateway.
pub struct Plane {
    etcd: EtcdConfig,
    state_dir: PathBuf,
    applier: Arc<Applier>,
    metrics: ControlMetrics,
    state: Mutex<State>,
    store: Mutex<Option<Store>>,
    /// The applied revision, for writers waiting to see theirs in force.
    applied: watch::Sender<i64>,
}

impl Plane {
    /// The plane over what start-up read, its objects put in force (before the workers
    /// serve); call [`Plane::run`] to watch.
    pub fn new(
        initial: Initial,
        applier: Arc<Applier>,
        metrics: &crate::ops::metrics::Metrics,
    ) -> Arc<Plane> {
        let file = &initial.state.file;
        let etcd = file.control.etcd.clone().expect("[control] etcd");
        let plane = Plane {
            state_dir: file.control.state_dir(),
            etcd,
            applier,
            metrics: ControlMetrics::register(metrics),
            applied: watch::channel(initial.state.revision).0,
            store: Mutex::new(initial.store),
            state: Mutex::new(initial.state),
        };
        {
            let mut s = plane.lock();
            let keys: Vec<String> = s.desired.keys().cloned().collect();
            let revision = s.revision;
            plane.apply(&mut s, revision, &keys, Instant::now());
        }
        Arc::new(plane)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches etcd until `stop`: applies every change, reconnects with backoff (100 ms
    /// doubling to 5 s) while etcd is unreachable, and resumes from the applied revision.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            if *stop.borrow() {
                return;
            }
            let outcome = tokio::select! {
                o = self.watch_once() => o,
                _ = stop.wait_for(|s| *s) => return,
            };
            if let Err(e) = outcome {
                let first = self.disconnected(&e);
                if first {
                    tracing::warn!(error = %e, "etcd unreachable: serving the configuration in force; reconnecting");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            } else {
                backoff = Duration::from_millis(100);
            }
        }
    }

    /// One connection's life: (connect,) catch up, watch until the stream ends.
    async fn watch_once(&self) -> Result<(), StoreError> {
        let existing = self.store.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let store = match existing {
            Some(s) => s,
            None => {
                let s = Store::connect(&self.etcd).await?;
                *self.store.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.clone());
                s
            }
        };
        // Objects from a snapshot (or none) are replaced by etcd's whole; otherwise the watch
        // resumes after the revision in force.
        let from_etcd = self.lock().source == Source::Etcd;
        if !from_etcd {
            self.reload_all(&store).await?;
        }
        let revision = self.lock().revision;
        let mut stream = store.watch(revision).await?;
        loop {
            let Some(resp) = stream.message().await? else {
                return Err(StoreError::ended());
            };
            if resp.created() {
                self.connected();
            }
            if resp.canceled() {
                if resp.compact_revision() > 0 {
                    tracing::warn!(
                        compacted = resp.compact_revision(),
                        "the applied revision was compacted: reading every object again"
                    );
                    self.reload_all(&store).await?;
                    let revision = self.lock().revision;
                    stream = store.watch(revision).await?;
                    continue;
                }
                return Err(StoreError::canceled(resp.cancel_reason()));
            }
            let revision = resp.header().map_or(0, |h| h.revision());
            let changes = store.changes(resp.events());
            if changes.is_empty() {
                // A progress notification: everything up to `revision` has been seen.
                self.advance(revision);
                continue;
            }
            self.apply_changes(changes, revision, Instant::now());
        }
    }

    /// Reads every object again and puts them in force.
    async fn reload_all(&self, store: &Store) -> Result<(), StoreError> {
        let (revision, entries) = store.load().await?;
        let started = Instant::now();
        let mut s = self.lock();
        let before = s.desired.clone();
        s.desired = by_key(entries);
        s.source = Source::Etcd;
        let changed: Vec<String> = s
            .desired
            .iter()
            .filter(|(k, e)| before.get(*k) != Some(*e))
            .map(|(k, _)| k.clone())
            .chain(
                before
                    .keys()
                    .filter(|k| !s.desired.contains_key(*k))
                    .cloned(),
            )
            .collect();
        self.apply(&mut s, revision, &changed, started);
        drop(s);
        self.connected();
        Ok(())
    }

    fn apply_changes(&self, changes: Vec<Change>, revision: i64, started: Instant) {
        let mut s = self.lock();
        let mut changed = Vec::with_capacity(changes.len());
        for c in changes {
            match c {
                Change::Put(e) => {
                    changed.push(e.key.clone());
                    s.desired.insert(e.key.clone(), e);
                }
                Change::Delete(k) => {
                    s.desired.remove(&k);
                    changed.push(k);
                }
            }
        }
        self.apply(&mut s, revision, &changed, started);
    }

    /// Composes the objects desired with the file and puts the result in force; `changed`
    /// are the keys that moved (counted). When the whole does not build (e.g. an object's
    /// file is missing), each changed object is tried alone over what is in force, and those
    /// that fail are refused.
    fn apply(&self, s: &mut State, revision: i64, changed: &[String], started: Instant) {
        let composed = compose(&s.file, &s.desired, &s.in_force);
        let outcome = match self.put_in_force(&composed) {
            Ok(_) => Some(composed),
            Err(whole) => {
                tracing::warn!(error = %whole, "control-plane change does not build; trying its objects one at a time");
                self.apply_one_by_one(s, changed)
            }
        };
        if let Some(c) = outcome {
            s.in_force = c.in_force;
            s.errors = c.errors;
        }
        for key in changed {
            let kind = split_key(key).map_or("other", |(k, _)| k.plural());
            let refused = s.errors.contains_key(key);
            if refused {
                tracing::warn!(%key, error = %s.errors[key], "control-plane object refused");
            }
            self.metrics
                .changes
                .with_label_values(&[kind, if refused { "refused" } else { "applied" }])
                .inc();
        }
        s.revision = s.revision.max(revision);
        self.metrics
            .apply_seconds
            .observe(started.elapsed().as_secs_f64());
        self.export(s);
        self.write_snapshot(s);
        self.applied.send_replace(s.revision);
    }

    /// The changed objects added one at a time to what is in force, each kept only if the
    /// whole still builds.
    fn apply_one_by_one(&self, s: &mut State, changed: &[String]) -> Option<compose::Composed> {
        let mut accepted: BTreeMap<String, Entry> = s
            .in_force
            .iter()
            .map(|(k, f)| (k.clone(), f.entry.clone()))
            .collect();
        let mut build_errors = BTreeMap::new();
        for key in changed {
            let mut trial = accepted.clone();
            match s.desired.get(key) {
                Some(e) => trial.insert(key.clone(), e.clone()),
                None => trial.remove(key),
            };
            let c = compose(&s.file, &trial, &s.in_force);
            match self.put_in_force(&c) {
                Ok(_) => accepted = trial,
                Err(e) => {
                    build_errors.insert(
                        key.clone(),
                        ConfigError::at(
                            s.file.control.object_source(key),
                            "",
                            format!("does not build: {e:#}"),
                        ),
                    );
                }
            }
        }
        // In force now: `accepted`, as its last successful reload (or, if none succeeded, the
        // generation before the change, which is `accepted` too) left it; composing it again
        // gives what that reload was of. What etcd holds but could not be applied is reported
        // alongside what the decisions found.
        let mut c = compose(&s.file, &accepted, &s.in_force);
        c.errors
            .extend(compose::decide(&s.file, &s.desired, &s.in_force).errors);
        c.errors.extend(build_errors);
        Some(c)
    }

    /// Writes the composed configuration's certificate chains, then reloads with it.
    fn put_in_force(
        &self,
        c: &compose::Composed,
    ) -> anyhow::Result<crate::bootstrap::reload::ReloadReport> {
        c.write_chains().map_err(|e| {
            anyhow::anyhow!("cannot write certificate chains to the state folder: {e}")
        })?;
        self.applier.reload(c.config.clone())
    }

    fn advance(&self, revision: i64) {
        let mut s = self.lock();
        if revision > s.revision {
            s.revision = revision;
            self.metrics.revision.set(revision);
            self.applied.send_replace(revision);
        }
    }

    fn connected(&self) {
        let mut s = self.lock();
        if s.etcd_error.take().is_some() {
            tracing::info!("etcd reachable again: watching");
        }
        self.metrics.connected.set(1);
    }

    /// Marks etcd unreachable; true if it was reachable until now.
    fn disconnected(&self, e: &StoreError) -> bool {
        let mut s = self.lock();
        let first = s.etcd_error.is_none();
        s.etcd_error = Some(e.to_string());
        self.metrics.connected.set(0);
        first
    }

    fn export(&self, s: &State) {
        self.metrics.revision.set(s.revision);
        self.metrics.refused.set(s.errors.len() as i64);
        for kind in ObjectKind::ALL {
            let n = s.count(kind);
            self.metrics
                .objects
                .with_label_values(&[kind.plural()])
                .set(n as i64);
        }
        self.metrics.connected.set(i64::from(
            s.etcd_error.is_none() && s.source == Source::Etcd,
        ));
    }

    fn write_snapshot(&self, s: &State) {
        let snap = Snapshot::of(s.revision, s.in_force.values().map(|f| &f.entry));
        if let Err(e) = snap.write(&self.state_dir) {
            tracing::warn!(error = %e, dir = %self.state_dir.display(), "cannot write the control-plane snapshot");
        }
    }

    /// Replaces the file's part (SIGHUP) and puts it in force with the objects.
    pub fn replace_file(
        &self,
        file: Config,
    ) -> anyhow::Result<crate::bootstrap::reload::ReloadReport> {
        let mut s = self.lock();
        let composed = compose(&file, &s.desired, &s.in_force);
        let report = self.put_in_force(&composed)?;
        s.file = file;
        s.in_force = composed.in_force;
        s.errors = composed.errors;
        self.export(&s);
        Ok(report)
    }

    /// The status the admin API shows.
    pub fn status(&self) -> serde_json::Value {
        let s = self.lock();
        let errors: Vec<serde_json::Value> = s
            .errors
            .iter()
            .map(|(k, e)| {
                serde_json::json!({
                    "key": s.file.control.object_source(k),
                    "field": e.path,
                    "line": e.line,
                    "message": e.message,
                })
            })
            .collect();
        let mut objects = serde_json::Map::new();
        for kind in ObjectKind::ALL {
            let n = s.count(kind);
            objects.insert(kind.plural().into(), n.into());
        }
        serde_json::json!({
            "source": s.source,
            "etcd": {
                "endpoints": self.etcd.endpoints,
                "prefix": self.etcd.prefix,
                "connected": s.etcd_error.is_none() && s.source == Source::Etcd,
                "error": s.etcd_error,
            },
            "applied_revision": s.revision,
            "objects": objects,
            "refused": errors,
        })
    }

    /// The objects of `kind` in etcd: (name, mod revision, document, whether in force).
    pub fn objects(&self, kind: ObjectKind) -> Vec<(String, i64, String, bool)> {
        let s = self.lock();
        s.desired
            .values()
            .filter_map(|e| {
                let (k, name) = split_key(&e.key)?;
                (k == kind).then(|| {
                    let live = s.in_force.get(&e.key).is_some_and(|f| f.entry == *e);
                    (name.to_string(), e.mod_revision, e.doc.clone(), live)
                })
            })
            .collect()
    }

    /// Why the object at `kind/name` is refused, if it is.
    pub fn refusal(&self, kind: ObjectKind, name: &str) -> Option<ConfigError> {
        let key = format!("{}/{name}", kind.plural());
        self.lock().errors.get(&key).cloned()
    }

    /// One object in etcd: (mod revision, document, whether in force).
    pub fn object(&self, kind: ObjectKind, name: &str) -> Option<(i64, String, bool)> {
        let s = self.lock();
        let key = format!("{}/{name}", kind.plural());
        let e = s.desired.get(&key)?;
        let live = s.in_force.get(&key).is_some_and(|f| f.entry == *e);
        Some((e.mod_revision, e.doc.clone(), live))
    }

    /// Writes one object (created if `expect` is `Absent`, else replaced at that revision),
    /// after the same checks the watch makes; returns the new revision once it is in force
    /// here (or after 2 s).
    pub async fn put(
        &self,
        kind: ObjectKind,
        name: &str,
        doc: &str,
        expect: Expect,
    ) -> Result<i64, WriteError> {
        let key = format!("{}/{name}", kind.plural());
        self.check(&key, Some(doc))?;
        let store = self.writable()?;
        let written = store
            .put(&key, doc, expect)
            .await
            .map_err(|e| WriteError::Unavailable(e.to_string()))?;
        self.settle(&key, written).await
    }

    /// Deletes one object (at `expect`'s revision when given).
    pub async fn delete(
        &self,
        kind: ObjectKind,
        name: &str,
        expect: Option<i64>,
    ) -> Result<i64, WriteError> {
        let key = format!("{}/{name}", kind.plural());
        self.check(&key, None)?;
        let store = self.writable()?;
        let current = match expect {
            Some(r) => r,
            None => {
                store
                    .get(&key)
                    .await
                    .map_err(|e| WriteError::Unavailable(e.to_string()))?
                    .ok_or(WriteError::NotFound)?
                    .mod_revision
            }
        };
        let deleted = store
            .delete(&key, Expect::Revision(current))
            .await
            .map_err(|e| WriteError::Unavailable(e.to_string()))?;
        self.settle(&key, deleted).await
    }

    fn writable(&self) -> Result<Store, WriteError> {
        let s = self.lock();
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match (store, &s.etcd_error) {
            (Some(st), None) => Ok(st),
            (_, e) => Err(WriteError::Unavailable(
                e.clone()
                    .unwrap_or_else(|| "not connected to etcd yet".into()),
            )),
        }
    }

    /// Refuses a write the watch would refuse: the object with `doc` (none: deleted) must
    /// parse and check, and leave every reference intact.
    fn check(&self, key: &str, doc: Option<&str>) -> Result<(), WriteError> {
        let mut s = self.lock();
        if let (Some(doc), Some((kind, name))) = (doc, split_key(key)) {
            let (source, base) = (s.file.control.object_source(key), s.file.control.base_dir());
            parse_object(kind, name, doc, &source, &base).map_err(WriteError::Invalid)?;
        }
        // The write made in place, decided on, and undone (no copy of every object).
        let before = match doc {
            Some(d) => s.desired.insert(
                key.to_string(),
                Entry {
                    key: key.to_string(),
                    doc: d.to_string(),
                    mod_revision: 0,
                },
            ),
            None => s.desired.remove(key),
        };
        let c = compose::decide(&s.file, &s.desired, &s.in_force);
        match before {
            Some(e) => s.desired.insert(key.to_string(), e),
            None => s.desired.remove(key),
        };
        match c.errors.get(key) {
            None => Ok(()),
            Some(e) if doc.is_none() => Err(WriteError::Conflict(e.message.clone())),
            Some(e) => Err(WriteError::Invalid(e.clone())),
        }
    }

    /// The write's outcome: its revision once in force here, or the conflict.
    async fn settle(&self, key: &str, written: Result<i64, Conflict>) -> Result<i64, WriteError> {
        let revision = written.map_err(|c| {
            WriteError::Conflict(match c.current {
                Some(r) => format!(
                    "{}{key} is at revision {r}, not the one expected: read it again",
                    self.etcd.prefix
                ),
                None => format!("{}{key} does not exist (any more)", self.etcd.prefix),
            })
        })?;
        let mut applied = self.applied.subscribe();
        let _ = tokio::time::timeout(Duration::from_secs(2), applied.wait_for(|r| *r >= revision))
            .await;
        Ok(revision)
    }
}

impl StoreError {
    fn ended() -> StoreError {
        StoreError::from_message("the watch stream ended".into())
    }

    fn canceled(reason: &str) -> StoreError {
        StoreError::from_message(format!("the watch was canceled: {reason}"))
    }
}
