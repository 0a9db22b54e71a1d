//! The CUDA backend: libcuda and NVRTC are loaded at run time (`cudarc` with dynamic loading),
//! the kernel (`kernels/rsa_core.h` + `kernels/rsa_kernel.cu`) is compiled by NVRTC for the
//! device found. Each runner owns a CUDA stream, pinned host buffers and device buffers sized
//! for the largest batch; a batch is copy-in, one launch, copy-out on its stream, and the
//! runner's thread polls an event until it completes or the deadline passes.
//!
//! Nothing here has run on a device yet: CI and the development machine have no GPU. The
//! arithmetic is the host-tested core; what needs a device is listed in the crate README.

use crate::backend::{BackendError, BatchBackend, Staging, StreamRunner};
use crate::error::GpuError;
use crate::host_core::{KernelShape, KeyLayout};
use crate::DeviceInfo;
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
/// A kernel module: PTX text, or a cubin built for the device (`Ptx::from_binary`).
pub use cudarc::nvrtc::Ptx;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The kernel source NVRTC compiles: the core, the group and FP64 arithmetic, then the entry
/// points.
pub fn kernel_source() -> String {
    [
        include_str!("../kernels/rsa_core.h"),
        include_str!("../kernels/rsa_group.h"),
        include_str!("../kernels/rsa_fp64.h"),
        include_str!("../kernels/rsa_kernel.cu"),
    ]
    .concat()
}

fn driver(e: cudarc::driver::DriverError) -> GpuError {
    GpuError::Driver(e.to_string())
}

fn device(e: cudarc::driver::DriverError) -> BackendError {
    BackendError::Device(e.to_string())
}

/// Compiles the kernel with NVRTC for a device of compute capability `(major, minor)` in the
/// given shape. Needs libnvrtc, not a device.
pub fn compile_kernel((major, minor): (i32, i32), shape: KernelShape) -> Result<Ptx, GpuError> {
    compile_kernel_source(kernel_source(), (major, minor), shape)
}

/// [`compile_kernel`] for another text of the kernel with the same entry points (for measuring
/// a changed kernel on a device without rebuilding; see `examples/device_bench.rs`).
pub fn compile_kernel_source(
    source: String,
    (major, minor): (i32, i32),
    shape: KernelShape,
) -> Result<Ptx, GpuError> {
    let opts = CompileOptions {
        options: nvrtc_options(format!("compute_{major}{minor}"), shape)?,
        ..Default::default()
    };
    on_compile_stack(|| {
        compile_ptx_with_opts(source, opts).map_err(|e| GpuError::Compile(e.to_string()))
    })
}

/// Compiles the kernel with NVRTC straight to a cubin for `sm_{major}{minor}` (NVRTC runs the
/// assembler itself, so loading it needs no JIT). The options are those of [`compile_kernel`].
pub fn compile_cubin(
    source: &str,
    (major, minor): (i32, i32),
    shape: KernelShape,
) -> Result<Vec<u8>, GpuError> {
    let options = nvrtc_options(format!("sm_{major}{minor}"), shape)?;
    let src = std::ffi::CString::new(source)
        .map_err(|_| GpuError::Compile("kernel source holds a NUL byte".into()))?;
    on_compile_stack(|| cubin_of(&src, &options))
}

/// NVRTC on a thread with a deep stack: the group kernels' unrolled templates recurse deeper
/// in NVRTC than a default 2 MiB thread stack holds (it overflowed in a test thread).
fn on_compile_stack<T: Send>(
    f: impl FnOnce() -> Result<T, GpuError> + Send,
) -> Result<T, GpuError> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("nvrtc".into())
            .stack_size(256 << 20)
            .spawn_scoped(s, f)
            .map_err(|e| GpuError::Compile(format!("no thread for NVRTC: {e}")))?
            .join()
            .unwrap_or_else(|_| Err(GpuError::Compile("NVRTC panicked".into())))
    })
}

/// The cubin NVRTC builds from `src` with `options`.
fn cubin_of(src: &std::ffi::CStr, options: &[String]) -> Result<Vec<u8>, GpuError> {
    use cudarc::nvrtc::{result, sys};
    let compile = |e: cudarc::nvrtc::result::NvrtcError| GpuError::Compile(e.to_string());
    let prog = result::create_program(src, None).map_err(compile)?;
    // SAFETY: `prog` was created above and is destroyed once, at the end; the size NVRTC
    // reports is the buffer handed to nvrtcGetCUBIN.
    unsafe {
        let built = result::compile_program(prog, options)
            .map_err(|e| {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&bytes).into_owned()
                    })
                    .unwrap_or_default();
                GpuError::Compile(format!("{e}: {log}"))
            })
            .and_then(|()| {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(compile)?;
                let mut cubin = vec![0u8; size];
                sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                    .result()
                    .map_err(compile)?;
                Ok(cubin)
            });
        let _ = result::destroy_program(prog);
        built
    }
}

/// NVRTC's options for the kernel built for `arch` (`compute_90` for PTX, `sm_90` for a cubin)
/// in the given shape, once the shape is checked and libnvrtc found.
fn nvrtc_options(arch: String, shape: KernelShape) -> Result<Vec<String>, GpuError> {
    // Any block the shape takes: the block is checked again at launch.
    shape
        .check(shape.threads_per_request.max(32))
        .map_err(GpuError::Compile)?;
    // SAFETY: only tries to dlopen libnvrtc; no symbol is called.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    Ok(vec![
        format!("--gpu-architecture={arch}"),
        format!("-DRSA_WINDOW={}", shape.window),
        format!("-DRSA_SPLIT={}", shape.threads_per_request),
        format!("-DRSA_TABLE_SHARED={}", u8::from(shape.table_shared)),
        format!("-DRSA_PTX={}", u8::from(shape.carry_chains)),
        format!("-DRSA_FP64={}", u8::from(shape.fp64)),
    ])
}

/// Loads the driver and finds device 0, without compiling anything.
fn open_context() -> Result<(Arc<CudaContext>, DeviceInfo), GpuError> {
    device_present()?;
    let ctx = CudaContext::new(0).map_err(driver)?;
    let info = DeviceInfo {
        name: ctx.name().map_err(driver)?,
        compute_capability: ctx.compute_capability().map_err(driver)?,
        memory_bytes: ctx.total_mem().map_err(driver)?,
        multiprocessors: ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver)?,
    };
    Ok((ctx, info))
}

/// Whether a driver, NVRTC and a device are there, without making a CUDA context (for an
/// engine whose device work runs in a worker process: this process then holds no context).
pub fn device_present() -> Result<(), GpuError> {
    // SAFETY: only tries to dlopen the system's libcuda / libnvrtc (running their initializers,
    // as any CUDA program does); no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    if CudaContext::device_count().map_err(driver)? < 1 {
        return Err(GpuError::NoDevice);
    }
    Ok(())
}

/// Looks for a CUDA device: `Ok` with what was found, or why there is none.
pub fn probe() -> Result<DeviceInfo, GpuError> {
    open_context().map(|(_, info)| info)
}

/// The CUDA batch backend on device 0.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    funcs: [CudaFunction; 3],
    info: DeviceInfo,
    streams: usize,
    max_batch: usize,
    block: u32,
    shape: KernelShape,
}

impl CudaBackend {
    /// Loads the driver, compiles the kernel for the device (`config.window`) and loads it;
    /// `config.streams`, `config.max_batch` and `config.threads_per_block` shape the launches.
    pub fn new(config: &crate::GpuConfig) -> Result<Self, GpuError> {
        let Some(dir) = &config.kernel_cache else {
            return Self::with_source(config, kernel_source());
        };
        Self::check(config)?;
        let (ctx, info) = open_context()?;
        let source = kernel_source();
        let shape = format!("{:?}", config.shape());
        let path = crate::kernel_cache::entry(dir, info.compute_capability, &[&source, &shape]);
        let cached = crate::kernel_cache::load_or_build(&path, || {
            compile_cubin(&source, info.compute_capability, config.shape())
        })
        .and_then(|cubin| {
            Self::load(config, ctx.clone(), info.clone(), Ptx::from_binary(cubin)).inspect_err(
                |_| crate::kernel_cache::forget(&path), // the driver refused it: not kept
            )
        });
        match cached {
            Ok(backend) => Ok(backend),
            Err(e) => {
                // No cubin (NVRTC cannot build one for this architecture) or one the driver
                // refuses: PTX for the driver to compile, as without a cache.
                tracing::warn!(error = %e, "gpu engine: no usable cubin; building PTX instead");
                Self::load_source(config, ctx, info, source)
            }
        }
    }

    /// [`CudaBackend::new`] with another text of the kernel (same entry points).
    pub fn with_source(config: &crate::GpuConfig, source: String) -> Result<Self, GpuError> {
        Self::check(config)?;
        let (ctx, info) = open_context()?;
        Self::load_source(config, ctx, info, source)
    }

    /// Compiles `source` to PTX for the device and loads it (the driver compiles the PTX).
    fn load_source(
        config: &crate::GpuConfig,
        ctx: Arc<CudaContext>,
        info: DeviceInfo,
        source: String,
    ) -> Result<Self, GpuError> {
        let ptx = compile_kernel_source(source, info.compute_capability, config.shape())?;
        Self::load(config, ctx, info, ptx)
    }

    /// [`CudaBackend::new`] with a module already built (PTX, or a cubin for this device:
    /// `Ptx::from_binary`), built for `config.shape()` (whose window is not checked).
    pub fn with_module(config: &crate::GpuConfig, module: Ptx) -> Result<Self, GpuError> {
        Self::check(config)?;
        let (ctx, info) = open_context()?;
        Self::load(config, ctx, info, module)
    }

    fn check(config: &crate::GpuConfig) -> Result<(), GpuError> {
        config
            .shape()
            .check(Self::block_of(config))
            .map_err(GpuError::Compile)
    }

    /// Threads per block the launches use.
    fn block_of(config: &crate::GpuConfig) -> u32 {
        config.threads_per_block.clamp(32, 1024)
    }

    fn load(
        config: &crate::GpuConfig,
        ctx: Arc<CudaContext>,
        info: DeviceInfo,
        ptx: Ptx,
    ) -> Result<Self, GpuError> {
        let (shape, block) = (config.shape(), Self::block_of(config));
        let funcs = load_functions(&ctx, ptx, shape, block)?;
        Ok(CudaBackend {
            ctx,
            funcs,
            info,
            streams: config.streams.max(2),
            max_batch: config.max_batch.max(1),
            block,
            shape,
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Makes the device fault on this backend's context, as a broken kernel would: a kernel
    /// that stores to an unmapped address, launched on a stream of its own and waited for.
    /// Returns the error the driver reported. For measuring how the engine recovers from a
    /// real device error (`device_bench fault`); nothing in the engine calls it.
    pub fn inject_illegal_address(&self) -> Result<String, GpuError> {
        const PTX: &str = ".version 7.0\n.target sm_50\n.address_size 64\n\
            .visible .entry rampart_fault(.param .u64 p)\n{\n\
            .reg .u64 %rd<2>;\n.reg .b32 %r<2>;\n\
            ld.param.u64 %rd1, [p];\nmov.u32 %r1, 1;\nst.global.u32 [%rd1], %r1;\nret;\n}\n";
        let ctx = &self.ctx;
        let module = ctx.load_module(Ptx::from_src(PTX)).map_err(driver)?;
        let f = module.load_function("rampart_fault").map_err(driver)?;
        let stream = ctx.new_stream().map_err(driver)?;
        let address: u64 = 0x10;
        let mut b = stream.launch_builder(&f);
        b.arg(&address);
        // SAFETY: deliberately unsound for the device (a store to an unmapped address): the
        // device reports it as a launch error; host memory is not touched.
        let launched = unsafe { b.launch(LaunchConfig::for_num_elems(1)) };
        let waited = stream.synchronize();
        Ok(format!("launch: {launched:?}; synchronize: {waited:?}"))
    }
}

/// Loads `module` in `ctx` and returns its three entry points, each allowed the dynamic shared
/// memory a launch of `block` threads in `shape` takes (a window table in shared memory may take
/// more than the 48 KiB a launch gets without asking).
fn load_functions(
    ctx: &Arc<CudaContext>,
    module: Ptx,
    shape: KernelShape,
    block: u32,
) -> Result<[CudaFunction; 3], GpuError> {
    let module = ctx.load_module(module).map_err(driver)?;
    let f = |n: usize| {
        module
            .load_function(&format!("rsa_crt_batch_{n}"))
            .map_err(driver)
    };
    let funcs = [f(32)?, f(48)?, f(64)?];
    let most = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_err(driver)?;
    for (func, half) in funcs.iter().zip(crate::host_core::HALF_LIMBS) {
        let bytes = shape.dynamic_shared_bytes(half, block);
        if bytes == 0 {
            continue;
        }
        // The static hand-over of the halves' results: 2·half words per request the largest
        // block holds.
        let requests = (crate::host_core::MAX_SPLIT_BLOCK / shape.threads_per_request) as usize;
        let total = bytes + requests * 8 * half;
        if total > most as usize {
            return Err(GpuError::Compile(format!(
                "the window table in shared memory takes {} KiB per block of {block} threads at \
                 RSA-{} and this device allows {} KiB: use fewer threads per block, a 4-bit \
                 window or more threads per request",
                total >> 10,
                half * 64,
                most >> 10
            )));
        }
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(bytes).unwrap_or(i32::MAX),
        )
        .map_err(driver)?;
    }
    Ok(funcs)
}

impl BatchBackend for CudaBackend {
    fn describe(&self) -> String {
        self.info.to_string()
    }

    fn streams(&self) -> usize {
        self.streams
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    fn open_stream(&self, _index: usize) -> Result<Box<dyn StreamRunner>, BackendError> {
        let ctx = &self.ctx;
        let stream = ctx.new_stream().map_err(device)?;
        let io_words = self.max_batch * 2 * 64;
        let key_words = self.max_keys() * KeyLayout::words(64);
        let pinned = |len: usize| -> Result<PinnedHostSlice<u32>, BackendError> {
            // SAFETY: plain page-locked memory (flags 0: not write-combined, the CPU reads the
            // outputs back); zero-filled at once so no uninitialized value is ever read.
            let mut p = unsafe { ctx.alloc_pinned_with_flags::<u32>(len, 0) }.map_err(device)?;
            p.as_mut_slice().map_err(device)?.fill(0);
            Ok(p)
        };
        Ok(Box::new(CudaRunner {
            h_keys: pinned(key_words)?,
            h_index: pinned(self.max_batch)?,
            h_in: pinned(io_words)?,
            h_out: pinned(io_words)?,
            d_keys: stream.alloc_zeros::<u32>(key_words).map_err(device)?,
            d_index: stream.alloc_zeros::<u32>(self.max_batch).map_err(device)?,
            d_in: stream.alloc_zeros::<u32>(io_words).map_err(device)?,
            d_out: stream.alloc_zeros::<u32>(io_words).map_err(device)?,
            funcs: self.funcs.clone(),
            block: self.block,
            shape: self.shape,
            staged: None,
            stream,
        }))
    }
}

struct CudaRunner {
    stream: Arc<CudaStream>,
    funcs: [CudaFunction; 3],
    block: u32,
    shape: KernelShape,
    h_keys: PinnedHostSlice<u32>,
    h_index: PinnedHostSlice<u32>,
    h_in: PinnedHostSlice<u32>,
    h_out: PinnedHostSlice<u32>,
    d_keys: CudaSlice<u32>,
    d_index: CudaSlice<u32>,
    d_in: CudaSlice<u32>,
    d_out: CudaSlice<u32>,
    /// (half, keys, items) of the staged batch.
    staged: Option<(usize, usize, usize)>,
}

impl StreamRunner for CudaRunner {
    fn stage(
        &mut self,
        half: usize,
        keys: usize,
        items: usize,
    ) -> Result<Staging<'_>, BackendError> {
        let kw = keys * KeyLayout::words(half);
        let iw = items * 2 * half;
        if kw > self.h_keys.len() || items > self.h_index.len() || iw > self.h_in.len() {
            return Err(BackendError::Device(
                "batch larger than the runner's buffers".into(),
            ));
        }
        self.staged = Some((half, keys, items));
        // The previous batch on this stream completed before `run` returned, so the host
        // buffers are free.
        Ok(Staging {
            keys: &mut self.h_keys.as_mut_slice().map_err(device)?[..kw],
            key_index: &mut self.h_index.as_mut_slice().map_err(device)?[..items],
            input: &mut self.h_in.as_mut_slice().map_err(device)?[..iw],
        })
    }

    fn run(&mut self, deadline: Duration) -> Result<&[u32], BackendError> {
        let start = Instant::now();
        let (half, keys, items) = self
            .staged
            .take()
            .ok_or_else(|| BackendError::Device("nothing staged".into()))?;
        let kw = keys * KeyLayout::words(half);
        let iw = items * 2 * half;
        let s = &self.stream;
        s.memcpy_htod(
            &self.h_keys.as_slice().map_err(device)?[..kw],
            &mut self.d_keys.slice_mut(..kw),
        )
        .map_err(device)?;
        s.memcpy_htod(
            &self.h_index.as_slice().map_err(device)?[..items],
            &mut self.d_index.slice_mut(..items),
        )
        .map_err(device)?;
        s.memcpy_htod(
            &self.h_in.as_slice().map_err(device)?[..iw],
            &mut self.d_in.slice_mut(..iw),
        )
        .map_err(device)?;
        let f = &self.funcs[crate::host_core::size_index(half)];
        let count = items as u32;
        let cfg = LaunchConfig {
            grid_dim: (
                (count * self.shape.threads_per_request).div_ceil(self.block),
                1,
                1,
            ),
            block_dim: (self.block, 1, 1),
            shared_mem_bytes: self.shape.dynamic_shared_bytes(half, self.block) as u32,
        };
        let mut b = s.launch_builder(f);
        b.arg(&mut self.d_out);
        b.arg(&self.d_in);
        b.arg(&self.d_keys);
        b.arg(&self.d_index);
        b.arg(&count);
        // SAFETY: the kernel takes (out, in, keys, key_index, count) as pushed; every buffer
        // holds at least `count` requests of `half` limbs (checked in `stage`), key indices are
        // below `keys` (built by the engine), and threads with i >= count return at once.
        unsafe { b.launch(cfg) }.map_err(device)?;
        s.memcpy_dtoh(
            &self.d_out.slice(..iw),
            &mut self.h_out.as_mut_slice().map_err(device)?[..iw],
        )
        .map_err(device)?;
        let done = s.record_event(None).map_err(device)?;
        let mut spins = 0u32;
        while !done.try_is_complete().map_err(device)? {
            if start.elapsed() > deadline {
                return Err(BackendError::Deadline(deadline));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(&self.h_out.as_slice().map_err(device)?[..iw])
    }
}

impl Drop for CudaRunner {
    fn drop(&mut self) {
        // A runner dropped after a deadline may still have copies in flight into its pinned
        // buffers: wait for the stream before they are freed.
        let _ = self.stream.synchronize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs libnvrtc (no device): `LD_LIBRARY_PATH=<dir of libnvrtc.so.12> cargo test -p
    /// gpu-engine -- --ignored nvrtc`. The pip wheel `nvidia-cuda-nvrtc-cu12` has it.
    #[test]
    #[ignore = "needs libnvrtc"]
    fn nvrtc_compiles_the_kernel_for_hopper() {
        let shape = |threads_per_request, table_shared, carry_chains| KernelShape {
            window: crate::host_core::DEFAULT_WINDOW,
            threads_per_request,
            table_shared,
            carry_chains,
            fp64: false,
        };
        let ptx = compile_kernel((9, 0), shape(1, false, false))
            .unwrap()
            .to_src();
        for n in [32, 48, 64] {
            assert!(
                ptx.contains(&format!(".entry rsa_crt_batch_{n}")),
                "entry {n}"
            );
        }
        assert!(ptx.contains(".target sm_90"));
        let split = compile_kernel((9, 0), shape(2, false, false))
            .unwrap()
            .to_src();
        assert!(split.contains(".shared") && split.contains("bar.sync"));
        // FP64 arithmetic: the split product's round-toward-zero fma.
        let fp64 = compile_kernel(
            (9, 0),
            KernelShape {
                fp64: true,
                ..shape(2, false, false)
            },
        )
        .unwrap()
        .to_src();
        assert!(fp64.contains("fma.rz.f64"));
        assert!(!split.contains("fma.rz.f64"));
        // The group kernels: shuffles and ballots, and the carry chains when asked for.
        for tpr in [8, 16, 32] {
            let group = compile_kernel((9, 0), shape(tpr, true, true))
                .unwrap()
                .to_src();
            assert!(group.contains("shfl.sync") && group.contains("vote.sync.ballot"));
            assert!(group.contains("madc.hi.cc.u32"), "{tpr}");
            let plain = compile_kernel((9, 0), shape(tpr, false, false))
                .unwrap()
                .to_src();
            assert!(!plain.contains("madc.hi.cc.u32"), "{tpr}");
        }
    }

    /// Needs libnvrtc (no device), like the test above.
    #[test]
    #[ignore = "needs libnvrtc"]
    fn nvrtc_builds_a_cubin_for_hopper() {
        let shape = KernelShape {
            window: crate::host_core::DEFAULT_WINDOW,
            threads_per_request: 2,
            table_shared: false,
            carry_chains: false,
            fp64: false,
        };
        let cubin = compile_cubin(&kernel_source(), (9, 0), shape).unwrap();
        assert_eq!(&cubin[..4], b"\x7fELF");
        let err = compile_cubin("this is not CUDA", (9, 0), shape).unwrap_err();
        assert!(err.to_string().contains("error"), "{err}");
    }
}
