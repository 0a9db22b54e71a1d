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
    // Once per window width the CUDA build can be given (4, 5, 6), each under its own name.
    for window in [4, 5, 6] {
        cc::Build::new()
            .cpp(true)
            .file("kernels/emulate.cpp")
            .include("kernels")
            .define("RSA_WINDOW", window.to_string().as_str())
            .define(
                "RSA_EMULATE_LAUNCH",
                format!("rsa_emulate_launch_w{window}").as_str(),
            )
            .opt_level(3)
            .warnings(true)
            .extra_warnings(true)
            .flag_if_supported("-Wno-unused-function")
            .compile(&format!("rsa_kernel_emulated_w{window}"));
    }
}
