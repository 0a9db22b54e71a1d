//! One stream's shared memory between the engine and its worker process: an anonymous memfd
//! both map, laid out as the staging buffers of one batch (key records, key indices, inputs)
//! and the outputs. The wire protocol hands the region back and forth: the engine writes the
//! inputs and sends `run`; the worker reads them, writes the outputs and answers; only then
//! does the engine read. Neither side touches it while the other owns it.

use crate::host_core::KeyLayout;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The largest prime the regions are sized for (RSA-4096: 64 limbs).
const MAX_HALF: usize = 64;

/// Word offsets of the parts of a region for `max_batch` requests and `max_keys` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub max_batch: usize,
    pub max_keys: usize,
}

impl Layout {
    fn key_words(self) -> usize {
        self.max_keys * KeyLayout::words(MAX_HALF)
    }
    fn io_words(self) -> usize {
        self.max_batch * 2 * MAX_HALF
    }
    /// Offsets of keys, key indices, inputs, outputs, and the total, in words.
    fn offsets(self) -> [usize; 5] {
        let keys = 0;
        let index = keys + self.key_words();
        let input = index + self.max_batch;
        let output = input + self.io_words();
        [keys, index, input, output, output + self.io_words()]
    }
    fn bytes(self) -> usize {
        self.offsets()[4] * 4
    }
    /// Whether a batch of `items` requests over `keys` keys of primes of `half` limbs fits.
    pub fn fits(self, half: usize, keys: usize, items: usize) -> bool {
        half <= MAX_HALF && keys <= self.max_keys && items <= self.max_batch
    }
}

/// A mapped region. Dropping it unmaps it (the memfd closes with its last descriptor).
pub(crate) struct Shm {
    fd: OwnedFd,
    base: *mut u32,
    layout: Layout,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through &self/&mut self.
unsafe impl Send for Shm {}

impl Shm {
    /// A new zero-filled region for `layout` (the engine's side).
    pub fn create(layout: Layout) -> std::io::Result<Shm> {
        // SAFETY: memfd_create takes a NUL-terminated name and flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"rampart-gpu-batch".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor this process owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on a descriptor we own; the result is checked.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), layout.bytes() as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The size is fixed for good: a worker that shrank the region would make this process's
        // next access to it fault (SIGBUS).
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: adds seals to a memfd we own, made with MFD_ALLOW_SEALING; checked.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Self::map(fd, layout)
    }

    /// Maps a region the engine made and passed down as `fd` (the worker's side).
    pub fn open(fd: OwnedFd, layout: Layout) -> std::io::Result<Shm> {
        // SAFETY: fstat on a descriptor we own, into a zeroed struct; the result is checked.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if (st.st_size as usize) < layout.bytes() {
            return Err(std::io::Error::other(
                "shared region smaller than its layout",
            ));
        }
        Self::map(fd, layout)
    }

    fn map(fd: OwnedFd, layout: Layout) -> std::io::Result<Shm> {
        // SAFETY: a fresh shared mapping of `bytes` of a descriptor at least that long; the
        // result is checked before use.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.bytes(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // Key records (private) stay out of core dumps; best effort.
        // SAFETY: advice on the mapping just made, its own length.
        unsafe { libc::madvise(base, layout.bytes(), libc::MADV_DONTDUMP) };
        Ok(Shm {
            fd,
            base: base.cast(),
            layout,
        })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn part(&self, i: usize, len: usize) -> *mut u32 {
        let o = self.layout.offsets();
        assert!(o[i] + len <= o[i + 1], "part {i} overruns its room");
        // SAFETY: o[i] + len is within the mapping (asserted against the next offset).
        unsafe { self.base.add(o[i]) }
    }

    /// The staging parts for a batch (the layout must fit it): keys, key indices, inputs.
    pub fn staging(&mut self, half: usize, keys: usize, items: usize) -> crate::Staging<'_> {
        let (kw, iw) = (keys * KeyLayout::words(half), items * 2 * half);
        let (k, x, i) = (self.part(0, kw), self.part(1, items), self.part(2, iw));
        // SAFETY: three disjoint in-bounds parts of our mapping (offsets strictly increase),
        // borrowed mutably with `self`; the other process does not touch the region while we
        // own it (the wire protocol).
        unsafe {
            crate::Staging {
                keys: std::slice::from_raw_parts_mut(k, kw),
                key_index: std::slice::from_raw_parts_mut(x, items),
                input: std::slice::from_raw_parts_mut(i, iw),
            }
        }
    }

    /// The outputs of `items` requests of `half` limbs.
    pub fn output(&self, half: usize, items: usize) -> &[u32] {
        let len = items * 2 * half;
        // SAFETY: an in-bounds part of our mapping, borrowed with `self` (as above).
        unsafe { std::slice::from_raw_parts(self.part(3, len), len) }
    }

    /// The outputs, for the worker to write.
    pub fn output_mut(&mut self, half: usize, items: usize) -> &mut [u32] {
        let len = items * 2 * half;
        // SAFETY: as `output`, borrowed mutably with `self`.
        unsafe { std::slice::from_raw_parts_mut(self.part(3, len), len) }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let len = self.layout.bytes();
        // SAFETY: the key records are private: wipe them before unmapping (our mapping, its
        // own key part), then unmap what `map` mapped.
        unsafe {
            std::ptr::write_bytes(self.base, 0, self.layout.offsets()[1]);
            libc::munmap(self.base.cast(), len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_mappings_see_the_same_words_and_parts_do_not_overlap() {
        let layout = Layout {
            max_batch: 4,
            max_keys: 2,
        };
        let mut a = Shm::create(layout).unwrap();
        let fd = a.fd().try_clone().unwrap();
        let mut b = Shm::open(fd, layout).unwrap();
        let st = a.staging(32, 2, 4);
        st.keys.fill(1);
        st.key_index.fill(2);
        st.input.fill(3);
        b.output_mut(32, 4).fill(4);
        let seen = b.staging(32, 2, 4);
        assert!(seen.keys.iter().all(|&w| w == 1));
        assert!(seen.key_index.iter().all(|&w| w == 2));
        assert!(seen.input.iter().all(|&w| w == 3));
        assert!(a.output(32, 4).iter().all(|&w| w == 4));
        assert!(layout.fits(64, 2, 4) && !layout.fits(64, 3, 4) && !layout.fits(64, 2, 5));
    }
}
