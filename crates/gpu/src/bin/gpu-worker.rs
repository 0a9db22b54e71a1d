//! The gpu engine's worker process on its own (the gateway runs the same code as
//! `rampart gpu-worker`); the engine's tests start it with the simulated device.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(gpu_engine::process::worker::run(&args));
}
