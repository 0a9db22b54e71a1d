//! The worker process's side (`rampart gpu-worker`): builds the CUDA backend from the settings
//! on its command line, opens its streams, says `Ready` on every channel, then serves each
//! channel on a thread of its own: copy the staged batch from the shared region into its
//! stream's buffers, run it, copy the outputs back, answer. On a device error it answers
//! `Error` and exits (the context is lost for the process); when the engine closes the sockets,
//! or the engine's process is gone, it exits. It ignores SIGINT, SIGTERM and SIGHUP: those are
//! for the gateway, which keeps signing through a drain or a reload.

use super::shm::{Layout, Shm};
use super::wire::{Reply, Run};
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
        "--fp64".into(),
        u8::from(config.fp64).to_string(),
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
    /// Per channel: its socket's and its shared region's descriptors.
    fds: Vec<(i32, i32)>,
    /// `--simulated LAUNCH_US:PER_ITEM_NS`: the simulated device instead of CUDA (tests).
    simulated: Option<crate::CostModel>,
    fault_after: Option<u64>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        config: crate::GpuConfig::default(),
        fds: Vec::new(),
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
            "--fp64" => o.config.fp64 = num(flag)? != 0,
            "--kernel-cache" => o.config.kernel_cache = Some(value.into()),
            "--fds" => {
                let fds: Vec<i32> = value
                    .split(',')
                    .map(|f| f.parse::<i32>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("--fds: descriptors, got {value:?}"))?;
                if fds.is_empty() || !fds.len().is_multiple_of(2) {
                    return Err(format!(
                        "--fds: a socket and a region per channel, got {value:?}"
                    ));
                }
                o.fds = fds.chunks(2).map(|p| (p[0], p[1])).collect();
            }
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
    if o.fds.is_empty() {
        return Err("--fds: at least one channel is expected".into());
    }
    o.config.streams = o.fds.len();
    Ok(o)
}

/// The backend and what makes it fault on demand (the `--fault-after` hook).
type Device = (Arc<dyn BatchBackend>, Box<dyn Fn() + Send + Sync>);

fn device(o: &Options) -> Result<Device, String> {
    if let Some(cost) = o.simulated {
        let sim = crate::SimulatedGpu::new(cost, o.fds.len(), o.config.max_batch);
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
    let mut channels = Vec::with_capacity(o.fds.len());
    for (i, &(sock, region)) in o.fds.iter().enumerate() {
        match (owned(sock, libc::S_IFSOCK), owned(region, libc::S_IFREG)) {
            (Some(sock), Some(region)) => match Shm::open(region, layout) {
                Ok(shm) => channels.push((UnixStream::from(sock), shm)),
                Err(e) => {
                    eprintln!("gpu-worker: channel {i}: {e}");
                    return 2;
                }
            },
            _ => {
                eprintln!("gpu-worker: channel {i}: descriptors {sock} and {region} are not a socket and a shared region");
                return 2;
            }
        }
    }
    ignore_gateway_signals();
    watch_parent();
    let (backend, fault) = match device(&o) {
        Ok(d) => d,
        Err(why) => {
            for (sock, _) in &mut channels {
                let _ = Reply::Failed(why.clone()).write(sock);
            }
            return 1;
        }
    };
    // Every stream opened (its device buffers allocated) before saying ready.
    let mut runners = Vec::with_capacity(channels.len());
    for i in 0..channels.len() {
        match backend.open_stream(i) {
            Ok(r) => runners.push(r),
            Err(e) => {
                for (sock, _) in &mut channels {
                    let _ = Reply::Failed(format!("opening stream {i}: {e}")).write(sock);
                }
                return 1;
            }
        }
    }
    let describe = backend.describe();
    for (sock, _) in &mut channels {
        if Reply::Ready(describe.clone()).write(sock).is_err() {
            return 1;
        }
    }
    let countdown = AtomicU64::new(o.fault_after.unwrap_or(u64::MAX));
    std::thread::scope(|s| {
        for ((sock, shm), runner) in channels.into_iter().zip(runners) {
            let (fault, countdown) = (&fault, &countdown);
            s.spawn(move || serve(sock, shm, runner, &**fault, countdown));
        }
    });
    0
}

/// `fd` as an owned descriptor if it is open and of file type `kind` (checked before this
/// process takes ownership of a number it was given).
fn owned(fd: i32, kind: libc::mode_t) -> Option<OwnedFd> {
    // SAFETY: fstat on a descriptor number into a zeroed struct; a closed or foreign number
    // fails or shows another type, and nothing is taken over then.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if fd < 3 || unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != kind {
        return None;
    }
    // SAFETY: the engine passed this descriptor down for this process to own (it is open and of
    // the expected type); nothing else here uses the number.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// SIGINT, SIGTERM and SIGHUP are the gateway's (a terminal's Ctrl-C reaches the whole process
/// group): the worker ends when the gateway closes its sockets.
fn ignore_gateway_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: setting a signal's disposition to "ignore" installs no handler code.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Exits once the process that started this one is gone (this one re-parented), even while a
/// batch is running and no socket is read.
fn watch_parent() {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let _ = std::thread::Builder::new()
        .name("gpu-worker-parent".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            // SAFETY: as above.
            if unsafe { libc::getppid() } != parent {
                std::process::exit(3);
            }
        });
}

/// One channel: runs each batch the engine sends until it closes the socket.
fn serve(
    mut sock: UnixStream,
    mut shm: Shm,
    mut runner: Box<dyn crate::StreamRunner>,
    fault: &(dyn Fn() + Send + Sync),
    countdown: &AtomicU64,
) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn settings_round_trip_and_bad_arguments_are_refused() {
        let config = crate::GpuConfig {
            max_batch: 1024,
            window: 5,
            kernel_cache: Some("/tmp/k".into()),
            ..crate::GpuConfig::default()
        };
        let mut args = settings_args(&config);
        args.extend(["--fds".into(), "7,8,9,10".into()]);
        let o = parse(&args).unwrap();
        assert_eq!(o.fds, vec![(7, 8), (9, 10)]);
        assert_eq!(o.config.streams, 2);
        assert_eq!(o.config.max_batch, 1024);
        assert_eq!(o.config.window, 5);
        assert_eq!(o.config.kernel_cache, config.kernel_cache);
        for bad in [
            &["--fds", "7"][..],
            &["--fds", "a,b"],
            &["--window"],
            &["--nope", "1"],
            &[],
        ] {
            let bad: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_open_descriptors_of_the_expected_kind_are_taken() {
        let (a, _b) = UnixStream::pair().unwrap();
        let file = tempfile_fd();
        assert!(owned(0, libc::S_IFSOCK).is_none(), "stdin is never taken");
        assert!(
            owned(file.as_raw_fd(), libc::S_IFSOCK).is_none(),
            "a file is not a socket"
        );
        assert!(owned(1 << 20, libc::S_IFSOCK).is_none(), "a closed number");
        let raw = a.as_raw_fd();
        std::mem::forget(a); // `owned` takes it over
        assert!(owned(raw, libc::S_IFSOCK).is_some());
    }

    fn tempfile_fd() -> std::fs::File {
        std::fs::File::open("/proc/self/stat").unwrap()
    }
}
