//! What one `SealKey::seal` costs by message size, on one thread, with the data hot in cache:
//! the fixed cost per packet and the cost per byte, from the slope between sizes.
//!   cargo run --release -p packetseal --example sizes
//!   taskset -c 1 ./target/release/examples/sizes
use std::hint::black_box;
use std::time::Instant;

/// Plaintext sizes: a few small messages, the packets quiche writes (1,323 bytes of a
/// 1,350-byte packet, 1,408 of a 1,452-byte one), and the larger windows.
const SIZES: [usize; 10] = [64, 256, 512, 1024, 1323, 1408, 2048, 4096, 8192, 16384];

/// Bytes sealed per size and timing pass; the best of `PASSES` passes is printed.
const BYTES_PER_PASS: usize = 20_000_000;
const PASSES: usize = 5;

/// The frame headers quiche leaves in the packet before the stream data.
const IN_PACKET: usize = 16;

fn main() {
    let Some(key) = packetseal::SealKey::new(&[7u8; 16]) else {
        eprintln!("this CPU has neither of packetseal's widths (VAES and VPCLMULQDQ)");
        std::process::exit(1);
    };
    println!("width: {:?}", key.width());
    let aad = [1u8; 11];
    for n in SIZES {
        let data = vec![3u8; n];
        let mut buf = vec![0u8; n + packetseal::TAG_LEN];
        let iters = BYTES_PER_PASS / (n + 100);
        let mut best = f64::MAX;
        for _ in 0..PASSES {
            let start = Instant::now();
            for i in 0..iters {
                let mut nonce = [0u8; packetseal::NONCE_LEN];
                nonce[4..].copy_from_slice(&(i as u64).to_be_bytes());
                let sealed = key.seal(
                    &nonce,
                    &aad,
                    &mut buf,
                    IN_PACKET,
                    black_box(&data[IN_PACKET..]),
                );
                black_box(sealed.expect("buffer sized for the tag"));
            }
            best = best.min(start.elapsed().as_nanos() as f64 / iters as f64);
        }
        println!(
            "{n:6} B  {best:8.1} ns  {:6.1} ns per KB",
            best * 1000.0 / n as f64
        );
    }
}
