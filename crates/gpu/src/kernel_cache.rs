//! Built kernels kept on disk between starts: a cubin for the device's architecture, named by
//! a digest of everything that shapes it (source text, compile options, architecture). NVRTC
//! takes tens of seconds for the unrolled kernels, so without a cache every start of the
//! gateway waits that long before the GPU joins.
//!
//! A cache that cannot be read or written never stops the engine: the kernel is built as if
//! there were none, and the problem is logged.

use crate::error::GpuError;
use std::path::{Path, PathBuf};

/// The cache file for a kernel built from `material` (source text and options).
pub fn entry(dir: &Path, arch: (i32, i32), material: &[&str]) -> PathBuf {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for part in material {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part.as_bytes());
    }
    let digest = ctx.finish();
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    dir.join(format!("rsa-kernel-sm{}{}-{hex}.cubin", arch.0, arch.1))
}

/// The bytes at `path` when present; otherwise `build()`'s, written to `path` for the next
/// start (through a temporary file and a rename, so a reader never sees half a file).
pub fn load_or_build(
    path: &Path,
    build: impl FnOnce() -> Result<Vec<u8>, GpuError>,
) -> Result<Vec<u8>, GpuError> {
    match std::fs::read(path) {
        Ok(bytes) if !bytes.is_empty() => {
            tracing::info!(path = %path.display(), "gpu engine: kernel from the cache");
            return Ok(bytes);
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "gpu engine: kernel cache unreadable; building")
        }
    }
    let bytes = build()?;
    if let Err(e) = store(path, &bytes) {
        tracing::warn!(path = %path.display(), error = %e, "gpu engine: kernel not cached");
    }
    Ok(bytes)
}

/// Removes a cached kernel the driver refused (e.g. after a driver change).
pub fn forget(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), error = %e, "gpu engine: stale cached kernel not removed");
    }
}

fn store(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "rampart-kernel-cache-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_kernel_is_built_once_then_read_back_and_every_input_names_its_own_entry() {
        let dir = scratch("reuse");
        let path = entry(&dir, (9, 0), &["source", "-DRSA_WINDOW=5"]);
        let builds = Cell::new(0);
        let build = || {
            builds.set(builds.get() + 1);
            Ok(vec![0x7f, b'E', b'L', b'F'])
        };
        assert_eq!(load_or_build(&path, build).unwrap(), b"\x7fELF");
        assert_eq!(load_or_build(&path, build).unwrap(), b"\x7fELF");
        assert_eq!(builds.get(), 1, "the second start reads the cache");
        // Another source, option or architecture is another kernel.
        let others = [
            entry(&dir, (9, 0), &["source2", "-DRSA_WINDOW=5"]),
            entry(&dir, (9, 0), &["source", "-DRSA_WINDOW=4"]),
            entry(&dir, (8, 0), &["source", "-DRSA_WINDOW=5"]),
            entry(&dir, (9, 0), &["sourc", "e-DRSA_WINDOW=5"]),
        ];
        for other in &others {
            assert_ne!(other, &path);
        }
        forget(&path);
        load_or_build(&path, build).unwrap();
        assert_eq!(builds.get(), 2, "a forgotten kernel is built again");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cache_that_cannot_be_written_still_gives_the_kernel_and_build_errors_pass_through() {
        let dir = scratch("blocked");
        std::fs::create_dir_all(&dir).unwrap();
        // A file where the cache directory should be: nothing can be stored under it.
        let blocker = dir.join("not-a-dir");
        std::fs::write(&blocker, b"x").unwrap();
        let path = entry(&blocker, (9, 0), &["s"]);
        assert_eq!(
            load_or_build(&path, || Ok(vec![1, 2, 3])).unwrap(),
            [1, 2, 3]
        );
        assert!(!path.exists());
        let err = load_or_build(&path, || Err(GpuError::Compile("bad".into()))).unwrap_err();
        assert!(err.to_string().contains("bad"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
