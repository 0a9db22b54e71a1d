//! The configuration API, JSON over HTTP on the admin listener:
//!
//! - `GET /status`: where the objects come from, the applied etcd revision, the connection,
//!   and every refused object with its key, field and what was expected.
//! - `GET /config/{routes|clusters|listeners}`, `GET /config/{kind}/{name}`: the objects in
//!   force (the file's and etcd's; a listener's object is its access lists) and etcd's refused
//!   ones. An etcd object's `ETag` is its revision.
//! - `PUT /config/{kind}/{name}` (the object as JSON or TOML, in the file's schema): a create,
//!   or with `If-Match: <revision>` a replace of that revision; `DELETE` the same way. Checked
//!   as the watch checks, then written to etcd with a compare-and-swap: 409 when another
//!   writer got there first. Answered once the change is applied here (at most 2 s), with
//!   whether it went in force (`in_force`; if not, why it was `refused`).
//! - `POST /reload`: the configuration file read again (what SIGHUP does).
//!
//! With `[admin] token_file`, every call needs `Authorization: Bearer <token>` (401 else).

use crate::bootstrap::Applier;
use crate::config::{Config, ConfigError, ListenerAccessConfig, ObjectKind};
use crate::control::store::Expect;
use crate::control::{Plane, WriteError};
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest object document the API takes.
const MAX_BODY: usize = 1 << 20;

/// The API's bearer token, read from its file.
pub struct Token(Vec<u8>);

impl Token {
    pub fn read(path: &Path) -> std::io::Result<Token> {
        let t = std::fs::read_to_string(path)?;
        let t = t.trim();
        if t.len() < 16 {
            return Err(std::io::Error::other(
                "the token must be at least 16 characters",
            ));
        }
        Ok(Token(t.as_bytes().to_vec()))
    }

    /// Whether `header` is `Bearer <token>`, compared in constant time.
    fn admits(&self, header: Option<&header::HeaderValue>) -> bool {
        let Some(given) = header.and_then(|h| h.as_bytes().strip_prefix(b"Bearer ")) else {
            return false;
        };
        let mut diff = (given.len() != self.0.len()) as u8;
        for (i, b) in self.0.iter().enumerate() {
            diff |= b ^ given.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }
}

pub struct Api {
    token: Option<Token>,
    plane: Option<Arc<Plane>>,
    applier: Arc<Applier>,
    config_path: Option<PathBuf>,
}

type Resp = Response<Full<Bytes>>;

fn reply(status: StatusCode, body: Value) -> Resp {
    let mut text = serde_json::to_vec_pretty(&body).unwrap_or_default();
    text.push(b'\n');
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

fn fail(status: StatusCode, message: impl Into<String>) -> Resp {
    reply(status, json!({ "error": { "message": message.into() } }))
}

fn invalid(e: &ConfigError) -> Resp {
    reply(
        StatusCode::BAD_REQUEST,
        json!({ "error": {
            "key": e.file,
            "field": e.path,
            "line": e.line,
            "message": e.message,
            "text": e.to_string(),
        }}),
    )
}

impl Api {
    pub fn new(
        token: Option<Token>,
        plane: Option<Arc<Plane>>,
        applier: Arc<Applier>,
        config_path: Option<PathBuf>,
    ) -> Arc<Api> {
        Arc::new(Api {
            token,
            plane,
            applier,
            config_path,
        })
    }

    /// Whether `req` carries the token (or none is needed).
    pub fn admits<B>(&self, req: &Request<B>) -> bool {
        self.token
            .as_ref()
            .is_none_or(|t| t.admits(req.headers().get(header::AUTHORIZATION)))
    }

    pub async fn handle(&self, req: Request<Incoming>) -> Resp {
        if let Some(t) = &self.token {
            if !t.admits(req.headers().get(header::AUTHORIZATION)) {
                let mut r = fail(
                    StatusCode::UNAUTHORIZED,
                    "a valid Authorization: Bearer token is needed",
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                return r;
            }
        }
        let path = req.uri().path().to_string();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (req.method().clone(), segments.as_slice()) {
            (Method::GET, ["status"]) => self.status(),
            (Method::POST, ["reload"]) => self.reload(),
            (Method::GET, ["config", kind]) => match ObjectKind::from_plural(kind) {
                Some(k) => reply(StatusCode::OK, json!({ "items": self.items(k) })),
                None => unknown_kind(kind),
            },
            (m, ["config", kind, name]) => match ObjectKind::from_plural(kind) {
                None => unknown_kind(kind),
                Some(k) if m == Method::GET => self.get(k, name),
                Some(k) if m == Method::PUT => self.put(k, name, req).await,
                Some(k) if m == Method::DELETE => self.delete(k, name, &req).await,
                Some(_) => fail(StatusCode::METHOD_NOT_ALLOWED, "GET, PUT or DELETE"),
            },
            _ => fail(
                StatusCode::NOT_FOUND,
                "not found: /status, /config/{routes|clusters|listeners|certificates}[/{name}], /reload, /healthz, /metrics",
            ),
        }
    }

    fn status(&self) -> Resp {
        let (routes, clusters) = self
            .applier
            .with_config(|c| (c.routes.len(), c.clusters.len()));
        let control = match &self.plane {
            Some(p) => p.status(),
            None => json!({ "source": "file" }),
        };
        reply(
            StatusCode::OK,
            json!({
                "control": control,
                "in_force": { "routes": routes, "clusters": clusters },
            }),
        )
    }

    fn reload(&self) -> Resp {
        let Some(path) = &self.config_path else {
            return fail(
                StatusCode::NOT_IMPLEMENTED,
                "this gateway was not started from a file",
            );
        };
        let cfg = match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                self.applier.count_reload(false);
                return invalid(&e);
            }
        };
        let done = match &self.plane {
            Some(p) => p.replace_file(cfg),
            None => self.applier.reload(cfg),
        };
        match done {
            Ok(r) => reply(
                StatusCode::OK,
                json!({
                    "clusters_kept": r.clusters_kept,
                    "clusters_built": r.clusters_built,
                    "needs_restart": r.needs_restart,
                }),
            ),
            Err(e) => fail(StatusCode::BAD_REQUEST, format!("{e:#}")),
        }
    }

    /// Every object of `kind`: the file's and, with a control plane, etcd's (those refused
    /// with `in_force: false`).
    fn items(&self, kind: ObjectKind) -> Vec<Value> {
        let etcd = self
            .plane
            .as_ref()
            .map(|p| p.objects(kind))
            .unwrap_or_default();
        let mut items: Vec<Value> = self
            .applier
            .with_config(|c| file_objects(c, kind, None))
            .into_iter()
            .filter(|(name, _)| !etcd.iter().any(|(n, ..)| n == name))
            .map(|(name, object)| file_item(&name, object))
            .collect();
        for (name, revision, doc, live) in etcd {
            items.push(etcd_item(&name, revision, &doc, live));
        }
        items
    }

    fn get(&self, kind: ObjectKind, name: &str) -> Resp {
        let Some(item) = self.item(kind, name) else {
            return fail(
                StatusCode::NOT_FOUND,
                format!("no {} named {name:?}", kind.singular()),
            );
        };
        let mut r = reply(StatusCode::OK, item.clone());
        if let Some(rev) = item["revision"].as_i64() {
            if let Ok(v) = header::HeaderValue::from_str(&format!("\"{rev}\"")) {
                r.headers_mut().insert(header::ETAG, v);
            }
        }
        r
    }

    /// One object, as [`Api::items`] lists it (without listing the others).
    fn item(&self, kind: ObjectKind, name: &str) -> Option<Value> {
        if let Some((revision, doc, live)) = self.plane.as_ref().and_then(|p| p.object(kind, name))
        {
            return Some(etcd_item(name, revision, &doc, live));
        }
        let found = self
            .applier
            .with_config(|c| file_objects(c, kind, Some(name)));
        found
            .into_iter()
            .next()
            .map(|(n, object)| file_item(&n, object))
    }

    async fn put(&self, kind: ObjectKind, name: &str, req: Request<Incoming>) -> Resp {
        let Some(plane) = &self.plane else {
            return no_control_plane();
        };
        let expect = match precondition(&req) {
            Ok(e) => e,
            Err(m) => return fail(StatusCode::BAD_REQUEST, m),
        };
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return fail(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("an object of at most {MAX_BODY} bytes"),
                )
            }
        };
        let Ok(doc) = std::str::from_utf8(&body) else {
            return fail(
                StatusCode::BAD_REQUEST,
                "the object must be UTF-8 JSON or TOML",
            );
        };
        let created = expect.unwrap_or(Expect::Absent) == Expect::Absent;
        match plane
            .put(kind, name, doc, expect.unwrap_or(Expect::Absent))
            .await
        {
            // Written; whether it went in force here (a certificate whose key does not match
            // its chain, say, is refused only when built) is said too.
            Ok(revision) => reply(
                if created {
                    StatusCode::CREATED
                } else {
                    StatusCode::OK
                },
                match plane.refusal(kind, name) {
                    None => json!({ "name": name, "revision": revision, "in_force": true }),
                    Some(e) => json!({
                        "name": name,
                        "revision": revision,
                        "in_force": false,
                        "refused": { "field": e.path, "message": e.message, "text": e.to_string() },
                    }),
                },
            ),
            Err(e) => write_error(e),
        }
    }

    async fn delete(&self, kind: ObjectKind, name: &str, req: &Request<Incoming>) -> Resp {
        let Some(plane) = &self.plane else {
            return no_control_plane();
        };
        let expect = match precondition(req) {
            Ok(Some(Expect::Revision(r))) => Some(r),
            Ok(_) => None,
            Err(m) => return fail(StatusCode::BAD_REQUEST, m),
        };
        match plane.delete(kind, name, expect).await {
            Ok(revision) => reply(
                StatusCode::OK,
                json!({ "name": name, "revision": revision }),
            ),
            Err(e) => write_error(e),
        }
    }
}

/// The write's precondition: `If-Match: <revision>` (quoted or not) to replace that revision,
/// `If-None-Match: *` (or nothing) to create.
fn precondition<B>(req: &Request<B>) -> Result<Option<Expect>, &'static str> {
    if let Some(v) = req.headers().get(header::IF_MATCH) {
        let rev = v
            .to_str()
            .ok()
            .map(|s| s.trim().trim_matches('"'))
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|r| *r > 0);
        return match rev {
            Some(r) => Ok(Some(Expect::Revision(r))),
            None => Err("If-Match: the object's revision (its ETag), a positive integer"),
        };
    }
    match req.headers().get(header::IF_NONE_MATCH) {
        Some(v) if v != "*" => Err("If-None-Match: *"),
        _ => Ok(None),
    }
}

fn write_error(e: WriteError) -> Resp {
    match e {
        WriteError::Invalid(e) => invalid(&e),
        WriteError::Conflict(m) => fail(StatusCode::CONFLICT, m),
        WriteError::NotFound => fail(StatusCode::NOT_FOUND, "no such object in etcd"),
        WriteError::Unavailable(m) => fail(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("etcd is unreachable, nothing written (the configuration in force stays): {m}"),
        ),
    }
}

fn no_control_plane() -> Resp {
    fail(
        StatusCode::SERVICE_UNAVAILABLE,
        "this gateway has no control plane ([control] etcd): change its file and POST /reload",
    )
}

fn unknown_kind(kind: &str) -> Resp {
    fail(
        StatusCode::NOT_FOUND,
        format!("no object kind {kind:?}: routes, clusters, listeners or certificates"),
    )
}

/// The objects of `kind` in force from `cfg` (a listener's: its access lists), by name; with
/// `only`, just that one (the others not serialized).
fn file_objects(cfg: &Config, kind: ObjectKind, only: Option<&str>) -> Vec<(String, Value)> {
    let wanted = |name: &str| only.is_none_or(|o| o == name);
    let as_json = |v: Result<Value, serde_json::Error>| v.unwrap_or(Value::Null);
    match kind {
        // The file's certificates are its listeners' (files, no names): not objects.
        ObjectKind::Certificate => Vec::new(),
        ObjectKind::Route => cfg
            .routes
            .iter()
            .map(|r| (r.effective_name(), r))
            .filter(|(n, _)| wanted(n))
            .map(|(n, r)| (n, as_json(serde_json::to_value(r))))
            .collect(),
        ObjectKind::Cluster => cfg
            .clusters
            .iter()
            .filter(|c| wanted(&c.name))
            .map(|c| (c.name.clone(), as_json(serde_json::to_value(c))))
            .collect(),
        ObjectKind::Listener => cfg
            .listeners
            .iter()
            .filter(|l| wanted(&l.name))
            .map(|l| {
                let access = ListenerAccessConfig {
                    name: Some(l.name.clone()),
                    allow: l.allow.clone(),
                    deny: l.deny.clone(),
                };
                (l.name.clone(), as_json(serde_json::to_value(access)))
            })
            .collect(),
    }
}

fn file_item(name: &str, object: Value) -> Value {
    json!({ "name": name, "source": "file", "in_force": true, "object": object })
}

fn etcd_item(name: &str, revision: i64, doc: &str, live: bool) -> Value {
    json!({
        "name": name,
        "source": "etcd",
        "revision": revision,
        "in_force": live,
        "object": document_value(doc),
    })
}

/// An object's document as JSON (a TOML one converted; one that parses as neither, as text).
fn document_value(doc: &str) -> Value {
    if doc.trim_start().starts_with('{') {
        if let Ok(v) = serde_json::from_str::<Value>(doc) {
            return v;
        }
    } else if let Ok(v) = toml::from_str::<toml::Table>(doc) {
        if let Ok(v) = serde_json::to_value(v) {
            return v;
        }
    }
    Value::String(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_checked_whole() {
        let t = Token(b"0123456789abcdef".to_vec());
        let h = |s: &str| header::HeaderValue::from_str(s).unwrap();
        assert!(t.admits(Some(&h("Bearer 0123456789abcdef"))));
        for wrong in [
            "Bearer 0123456789abcde",
            "Bearer 0123456789abcdefg",
            "Bearer 0123456789abcdeF",
            "bearer 0123456789abcdef",
            "0123456789abcdef",
        ] {
            assert!(!t.admits(Some(&h(wrong))), "{wrong}");
        }
        assert!(!t.admits(None));
    }

    #[test]
    fn preconditions_pick_create_or_replace() {
        let req = |name: &str, v: &str| Request::builder().header(name, v).body(()).unwrap();
        assert_eq!(precondition(&Request::new(())).ok(), Some(None));
        assert_eq!(
            precondition(&req("if-match", "\"42\"")).ok(),
            Some(Some(Expect::Revision(42)))
        );
        assert_eq!(precondition(&req("if-none-match", "*")).ok(), Some(None));
        assert!(precondition(&req("if-match", "soon")).is_err());
        assert!(precondition(&req("if-match", "0")).is_err());
    }
}
