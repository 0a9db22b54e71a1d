//! `rampart ctl`: the operator's tool over a gateway's admin API. Objects are written in the
//! configuration file's own schema (a file of `[[routes]]` and `[[clusters]]` tables, TOML or
//! the same as JSON), so there is one schema, one validator (the gateway's) and one set of
//! error messages.
//!
//! - `get KIND [NAME]`, `status`: what is in force (and what etcd holds but was refused).
//! - `apply -f FILE`: each object created, or replaced at the revision just read (a
//!   concurrent writer makes it fail with a conflict rather than be overwritten); clusters
//!   before routes, since routes name them.
//! - `delete KIND NAME`, `diff -f FILE` (what `apply` would change), `watch` (the applied
//!   revision and refusals as they change).

mod client;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use client::{Answer, Client};
use http::{header, Method};
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The gateway's admin listener.
    #[arg(long, default_value = "http://127.0.0.1:9901")]
    pub admin: String,
    /// A file holding the admin API's bearer token (`[admin] token_file` on the gateway).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Objects of a kind (routes, clusters, listeners), or one of them, as JSON.
    Get { kind: String, name: Option<String> },
    /// Creates or replaces every object of a file of [[routes]] and [[clusters]] tables.
    Apply {
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
    /// Deletes one object.
    Delete { kind: String, name: String },
    /// What `apply -f FILE` would change; exits 1 when something would.
    Diff {
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
    /// The gateway's control-plane status.
    Status,
    /// Prints the applied revision and refusals whenever they change.
    Watch {
        /// Stop after this many lines.
        #[arg(long)]
        count: Option<usize>,
        #[arg(long, default_value = "500")]
        interval_ms: u64,
    },
}

/// Runs one command, writing to `out`; `Ok(false)` when it ran but the answer is "no"
/// (`diff` found differences, `apply` had failures).
pub async fn run(args: &CtlArgs, out: &mut dyn Write) -> anyhow::Result<bool> {
    let token = match &args.token_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("--token-file {}", f.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let api = Client::new(&args.admin, token)?;
    match &args.command {
        CtlCommand::Status => {
            let a = expect_ok(api.get("/status").await?)?;
            writeln!(out, "{}", pretty(&a.body))?;
            Ok(true)
        }
        CtlCommand::Get { kind, name } => {
            let path = match name {
                Some(n) => format!("/config/{kind}/{n}"),
                None => format!("/config/{kind}"),
            };
            let a = expect_ok(api.get(&path).await?)?;
            writeln!(out, "{}", pretty(&a.body))?;
            Ok(true)
        }
        CtlCommand::Delete { kind, name } => {
            let a = api
                .call(Method::DELETE, &format!("/config/{kind}/{name}"), None, &[])
                .await?;
            let a = expect_ok(a)?;
            writeln!(
                out,
                "{kind}/{name} deleted (revision {})",
                a.body["revision"]
            )?;
            Ok(true)
        }
        CtlCommand::Apply { file } => apply(&api, &objects_of(file)?, out).await,
        CtlCommand::Diff { file } => diff(&api, &objects_of(file)?, out).await,
        CtlCommand::Watch { count, interval_ms } => {
            watch(&api, *count, Duration::from_millis(*interval_ms), out).await
        }
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn expect_ok(a: Answer) -> anyhow::Result<Answer> {
    if (200..300).contains(&a.status) {
        Ok(a)
    } else {
        bail!("{} {}", a.status, a.message())
    }
}

/// One object of a file: (kind's plural, name, the object as JSON).
type FileObject = (&'static str, String, Value);

/// The objects of a file of `[[clusters]]`, `[[listeners]]` (name, allow, deny) and `[[routes]]`
/// tables (TOML, or the same as a JSON object), clusters first. Every object needs a `name`: it is its address.
fn objects_of(path: &Path) -> anyhow::Result<Vec<FileObject>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let doc: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?
    } else {
        let t: toml::Table =
            toml::from_str(&text).with_context(|| format!("{}: not TOML", path.display()))?;
        serde_json::to_value(t)?
    };
    let Value::Object(tables) = doc else {
        bail!("{}: a table of [[routes]] and [[clusters]]", path.display());
    };
    let mut objects = Vec::new();
    for key in tables.keys() {
        if !["routes", "clusters", "listeners"].contains(&key.as_str()) {
            bail!(
                "{}: `{key}`: only [[routes]], [[clusters]] and [[listeners]] (their allow and deny) are objects (the rest of the configuration stays in the gateway's file)",
                path.display()
            );
        }
    }
    for kind in ["clusters", "listeners", "routes"] {
        let Some(list) = tables.get(kind) else {
            continue;
        };
        let Some(list) = list.as_array() else {
            bail!(
                "{}: `{kind}`: an array of tables ([[{kind}]])",
                path.display()
            );
        };
        for (i, o) in list.iter().enumerate() {
            let Some(name) = o.get("name").and_then(Value::as_str) else {
                bail!(
                    "{}: {kind}[{i}].name: a name, which addresses the object in the control plane",
                    path.display()
                );
            };
            objects.push((kind, name.to_string(), o.clone()));
        }
    }
    if objects.is_empty() {
        bail!("{}: no [[routes]] or [[clusters]]", path.display());
    }
    Ok(objects)
}

/// What the gateway holds under `kind/name`: none, or (source, revision, object).
async fn current(
    api: &Client,
    kind: &str,
    name: &str,
) -> anyhow::Result<Option<(String, i64, Value)>> {
    let a = api.get(&format!("/config/{kind}/{name}")).await?;
    match a.status {
        404 => Ok(None),
        200 => Ok(Some((
            a.body["source"].as_str().unwrap_or("").to_string(),
            a.body["revision"].as_i64().unwrap_or(0),
            a.body["object"].clone(),
        ))),
        _ => bail!("{kind}/{name}: {} {}", a.status, a.message()),
    }
}

async fn apply(api: &Client, objects: &[FileObject], out: &mut dyn Write) -> anyhow::Result<bool> {
    let mut ok = true;
    for (kind, name, object) in objects {
        let put = |headers: Vec<(header::HeaderName, String)>| {
            let body = object.to_string();
            async move {
                api.call(
                    Method::PUT,
                    &format!("/config/{kind}/{name}"),
                    Some(body),
                    &headers,
                )
                .await
            }
        };
        let outcome = match current(api, kind, name).await? {
            Some((source, _, _)) if source == "file" => Err(
                "defined in the gateway's configuration file, which the control plane does not replace"
                    .to_string(),
            ),
            Some((_, _, now)) if now == *object => Ok("unchanged".to_string()),
            Some((_, revision, _)) => {
                let a = put(vec![(header::IF_MATCH, format!("\"{revision}\""))]).await?;
                match a.status {
                    200 => written("configured", &a),
                    _ => Err(format!("{} {}", a.status, a.message())),
                }
            }
            None => {
                let a = put(vec![]).await?;
                match a.status {
                    201 => written("created", &a),
                    _ => Err(format!("{} {}", a.status, a.message())),
                }
            }
        };
        match outcome {
            Ok(what) => writeln!(out, "{kind}/{name} {what}")?,
            Err(why) => {
                ok = false;
                writeln!(out, "{kind}/{name} not applied: {why}")?;
            }
        }
    }
    Ok(ok)
}

/// A write's outcome: `what` at its revision, or, when the gateway refused to put it in force
/// (written all the same), why.
fn written(what: &str, a: &Answer) -> Result<String, String> {
    if a.body["in_force"] == false {
        return Err(format!(
            "written (revision {}) but refused: {}",
            a.body["revision"], a.body["refused"]["text"]
        ));
    }
    Ok(format!("{what} (revision {})", a.body["revision"]))
}

async fn diff(api: &Client, objects: &[FileObject], out: &mut dyn Write) -> anyhow::Result<bool> {
    let mut same = true;
    for (kind, name, object) in objects {
        match current(api, kind, name).await? {
            None => {
                same = false;
                writeln!(out, "+ {kind}/{name}")?;
            }
            Some((_, _, now)) if now == *object => {}
            Some((_, _, now)) => {
                same = false;
                writeln!(out, "~ {kind}/{name}")?;
                let empty = Map::new();
                let (a, b) = (
                    now.as_object().unwrap_or(&empty),
                    object.as_object().unwrap_or(&empty),
                );
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    match (a.get(k), b.get(k)) {
                        (x, y) if x == y => {}
                        (Some(x), Some(y)) => writeln!(out, "    {k}: {x} -> {y}")?,
                        (Some(x), None) => writeln!(out, "  - {k}: {x}")?,
                        (None, Some(y)) => writeln!(out, "  + {k}: {y}")?,
                        (None, None) => {}
                    }
                }
            }
        }
    }
    Ok(same)
}

async fn watch(
    api: &Client,
    count: Option<usize>,
    every: Duration,
    out: &mut dyn Write,
) -> anyhow::Result<bool> {
    let mut last = Value::Null;
    let mut printed = 0;
    loop {
        let a = expect_ok(api.get("/status").await?)?;
        let c = &a.body["control"];
        let now = serde_json::json!([
            c["applied_revision"],
            c["etcd"]["connected"],
            c["refused"],
            c["objects"]
        ]);
        if now != last {
            let refused: Vec<String> = c["refused"]
                .as_array()
                .map(|r| {
                    r.iter()
                        .map(|e| format!("{} {}: {}", e["key"], e["field"], e["message"]))
                        .collect()
                })
                .unwrap_or_default();
            writeln!(
                out,
                "revision {} connected={} objects={} refused={}{}",
                c["applied_revision"],
                c["etcd"]["connected"],
                c["objects"],
                refused.len(),
                refused
                    .iter()
                    .map(|r| format!("\n  {r}"))
                    .collect::<String>()
            )?;
            out.flush()?;
            last = now;
            printed += 1;
            if count.is_some_and(|n| printed >= n) {
                return Ok(true);
            }
        }
        tokio::time::sleep(every).await;
    }
}
