//! The `gpu` key engine (work in progress).
pub mod host_core;
