//! Regular expressions in routes: compiled once at load with a linear-time engine (the `regex`
//! crate's automata: no backtracking, so no request can make a match take more than time in
//! proportion to its length), matched against the whole value, and bounded in size.
//!
//! A path pattern also yields the literal text every matching path starts with, so the router
//! can index a regex route under that prefix instead of trying it on every request.

use regex::{Regex, RegexBuilder};

/// The most memory one compiled pattern may take (a pattern such as `a{1000}{1000}` is refused
/// instead of compiled).
const SIZE_LIMIT: usize = 1 << 20;

/// `pattern` compiled to match a whole value (`^(?:pattern)$`); the error says why not.
pub(crate) fn compile(pattern: &str, case_insensitive: bool) -> Result<Regex, String> {
    RegexBuilder::new(&anchored(pattern))
        .case_insensitive(case_insensitive)
        .size_limit(SIZE_LIMIT)
        .dfa_size_limit(SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => {
                format!("a pattern that compiles to at most {SIZE_LIMIT} bytes")
            }
            e => format!("a regular expression ({})", first_line(&e.to_string())),
        })
}

/// The literal text that every value matching `pattern` (whole) starts with: empty when it
/// has none. Cut at a character boundary.
pub(crate) fn literal_prefix(pattern: &str) -> String {
    use regex_syntax::hir::literal::{ExtractKind, Extractor};
    let Ok(hir) = regex_syntax::Parser::new().parse(&anchored(pattern)) else {
        return String::new();
    };
    let seq = Extractor::new().kind(ExtractKind::Prefix).extract(&hir);
    let bytes = seq.longest_common_prefix().unwrap_or_default();
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(e) => String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned(),
    }
}

fn anchored(pattern: &str) -> String {
    format!("^(?:{pattern})$")
}

/// The `regex` crate's errors span lines (the pattern with a caret under the fault); a config
/// error is one line.
fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("regex parse error"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_values() {
        let r = compile("/users/[0-9]+", false).unwrap();
        assert!(r.is_match("/users/42"));
        assert!(!r.is_match("/users/42/x"));
        assert!(!r.is_match("/v1/users/42"));
        let ci = compile("/Users/[0-9]+", true).unwrap();
        assert!(ci.is_match("/users/7"));
    }

    #[test]
    fn bad_and_huge_patterns_are_refused_with_a_reason() {
        let e = compile("/users/[0-9", false).unwrap_err();
        assert!(e.starts_with("a regular expression ("), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = compile("(a{1000}){1000}", false).unwrap_err();
        assert!(e.contains("at most"), "{e}");
        // Backreferences and look-around need backtracking: not in this engine.
        assert!(compile(r"(a)\1", false).is_err());
    }

    #[test]
    fn a_linear_engine_is_not_slowed_by_a_classic_backtracking_bomb() {
        // (a+)+$ against "aaaa…b" takes exponential time in a backtracking engine.
        let r = compile("(a+)+", false).unwrap();
        let input = "a".repeat(100_000) + "b";
        assert!(!r.is_match(&input));
    }

    #[test]
    fn literal_prefixes() {
        assert_eq!(literal_prefix("/users/[0-9]+"), "/users/");
        assert_eq!(literal_prefix("/api/v(1|2)/x"), "/api/v");
        assert_eq!(literal_prefix("/a|/b"), "/");
        assert_eq!(literal_prefix("(?i)/admin"), "/", "no case in /");
        assert_eq!(literal_prefix(".*"), "");
        assert_eq!(literal_prefix("/é[0-9]"), "/é");
    }
}
