//! Configuration reload (SIGHUP): which settings a running gateway can take in place (routes,
//! clusters, certificates) and the clusters of each generation. A cluster whose settings are
//! unchanged is carried over whole (every worker's connection pools, its request slots, its
//! health marks and checks); a new or changed one starts afresh (a changed one keeping only
//! its request slots, so that requests in flight still count against `max_requests`), and a
//! retired one's health checks stop once the new generation is in force.

use crate::config::{ClusterConfig, Config};
use crate::http::pipeline::Routing;
use crate::http::router::Router;
use crate::ops::metrics::Metrics;
use crate::upstream::health::Health;
use crate::upstream::tls::UpstreamTls;
use crate::upstream::{Cluster, RequestSlots};
use anyhow::Context as _;
use std::sync::Arc;
use tokio::sync::watch;

/// One cluster of a generation: its settings, every worker's copy of it, and the switch that
/// stops its active health checks.
pub(crate) struct ClusterEntry {
    cfg: ClusterConfig,
    per_worker: Vec<Arc<Cluster>>,
    slots: Arc<RequestSlots>,
    health: Arc<Health>,
    tls: Option<Arc<UpstreamTls>>,
    checks: Arc<watch::Sender<bool>>,
    /// Built by this generation (its checks not started yet), not carried over.
    fresh: bool,
}

impl ClusterEntry {
    /// Built by this generation rather than carried over.
    pub(crate) fn is_fresh(&self) -> bool {
        self.fresh
    }
}

/// The clusters of `cfg` for `workers` workers: those of `previous` whose settings are
/// unchanged are carried over (except clusters with upstream TLS, rebuilt so that their
/// certificate files are read again), the others built. Nothing is started: an error leaves
/// `previous` in force.
pub(crate) fn build_clusters(
    cfg: &Config,
    metrics: &Metrics,
    workers: usize,
    previous: &[ClusterEntry],
) -> anyhow::Result<Vec<ClusterEntry>> {
    // Upstream TLS first: the one step that reads files and can fail.
    let mut tls = Vec::with_capacity(cfg.clusters.len());
    for (i, c) in cfg.clusters.iter().enumerate() {
        let t = c
            .tls
            .as_ref()
            .map(|t| UpstreamTls::new(t, c.protocol).map(Arc::new))
            .transpose()
            .with_context(|| format!("clusters[{i}].tls ({})", c.name))?;
        tls.push(t);
    }
    // By name: a fleet's thousands of clusters are matched in one pass, not one scan each.
    let by_name: std::collections::HashMap<&str, &ClusterEntry> =
        previous.iter().map(|e| (e.cfg.name.as_str(), e)).collect();
    Ok(cfg
        .clusters
        .iter()
        .zip(tls)
        .map(|(c, tls)| {
            let named = by_name.get(c.name.as_str()).copied();
            let same = named.filter(|e| e.cfg == *c && c.tls.is_none());
            match same {
                Some(e) => ClusterEntry {
                    cfg: c.clone(),
                    per_worker: e.per_worker.clone(),
                    slots: e.slots.clone(),
                    health: e.health.clone(),
                    tls: e.tls.clone(),
                    checks: e.checks.clone(),
                    fresh: false,
                },
                None => {
                    // A changed cluster keeps counting its requests in flight against
                    // `max_requests` (the new value), so a reload admits no extra ones.
                    let slots = match named {
                        Some(e) => e.slots.reuse(c),
                        None => RequestSlots::new(c, metrics),
                    };
                    let health = Health::new(c, metrics);
                    let per_worker = (0..workers)
                        .map(|_| {
                            Arc::new(Cluster::new(
                                c,
                                metrics,
                                slots.clone(),
                                health.clone(),
                                tls.clone(),
                            ))
                        })
                        .collect();
                    ClusterEntry {
                        cfg: c.clone(),
                        per_worker,
                        slots,
                        health,
                        tls,
                        checks: Arc::new(watch::channel(false).0),
                        fresh: true,
                    }
                }
            }
        })
        .collect())
}

/// Every worker's routing over `clusters`, with the routes of `cfg` (replacing `previous`'s,
/// whose unchanged rate limiters are kept) and their web application firewalls `wafs`.
pub(crate) fn routings(
    cfg: &Config,
    clusters: &[ClusterEntry],
    workers: usize,
    previous: Option<&Router>,
    fleet: Option<&Arc<crate::fleet::FleetStore>>,
    wafs: Vec<Option<Arc<crate::policy::waf::RouteWaf>>>,
) -> Vec<Routing> {
    let index: std::collections::HashMap<&str, usize> = clusters
        .iter()
        .enumerate()
        .map(|(i, c)| (c.cfg.name.as_str(), i))
        .collect();
    let router = Arc::new(
        Router::after(
            &cfg.routes,
            |name| *index.get(name).expect("validated"),
            previous,
            fleet,
        )
        .with_wafs(wafs),
    );
    (0..workers)
        .map(|w| Routing {
            router: router.clone(),
            clusters: clusters.iter().map(|c| c.per_worker[w].clone()).collect(),
        })
        .collect()
}

/// Starts the active health checks of the clusters this generation built. Must run inside
/// the control runtime.
pub(crate) fn start_checks(clusters: &mut [ClusterEntry]) {
    for c in clusters.iter_mut().filter(|c| c.fresh) {
        c.health
            .spawn_checks(&c.cfg, c.tls.clone(), c.checks.subscribe());
        c.fresh = false;
    }
}

/// Stops the health checks of the clusters of `old` that `new` does not carry over, and drops
/// the health gauges of endpoints no cluster of that name has any more.
pub(crate) fn retire(old: &[ClusterEntry], new: &[ClusterEntry], metrics: &Metrics) {
    let carried: std::collections::HashSet<*const watch::Sender<bool>> =
        new.iter().map(|n| Arc::as_ptr(&n.checks)).collect();
    let by_name: std::collections::HashMap<&str, &ClusterEntry> =
        new.iter().map(|n| (n.cfg.name.as_str(), n)).collect();
    for e in old {
        if carried.contains(&Arc::as_ptr(&e.checks)) {
            continue;
        }
        let _ = e.checks.send(true);
        for a in &e.cfg.endpoints {
            let kept = by_name
                .get(e.cfg.name.as_str())
                .is_some_and(|n| n.cfg.endpoints.contains(a));
            if !kept {
                let _ = metrics
                    .upstream_healthy
                    .remove_label_values(&[&e.cfg.name, &a.to_string()]);
            }
        }
    }
}

/// Stops every cluster's health checks (shutdown).
pub(crate) fn stop_checks(clusters: &[ClusterEntry]) {
    for c in clusters {
        let _ = c.checks.send(true);
    }
}

/// The settings of `new` that differ from those in force (`old`) and take a restart: the
/// `[server]`, `[admin]` and `[key_engine]` tables, and every listener setting but its
/// certificates and access lists (a listener added, removed or renamed among them).
pub(crate) fn needing_restart(old: &Config, new: &Config) -> Vec<String> {
    let mut differ = Vec::new();
    if old.server != new.server {
        differ.push("[server]".to_string());
    }
    if old.admin != new.admin {
        differ.push("[admin]".to_string());
    }
    if old.key_engine != new.key_engine {
        differ.push("[key_engine]".to_string());
    }
    if old.control != new.control {
        differ.push("[control]".to_string());
    }
    if old.fleet != new.fleet {
        differ.push("[fleet]".to_string());
    }
    if old.tracing != new.tracing {
        differ.push("[tracing]".to_string());
    }
    // The Core Rule Set's paths take effect at the reload (rule sets are compiled then); the
    // inspection threads, their queue and the match log were made at start.
    let (ow, nw) = (&old.waf, &new.waf);
    if (ow.threads, ow.queue, &ow.log) != (nw.threads, nw.queue, &nw.log) {
        differ.push("[waf] threads, queue or log".to_string());
    }
    let names = |c: &Config| {
        c.listeners
            .iter()
            .map(|l| l.name.clone())
            .collect::<Vec<_>>()
    };
    if names(old) != names(new) {
        differ.push("[[listeners]] (added, removed or renamed)".to_string());
        return differ;
    }
    for (i, (o, n)) in old.listeners.iter().zip(&new.listeners).enumerate() {
        let mut n = n.clone();
        n.certificates = o.certificates.clone();
        n.allow = o.allow.clone();
        n.deny = o.deny.clone();
        if *o != n {
            differ.push(format!("listeners[{i}] ({})", o.name));
        }
    }
    differ
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// Clusters carried over with their connections and health marks.
    pub clusters_kept: usize,
    /// Clusters built afresh (new, changed, or with upstream TLS).
    pub clusters_built: usize,
    /// Settings that changed but take a restart; the running ones stay in force.
    pub needs_restart: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra_listener: &str, extra_server: &str) -> Config {
        let text = format!(
            r#"
[server]
access_log = "off"
{extra_server}

[[listeners]]
name = "https"
listen = "127.0.0.1:8443"
{extra_listener}

[[listeners.certificates]]
server_names = ["localhost"]
rsa = {{ cert = "a.crt", key = "a.key" }}

[[routes]]
cluster = "app"

[[clusters]]
name = "app"
endpoints = ["127.0.0.1:8080"]
"#
        );
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn unchanged_clusters_are_carried_over_and_changed_ones_keep_counting_requests() {
        let metrics = Metrics::new();
        let base = config("", "");
        let first = build_clusters(&base, &metrics, 2, &[]).unwrap();
        assert!(first[0].is_fresh());

        // The same settings: the same clusters, every worker's copy.
        let same = build_clusters(&base, &metrics, 2, &first).unwrap();
        assert!(!same[0].is_fresh());
        assert!(Arc::ptr_eq(&same[0].per_worker[1], &first[0].per_worker[1]));

        // A changed setting: new copies, but the same request slots, with the new bound.
        let mut changed = base.clone();
        changed.clusters[0].max_requests = 7;
        let next = build_clusters(&changed, &metrics, 2, &same).unwrap();
        assert!(next[0].is_fresh());
        assert!(!Arc::ptr_eq(&next[0].per_worker[0], &same[0].per_worker[0]));
        assert!(Arc::ptr_eq(&next[0].slots, &first[0].slots));
        assert_eq!(
            next[0].slots.max.load(std::sync::atomic::Ordering::Relaxed),
            7
        );

        // Another name: its own slots.
        let mut renamed = changed.clone();
        renamed.clusters[0].name = "other".into();
        renamed.routes[0].cluster = "other".into();
        let other = build_clusters(&renamed, &metrics, 2, &next).unwrap();
        assert!(!Arc::ptr_eq(&other[0].slots, &first[0].slots));
    }

    #[test]
    fn restart_is_needed_for_listener_and_server_settings_not_for_certificates() {
        let base = config("", "");
        assert!(needing_restart(&base, &base).is_empty());
        let mut certs = base.clone();
        certs.listeners[0].certificates[0].server_names = vec!["example.com".into()];
        certs.listeners[0].deny = vec!["192.0.2.0/24".parse().unwrap()];
        assert!(needing_restart(&base, &certs).is_empty());
        let limits = config("limits.max_headers = 10", "");
        assert_eq!(
            needing_restart(&base, &limits),
            vec!["listeners[0] (https)"]
        );
        let server = config("", "worker_threads = 3");
        assert_eq!(needing_restart(&base, &server), vec!["[server]"]);
        let mut waf = base.clone();
        waf.waf.crs_rules = "/opt/crs/rules".into();
        assert!(
            needing_restart(&base, &waf).is_empty(),
            "the rules' paths reload"
        );
        waf.waf.threads = 7;
        waf.tracing.sample_ratio = 0.5;
        assert_eq!(
            needing_restart(&base, &waf),
            vec!["[tracing]", "[waf] threads, queue or log"]
        );
        let mut renamed = base.clone();
        renamed.listeners[0].name = "other".into();
        assert_eq!(
            needing_restart(&base, &renamed),
            vec!["[[listeners]] (added, removed or renamed)"]
        );
    }
}
