//! `https-requests --request-set FILE`: a mix of requests sent in turn instead of one URL, each
//! with the status it must get (a WAF benchmark's attacks and ordinary requests, the same
//! file for every server compared: a different verdict is an error).
//!
//! One JSON object per line: `{"method": "POST", "path": "/login?x=1", "headers": {"Content-Type":
//! "application/x-www-form-urlencoded"}, "body": "user=a", "expect": 403}`; `method` (GET),
//! `headers`, `body` and `expect` (any 2xx) may be left out. Blank lines and lines starting
//! with `#` are skipped.

use anyhow::Context as _;
use bytes::Bytes;
use std::collections::BTreeMap;

/// One request of the set.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SetRequest {
    #[serde(default = "get")]
    pub method: String,
    pub path: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub body: String,
    /// The status it must get; any 2xx when absent, any at all when 0.
    pub expect: Option<u16>,
}

fn get() -> String {
    "GET".into()
}

impl SetRequest {
    /// Whether `status` is what this request must get.
    pub fn accepts(&self, status: http::StatusCode) -> bool {
        match self.expect {
            Some(0) => true,
            Some(e) => status.as_u16() == e,
            None => status.is_success(),
        }
    }

    pub fn body(&self) -> Bytes {
        Bytes::from(self.body.clone())
    }
}

/// Reads a request set.
pub(crate) fn load(path: &std::path::Path) -> anyhow::Result<Vec<SetRequest>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--request-set: cannot read {}", path.display()))?;
    let set: Vec<SetRequest> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| {
            let r: SetRequest =
                serde_json::from_str(l).with_context(|| format!("{}:{}", path.display(), i + 1))?;
            anyhow::ensure!(
                r.path.starts_with('/'),
                "{}:{}: path must start with /",
                path.display(),
                i + 1
            );
            http::Method::from_bytes(r.method.as_bytes())
                .with_context(|| format!("{}:{}: method", path.display(), i + 1))?;
            Ok(r)
        })
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!set.is_empty(), "{}: no requests", path.display());
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_bad_ones_say_where() {
        let dir = std::env::temp_dir().join(format!("bench-set-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("set.jsonl");
        std::fs::write(
            &f,
            "# ordinary\n{\"path\": \"/\"}\n\n{\"method\": \"POST\", \"path\": \"/login\", \"body\": \"a=1\", \"headers\": {\"Content-Type\": \"text/plain\"}, \"expect\": 403}\n",
        )
        .unwrap();
        let set = load(&f).unwrap();
        assert_eq!(set.len(), 2);
        assert!(
            set[0].accepts(http::StatusCode::OK) && !set[0].accepts(http::StatusCode::FORBIDDEN)
        );
        assert!(
            set[1].accepts(http::StatusCode::FORBIDDEN) && !set[1].accepts(http::StatusCode::OK)
        );
        assert_eq!(set[1].headers["Content-Type"], "text/plain");
        let any = SetRequest {
            expect: Some(0),
            ..set[1].clone()
        };
        assert!(any.accepts(http::StatusCode::NOT_FOUND) && any.accepts(http::StatusCode::OK));
        std::fs::write(&f, "{\"path\": \"/\"}\n{\"path\": \"nope\"}\n").unwrap();
        assert!(load(&f).unwrap_err().to_string().contains("set.jsonl:2"));
        std::fs::remove_dir_all(dir).ok();
    }
}
