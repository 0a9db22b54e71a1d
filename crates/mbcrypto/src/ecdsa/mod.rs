//! ECDSA P-256 signing from a pool of precomputed nonces.
