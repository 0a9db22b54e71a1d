//! The `gpu` key engine: batched RSA-CRT private-key operations on a CUDA device.
//!
//! * [`host_core`]: the kernel's arithmetic core (`kernels/rsa_core.h`, portable C) built for
//!   the host, tested against BoringSSL; NVRTC compiles the same text for the device.
//! * [`GpuEngine`]: a [`keyengine::Engine`] that batches queued requests, pads and blinds them
//!   on the CPU, runs them on the device over several streams, verifies every result with the
//!   public key, and hands anything the device got wrong (or did not finish) back to the CPU.
//! * [`BatchBackend`]: the device seam, with the CUDA implementation (feature `cuda`: libcuda
//!   and NVRTC loaded at run time, nothing linked) and [`SimulatedGpu`] for tests.
//! * [`process`]: the device's work in a worker process that a device fault can take down
//!   and the engine starts again ([`process::ProcessBackend`], `rampart gpu-worker`).
//! * [`probe`] and [`bench_batch`]: for `rampart bench engine`.

mod backend;
mod batch_size;
mod bench;
mod cpu_pool;
#[cfg(feature = "cuda")]
pub mod cuda;
mod engine;
mod error;
pub mod host_core;
#[cfg(feature = "cuda")]
mod kernel_cache;
mod key;
mod padding;
pub mod process;

pub use backend::{
    BackendError, BatchBackend, CostModel, SimControl, SimulatedGpu, Staging, StreamRunner,
};
pub use bench::{bench_batch, bench_cpu_side, crossover, BatchBench};
pub use engine::{GpuConfig, GpuEngine, GpuStatus};
pub use error::GpuError;
pub use key::GpuKey;
use std::sync::Arc;

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub memory_bytes: usize,
    pub multiprocessors: i32,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (sm_{}{}, {} SMs, {} MiB)",
            self.name,
            self.compute_capability.0,
            self.compute_capability.1,
            self.multiprocessors,
            self.memory_bytes >> 20
        )
    }
}

/// Looks for a CUDA device (driver, NVRTC, device 0) without compiling anything: what was
/// found, or why there is none (for logs, metrics and `rampart bench engine`).
pub fn probe() -> Result<DeviceInfo, GpuError> {
    #[cfg(feature = "cuda")]
    return cuda::probe();
    #[cfg(not(feature = "cuda"))]
    Err(GpuError::NotBuilt)
}

/// Whether a CUDA driver, NVRTC and a device are there, without making a CUDA context.
pub fn device_present() -> Result<(), GpuError> {
    #[cfg(feature = "cuda")]
    return cuda::device_present();
    #[cfg(not(feature = "cuda"))]
    Err(GpuError::NotBuilt)
}

/// The CUDA backend for `config`, or why there is none.
pub fn cuda_backend(config: &GpuConfig) -> Result<Arc<dyn BatchBackend>, GpuError> {
    #[cfg(feature = "cuda")]
    return Ok(Arc::new(cuda::CudaBackend::new(config)?));
    #[cfg(not(feature = "cuda"))]
    {
        let _ = config;
        Err(GpuError::NotBuilt)
    }
}

#[cfg(test)]
pub(crate) mod testkeys {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    /// An RSA key of `bits` as PKCS#1 DER, generated once per size per test binary.
    pub fn rsa_der(bits: u32) -> Vec<u8> {
        static KEYS: OnceLock<Mutex<HashMap<u32, Vec<u8>>>> = OnceLock::new();
        let mut m = KEYS.get_or_init(Default::default).lock().unwrap();
        m.entry(bits)
            .or_insert_with(|| {
                boring::rsa::Rsa::generate(bits)
                    .unwrap()
                    .private_key_to_der()
                    .unwrap()
            })
            .clone()
    }
}
