//! The worker process's side (`rampart gpu-worker`): builds the CUDA backend from the settings
//! on its command line, says `Ready` on every channel, then serves each channel on a thread of
//! its own: copy the staged batch from the shared region into its stream's buffers, run it,
//! copy the outputs back, answer. On a device error it answers `Error` and exits (the context
//! is lost for the process); when the engine closes the sockets it exits.

use super::shm::{Layout, Shm};
use super::wire::{Reply, Run};
use super::FIRST_FD;
use crate::backend::BatchBackend;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The kernel settings of `config` as the worker's arguments (what [`run`] reads back).
pub(crate) fn settings_args(config: &crate::GpuConfig) -> Vec<String> {
    let mut a = vec![
        "--max-batch".to_string(),
        config.max_batch.to_string(),
        "--threads-per-block".into(),
        config.threads_per_block.to_string(),
        "--window".into(),
        config.window.to_string(),
        "--threads-per-request".into(),
        config.threads_per_request.to_string(),
        "--table-shared".into(),
        u8::from(config.table_shared).to_string(),
        "--carry-chains".into(),
        u8::from(config.carry_chains).to_string(),
    ];
    if let Some(dir) = &config.kernel_cache {
        a.push("--kernel-cache".into());
        a.push(dir.display().to_string());
    }
    a
}

/// What the worker was told.
struct Options {
    config: crate::GpuConfig,
    channels: usize,
    /// `--simulated LAUNCH_US:PER_ITEM_NS`: the simulated device instead of CUDA (tests).
    simulated: Option<crate::CostModel>,
    fault_after: Option<u64>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        config: crate::GpuConfig::default(),
        channels: 0,
        simulated: None,
        fault_after: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag}: a value is expected"))?;
        let num = |what: &str| {
            value
                .parse::<u64>()
                .map_err(|_| format!("{what}: a number is expected, got {value:?}"))
        };
        match flag.as_str() {
            "--max-batch" => o.config.max_batch = num(flag)? as usize,
            "--threads-per-block" => o.config.threads_per_block = num(flag)? as u32,
            "--window" => o.config.window = num(flag)? as u32,
            "--threads-per-request" => o.config.threads_per_request = num(flag)? as u32,
            "--table-shared" => o.config.table_shared = num(flag)? != 0,
            "--carry-chains" => o.config.carry_chains = num(flag)? != 0,
            "--kernel-cache" => o.config.kernel_cache = Some(value.into()),
            "--channels" => o.channels = num(flag)? as usize,
            "--fault-after" => o.fault_after = Some(num(flag)?),
            "--simulated" => {
                let (l, p) = value
                    .split_once(':')
                    .ok_or_else(|| format!("--simulated: LAUNCH_US:PER_ITEM_NS, got {value:?}"))?;
                let n = |s: &str| {
                    s.parse::<u64>()
                        .map_err(|_| format!("--simulated: {value:?}"))
                };
                o.simulated = Some(crate::CostModel {
                    launch: Duration::from_micros(n(l)?),
                    per_item: Duration::from_nanos(n(p)?),
                });
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.channels == 0 {
        return Err("--channels: at least one is expected".into());
    }
    o.config.streams = o.channels;
    Ok(o)
}

/// The backend and what makes it fault on demand (the `--fault-after` hook).
type Device = (Arc<dyn BatchBackend>, Box<dyn Fn() + Send + Sync>);

fn device(o: &Options) -> Result<Device, String> {
    if let Some(cost) = o.simulated {
        let sim = crate::SimulatedGpu::new(cost, o.channels, o.config.max_batch);
        // A simulated fault is the process dying mid-batch, as a crashed driver would take it.
        return Ok((Arc::new(sim), Box::new(|| std::process::abort())));
    }
    #[cfg(feature = "cuda")]
    {
        let cuda = Arc::new(crate::cuda::CudaBackend::new(&o.config).map_err(|e| e.to_string())?);
        let faulty = cuda.clone();
        let fault = Box::new(move || {
            let _ = faulty.inject_illegal_address();
        });
        Ok((cuda, fault))
    }
    #[cfg(not(feature = "cuda"))]
    Err(crate::GpuError::NotBuilt.to_string())
}

/// The worker's main: serves until the engine closes its sockets. Returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu-worker: {e}");
            return 2;
        }
    };
    let layout = Layout {
        max_batch: o.config.max_batch.max(1),
        max_keys: 256,
    };
    let mut channels = Vec::with_capacity(o.channels);
    for i in 0..o.channels {
        let fd = FIRST_FD + 2 * i as i32;
        // SAFETY: the engine placed channel i's socket and region at these descriptors (see
        // `ProcessBackend::spawn`); nothing else in this process owns them.
        let (sock, region) = unsafe {
            (
                UnixStream::from(OwnedFd::from_raw_fd(fd)),
                OwnedFd::from_raw_fd(fd + 1),
            )
        };
        match Shm::open(region, layout) {
            Ok(shm) => channels.push((sock, shm)),
            Err(e) => {
                eprintln!("gpu-worker: channel {i}: {e}");
                return 2;
            }
        }
    }
    let (backend, fault) = match device(&o) {
        Ok(d) => d,
        Err(why) => {
            for (sock, _) in &mut channels {
                let _ = Reply::Failed(why.clone()).write(sock);
            }
            return 1;
        }
    };
    let describe = backend.describe();
    for (sock, _) in &mut channels {
        if Reply::Ready(describe.clone()).write(sock).is_err() {
            return 1;
        }
    }
    let countdown = AtomicU64::new(o.fault_after.unwrap_or(u64::MAX));
    std::thread::scope(|s| {
        for (i, (sock, shm)) in channels.into_iter().enumerate() {
            let (backend, fault, countdown) = (&backend, &fault, &countdown);
            s.spawn(move || serve(i, sock, shm, &**backend, &**fault, countdown));
        }
    });
    0
}

/// One channel: runs each batch the engine sends until it closes the socket.
fn serve(
    index: usize,
    mut sock: UnixStream,
    mut shm: Shm,
    backend: &dyn BatchBackend,
    fault: &(dyn Fn() + Send + Sync),
    countdown: &AtomicU64,
) {
    let mut runner = match backend.open_stream(index) {
        Ok(r) => r,
        Err(e) => {
            let _ = Reply::Error(e.to_string()).write(&mut sock);
            std::process::exit(1);
        }
    };
    while let Ok(Some(run)) = Run::read(&mut sock) {
        let (half, keys, items) = (run.half as usize, run.keys as usize, run.items as usize);
        if !shm.layout().fits(half, keys, items) || ![32, 48, 64].contains(&half) {
            let _ = Reply::Error(format!("batch shape {run:?} out of range")).write(&mut sock);
            std::process::exit(1);
        }
        if countdown.fetch_sub(1, Ordering::SeqCst) == 1 {
            fault();
        }
        let result = (|| {
            let src = shm.staging(half, keys, items);
            let dst = runner.stage(half, keys, items)?;
            dst.keys.copy_from_slice(src.keys);
            dst.key_index.copy_from_slice(src.key_index);
            dst.input.copy_from_slice(src.input);
            // The engine keeps the deadline; this only bounds a batch the engine gave up on.
            let out = runner.run(Duration::from_secs(600))?;
            shm.output_mut(half, items).copy_from_slice(out);
            Ok::<(), crate::BackendError>(())
        })();
        match result {
            Ok(()) => {
                if Reply::Done.write(&mut sock).is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = Reply::Error(e.to_string()).write(&mut sock);
                // The device context is not to be trusted after an error: a new worker starts.
                std::process::exit(1);
            }
        }
    }
}
