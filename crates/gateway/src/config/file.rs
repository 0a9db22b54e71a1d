//! Reading a configuration file: its text, TOML with the field path and line in every error,
//! and durations such as "30s". Shared by the gateway's file and the key server's.

use super::ConfigError;
use serde::{Deserialize, Deserializer};
use std::path::Path;
use std::time::Duration;

/// A duration field: "500ms", "30s", "1h".
pub fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {s:?} ({e}); expected e.g. \"500ms\", \"30s\", \"1h\""
        ))
    })
}

/// A duration field read and written as text ("30s"), for objects the control plane shows.
pub mod duration_text {
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::duration(d)
    }

    pub fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*v))
    }
}

/// Hex digits as bytes (server IDs, keys); `None` for an odd count or a non-hex digit.
pub fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let mut out = vec![0u8; s.len() / 2];
    hex_from(s, &mut out)?;
    Some(out)
}

/// Hex digits into `out`, in place (no allocation: read per request); `None` unless `s` has
/// exactly two digits per byte of `out`.
pub fn hex_from(s: &str, out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(())
}

/// `b` as lowercase hex digits into `out` (twice its length): written in place, so no
/// piece of it (a key's, say) is left in a temporary string.
pub fn hex_into(out: &mut [u8], b: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (o, x) in out.chunks_exact_mut(2).zip(b) {
        o[0] = DIGITS[usize::from(x >> 4)];
        o[1] = DIGITS[usize::from(x & 15)];
    }
}

/// `b` as lowercase hex digits (what [`hex`] reads back).
pub fn to_hex(b: &[u8]) -> String {
    let mut out = vec![0u8; b.len() * 2];
    hex_into(&mut out, b);
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Reads `path` and hands its text to `parse` with the file name and directory.
pub fn load_file<T>(
    path: &Path,
    parse: impl FnOnce(&str, &str, &Path) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::at(&file, "", format!("cannot read: {e}")))?;
    parse(&text, &file, path.parent().unwrap_or(Path::new(".")))
}

/// TOML text into `T`, with errors naming the field path and line.
pub fn parse_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
) -> Result<T, ConfigError> {
    let line_of = |span: Option<std::ops::Range<usize>>| {
        span.map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
    };
    let de = toml::Deserializer::parse(text).map_err(|e| ConfigError {
        file: file.into(),
        path: String::new(),
        line: line_of(e.span()),
        message: e.message().to_string(),
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| ConfigError {
        file: file.into(),
        path: e.path().to_string(),
        line: line_of(e.inner().span()),
        message: e.inner().message().to_string(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_written_is_hex_read() {
        let bytes: Vec<u8> = (0..=255).collect();
        let text = super::to_hex(&bytes);
        assert_eq!(&text[..8], "00010203");
        assert_eq!(&text[text.len() - 4..], "feff");
        assert_eq!(super::hex(&text), Some(bytes));
        assert_eq!(super::to_hex(&[]), "");
    }
}
