//! Why a signature was not produced.

use crate::algorithm::SignatureAlgorithm;
use crate::key_id::KeyId;

/// Why a signature was not produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignError {
    #[error("key {0} not found")]
    KeyNotFound(KeyId),
    #[error("algorithm {0} does not match the key")]
    UnsupportedAlgorithm(SignatureAlgorithm),
    #[error("digest has {got} bytes, expected {expected}")]
    BadDigest { expected: usize, got: usize },
    #[error("engine {0} overloaded: queue full")]
    Overloaded(&'static str),
    #[error("engine {0} stopped")]
    Stopped(&'static str),
    #[error("engine {0} unavailable: {1}")]
    Unavailable(&'static str, String),
    #[error("signature from engine {0} failed verification (fault detected)")]
    FaultDetected(&'static str),
    #[error("crypto failure: {0}")]
    Crypto(String),
}

impl SignError {
    /// A short stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            SignError::KeyNotFound(_) => "key_not_found",
            SignError::UnsupportedAlgorithm(_) => "unsupported_algorithm",
            SignError::BadDigest { .. } => "bad_digest",
            SignError::Overloaded(_) => "overloaded",
            SignError::Stopped(_) => "stopped",
            SignError::Unavailable(..) => "unavailable",
            SignError::FaultDetected(_) => "fault",
            SignError::Crypto(_) => "crypto",
        }
    }
}
