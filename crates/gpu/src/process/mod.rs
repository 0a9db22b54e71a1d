//! The device's work in a worker process (`rampart gpu-worker`), so that a device fault costs a
//! process, not the gateway's CUDA for good: on driver 580 an illegal address leaves the CUDA
//! context failed for the life of the process (a primary-context reset did not help; measured
//! on an H100, docs/benchmarks-history.md). [`ProcessBackend`] is a [`BatchBackend`] whose
//! runners stage each batch in memory shared with the worker ([`shm`]) and ask it to run it
//! ([`wire`]); the worker runs the CUDA backend. When a batch fails, or the worker dies or
//! overruns a deadline, the worker is killed; the engine re-runs the batch on the CPU as for
//! any device error, and its next probe opens a stream, which starts a fresh worker (the kernel
//! cache makes that about half a second).

pub(crate) mod shm;
pub(crate) mod wire;
pub mod worker;

use crate::backend::{BackendError, BatchBackend, Staging, StreamRunner};
use crate::error::GpuError;
use shm::{Layout, Shm};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wire::{Reply, Run};

/// The program that serves as the worker, and its first arguments (for the gateway: its own
/// executable and `gpu-worker`). The engine appends the kernel settings and the channel count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// How long a starting worker may take to say it is ready (an NVRTC build with an empty kernel
/// cache took 37 s on an H200).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The worker's channels start at this descriptor: channel i's socket at `FIRST_FD + 2i`, its
/// shared region at `FIRST_FD + 2i + 1`.
pub(crate) const FIRST_FD: i32 = 3;

/// A [`BatchBackend`] that runs batches in a worker process (module docs).
pub struct ProcessBackend {
    command: WorkerCommand,
    settings: Vec<String>,
    streams: usize,
    layout: Layout,
    describe: Mutex<String>,
    worker: Mutex<Option<Arc<Worker>>>,
    /// Test hook: the first worker faults on this batch (`--fault-after`).
    first_fault: Option<u64>,
    started: AtomicU64,
}

/// One running worker and its channels (taken by the runners while open).
struct Worker {
    child: Mutex<Child>,
    channels: Vec<Mutex<Option<Channel>>>,
    failed: AtomicBool,
}

struct Channel {
    sock: UnixStream,
    shm: Shm,
}

impl Worker {
    /// Kills the worker (once): a failed device context, a dead process or a hung batch.
    fn fail(&self) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the sockets ends a healthy worker; a stuck one is killed.
        for ch in &self.channels {
            ch.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        for _ in 0..50 {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl ProcessBackend {
    /// Starts a worker with `config`'s kernel settings and waits until it is ready (its kernel
    /// built or loaded): the backend, or why the worker could not start.
    pub fn start(command: WorkerCommand, config: &crate::GpuConfig) -> Result<Self, GpuError> {
        Self::start_with_fault(command, config, None)
    }

    /// [`ProcessBackend::start`] whose first worker faults on batch `fault_after` (a test hook:
    /// an illegal address on a device, an abort in the simulation). Later workers do not.
    #[doc(hidden)]
    pub fn start_with_fault(
        command: WorkerCommand,
        config: &crate::GpuConfig,
        fault_after: Option<u64>,
    ) -> Result<Self, GpuError> {
        let backend = ProcessBackend {
            settings: worker::settings_args(config),
            command,
            streams: config.streams.max(2),
            layout: Layout {
                max_batch: config.max_batch.max(1),
                max_keys: 256,
            },
            describe: Mutex::new(String::new()),
            worker: Mutex::new(None),
            first_fault: fault_after,
            started: AtomicU64::new(0),
        };
        backend.worker().map_err(GpuError::Worker)?;
        Ok(backend)
    }

    /// Workers started so far (1 until the first one fails).
    pub fn workers_started(&self) -> u64 {
        self.started.load(Ordering::SeqCst)
    }

    /// The running worker, or a fresh one if there is none or it failed.
    fn worker(&self) -> Result<Arc<Worker>, String> {
        let mut slot = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = slot.as_ref().filter(|w| !w.failed.load(Ordering::SeqCst)) {
            return Ok(w.clone());
        }
        *slot = None;
        let w = Arc::new(self.spawn()?);
        *slot = Some(w.clone());
        Ok(w)
    }

    fn spawn(&self) -> Result<Worker, String> {
        let first = self.started.fetch_add(1, Ordering::SeqCst) == 0;
        let mut ours = Vec::with_capacity(self.streams);
        let mut theirs = Vec::with_capacity(2 * self.streams);
        for _ in 0..self.streams {
            let (a, b) = UnixStream::pair().map_err(|e| format!("socket pair: {e}"))?;
            let shm = Shm::create(self.layout).map_err(|e| format!("shared memory: {e}"))?;
            theirs.push(b.as_raw_fd());
            theirs.push(shm.fd().as_raw_fd());
            ours.push((a, shm, b));
        }
        let mut cmd = Command::new(&self.command.program);
        cmd.args(&self.command.args)
            .args(&self.settings)
            .arg("--channels")
            .arg(self.streams.to_string());
        if let (true, Some(n)) = (first, self.first_fault) {
            cmd.arg("--fault-after").arg(n.to_string());
        }
        let fds = theirs.clone();
        // SAFETY: runs in the child between fork and exec, calling only fcntl and dup2
        // (async-signal-safe) on descriptors this process holds: each is first moved above
        // the target range, then placed at FIRST_FD + i without close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                let mut high = Vec::with_capacity(fds.len());
                for &fd in &fds {
                    let h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100);
                    if h < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    high.push(h);
                }
                for (i, &h) in high.iter().enumerate() {
                    if libc::dup2(h, FIRST_FD + i as i32) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.command.program.display()))?;
        let worker = Worker {
            child: Mutex::new(child),
            channels: Vec::with_capacity(self.streams),
            failed: AtomicBool::new(false),
        };
        let mut worker = worker;
        for (sock, shm, theirs) in ours {
            drop(theirs);
            worker
                .channels
                .push(Mutex::new(Some(Channel { sock, shm })));
        }
        for ch in &worker.channels {
            let mut guard = ch.lock().unwrap_or_else(|e| e.into_inner());
            let ch = guard.as_mut().expect("just made");
            let _ = ch.sock.set_read_timeout(Some(START_TIMEOUT));
            match Reply::read(&mut ch.sock) {
                Ok(Reply::Ready(device)) => {
                    *self.describe.lock().unwrap_or_else(|e| e.into_inner()) = device;
                }
                Ok(Reply::Failed(why)) => {
                    drop(guard);
                    worker.fail();
                    return Err(why);
                }
                Ok(other) => {
                    drop(guard);
                    worker.fail();
                    return Err(format!("gpu worker said {other:?} at start"));
                }
                Err(e) => {
                    drop(guard);
                    worker.fail();
                    return Err(format!("gpu worker did not start: {e}"));
                }
            }
        }
        tracing::info!(
            workers = self.started.load(Ordering::SeqCst),
            "gpu engine: worker process ready"
        );
        Ok(worker)
    }
}

impl BatchBackend for ProcessBackend {
    fn describe(&self) -> String {
        format!(
            "{} (worker process)",
            self.describe.lock().unwrap_or_else(|e| e.into_inner())
        )
    }

    fn streams(&self) -> usize {
        self.streams
    }

    fn max_batch(&self) -> usize {
        self.layout.max_batch
    }

    fn max_keys(&self) -> usize {
        self.layout.max_keys
    }

    fn open_stream(&self, index: usize) -> Result<Box<dyn StreamRunner>, BackendError> {
        let worker = self.worker().map_err(BackendError::Device)?;
        let channel = worker
            .channels
            .get(index)
            .and_then(|c| c.lock().unwrap_or_else(|e| e.into_inner()).take())
            .ok_or_else(|| BackendError::Device(format!("stream {index} is already open")))?;
        Ok(Box::new(ProcessRunner {
            worker,
            index,
            channel: Some(channel),
            staged: None,
        }))
    }
}

/// One stream of a worker: stages into the shared region, asks the worker to run it.
struct ProcessRunner {
    worker: Arc<Worker>,
    index: usize,
    channel: Option<Channel>,
    staged: Option<Run>,
}

impl ProcessRunner {
    fn channel(&mut self) -> Result<&mut Channel, BackendError> {
        if self.worker.failed.load(Ordering::SeqCst) {
            return Err(BackendError::Device("the gpu worker has stopped".into()));
        }
        self.channel
            .as_mut()
            .ok_or_else(|| BackendError::Device("runner closed".into()))
    }

    /// The worker failed this batch: it is killed, and so is this runner's channel.
    fn failed(&mut self, err: BackendError) -> BackendError {
        self.channel = None;
        self.worker.fail();
        err
    }
}

impl StreamRunner for ProcessRunner {
    fn stage(
        &mut self,
        half: usize,
        keys: usize,
        items: usize,
    ) -> Result<Staging<'_>, BackendError> {
        let ch = self.channel()?;
        if !ch.shm.layout().fits(half, keys, items) {
            return Err(BackendError::Device(
                "batch larger than the runner's buffers".into(),
            ));
        }
        self.staged = Some(Run {
            half: half as u32,
            keys: keys as u32,
            items: items as u32,
        });
        let ch = self.channel.as_mut().expect("checked above");
        Ok(ch.shm.staging(half, keys, items))
    }

    fn run(&mut self, deadline: Duration) -> Result<&[u32], BackendError> {
        let run = self
            .staged
            .take()
            .ok_or_else(|| BackendError::Device("nothing staged".into()))?;
        let ch = self.channel()?;
        let sent = ch
            .sock
            .set_read_timeout(Some(deadline.max(Duration::from_millis(1))));
        let reply = sent
            .and_then(|()| run.write(&mut ch.sock))
            .and_then(|()| Reply::read(&mut ch.sock));
        match reply {
            Ok(Reply::Done) => {}
            Ok(Reply::Error(why)) => return Err(self.failed(BackendError::Device(why))),
            Ok(other) => {
                let why = format!("gpu worker answered {other:?}");
                return Err(self.failed(BackendError::Device(why)));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(self.failed(BackendError::Deadline(deadline)));
            }
            Err(e) => {
                let status = {
                    let mut child = self.worker.child.lock().unwrap_or_else(|e| e.into_inner());
                    child.try_wait().ok().flatten()
                };
                let why = match status {
                    Some(s) => format!("the gpu worker exited ({s})"),
                    None => format!("the gpu worker stopped answering: {e}"),
                };
                return Err(self.failed(BackendError::Device(why)));
            }
        }
        let ch = self.channel.as_ref().expect("answered on it");
        Ok(ch.shm.output(run.half as usize, run.items as usize))
    }
}

impl Drop for ProcessRunner {
    fn drop(&mut self) {
        // A runner closed with its worker healthy gives its channel back for the next open.
        if let Some(ch) = self.channel.take() {
            if !self.worker.failed.load(Ordering::SeqCst) {
                if let Some(slot) = self.worker.channels.get(self.index) {
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(ch);
                }
            }
        }
    }
}
