//! The key engine assembled from the `[key_engine]` section: the configured engines started,
//! every listener certificate's key registered, the scheduler's pins applied.

use crate::config::{self, Config, EngineKind};
use crate::ops::metrics;
use crate::tls;
use anyhow::Context as _;
use keyengine::{
    Engine, EngineMetrics, InlineEngine, KeyEngine, KeyKind, KeyRegistry, Scheduler,
    SchedulerPolicy, ThreadsEngine,
};
use std::sync::Arc;

/// Starts the engines named in `cfg` (`inline`, `threads`, `remote`).
/// `rsa_keys` are the DER private keys a `gpu` engine prepares for the device.
pub fn start_engines(
    cfg: &config::KeyEngineConfig,
    rsa_keys: &[Vec<u8>],
) -> anyhow::Result<Vec<Arc<dyn Engine>>> {
    cfg.engines
        .iter()
        .map(|k| -> anyhow::Result<Arc<dyn Engine>> {
            Ok(match k {
                EngineKind::Inline => Arc::new(InlineEngine),
                EngineKind::Threads => {
                    Arc::new(ThreadsEngine::new(cfg.threads, cfg.queue_capacity))
                }
                EngineKind::Batch => {
                    let b = &cfg.batch;
                    let backend = b
                        .backend()
                        .map_err(|e| anyhow::anyhow!("key_engine.batch.kernel: {e}"))?;
                    tracing::info!(kernel = %backend, threads = b.threads, "batch engine");
                    Arc::new(keyengine::BatchEngine::new(keyengine::BatchConfig {
                        threads: b.threads,
                        queue_capacity: b.queue_capacity,
                        backend,
                        inline_when_idle: b.inline_when_idle,
                        nonce_pool: (b.nonce_pool > 0).then_some(mbcrypto::ecdsa::PoolConfig {
                            capacity: b.nonce_pool,
                            refill_below: b.nonce_refill_below,
                            batch: b.nonce_batch,
                        }),
                    })?)
                }
                EngineKind::Gpu => {
                    // With a device, the kernel builds in the background (tens of seconds): the
                    // scheduler routes around the engine until it is ready.
                    let gpu = gpu_engine::GpuEngine::new(cfg.gpu.engine_config());
                    match gpu.status() {
                        gpu_engine::GpuStatus::Unavailable(reason) => tracing::warn!(
                            %reason,
                            "gpu engine unavailable: every signature goes to the other engines"
                        ),
                        _ => {
                            for der in rsa_keys {
                                if let Err(e) = gpu.add_key(der) {
                                    tracing::warn!(error = %e, "gpu engine: key not loaded; it signs on the CPU engines");
                                }
                            }
                        }
                    }
                    Arc::new(gpu)
                }
                EngineKind::Remote => {
                    let r = cfg.remote.as_ref().context("key_engine.remote: missing")?;
                    let connector =
                        keyless::tls::client_connector(&r.ca, &r.client_cert, &r.client_key)
                            .context("key_engine.remote")?;
                    Arc::new(keyless::client::RemoteEngine::start(
                        keyless::client::RemoteConfig {
                            servers: r.servers.clone(),
                            server_name: r.server_name.clone(),
                            connector,
                            connections_per_server: r.connections_per_server,
                            timeout: r.timeout,
                            ping_interval: r.ping_interval,
                            breaker_failures: r.breaker_failures,
                            breaker_cooldown: r.breaker_cooldown,
                        },
                    )?)
                }
            })
        })
        .collect()
}

/// Assembles a key engine from a registry, the configured (or given) engines and the pins.
pub fn assemble_key_engine(
    registry: KeyRegistry,
    cfg: &config::KeyEngineConfig,
    metrics: &metrics::Metrics,
    engines: Option<Vec<Arc<dyn Engine>>>,
    key_files: &[std::path::PathBuf],
) -> anyhow::Result<Arc<KeyEngine>> {
    let engines = match engines {
        Some(e) => e,
        None => {
            // Only a `gpu` engine needs the keys' DER (it prepares RSA keys for the device).
            let rsa_keys = if cfg.engines.contains(&EngineKind::Gpu) {
                rsa_key_ders(key_files)?
            } else {
                Vec::new()
            };
            start_engines(cfg, &rsa_keys)?
        }
    };
    let mut policy = SchedulerPolicy::default();
    if let Some(e) = cfg.pin.rsa {
        policy.pins.insert(KeyKind::Rsa, e.as_str().into());
    }
    if let Some(e) = cfg.pin.ecdsa {
        policy.pins.insert(KeyKind::EcdsaP256, e.as_str().into());
        policy.pins.insert(KeyKind::EcdsaP384, e.as_str().into());
    }
    if engines.iter().any(|e| e.offloads_cpu()) {
        policy.offload = Some(keyengine::CpuOffload {
            load: keyengine::CpuLoad::sampled(std::time::Duration::from_millis(100))
                .context("starting the CPU load sampler")?,
            enter: cfg.cpu_offload_above,
            leave: cfg.cpu_offload_above - 0.15,
        });
    }
    let scheduler = Scheduler::new(engines, &policy)?;
    let em = EngineMetrics::new(&metrics.registry)?;
    Ok(KeyEngine::new(registry, scheduler, em))
}

/// The RSA private keys (DER) in `key_files`, for an engine that prepares them ahead.
pub(super) fn rsa_key_ders(key_files: &[std::path::PathBuf]) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut rsa_keys = Vec::new();
    for path in key_files {
        let text =
            std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
        for block in pem::parse_many(&text).unwrap_or_default() {
            if block.tag().ends_with("PRIVATE KEY") && !block.tag().starts_with("EC") {
                rsa_keys.push(block.into_contents());
            }
        }
    }
    Ok(rsa_keys)
}

/// Builds the gateway's key engine: every configured private key is loaded; a certificate
/// without a key contributes its public key (signed remotely, verified here).
pub fn build_key_engine(
    cfg: &Config,
    metrics: &metrics::Metrics,
    engines: Option<Vec<Arc<dyn Engine>>>,
) -> anyhow::Result<Arc<KeyEngine>> {
    let (registry, key_files) = load_keys(&cfg.listeners)?;
    assemble_key_engine(registry, &cfg.key_engine, metrics, engines, &key_files)
}

/// Every listener certificate's key: the private key from its file, or the certificate's
/// public key where the key is held elsewhere. Also returns the private-key files read.
pub(super) fn load_keys(
    listeners: &[config::ListenerConfig],
) -> anyhow::Result<(KeyRegistry, Vec<std::path::PathBuf>)> {
    let mut registry = KeyRegistry::new();
    let mut key_files = Vec::new();
    for (i, l) in listeners.iter().enumerate() {
        for (j, c) in l.certificates.iter().enumerate() {
            for (kind, pair) in [("rsa", &c.rsa), ("ecdsa", &c.ecdsa)] {
                let Some(p) = pair else { continue };
                let field = format!("listeners[{i}].certificates[{j}].{kind}");
                match &p.key {
                    Some(key) => {
                        registry
                            .load_pem_file(key)
                            .with_context(|| format!("{field}.key"))?;
                        key_files.push(key.clone());
                    }
                    None => {
                        let public = tls::certificate_public_key(&p.cert)
                            .with_context(|| format!("{field}.cert"))?;
                        registry.insert_public(public);
                    }
                }
            }
        }
    }
    Ok((registry, key_files))
}
