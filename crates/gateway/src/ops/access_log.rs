//! The access log: one JSON line per request, written by a dedicated thread so that event
//! loops never block on the disk.

use serde::Serialize;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

#[derive(Debug, Serialize, Default, Clone)]
pub struct AccessRecord {
    pub time: String,
    pub request_id: String,
    pub client: Option<SocketAddr>,
    pub listener: String,
    pub protocol: &'static str,
    pub tls_version: &'static str,
    pub tls_resumed: bool,
    /// The request arrived in 0-RTT early data.
    pub early_data: bool,
    pub sni: Option<String>,
    pub method: String,
    pub host: String,
    pub path: String,
    pub route: Option<String>,
    /// The cluster the request went to (the route's, or the one its split or a cohort chose).
    pub cluster: Option<String>,
    pub upstream: Option<SocketAddr>,
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub upstream_ms: Option<f64>,
    pub duration_ms: f64,
    /// How the response body ended: `complete`, `upstream_error` (the upstream's body failed
    /// midway; the client saw an error, not a short body) or `abandoned` (the client left or
    /// cancelled first).
    pub response_end: &'static str,
    /// Whose fault a failed request was (`client`, `upstream` or `gateway`); absent when the
    /// request did not fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<&'static str>,
    /// What the route's WAF did: `inspected`, `partial` (the body past `waf.body_limit`
    /// uninspected), `blocked`, `unavailable` (not inspected: overloaded or failed) or
    /// `response_blocked` / `response_unavailable` (`waf.response_headers`: the upstream's
    /// answer withheld / passed uninspected), `response_partial` / `response_encoded`
    /// (`waf.response_body`: the body past `response_body_limit` uninspected / content-coded,
    /// not read); absent on routes without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waf: Option<&'static str>,
    /// The request's W3C trace id (its `traceparent`'s, or the one `[tracing]` started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

#[derive(Clone)]
pub struct AccessLog {
    tx: Option<SyncSender<Entry>>,
    dropped: Arc<AtomicU64>,
    /// Set by [`AccessLog::reopen`] for a file log; the writer reopens before its next write.
    reopen: Option<Arc<AtomicBool>>,
}

/// What the writer thread receives: a record, or a wake-up to reopen the file.
enum Entry {
    Record(Box<AccessRecord>),
    Reopen,
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl AccessLog {
    /// `target`: `stdout`, `off`, or a file path (appended to).
    pub fn open(target: &str) -> std::io::Result<Self> {
        let (sink, path): (Box<dyn Write + Send>, Option<PathBuf>) = match target {
            "off" => {
                return Ok(AccessLog {
                    tx: None,
                    dropped: Default::default(),
                    reopen: None,
                })
            }
            "stdout" => (Box::new(std::io::stdout()), None),
            path => (Box::new(open_append(Path::new(path))?), Some(path.into())),
        };
        let reopen = path.as_ref().map(|_| Arc::new(AtomicBool::new(false)));
        let (tx, rx) = sync_channel::<Entry>(8192);
        let flag = reopen.clone();
        std::thread::Builder::new()
            .name("rampart-access-log".into())
            .spawn(move || {
                let mut w = std::io::BufWriter::new(sink);
                let write = |w: &mut std::io::BufWriter<Box<dyn Write + Send>>, e: Entry| {
                    if let Entry::Record(rec) = e {
                        let _ = serde_json::to_writer(&mut *w, &rec);
                        let _ = w.write_all(b"\n");
                    }
                };
                while let Ok(first) = rx.recv() {
                    if let (Some(flag), Some(path)) = (&flag, &path) {
                        if flag.swap(false, Ordering::AcqRel) {
                            let _ = w.flush();
                            match open_append(path) {
                                Ok(f) => w = std::io::BufWriter::new(Box::new(f)),
                                Err(e) => tracing::error!(path = %path.display(), error = %e,
                                    "access log: cannot reopen; still writing to the file open before"),
                            }
                        }
                    }
                    write(&mut w, first);
                    // Drain what is queued, then flush once.
                    while let Ok(e) = rx.try_recv() {
                        write(&mut w, e);
                    }
                    let _ = w.flush();
                }
            })?;
        Ok(AccessLog {
            tx: Some(tx),
            dropped: Default::default(),
            reopen,
        })
    }

    /// Reopens a file log by its path (after logrotate renamed it; nginx's SIGUSR1): the
    /// writer flushes what it holds to the file open before, then writes every later line to
    /// the file at the path, created if missing (lines queued around the call land in one file
    /// or the other; none is lost). Returns false for `stdout` or `off`.
    pub fn reopen(&self) -> bool {
        let (Some(flag), Some(tx)) = (&self.reopen, &self.tx) else {
            return false;
        };
        flag.store(true, Ordering::Release);
        // Wakes an idle writer; with a full queue the flag is seen at the next record.
        let _ = tx.try_send(Entry::Reopen);
        true
    }

    /// Queues a record; if the writer is behind by 8,192 lines the record is dropped and
    /// counted rather than stalling a request.
    pub fn write(&self, rec: AccessRecord) {
        if let Some(tx) = &self.tx {
            if let Err(TrySendError::Full(_)) = tx.try_send(Entry::Record(Box::new(rec))) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }
}
