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
    // Once per kernel shape the CUDA build can be given (windows 4, 5, 6 with one thread per
    // request; window 5 with two), each under its own name.
    for (window, split) in [(4, 1), (5, 1), (6, 1), (5, 2)] {
        let name = if split == 1 {
            format!("rsa_emulate_launch_w{window}")
        } else {
            format!("rsa_emulate_launch_w{window}_s{split}")
        };
        cc::Build::new()
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
