//! Fuzzes the HTTP/2 control-frame counter, which reads every byte a client sends on an
//! HTTP/2 connection: it must never panic, and feeding the same bytes in any split must give
//! the same verdict (a frame header cut between reads counts the same as a whole one).
#![no_main]

use gateway::h2_flood::FrameCounter;
use libfuzzer_sys::fuzz_target;
use std::time::Instant;

fuzz_target!(|data: &[u8]| {
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let t = Instant::now();
    let mut whole = FrameCounter::new(1);
    let verdict = whole.feed(stream, t);
    let mut pieces = FrameCounter::new(1);
    let step = usize::from(split).max(1);
    let mut split_verdict = Ok(());
    for chunk in stream.chunks(step) {
        split_verdict = pieces.feed(chunk, t);
        if split_verdict.is_err() {
            break;
        }
    }
    assert_eq!(verdict, split_verdict);
});
