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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use wire::{Reply, Run};

/// The program that serves as the worker, and its first arguments (for the gateway: its own
/// executable and `gpu-worker`). The engine appends the kernel settings and the descriptors of
/// the channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

/// How long a starting worker may take to say it is ready (an NVRTC build with an empty kernel
/// cache took 37 s on an H200).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A [`BatchBackend`] that runs batches in a worker process (module docs).
pub struct ProcessBackend {
    inner: Arc<Inner>,
}

/// What the backend and its runners share: how to start a worker, and the current one.
struct Inner {
    command: WorkerCommand,
    settings: Vec<String>,
    streams: usize,
    layout: Layout,
    describe: Mutex<String>,
    worker: Mutex<Option<Arc<Worker>>>,
    /// A kernel cache of the backend's own when none is configured (removed on drop), so that
    /// a worker started after a fault loads the kernel instead of building it again.
    own_cache: Option<PathBuf>,
    /// Test hook: the first worker faults on this batch (`--fault-after`).
    first_fault: Option<u64>,
    started: AtomicU64,
}

/// One running worker and its channels (taken by the runners while open).
struct Worker {
    /// `None` once handed to a reaper.
    child: Mutex<Option<Child>>,
    channels: Vec<Mutex<Option<Channel>>>,
    failed: AtomicBool,
}

struct Channel {
    sock: UnixStream,
    shm: Shm,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Worker {
    /// Kills the worker (once): a failed device context, a dead process or a hung batch. It
    /// does not wait: a process stuck in the driver may take long to go, so it is reaped on a
    /// thread of its own.
    fn fail(&self) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            if let Some(mut child) = lock(&self.child).take() {
                let _ = child.kill();
                let _ = std::thread::Builder::new()
                    .name("rampart-gpu-reap".into())
                    .spawn(move || child.wait());
            }
        }
    }

    /// Whether the worker is gone or failed (a worker that died while idle included).
    fn dead(&self) -> bool {
        if self.failed.load(Ordering::SeqCst) {
            return true;
        }
        let exited = lock(&self.child)
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
        if exited {
            self.fail();
        }
        exited
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the sockets ends a healthy worker; one still running a batch is killed.
        for ch in &self.channels {
            lock(ch).take();
        }
        let Some(mut child) = lock(&self.child).take() else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("rampart-gpu-reap".into())
            .spawn(move || {
                for _ in 0..100 {
                    if let Ok(Some(_)) = child.try_wait() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
                let _ = child.wait();
            });
    }
}

impl ProcessBackend {
    /// Starts a worker with `config`'s kernel settings and waits until it is ready (its kernel
    /// built or loaded, its streams open): the backend, or why the worker could not start.
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
        let mut config = config.clone();
        let own_cache = config.kernel_cache.is_none().then(|| {
            std::env::temp_dir().join(format!("rampart-gpu-kernels-{}", std::process::id()))
        });
        if own_cache.is_some() {
            config.kernel_cache = own_cache.clone();
        }
        let inner = Arc::new(Inner {
            settings: worker::settings_args(&config),
            command,
            streams: config.streams.max(2),
            layout: Layout {
                max_batch: config.max_batch.max(1),
                max_keys: 256,
            },
            describe: Mutex::new(String::new()),
            worker: Mutex::new(None),
            own_cache,
            first_fault: fault_after,
            started: AtomicU64::new(0),
        });
        inner.worker().map_err(GpuError::Worker)?;
        Ok(ProcessBackend { inner })
    }

    /// Workers started so far (1 until the first one fails).
    pub fn workers_started(&self) -> u64 {
        self.inner.started.load(Ordering::SeqCst)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(dir) = &self.own_cache {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Inner {
    /// The running worker, or a fresh one if there is none or it failed.
    fn worker(&self) -> Result<Arc<Worker>, String> {
        let mut slot = lock(&self.worker);
        if let Some(w) = slot.as_ref().filter(|w| !w.dead()) {
            return Ok(w.clone());
        }
        *slot = None;
        let w = Arc::new(self.spawn()?);
        *slot = Some(w.clone());
        Ok(w)
    }

    /// The running worker if there is a healthy one; never starts one.
    fn current(&self) -> Option<Arc<Worker>> {
        lock(&self.worker).as_ref().filter(|w| !w.dead()).cloned()
    }

    fn spawn(&self) -> Result<Worker, String> {
        let first = self.started.fetch_add(1, Ordering::SeqCst) == 0;
        let mut ours = Vec::with_capacity(self.streams);
        let mut theirs = Vec::with_capacity(self.streams);
        for _ in 0..self.streams {
            let (a, b) = UnixStream::pair().map_err(|e| format!("socket pair: {e}"))?;
            let shm = Shm::create(self.layout).map_err(|e| format!("shared memory: {e}"))?;
            ours.push((a, shm));
            theirs.push(b);
        }
        // The child's ends keep their numbers; only close-on-exec is cleared, in the child.
        let fds: Vec<i32> = theirs
            .iter()
            .zip(&ours)
            .flat_map(|(b, (_, shm))| [b.as_raw_fd(), shm.fd().as_raw_fd()])
            .collect();
        let list = fds.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
        let mut cmd = Command::new(&self.command.program);
        cmd.args(&self.command.args)
            .args(&self.settings)
            .arg("--fds")
            .arg(list);
        if let (true, Some(n)) = (first, self.first_fault) {
            cmd.arg("--fault-after").arg(n.to_string());
        }
        // SAFETY: runs in the child between fork and exec. It only calls fcntl
        // (async-signal-safe) on descriptors this process holds (the child's ends, still open
        // here until `spawn` returns) and reads `fds`, allocated before the fork; it neither
        // allocates nor moves descriptors, so std's own exec-error pipe is left alone.
        unsafe {
            cmd.pre_exec(move || {
                for &fd in &fds {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.command.program.display()))?;
        drop(theirs);
        let worker = Worker {
            child: Mutex::new(Some(child)),
            channels: ours
                .into_iter()
                .map(|(sock, shm)| Mutex::new(Some(Channel { sock, shm })))
                .collect(),
            failed: AtomicBool::new(false),
        };
        for ch in &worker.channels {
            let mut guard = lock(ch);
            let ch = guard.as_mut().expect("just made");
            let _ = ch.sock.set_read_timeout(Some(START_TIMEOUT));
            let why = match Reply::read(&mut ch.sock) {
                Ok(Reply::Ready(device)) => {
                    *lock(&self.describe) = device;
                    continue;
                }
                Ok(Reply::Failed(why)) => why,
                Ok(other) => format!("gpu worker said {other:?} at start"),
                Err(e) => format!("gpu worker did not start: {e}"),
            };
            drop(guard);
            worker.fail();
            return Err(why);
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
        format!("{} (worker process)", lock(&self.inner.describe))
    }

    fn streams(&self) -> usize {
        self.inner.streams
    }

    fn max_batch(&self) -> usize {
        self.inner.layout.max_batch
    }

    fn max_keys(&self) -> usize {
        self.inner.layout.max_keys
    }

    fn open_stream(&self, index: usize) -> Result<Box<dyn StreamRunner>, BackendError> {
        let worker = self.inner.worker().map_err(BackendError::Device)?;
        let channel = take_channel(&worker, index)?;
        Ok(Box::new(ProcessRunner {
            inner: self.inner.clone(),
            worker,
            index,
            channel: Some(channel),
            staged: None,
        }))
    }
}

fn take_channel(worker: &Worker, index: usize) -> Result<Channel, BackendError> {
    worker
        .channels
        .get(index)
        .and_then(|c| lock(c).take())
        .ok_or_else(|| BackendError::Device(format!("stream {index} is already open")))
}

/// One stream of a worker: stages into the shared region, asks the worker to run it.
struct ProcessRunner {
    inner: Arc<Inner>,
    worker: Arc<Worker>,
    index: usize,
    channel: Option<Channel>,
    staged: Option<Run>,
}

impl ProcessRunner {
    /// This runner's channel. A runner whose worker was replaced (another stream's batch
    /// failed and a probe started a new one) moves to the new worker's channel instead of
    /// failing a batch of its own.
    fn channel(&mut self) -> Result<&mut Channel, BackendError> {
        if self.worker.dead() {
            let fresh = self
                .inner
                .current()
                .ok_or_else(|| BackendError::Device("the gpu worker has stopped".into()))?;
            let channel = take_channel(&fresh, self.index)?;
            self.channel = Some(channel);
            self.worker = fresh;
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
        let ch = self
            .channel
            .as_mut()
            .ok_or_else(|| BackendError::Device("runner closed".into()))?;
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
                let why = format!("the gpu worker stopped answering: {e}");
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
            if !self.worker.dead() {
                if let Some(slot) = self.worker.channels.get(self.index) {
                    *lock(slot) = Some(ch);
                }
            }
        }
    }
}
