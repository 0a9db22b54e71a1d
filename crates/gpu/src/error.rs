//! Errors of the GPU engine. None carries key material.

/// Why the GPU or a key could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    #[error("CUDA driver library (libcuda) not found")]
    NoDriver,
    #[error("NVRTC library (libnvrtc) not found")]
    NoNvrtc,
    #[error("no CUDA device")]
    NoDevice,
    #[error("built without the `cuda` feature")]
    NotBuilt,
    #[error("CUDA driver error: {0}")]
    Driver(String),
    #[error("kernel compilation failed: {0}")]
    Compile(String),
    #[error("not an RSA private key (PKCS#1 or PKCS#8 DER)")]
    NotRsa,
    #[error(transparent)]
    Key(#[from] crate::host_core::CoreKeyError),
    #[error("the key does not load as a private key: {0}")]
    KeyLoad(String),
    #[error("the GPU result did not match the CPU build of the core (self-test failed)")]
    SelfTest,
    #[error("gpu worker process: {0}")]
    Worker(String),
}
