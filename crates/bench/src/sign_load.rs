//! `rampart bench sign-load`: signing throughput and latency through a key engine, in process
//! (`--engine inline|threads`) or on key servers (`--engine remote`), at a given concurrency.

use crate::stats::{Recorder, Summary};
use crate::BenchArgs;
use anyhow::{bail, Context as _};
use keyengine::{
    Engine, EngineMetrics, InlineEngine, KeyEngine, KeyRegistry, PrivateKey, Scheduler,
    SchedulerPolicy, SignatureAlgorithm, ThreadsEngine,
};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn engine(args: &BenchArgs) -> anyhow::Result<(Arc<dyn Engine>, bool)> {
    Ok(match args.engine.as_str() {
        "inline" => (Arc::new(InlineEngine), true),
        "threads" => (
            Arc::new(ThreadsEngine::new(args.threads.max(1), 65536)),
            true,
        ),
        "remote" => {
            let (Some(ca), Some(cert), Some(key)) = (&args.ca, &args.client_cert, &args.client_key)
            else {
                bail!("--engine remote needs --ca, --client-cert and --client-key");
            };
            if args.keyserver.is_empty() {
                bail!("--engine remote needs --keyserver ADDR (repeatable)");
            }
            let connector = keyless::tls::client_connector(ca, cert, key)?;
            let e = keyless::client::RemoteEngine::start(keyless::client::RemoteConfig {
                servers: args.keyserver.clone(),
                server_name: args.server_name.clone(),
                connector,
                connections_per_server: args.connections,
                timeout: Duration::from_secs(2),
                ping_interval: Duration::from_secs(1),
                breaker_failures: 3,
                breaker_cooldown: Duration::from_secs(1),
            })?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while e.live_connections() < args.keyserver.len() * args.connections {
                if Instant::now() > deadline {
                    bail!("could not connect to every key server");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (Arc::new(e), false)
        }
        other => bail!("--engine {other}: expected inline, threads or remote"),
    })
}

pub async fn run(args: BenchArgs) -> anyhow::Result<Summary> {
    let key_file = args
        .key_file
        .as_ref()
        .context("sign-load needs --key-file (a PEM private key)")?;
    let key = PrivateKey::from_pem_file(key_file)?;
    let alg = match key.kind() {
        keyengine::KeyKind::Rsa => SignatureAlgorithm::RsaPssSha256,
        keyengine::KeyKind::EcdsaP256 => SignatureAlgorithm::EcdsaP256Sha256,
        keyengine::KeyKind::EcdsaP384 => SignatureAlgorithm::EcdsaP384Sha384,
    };
    let (engine, local) = engine(&args).await?;
    let mut registry = KeyRegistry::new();
    let id = if local {
        registry.insert(key)
    } else {
        registry.insert_public(key.public_key())
    };
    let sched = Scheduler::new(vec![engine], &SchedulerPolicy::default())?;
    let ke = KeyEngine::new(registry, sched, EngineMetrics::unregistered());
    let budget = Arc::new(AtomicI64::new(args.requests.map_or(i64::MAX, |n| n as i64)));
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + args.duration;
    let server_cpu = crate::cpu::ServerCpuMeter::start(args.server_pid)?;
    let recorders: Vec<Recorder> = (0..args.concurrency.max(1))
        .map(|_| Recorder::new(budget.clone(), stop.clone(), deadline))
        .collect();
    let start = Instant::now();
    let digest = alg.hash().digest(b"rampart sign-load");
    let tasks: Vec<_> = recorders
        .iter()
        .cloned()
        .map(|rec| {
            let ke = ke.clone();
            let digest = digest.clone();
            tokio::spawn(async move {
                while rec.start_op() {
                    let t = Instant::now();
                    match ke.sign(&id, alg, digest.clone()).await {
                        Ok(_) => rec.ok(t.elapsed()),
                        Err(e) => rec.error(&anyhow::anyhow!("{}", e.kind())),
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed();
    let server_cpu = crate::cpu::ServerCpuMeter::stop(server_cpu)?;
    Ok(Summary::build(&args, &recorders, elapsed, server_cpu))
}
