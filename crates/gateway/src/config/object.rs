//! Control-plane objects: one route, one cluster, one listener's access lists or one
//! certificate as a document of its own, in the config file's schema (the fields of one
//! `[[routes]]` or `[[clusters]]` table, the `allow` and `deny` of one `[[listeners]]` table,
//! or a certificate whose chain is in the document and whose key stays a file on the node),
//! as TOML or JSON. Each is
//! parsed and checked alone, with the same messages as the file; whether a route's cluster or
//! the listener exists is checked when the objects are put together with the file's.

use super::file::parse_toml;
use super::{
    valid_server_name, At, CertKeyPair, CertificateConfig, ClusterConfig, ConfigError, RouteConfig,
};
use crate::policy::access::Cidr;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What an object is; its plural is its key's folder (`routes/api`) and its table's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Certificate,
    Cluster,
    Listener,
    Route,
}

impl ObjectKind {
    /// Clusters first: routes name them.
    pub const ALL: [ObjectKind; 4] = [
        ObjectKind::Certificate,
        ObjectKind::Cluster,
        ObjectKind::Listener,
        ObjectKind::Route,
    ];

    pub fn plural(self) -> &'static str {
        match self {
            ObjectKind::Certificate => "certificates",
            ObjectKind::Cluster => "clusters",
            ObjectKind::Listener => "listeners",
            ObjectKind::Route => "routes",
        }
    }

    pub fn singular(self) -> &'static str {
        match self {
            ObjectKind::Certificate => "certificate",
            ObjectKind::Cluster => "cluster",
            ObjectKind::Listener => "listener",
            ObjectKind::Route => "route",
        }
    }

    pub fn from_plural(s: &str) -> Option<ObjectKind> {
        ObjectKind::ALL.into_iter().find(|k| k.plural() == s)
    }
}

/// One parsed and checked object.
#[derive(Clone, Debug)]
pub enum Object {
    /// A certificate added to a listener of the file.
    Certificate(CertificateObject),
    Cluster(Box<ClusterConfig>),
    /// The access lists of the file's listener of the object's name, in place of the file's.
    Listener(ListenerAccessConfig),
    Route(Box<RouteConfig>),
}

impl Object {
    pub fn kind(&self) -> ObjectKind {
        match self {
            Object::Certificate(_) => ObjectKind::Certificate,
            Object::Cluster(_) => ObjectKind::Cluster,
            Object::Listener(_) => ObjectKind::Listener,
            Object::Route(_) => ObjectKind::Route,
        }
    }
}

/// A listener's `allow` and `deny` (for connections, TCP and QUIC), as an object: an incident's
/// address range shut out on every gateway at once.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerAccessConfig {
    /// The listener's name (the object's, if given).
    pub name: Option<String>,
    #[serde(default)]
    pub allow: Vec<Cidr>,
    #[serde(default)]
    pub deny: Vec<Cidr>,
}

/// A certificate as an object: its chain in the document, its private key a file on the
/// gateway's node (or, with the `remote` engine, on key servers). Private keys are never kept
/// in etcd.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CertificateObject {
    /// The file's listener that serves it.
    pub listener: String,
    /// Names it serves (exact, or `*.example.com`).
    pub server_names: Vec<String>,
    pub rsa: Option<ChainAndKey>,
    pub ecdsa: Option<ChainAndKey>,
    /// Client certificates for these names (`none`, `optional`, `required`), in place of the
    /// listener's `tls.client_auth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<super::ClientAuth>,
    /// The CAs (PEM) client certificates for these names must chain to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca: Option<String>,
    /// Revoked client certificates (a PEM CRL) for these names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_crl: Option<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChainAndKey {
    /// The PEM certificate chain, leaf first.
    pub chain: String,
    /// The PEM private key's file on the gateway's node.
    pub key: Option<std::path::PathBuf>,
    /// Staple the OCSP response fetched from the certificate's responder.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ocsp_fetch: bool,
}

impl CertificateObject {
    fn validate(&mut self, at: &At, base: &Path) -> Result<(), super::Invalid> {
        if self.server_names.is_empty() {
            return at.field("server_names").fail("at least one server name");
        }
        for (k, n) in self.server_names.iter().enumerate() {
            if !valid_server_name(n) {
                return at
                    .field("server_names")
                    .index(k)
                    .fail(format!("{n:?} is not a DNS name or *.wildcard"));
            }
        }
        if self.rsa.is_none() && self.ecdsa.is_none() {
            return at.fail("an `rsa` or an `ecdsa` certificate (or both)");
        }
        for (field, pem, tag, what) in [
            (
                "client_ca",
                &self.client_ca,
                "CERTIFICATE",
                "PEM CA certificates (-----BEGIN CERTIFICATE-----)",
            ),
            (
                "client_crl",
                &self.client_crl,
                "X509 CRL",
                "a PEM CRL (-----BEGIN X509 CRL-----)",
            ),
        ] {
            let Some(pem) = pem else { continue };
            let blocks = pem::parse_many(pem.as_bytes()).unwrap_or_default();
            if blocks.is_empty() || blocks.iter().any(|b| b.tag() != tag) {
                return at.field(field).fail(what);
            }
        }
        for (kind, pair) in [("rsa", &mut self.rsa), ("ecdsa", &mut self.ecdsa)] {
            let Some(pair) = pair else { continue };
            let at = at.field(kind);
            let certs = pem::parse_many(pair.chain.as_bytes()).unwrap_or_default();
            if certs.is_empty() || certs.iter().any(|c| c.tag() != "CERTIFICATE") {
                return at
                    .field("chain")
                    .fail("a PEM certificate chain (-----BEGIN CERTIFICATE-----), leaf first");
            }
            if let Some(key) = &mut pair.key {
                if key.to_string_lossy().contains("-----BEGIN") {
                    return at.field("key").fail(
                        "the path of a key file on the gateway's node: private keys are not kept in etcd",
                    );
                }
                *key = base.join(&*key);
                at.field("key").file_exists(key)?;
            }
        }
        Ok(())
    }

    /// The listener's certificate entry, its chains (and client CA and CRL) read from the
    /// files `chain_file` names (which the control plane writes from the document).
    pub fn to_config(
        &self,
        mut chain_file: impl FnMut(&str, &str) -> std::path::PathBuf,
    ) -> CertificateConfig {
        let mut pair = |kind: &str, p: &Option<ChainAndKey>| {
            p.as_ref().map(|p| CertKeyPair {
                cert: chain_file(kind, &p.chain),
                key: p.key.clone(),
                ocsp_response: None,
                ocsp_fetch: p.ocsp_fetch,
            })
        };
        let rsa = pair("rsa", &self.rsa);
        let ecdsa = pair("ecdsa", &self.ecdsa);
        let client_ca = self.client_ca.as_ref().map(|p| chain_file("client-ca", p));
        let client_crl = self
            .client_crl
            .as_ref()
            .map(|p| chain_file("client-crl", p));
        CertificateConfig {
            server_names: self.server_names.clone(),
            rsa,
            ecdsa,
            client_auth: self.client_auth,
            client_ca,
            client_crl,
        }
    }
}

/// Whether `name` can name an object (and be the last segment of its key).
pub fn valid_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Parses and checks one object's document: JSON when it starts with `{`, else TOML.
/// `name` is the object's name (its key's last segment): the document's own `name`, if it
/// has one, must be the same, and a route without one takes it. Errors name `source` (the
/// object's key), the field path within the document and what was expected; relative file
/// paths resolve against `base` (the configuration file's folder).
pub fn parse_object(
    kind: ObjectKind,
    name: &str,
    doc: &str,
    source: &str,
    base: &Path,
) -> Result<Object, ConfigError> {
    let fail = |path: &str, message: String| ConfigError::at(source, path, message);
    if !valid_object_name(name) {
        return Err(fail(
            "",
            format!("{name:?} is not an object name (1-128 of A-Z a-z 0-9 . _ -)"),
        ));
    }
    let mut object = match kind {
        ObjectKind::Certificate => Object::Certificate(parse_doc(doc, source)?),
        ObjectKind::Cluster => Object::Cluster(Box::new(parse_doc(doc, source)?)),
        ObjectKind::Listener => Object::Listener(parse_doc(doc, source)?),
        ObjectKind::Route => Object::Route(Box::new(parse_doc(doc, source)?)),
    };
    let at = At::root("");
    let checked = match &mut object {
        Object::Certificate(c) => c.validate(&at, base),
        Object::Cluster(c) => {
            if c.name != name {
                return Err(fail(
                    "name",
                    format!("{name:?}, the name in the object's key, not {:?}", c.name),
                ));
            }
            c.resolve_paths(base);
            c.validate(&at)
        }
        Object::Listener(l) => match &l.name {
            Some(n) if n != name => {
                return Err(fail(
                    "name",
                    format!("{name:?}, the name in the object's key, not {n:?}"),
                ))
            }
            _ => {
                l.name = Some(name.into());
                Ok(())
            }
        },
        Object::Route(r) => {
            match &r.name {
                Some(n) if n != name => {
                    return Err(fail(
                        "name",
                        format!("{name:?}, the name in the object's key, not {n:?}"),
                    ))
                }
                _ => r.name = Some(name.into()),
            }
            r.validate_fields(&at)
        }
    };
    checked.map_err(|(path, message)| fail(&path, message))?;
    Ok(object)
}

/// A document as `T`, TOML or JSON, its errors with the field path (and line).
fn parse_doc<T: serde::de::DeserializeOwned>(doc: &str, source: &str) -> Result<T, ConfigError> {
    if !doc.trim_start().starts_with('{') {
        return parse_toml(doc, source);
    }
    let mut de = serde_json::Deserializer::from_str(doc);
    let parsed: T = serde_path_to_error::deserialize(&mut de).map_err(|e| ConfigError {
        file: source.into(),
        path: match e.path().to_string() {
            p if p == "." => String::new(),
            p => p,
        },
        line: Some(e.inner().line()),
        message: e.inner().to_string(),
    })?;
    de.end().map_err(|e| ConfigError {
        file: source.into(),
        path: String::new(),
        line: Some(e.line()),
        message: format!("one JSON object: {e}"),
    })?;
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(kind: ObjectKind, name: &str, doc: &str) -> Result<Object, ConfigError> {
        parse_object(kind, name, doc, "/rampart/x", Path::new("/etc/rampart"))
    }

    #[test]
    fn a_route_in_toml_or_json_takes_its_name_from_the_key() {
        for doc in [
            "host = \"api.example\"\ncluster = \"app\"",
            r#"{"host": "api.example", "cluster": "app"}"#,
        ] {
            let Ok(Object::Route(r)) = parse(ObjectKind::Route, "api", doc) else {
                panic!("{doc}")
            };
            assert_eq!(
                (r.name.as_deref(), r.cluster.as_str()),
                (Some("api"), "app")
            );
        }
    }

    #[test]
    fn errors_name_the_key_the_field_and_what_was_expected() {
        let e = parse(
            ObjectKind::Route,
            "api",
            r#"{"cluster": "app", "colour": 1}"#,
        )
        .unwrap_err();
        assert_eq!((e.file.as_str(), e.path.as_str()), ("/rampart/x", "colour"));
        assert!(e.message.contains("unknown field"), "{e}");
        let e = parse(
            ObjectKind::Route,
            "api",
            r#"{"cluster": "app", "rate_limit": {"per_second": 0}}"#,
        )
        .unwrap_err();
        assert_eq!(e.path, "rate_limit.per_second");
        assert_eq!(
            e.to_string(),
            "/rampart/x: field `rate_limit.per_second`: a number of requests greater than zero"
        );
        let e = parse(ObjectKind::Cluster, "app", "name = \"app\"\nendpoints = []").unwrap_err();
        assert_eq!(e.path, "endpoints");
        let e = parse(
            ObjectKind::Cluster,
            "app",
            r#"{"name": "other", "endpoints": []}"#,
        )
        .unwrap_err();
        assert_eq!(e.path, "name");
        let e = parse(ObjectKind::Route, "api", "{\"cluster\": ").unwrap_err();
        assert!(e.line.is_some(), "{e}");
        let e = parse(ObjectKind::Route, "a/b", "cluster = \"app\"").unwrap_err();
        assert!(e.message.contains("not an object name"), "{e}");
    }
}
