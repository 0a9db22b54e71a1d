//! Fuzzes the reading of ModSecurity's per-rule log lines, which quote the client's bytes (the
//! matched value and data): it must never panic, and what it keeps (the message and the
//! variable's name) stays within `MAX_FIELD` bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    if let Some(m) = waf::parse_log_line(&line) {
        assert!(m.msg.len() <= waf::MAX_FIELD);
        assert!(m.variable.len() <= waf::MAX_FIELD);
    }
});
