//! ModSecurity's per-rule log lines, reduced to what may be logged: the rule, its message and
//! severity, and the name of the variable it matched. The line's `Value:` and `[data "…"]`
//! parts quote the client's bytes and are never kept.

use std::ffi::{c_void, CStr};

/// One rule that matched during an inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// The rule's id (`942100`).
    pub id: u32,
    /// The rule's message (`SQL Injection Attack Detected via libinjection`), at most
    /// [`MAX_FIELD`] bytes.
    pub msg: String,
    /// The variable it matched (`ARGS:q`, `REQUEST_HEADERS:User-Agent`), at most
    /// [`MAX_FIELD`] bytes; empty when the line names none.
    pub variable: String,
    /// CRS severity (0 emergency … 5 notice), when the rule gives one.
    pub severity: Option<u8>,
}

/// Longest message or variable name kept (a variable's name can be the client's argument
/// name).
pub const MAX_FIELD: usize = 200;

/// The matches an inspection collects: the transaction's `logCbData`.
pub(crate) type Collector = Vec<Match>;

/// `msc_set_log_cb`'s callback: parses one line into the transaction's collector.
///
/// # Safety
/// `data` is the `Collector` the transaction was created with (or null) and `line` a
/// NUL-terminated string, both valid for the call (ModSecurity calls it synchronously from the
/// thread running the transaction).
pub(crate) unsafe extern "C" fn on_log(data: *mut c_void, line: *const c_void) {
    if data.is_null() || line.is_null() {
        return;
    }
    // SAFETY: as the function's contract says.
    let text = unsafe { CStr::from_ptr(line.cast()) }.to_string_lossy();
    // Never unwind into C++.
    let parsed = std::panic::catch_unwind(|| parse(&text)).ok().flatten();
    if let Some(m) = parsed {
        // SAFETY: data is the transaction's collector, used by no one else during the call.
        unsafe { &mut *data.cast::<Collector>() }.push(m);
    }
}

/// The rule id, message, severity and variable name of one log line; `None` without an id.
/// Its input quotes the client's bytes: it is fuzzed (`fuzz/fuzz_targets/waf_log_line.rs`).
pub fn parse(line: &str) -> Option<Match> {
    let id = tag(line, "id")?.parse().ok()?;
    let msg = tag(line, "msg").map(bounded).unwrap_or_default();
    let severity = tag(line, "severity").and_then(|s| s.parse().ok());
    // `… against variable `ARGS:q' (Value: …`, or for libinjection's rules only in the data:
    // `[data "Matched Data: s&sos found within ARGS:q: <value>"]` (the value is not kept).
    let variable = line
        .split_once("against variable `")
        .and_then(|(_, rest)| rest.split_once('\''))
        .or_else(|| {
            tag(line, "data")?
                .split_once(" found within ")
                .and_then(|(_, rest)| rest.split_once(": "))
        })
        .map(|(v, _)| bounded(v))
        .unwrap_or_default();
    Some(Match {
        id,
        msg,
        variable,
        severity,
    })
}

/// The value of `[name "value"]` in a line.
fn tag<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("[{name} \"");
    let start = line.find(&open)? + open.len();
    let len = line[start..].find("\"]")?;
    Some(&line[start..start + len])
}

/// `s` cut to at most [`MAX_FIELD`] bytes at a character boundary.
fn bounded(s: &str) -> String {
    let mut end = s.len().min(MAX_FIELD);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "ModSecurity: Warning. Matched \"Operator `DetectSQLi' with parameter `' against variable `ARGS:q' (Value: `1' or '1'='1' ) [file \"/usr/share/modsecurity-crs/rules/REQUEST-942-APPLICATION-ATTACK-SQLI.conf\"] [line \"65\"] [id \"942100\"] [rev \"\"] [msg \"SQL Injection Attack Detected via libinjection\"] [data \"Matched Data: s&sos found within ARGS:q: 1' or '1'='1\"] [severity \"2\"] [ver \"OWASP_CRS/3.3.4\"] [hostname \"127.0.0.1\"] [uri \"/\"] [unique_id \"1\"]";

    #[test]
    fn keeps_the_rule_and_the_variable_name_and_drops_the_value() {
        let m = parse(LINE).unwrap();
        assert_eq!(m.id, 942100);
        assert_eq!(m.msg, "SQL Injection Attack Detected via libinjection");
        assert_eq!(m.variable, "ARGS:q");
        assert_eq!(m.severity, Some(2));
        assert!(!format!("{m:?}").contains("'1'='1"));
    }

    #[test]
    fn libinjection_lines_name_the_variable_in_their_data() {
        let line = "ModSecurity: Warning. detected SQLi using libinjection. [file \"x.conf\"] [line \"46\"] [id \"942100\"] [rev \"\"] [msg \"SQL Injection Attack Detected via libinjection\"] [data \"Matched Data: s&sos found within ARGS:q: 1' OR '1'='1\"] [severity \"2\"]";
        let m = parse(line).unwrap();
        assert_eq!((m.id, m.variable.as_str()), (942100, "ARGS:q"));
        assert!(!format!("{m:?}").contains("'1'='1"));
    }

    #[test]
    fn lines_without_an_id_and_long_fields() {
        assert_eq!(parse("ModSecurity: no rule here"), None);
        let long = format!("[id \"1\"] [msg \"{}\"]", "é".repeat(300));
        let m = parse(&long).unwrap();
        assert!(m.msg.len() <= MAX_FIELD && m.msg.starts_with('é'));
        assert_eq!(m.variable, "");
        assert_eq!(m.severity, None);
    }
}
