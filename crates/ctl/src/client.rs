//! A small client of the admin API: one HTTP/1.1 request per connection, JSON answers.

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::time::Duration;

pub struct Client {
    /// `host:port` of the admin listener.
    authority: String,
    token: Option<String>,
}

/// An answer: its status and JSON body (a string when the body is not JSON).
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    /// The API's error message, else the body.
    pub fn message(&self) -> String {
        match self.body["error"]["text"]
            .as_str()
            .or(self.body["error"]["message"].as_str())
        {
            Some(m) => m.to_string(),
            None => self.body.to_string(),
        }
    }
}

impl Client {
    /// `admin` is `http://host:port` (or `host:port`).
    pub fn new(admin: &str, token: Option<String>) -> anyhow::Result<Client> {
        let authority = admin
            .strip_prefix("http://")
            .unwrap_or(admin)
            .trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') || admin.starts_with("https://") {
            bail!("--admin: http://host:port of the gateway's admin listener, not {admin:?}");
        }
        Ok(Client {
            authority: authority.to_string(),
            token,
        })
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<String>,
        headers: &[(header::HeaderName, String)],
    ) -> anyhow::Result<Answer> {
        let io = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(&self.authority),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no connection within 5 s"))
        .and_then(|r| r.map_err(Into::into))
        .with_context(|| format!("cannot reach the admin listener at {}", self.authority))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        tokio::spawn(conn);
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.authority);
        if let Some(t) = &self.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        for (n, v) in headers {
            req = req.header(n, v);
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = tokio::time::timeout(Duration::from_secs(30), send.send_request(req))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within 30 s"))??;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok(Answer { status, body })
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Answer> {
        self.call(Method::GET, path, None, &[]).await
    }
}
