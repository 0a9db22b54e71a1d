//! Putting the control plane's objects together with the file's: which version of each object
//! goes in force, and why any is refused. Pure (no etcd, no I/O but the objects' own files),
//! so the watch, the admin API's checks before a write and start-up all decide alike.
//!
//! The rules, per object key (`routes/api`, `clusters/app`):
//! - a document that does not parse or check is refused; its last good version stays;
//! - a name the file already defines is refused (the file's object is not replaced);
//! - a route whose cluster exists nowhere is refused; its last good version stays if that
//!   one's cluster exists;
//! - a cluster deleted while routes in force still use it stays, reported, until they do not;
//! - a listener's access lists must name one of the file's listeners, whose `allow` and `deny`
//!   they replace;
//! - a certificate must name one of the file's listeners, and have a key file unless the
//!   `remote` engine signs; its chain goes to a file in the state folder (named by its
//!   content, so a changed chain is a new file) that [`Composed::chains`] lists for writing.

use super::store::Entry;
use crate::config::{parse_object, Config, ConfigError, EngineKind, Object, ObjectKind};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// An object in force: the checked object and the entry it came from.
#[derive(Debug, Clone)]
pub struct InForce {
    pub object: Object,
    pub entry: Entry,
}

/// What goes in force: the whole configuration, the objects in it, and the refusals.
pub struct Composed {
    pub config: Config,
    pub in_force: BTreeMap<String, InForce>,
    pub errors: BTreeMap<String, ConfigError>,
    /// Certificate chains to write before `config` is put in force: (file, PEM).
    pub chains: Vec<(PathBuf, String)>,
}

impl Composed {
    /// Writes the certificate chains `config` names (those already there are left alone).
    pub fn write_chains(&self) -> std::io::Result<()> {
        for (path, pem) in &self.chains {
            if path.exists() {
                continue;
            }
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, pem)?;
            std::fs::rename(&tmp, path)?;
        }
        Ok(())
    }
}

/// Where a certificate object's chain is written: named by the object, the kind and the
/// chain's content, in `state_dir/certificates`.
fn chain_file(dir: &Path, name: &str, kind: &str, pem: &str) -> PathBuf {
    let hash = crate::http::headers::stable_hash(pem.as_bytes(), 0);
    dir.join(format!("{name}.{kind}.{hash:016x}.pem"))
}

/// `(kind, name)` of an object key (`routes/api`), if it is one.
pub fn split_key(key: &str) -> Option<(ObjectKind, &str)> {
    let (kind, name) = key.split_once('/')?;
    Some((ObjectKind::from_plural(kind)?, name))
}

/// The configuration of `file` with the objects of `desired` (etcd's) added, falling back to
/// those of `previous` (in force until now) where a desired one is refused. Errors name an
/// object by its etcd key; relative paths resolve against the file's folder.
pub fn compose(
    file: &Config,
    desired: &BTreeMap<String, Entry>,
    previous: &BTreeMap<String, InForce>,
) -> Composed {
    let mut c = decide(file, desired, previous);
    c.build();
    c
}

/// [`compose`]'s decisions only (which objects go in force, which are refused), its
/// `config` still the file's: for checks that need no configuration (the API's, before a
/// write), which a fleet's thousands of objects would make dear.
pub fn decide(
    file: &Config,
    desired: &BTreeMap<String, Entry>,
    previous: &BTreeMap<String, InForce>,
) -> Composed {
    let base = file.control.base_dir();
    let source = |key: &str| file.control.object_source(key);
    let error =
        |key: &str, path: &str, message: String| ConfigError::at(source(key), path, message);
    let mut errors = BTreeMap::new();
    let refuse =
        |errors: &mut BTreeMap<String, ConfigError>, key: &str, path: &str, msg: String| {
            errors.insert(key.to_string(), error(key, path, msg));
        };
    let file_clusters: HashSet<&str> = file.clusters.iter().map(|c| c.name.as_str()).collect();
    let file_routes: HashSet<String> = file.routes.iter().map(|r| r.effective_name()).collect();
    let file_listeners: HashSet<&str> = file.listeners.iter().map(|l| l.name.as_str()).collect();
    let remote_keys = file.key_engine.engines.contains(&EngineKind::Remote);
    let listener_names = || {
        let mut known: Vec<&str> = file_listeners.iter().copied().collect();
        known.sort();
        known.join(", ")
    };
    // Why the file leaves no room for an object, as (field, what was expected): a name it
    // defines itself, a listener it lacks, a key a certificate needs. None: it fits.
    let conflict = |o: &Object| -> Option<(String, String)> {
        let clash = |kind: ObjectKind, name: &str| {
            Some((
                "name".to_string(),
                format!(
                    "a name the configuration file does not define: it has a {} {name:?}, which the control plane does not replace",
                    kind.singular()
                ),
            ))
        };
        match o {
            Object::Cluster(c) if file_clusters.contains(c.name.as_str()) => {
                clash(ObjectKind::Cluster, &c.name)
            }
            Object::Route(r) if file_routes.contains(&r.effective_name()) => {
                clash(ObjectKind::Route, &r.effective_name())
            }
            Object::Listener(l) => {
                let name = l.name.as_deref().unwrap_or("");
                (!file_listeners.contains(name)).then(|| {
                    (
                        "name".to_string(),
                        format!(
                            "no listener named {name:?} in the configuration file; expected one of: {}",
                            listener_names()
                        ),
                    )
                })
            }
            Object::Certificate(c) if !file_listeners.contains(c.listener.as_str()) => Some((
                "listener".into(),
                format!(
                    "no listener named {:?} in the configuration file; expected one of: {}",
                    c.listener,
                    listener_names()
                ),
            )),
            Object::Certificate(c) if !remote_keys => [("rsa", &c.rsa), ("ecdsa", &c.ecdsa)]
                .into_iter()
                .find(|(_, p)| p.as_ref().is_some_and(|p| p.key.is_none()))
                .map(|(kind, _)| {
                    (
                        format!("{kind}.key"),
                        "a private key file on the node, unless key_engine.engines includes \"remote\"".into(),
                    )
                }),
            _ => None,
        }
    };

    // Each desired object alone; a refused one falls back to its previous version.
    let mut candidates: BTreeMap<String, InForce> = BTreeMap::new();
    for (key, entry) in desired {
        // Unchanged since it was put in force: parsed and checked then (a fleet with
        // thousands of objects parses only what changed). Only the file can have moved.
        if let Some(p) = previous.get(key).filter(|p| p.entry.doc == entry.doc) {
            if conflict(&p.object).is_none() {
                candidates.insert(
                    key.clone(),
                    InForce {
                        object: p.object.clone(),
                        entry: entry.clone(),
                    },
                );
                continue;
            }
        }
        let parsed = match split_key(key) {
            None => Err(error(
                key,
                "",
                format!(
                    "not an object key: expected <kind>/<name>, the kind one of {}",
                    ObjectKind::ALL.map(ObjectKind::plural).join(", ")
                ),
            )),
            Some((kind, name)) => parse_object(kind, name, &entry.doc, &source(key), &base)
                .and_then(|o| match conflict(&o) {
                    Some((path, message)) => Err(error(key, &path, message)),
                    None => Ok(o),
                }),
        };
        match parsed {
            Ok(object) => {
                candidates.insert(
                    key.clone(),
                    InForce {
                        object,
                        entry: entry.clone(),
                    },
                );
            }
            Err(e) => {
                errors.insert(key.clone(), e);
                if let Some(p) = previous.get(key) {
                    candidates.insert(key.clone(), p.clone());
                }
            }
        }
    }

    let cluster_names = |c: &BTreeMap<String, InForce>| -> HashSet<String> {
        c.values()
            .filter_map(|f| match &f.object {
                Object::Cluster(c) => Some(c.name.clone()),
                _ => None,
            })
            .chain(file_clusters.iter().map(|s| s.to_string()))
            .collect()
    };
    // Every cluster a route names (its own, its split's and cohorts'), with the field.
    let route_clusters = |f: &InForce| -> Vec<(String, String)> {
        match &f.object {
            Object::Route(r) => r
                .cluster_refs()
                .into_iter()
                .map(|(path, name)| (path, name.to_string()))
                .collect(),
            _ => Vec::new(),
        }
    };
    let missing = |f: &InForce, known: &HashSet<String>| {
        route_clusters(f)
            .into_iter()
            .find(|(_, name)| !known.contains(name))
    };

    // A cluster deleted (or refused without a previous version) while routes still use it.
    let known = cluster_names(&candidates);
    for (key, p) in previous {
        let Object::Cluster(c) = &p.object else {
            continue;
        };
        if known.contains(&c.name) {
            continue;
        }
        let users: Vec<String> = candidates
            .iter()
            .filter(|(_, f)| route_clusters(f).iter().any(|(_, n)| *n == c.name))
            .map(|(k, _)| k.clone())
            .collect();
        if users.is_empty() {
            continue;
        }
        if !errors.contains_key(key) {
            let msg = format!(
                "deleted, but {} still use{} it: kept in force until no route does",
                users.join(", "),
                if users.len() == 1 { "s" } else { "" }
            );
            refuse(&mut errors, key, "", msg);
        }
        candidates.insert(key.clone(), p.clone());
    }

    // Routes must name a cluster that exists.
    let known = cluster_names(&candidates);
    let unknown: Vec<(String, (String, String))> = candidates
        .iter()
        .filter_map(|(k, f)| missing(f, &known).map(|m| (k.clone(), m)))
        .collect();
    for (key, (path, cluster)) in unknown {
        let mut names: Vec<&String> = known.iter().collect();
        names.sort();
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        refuse(
            &mut errors,
            &key,
            &path,
            format!(
                "no cluster named {cluster:?}; expected one of: {}",
                names.join(", ")
            ),
        );
        candidates.remove(&key);
        if let Some(p) = previous.get(&key) {
            if missing(p, &known).is_none() {
                candidates.insert(key, p.clone());
            }
        }
    }

    Composed {
        config: file.clone(),
        in_force: candidates,
        errors,
        chains: Vec::new(),
    }
}

impl Composed {
    /// Adds the objects in force to the file's configuration, and lists the certificate
    /// chains it names.
    fn build(&mut self) {
        let config = &mut self.config;
        let chains = &mut self.chains;
        let cert_dir = config.control.state_dir().join("certificates");
        for (key, f) in &self.in_force {
            match &f.object {
                Object::Certificate(c) => {
                    let name = split_key(key).map_or("", |(_, n)| n);
                    let cert = c.to_config(|kind, pem| {
                        let path = chain_file(&cert_dir, name, kind, pem);
                        chains.push((path.clone(), pem.to_string()));
                        path
                    });
                    if let Some(l) = config.listeners.iter_mut().find(|l| l.name == c.listener) {
                        l.certificates.push(cert);
                    }
                }
                Object::Cluster(c) => config.clusters.push((**c).clone()),
                Object::Route(r) => config.routes.push((**r).clone()),
                Object::Listener(a) => {
                    if let Some(l) = config
                        .listeners
                        .iter_mut()
                        .find(|l| Some(l.name.as_str()) == a.name.as_deref())
                    {
                        l.allow = a.allow.clone();
                        l.deny = a.deny.clone();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> Config {
        toml::from_str(
            r#"
[control.etcd]
endpoints = ["http://127.0.0.1:2379"]

[[listeners]]
name = "https"
listen = "127.0.0.1:8443"

[[listeners.certificates]]
server_names = ["localhost"]
rsa = { cert = "a.crt", key = "a.key" }

[[clusters]]
name = "static"
endpoints = ["127.0.0.1:8080"]
"#,
        )
        .unwrap()
    }

    fn entries(list: &[(&str, &str)]) -> BTreeMap<String, Entry> {
        list.iter()
            .map(|(k, d)| {
                (
                    k.to_string(),
                    Entry {
                        key: k.to_string(),
                        doc: d.to_string(),
                        mod_revision: 1,
                    },
                )
            })
            .collect()
    }

    fn run(desired: &BTreeMap<String, Entry>, previous: &BTreeMap<String, InForce>) -> Composed {
        compose(&file(), desired, previous)
    }

    fn routes(c: &Composed) -> Vec<(String, String)> {
        c.config
            .routes
            .iter()
            .map(|r| (r.effective_name(), r.cluster.clone()))
            .collect()
    }

    const APP: &str = r#"{"name": "app", "endpoints": ["127.0.0.1:9000"]}"#;

    #[test]
    fn valid_objects_join_the_file_and_a_refused_one_keeps_its_last_good_version() {
        let first = run(
            &entries(&[
                ("clusters/app", APP),
                (
                    "routes/api",
                    r#"{"cluster": "app", "path_prefix": "/api/"}"#,
                ),
                ("routes/web", r#"{"cluster": "static"}"#),
            ]),
            &BTreeMap::new(),
        );
        assert!(first.errors.is_empty(), "{:?}", first.errors);
        assert_eq!(first.config.clusters.len(), 2);
        assert_eq!(routes(&first).len(), 2);
        // A bad change to one route and a good one to another, in one batch.
        let second = run(
            &entries(&[
                ("clusters/app", APP),
                ("routes/api", r#"{"cluster": "app", "path_prefix": "api"}"#),
                ("routes/web", r#"{"cluster": "app"}"#),
            ]),
            &first.in_force,
        );
        let e = &second.errors["routes/api"];
        assert_eq!(
            (e.file.as_str(), e.path.as_str()),
            ("/rampart/routes/api", "path_prefix")
        );
        assert_eq!(second.errors.len(), 1);
        assert_eq!(
            routes(&second),
            [("api".into(), "app".into()), ("web".into(), "app".into())]
        );
        assert_eq!(
            second.config.routes[0].path_prefix, "/api/",
            "the last good version"
        );
    }

    #[test]
    fn references_and_names_are_checked_across_objects() {
        // A route to a cluster that exists nowhere; a cluster named as the file's; a key
        // that is no object.
        let c = run(
            &entries(&[
                ("routes/api", r#"{"cluster": "nowhere"}"#),
                (
                    "clusters/static",
                    r#"{"name": "static", "endpoints": ["127.0.0.1:1"]}"#,
                ),
                ("misc/x", "{}"),
            ]),
            &BTreeMap::new(),
        );
        assert_eq!(c.errors["routes/api"].path, "cluster");
        let split = run(
            &entries(&[(
                "routes/s",
                r#"{"cluster": "static", "split": [{"cluster": "gone", "weight": 5}]}"#,
            )]),
            &BTreeMap::new(),
        );
        assert_eq!(split.errors["routes/s"].path, "split[0].cluster");
        assert!(c.errors["routes/api"]
            .message
            .contains("expected one of: static"));
        assert!(c.errors["clusters/static"]
            .message
            .contains("does not replace"));
        assert!(c.errors["misc/x"].message.contains("not an object key"));
        // A listener's access lists name one of the file's listeners and replace its own.
        let l = run(
            &entries(&[
                ("listeners/https", r#"{"deny": ["192.0.2.0/24"]}"#),
                ("listeners/other", r#"{"deny": []}"#),
            ]),
            &BTreeMap::new(),
        );
        assert_eq!(l.config.listeners[0].deny.len(), 1);
        assert!(l.errors["listeners/other"]
            .message
            .contains("expected one of: https"));
        assert!(c.config.routes.is_empty());
        assert_eq!(c.config.clusters.len(), 1);

        // A cluster deleted while a route uses it stays, reported on the cluster's key.
        let first = run(
            &entries(&[
                ("clusters/app", APP),
                ("routes/api", r#"{"cluster": "app"}"#),
            ]),
            &BTreeMap::new(),
        );
        let second = run(
            &entries(&[("routes/api", r#"{"cluster": "app"}"#)]),
            &first.in_force,
        );
        assert!(second.errors["clusters/app"]
            .message
            .contains("routes/api still uses it"));
        assert_eq!(second.config.clusters.len(), 2);
        assert_eq!(routes(&second), [("api".into(), "app".into())]);
        // Once the route moves, the deletion goes through.
        let third = run(
            &entries(&[("routes/api", r#"{"cluster": "static"}"#)]),
            &second.in_force,
        );
        assert!(third.errors.is_empty(), "{:?}", third.errors);
        assert_eq!(third.config.clusters.len(), 1);
    }
}
