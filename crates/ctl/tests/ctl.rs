//! `rampart ctl` against a gateway watching a real etcd: apply creates, diff shows what would
//! change, apply again replaces (at the revision read) or leaves alone, get, delete, watch;
//! and the API's token is needed.

#[path = "../../gateway/tests/common/mod.rs"]
mod common;

use common::etcd::{member, Etcd};
use common::*;
use ctl::{CtlArgs, CtlCommand};
use std::path::PathBuf;

async fn ctl(fx: &Fixture, token: bool, command: CtlCommand) -> (bool, String) {
    let token_file = token.then(|| fx.dir.path().join("admin.token"));
    let args = CtlArgs {
        admin: format!("http://{}", fx.gw().admin.unwrap()),
        token_file,
        command,
    };
    let mut out = Vec::new();
    let ok = ctl::run(&args, &mut out)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    (ok, String::from_utf8(out).unwrap())
}

fn objects_file(fx: &Fixture, prefix: &str) -> PathBuf {
    let path = fx.dir.path().join("objects.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[[routes]]
name = "api"
path_prefix = "{prefix}"
cluster = "edge"
response_headers = {{ set = {{ "x-route" = "api" }} }}

[[clusters]]
name = "edge"
endpoints = ["{}"]
"#,
            fx.upstream
        ),
    )
    .unwrap();
    path
}

async fn x_route(fx: &Fixture, path: &str) -> String {
    response_header(fx, path, "x-route").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_diff_get_delete_and_watch() {
    let etcd = Etcd::start();
    let fx = member(&etcd).await;
    let file = objects_file(&fx, "/bytes/");

    // Nothing there yet: diff lists both as new, and says so by its result.
    let (same, out) = ctl(&fx, true, CtlCommand::Diff { file: file.clone() }).await;
    assert!(!same);
    assert_eq!(out, "+ clusters/edge\n+ routes/api\n");
    // Clusters go first, so the route's cluster exists when it is checked.
    let (ok, out) = ctl(&fx, true, CtlCommand::Apply { file: file.clone() }).await;
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("clusters/edge created"), "{out}");
    assert!(lines[1].starts_with("routes/api created"), "{out}");
    assert_eq!(x_route(&fx, "/bytes/10").await, "api");
    let (same, out) = ctl(&fx, true, CtlCommand::Diff { file: file.clone() }).await;
    assert!(same, "{out}");
    assert_eq!(out, "");

    // A changed prefix: diff names the field; apply replaces only what changed.
    let file = objects_file(&fx, "/headers");
    let (same, out) = ctl(&fx, true, CtlCommand::Diff { file: file.clone() }).await;
    assert!(!same);
    assert_eq!(
        out,
        "~ routes/api\n    path_prefix: \"/bytes/\" -> \"/headers\"\n"
    );
    let (ok, out) = ctl(&fx, true, CtlCommand::Apply { file: file.clone() }).await;
    assert!(ok, "{out}");
    assert!(out.contains("clusters/edge unchanged"), "{out}");
    assert!(out.contains("routes/api configured"), "{out}");
    assert_eq!(x_route(&fx, "/headers").await, "api");
    assert_eq!(x_route(&fx, "/bytes/10").await, "");

    let (_, out) = ctl(
        &fx,
        true,
        CtlCommand::Get {
            kind: "routes".into(),
            name: Some("api".into()),
        },
    )
    .await;
    let got: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got["object"]["path_prefix"], "/headers", "{got}");
    assert_eq!(got["source"], "etcd", "{got}");

    let (ok, out) = ctl(
        &fx,
        true,
        CtlCommand::Watch {
            count: Some(1),
            interval_ms: 50,
        },
    )
    .await;
    assert!(ok);
    assert!(
        out.starts_with("revision ") && out.contains("connected=true"),
        "{out}"
    );

    // An object the gateway refuses: apply says why and fails; the others still apply.
    let bad = fx.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[routes]]\nname = \"bad\"\ncluster = \"edge\"\nrate_limit = { per_second = 0 }\n\n[[routes]]\nname = \"fine\"\npath_prefix = \"/fine/\"\ncluster = \"edge\"\n",
    )
    .unwrap();
    let (ok, out) = ctl(&fx, true, CtlCommand::Apply { file: bad }).await;
    assert!(!ok);
    assert!(out.contains("routes/bad not applied: 400"), "{out}");
    assert!(out.contains("rate_limit.per_second"), "{out}");
    assert!(out.contains("routes/fine created"), "{out}");

    let (ok, out) = ctl(
        &fx,
        true,
        CtlCommand::Delete {
            kind: "routes".into(),
            name: "api".into(),
        },
    )
    .await;
    assert!(ok);
    assert!(out.starts_with("routes/api deleted"), "{out}");
    assert_eq!(x_route(&fx, "/headers").await, "");

    // Without the token, the API refuses and ctl says so.
    let args = CtlArgs {
        admin: format!("http://{}", fx.gw().admin.unwrap()),
        token_file: None,
        command: CtlCommand::Status,
    };
    let e = ctl::run(&args, &mut Vec::new()).await.unwrap_err();
    assert!(e.to_string().starts_with("401"), "{e:#}");
}
