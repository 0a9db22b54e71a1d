//! Secret keys one gateway of the fleet rotates and every gateway reads, kept in Redis as one
//! list of hex lines: the sealing (or signing) key first, then the previous one, and last the
//! *next* key, which every gateway can already open (or validate) with a period before it
//! seals anything, so a gateway that has not yet read a rotation still accepts what was made
//! after it. Whichever gateway takes the lease (`SET NX PX`) once it lapses rotates: the next
//! key seals, a fresh next is added, the oldest dropped. Every gateway reads the list four
//! times a period (sooner while a read fails). Until the first read, and while Redis cannot
//! be reached, a gateway keeps the keys it has. Key material is never logged.

use super::FleetStore;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use zeroize::Zeroize;

/// KEYS[1]: the list; KEYS[2]: the rotation lease. ARGV[1]: the period (ms); ARGV[2],
/// ARGV[3]: fresh keys (hex), used only when the list is made or rotated. Returns the list.
static ROTATE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local list = redis.call('GET', KEYS[1])
if not list then
  list = ARGV[2] .. '\n' .. ARGV[3]
  redis.call('SET', KEYS[1], list)
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
  return list
end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  local lines = {}
  for l in string.gmatch(list, '[^\n]+') do table.insert(lines, l) end
  list = lines[#lines] .. '\n' .. lines[1] .. '\n' .. ARGV[2]
  redis.call('SET', KEYS[1], list)
end
return list
",
    )
});

/// What the list's owner does with each read: `None` when it is gone (the sync stops),
/// else whether the list was taken (an error says why not, never with key material).
pub type Apply = Box<dyn Fn(&[u8]) -> Option<Result<(), String>> + Send>;

/// Keeps the list `name` (under the store's prefix) of keys of `key_len` bytes in step, every
/// `period`, handing each read to `apply`. Runs on the current runtime.
pub fn spawn_sync(
    store: Arc<FleetStore>,
    name: &str,
    period: Duration,
    key_len: usize,
    apply: Apply,
) {
    let list_key = format!("{}:{name}", store.key_prefix);
    let lease_key = format!("{list_key}:lease");
    let period_ms = period.as_millis().max(1).to_string();
    let every = (period / 4).max(Duration::from_millis(250));
    tokio::spawn(async move {
        let mut wait = Duration::ZERO;
        let mut failing = false;
        loop {
            tokio::time::sleep(wait).await;
            let mut args = [period_ms.clone(), fresh_hex(key_len), fresh_hex(key_len)];
            let answer: Result<Vec<u8>, _> = store
                .eval_within(
                    &ROTATE,
                    &[&list_key, &lease_key],
                    &args,
                    Duration::from_secs(1),
                )
                .await;
            args.iter_mut().for_each(|a| a.zeroize());
            let taken = match answer {
                Ok(mut text) => {
                    let r = apply(&text);
                    text.zeroize();
                    match r {
                        None => return,
                        Some(r) => r,
                    }
                }
                Err(e) => Err(e.to_string()),
            };
            match taken {
                Ok(()) => {
                    failing = false;
                    wait = every;
                }
                Err(e) => {
                    // The first read of a worker often finds its connection still being made.
                    if failing {
                        tracing::warn!(list = %list_key, error = %e, "shared keys not read from the fleet; the keys in use kept");
                    }
                    failing = true;
                    wait = (wait * 2).clamp(Duration::from_millis(100), every);
                }
            }
        }
    });
}

/// `len` random bytes, in hex.
fn fresh_hex(len: usize) -> String {
    let mut raw = vec![0u8; len];
    boring::rand::rand_bytes(&mut raw).expect("rng");
    let hex = crate::config::file::to_hex(&raw);
    raw.zeroize();
    hex
}

/// A key of `N` bytes from a line of `2N` hex digits; `None` (the partly decoded bytes wiped)
/// when the line is anything else.
pub fn hex_key<const N: usize>(line: &[u8]) -> Option<[u8; N]> {
    let mut k = [0u8; N];
    let hex = |c: u8| (c as char).to_digit(16);
    let ok = line.len() == N * 2
        && line
            .chunks(2)
            .zip(k.iter_mut())
            .all(|(p, out)| match (hex(p[0]), hex(p[1])) {
                (Some(h), Some(l)) => {
                    *out = (h * 16 + l) as u8;
                    true
                }
                _ => false,
            });
    if !ok {
        k.zeroize();
        return None;
    }
    Some(k)
}

/// The keys of a list of `N`-byte hex lines, in order; an error names the line.
pub fn parse_hex_keys<const N: usize>(text: &[u8]) -> Result<Vec<[u8; N]>, String> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, line)| (i, line.trim_ascii()))
        .filter(|(_, line)| !line.is_empty())
        .map(|(i, line)| {
            hex_key(line).ok_or_else(|| format!("line {}: expected {} hex digits", i + 1, N * 2))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_lines_parse_in_order_and_bad_ones_name_their_line() {
        let keys = parse_hex_keys::<2>(b"0a0b\n\nffee\n").unwrap();
        assert_eq!(keys, vec![[0x0a, 0x0b], [0xff, 0xee]]);
        let e = parse_hex_keys::<2>(b"0a0b\nzz00\n").unwrap_err();
        assert_eq!(e, "line 2: expected 4 hex digits");
        assert!(parse_hex_keys::<2>(b"0a0b0c").is_err());
        assert_eq!(fresh_hex(32).len(), 64);
    }
}
