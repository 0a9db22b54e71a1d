//! The seam between the engine's batching logic and the device: a [`BatchBackend`] opens one
//! [`StreamRunner`] per CUDA stream; a runner stages a batch into its (pinned) host buffers and
//! runs it: copy in, one launch, copy out. The engine runs one batching thread per runner, so
//! with two or more streams one batch's copies and compute overlap another's CPU-side steps and
//! copies.
//!
//! [`SimulatedGpu`] is a backend with a cost model (launch latency + per-item time, with the
//! device's compute shared by all streams) that computes real results with the host build of the
//! kernel (its CUDA entry point compiled for the host, [`crate::host_core::emulate_launch_shaped`]) and can inject errors, deadline overruns and corrupted results. It drives the
//! engine's tests and the scheduler tests in CI, where no GPU exists.

use crate::host_core::{emulate_launch_shaped, KernelShape, KeyLayout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why a batch did not run to completion. Results of a failed batch are never used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("device error: {0}")]
    Device(String),
    #[error("batch not finished within its deadline ({0:?})")]
    Deadline(Duration),
}

/// Host buffers for one batch, filled by the engine before [`StreamRunner::run`].
pub struct Staging<'a> {
    /// `keys` key records of `KeyLayout::words(half)` words each.
    pub keys: &'a mut [u32],
    /// Per request: which key record it uses.
    pub key_index: &'a mut [u32],
    /// Per request: the blinded input, `2·half` limbs.
    pub input: &'a mut [u32],
}

/// A device (or a simulation of one) that runs batches of RSA-CRT operations.
pub trait BatchBackend: Send + Sync + 'static {
    /// For logs and metrics, e.g. the device name.
    fn describe(&self) -> String;
    /// Streams (runners) the engine should open: batches in flight at once.
    fn streams(&self) -> usize;
    /// Most requests one launch takes.
    fn max_batch(&self) -> usize;
    /// Most distinct keys one launch takes.
    fn max_keys(&self) -> usize {
        256
    }
    /// Opens runner `index` (its stream and buffers).
    fn open_stream(&self, index: usize) -> Result<Box<dyn StreamRunner>, BackendError>;
}

/// One stream with its buffers. Used by one thread at a time.
pub trait StreamRunner: Send {
    /// Host buffers for a batch of `items` requests over `keys` key records, primes of `half`
    /// limbs. `items ≤ max_batch`, `keys ≤ max_keys`.
    fn stage(
        &mut self,
        half: usize,
        keys: usize,
        items: usize,
    ) -> Result<Staging<'_>, BackendError>;
    /// Runs the staged batch, waiting at most `deadline`; returns the outputs (`items × 2·half`
    /// limbs, request order). After an error the runner must be dropped, not reused.
    fn run(&mut self, deadline: Duration) -> Result<&[u32], BackendError>;
}

/// Launch latency and per-request cost of the simulated device.
#[derive(Debug, Clone, Copy)]
pub struct CostModel {
    /// Fixed cost of one batch (launch, copies, synchronization); overlaps across streams.
    pub launch: Duration,
    /// Device time per request; the device runs one batch's compute at a time.
    pub per_item: Duration,
}

impl CostModel {
    /// Modelled time of a batch of `items` on an idle device.
    pub fn batch_time(&self, items: usize) -> Duration {
        self.launch + self.per_item * items as u32
    }
}

/// Fault injection and counters for [`SimulatedGpu`]; shared with the test that made it.
#[derive(Debug, Default)]
pub struct SimControl {
    /// The next this-many batches fail with a device error.
    pub fail_batches: AtomicUsize,
    /// The next this-many batches overrun their deadline.
    pub slow_batches: AtomicUsize,
    /// The next this-many batches return one corrupted result (a silent device fault).
    pub corrupt_batches: AtomicUsize,
    /// While set, opening a stream fails (a device that stays broken).
    pub broken: AtomicBool,
    /// Batches run to completion, and the requests in them.
    pub batches: AtomicUsize,
    pub items: AtomicUsize,
    /// Largest batch seen.
    pub max_items: AtomicUsize,
}

fn take_one(c: &AtomicUsize) -> bool {
    c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

/// A simulated GPU (see the module docs).
pub struct SimulatedGpu {
    pub cost: CostModel,
    streams: usize,
    max_batch: usize,
    control: Arc<SimControl>,
    /// The device's compute: one batch at a time.
    device: Arc<Mutex<()>>,
    /// The kernel whose host build computes the results.
    kernel: KernelShape,
}

/// The shape the simulated device runs unless told otherwise: the 32-bit kernel with two
/// threads per request (fast to emulate).
const SIMULATED_KERNEL: KernelShape = KernelShape {
    window: crate::host_core::DEFAULT_WINDOW,
    threads_per_request: 2,
    table_shared: false,
    carry_chains: false,
    fp64: false,
};

impl SimulatedGpu {
    pub fn new(cost: CostModel, streams: usize, max_batch: usize) -> Self {
        SimulatedGpu {
            cost,
            streams: streams.max(1),
            max_batch: max_batch.max(1),
            control: Arc::default(),
            device: Arc::default(),
            kernel: SIMULATED_KERNEL,
        }
    }

    /// Computes results with the host build of `kernel` (one the host emulation is built for,
    /// in blocks of 128 threads) instead of the default shape.
    pub fn with_kernel(mut self, kernel: KernelShape) -> Self {
        self.kernel = kernel;
        self
    }

    pub fn control(&self) -> Arc<SimControl> {
        self.control.clone()
    }
}

impl BatchBackend for SimulatedGpu {
    fn describe(&self) -> String {
        format!(
            "simulated GPU (launch {:?}, {:?}/request)",
            self.cost.launch, self.cost.per_item
        )
    }

    fn streams(&self) -> usize {
        self.streams
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn open_stream(&self, _index: usize) -> Result<Box<dyn StreamRunner>, BackendError> {
        if self.control.broken.load(Ordering::SeqCst) {
            return Err(BackendError::Device("simulated device is broken".into()));
        }
        Ok(Box::new(SimRunner {
            cost: self.cost,
            kernel: self.kernel,
            control: self.control.clone(),
            device: self.device.clone(),
            half: 0,
            items: 0,
            keys: Vec::new(),
            key_index: Vec::new(),
            input: Vec::new(),
            output: Vec::new(),
        }))
    }
}

struct SimRunner {
    cost: CostModel,
    kernel: KernelShape,
    control: Arc<SimControl>,
    device: Arc<Mutex<()>>,
    half: usize,
    items: usize,
    keys: Vec<u32>,
    key_index: Vec<u32>,
    input: Vec<u32>,
    output: Vec<u32>,
}

impl StreamRunner for SimRunner {
    fn stage(
        &mut self,
        half: usize,
        keys: usize,
        items: usize,
    ) -> Result<Staging<'_>, BackendError> {
        self.half = half;
        self.items = items;
        self.keys.resize(keys * KeyLayout::words(half), 0);
        self.key_index.resize(items, 0);
        self.input.resize(items * 2 * half, 0);
        Ok(Staging {
            keys: &mut self.keys,
            key_index: &mut self.key_index,
            input: &mut self.input,
        })
    }

    fn run(&mut self, deadline: Duration) -> Result<&[u32], BackendError> {
        let start = Instant::now();
        if take_one(&self.control.fail_batches) {
            return Err(BackendError::Device("simulated launch failure".into()));
        }
        let mut modelled = self.cost.batch_time(self.items);
        if take_one(&self.control.slow_batches) {
            modelled += deadline * 2;
        }
        // Launch latency overlaps with other streams; compute holds the device.
        std::thread::sleep(self.cost.launch.min(deadline));
        let (half, items) = (self.half, self.items);
        {
            let _device = self.device.lock().unwrap_or_else(|e| e.into_inner());
            self.output.resize(items * 2 * half, 0);
            // The kernel's entry point itself (each block's threads at once), on the host.
            emulate_launch_shaped(
                self.kernel,
                half,
                128,
                &self.keys,
                &self.key_index,
                &self.input,
                &mut self.output,
            );
            let remaining = modelled.saturating_sub(start.elapsed());
            let budget = deadline.saturating_sub(start.elapsed());
            std::thread::sleep(remaining.min(budget));
        }
        if modelled > deadline {
            return Err(BackendError::Deadline(deadline));
        }
        if items > 0 && take_one(&self.control.corrupt_batches) {
            self.output[items / 2 * 2 * half + 1] ^= 0x10;
        }
        self.control.batches.fetch_add(1, Ordering::SeqCst);
        self.control.items.fetch_add(items, Ordering::SeqCst);
        self.control.max_items.fetch_max(items, Ordering::SeqCst);
        Ok(&self.output[..items * 2 * half])
    }
}
