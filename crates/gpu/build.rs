//! Compiles the kernel's arithmetic core (kernels/rsa_core.h) for the host, so that tests and
//! the CPU-side steps (key preparation, blinding set-up, simulated GPU) run the same C text the
//! CUDA kernel is built from at run time.

fn main() {
    println!("cargo:rerun-if-changed=kernels/rsa_core.h");
    println!("cargo:rerun-if-changed=kernels/rsa_host.c");
    cc::Build::new()
        .file("kernels/rsa_host.c")
        .include("kernels")
        // Unoptimized C makes the host core (used by tests for thousands of operations) crawl.
        .opt_level(3)
        .flag_if_supported("-std=c99")
        .warnings(true)
        .extra_warnings(true)
        .flag_if_supported("-Wno-unused-function")
        .compile("rsa_core_host");
    // The CUDA entry points (rsa_kernel.cu) compiled for the host, for the simulated GPU.
    println!("cargo:rerun-if-changed=kernels/rsa_kernel.cu");
    println!("cargo:rerun-if-changed=kernels/emulate.cpp");
    println!("cargo:rerun-if-changed=kernels/rsa_group.h");
    println!("cargo:rerun-if-changed=kernels/rsa_fp64.h");
    // Once per kernel shape the CUDA build can be given, each under its own name: windows 4, 5,
    // 6 with one thread per request; window 5 with two; groups of 4, 8 and 16 lanes per CRT
    // half (8, 16, 32 threads per request) with the table in local memory, and 8 lanes with it
    // in shared memory (windows 5 and 4: the engine's default).
    // FP64 arithmetic (rsa_fp64.h): two threads per request with windows 5 and 4, groups of 4,
    // 8 and 16 lanes per CRT half with window 4.
    for (window, split, shared, fp64) in [
        (4, 1, false, false),
        (5, 1, false, false),
        (6, 1, false, false),
        (5, 2, false, false),
        (5, 2, false, true),
        (4, 2, false, true),
        (4, 8, false, true),
        (4, 16, false, true),
        (4, 32, false, true),
        (5, 8, false, false),
        (5, 16, false, false),
        (5, 32, false, false),
        (5, 16, true, false),
        (4, 16, true, false),
    ] {
        let name = match (split, shared, fp64) {
            (1, _, _) => format!("rsa_emulate_launch_w{window}"),
            (_, _, true) => format!("rsa_emulate_launch_w{window}_s{split}_f64"),
            (_, false, _) => format!("rsa_emulate_launch_w{window}_s{split}"),
            (_, true, _) => format!("rsa_emulate_launch_w{window}_s{split}_sh"),
        };
        cc::Build::new()
            .define("RSA_TABLE_SHARED", if shared { "1" } else { "0" })
            .define("RSA_FP64", if fp64 { "1" } else { "0" })
            // Rounding modes are honoured (no folding across fesetround).
            .flag_if_supported("-frounding-math")
            .cpp(true)
            .file("kernels/emulate.cpp")
            .include("kernels")
            .define("RSA_WINDOW", window.to_string().as_str())
            .define("RSA_SPLIT", split.to_string().as_str())
            .define("RSA_EMULATE_LAUNCH", name.as_str())
            .opt_level(3)
            .flag_if_supported("-std=c++17")
            .warnings(true)
            .extra_warnings(true)
            .flag_if_supported("-Wno-unused-function")
            .compile(&format!("{name}_lib"));
    }
    println!("cargo:rustc-link-lib=pthread");
}
