//! The access log: one JSON line per request, written by a dedicated thread so that event
//! loops never block on the disk.

use serde::Serialize;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
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
}

#[derive(Clone)]
pub struct AccessLog {
    tx: Option<SyncSender<AccessRecord>>,
    dropped: Arc<AtomicU64>,
}

impl AccessLog {
    /// `target`: `stdout`, `off`, or a file path (appended to).
    pub fn open(target: &str) -> std::io::Result<Self> {
        let sink: Box<dyn Write + Send> = match target {
            "off" => {
                return Ok(AccessLog {
                    tx: None,
                    dropped: Default::default(),
                })
            }
            "stdout" => Box::new(std::io::stdout()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        let (tx, rx) = sync_channel::<AccessRecord>(8192);
        std::thread::Builder::new()
            .name("rampart-access-log".into())
            .spawn(move || {
                let mut w = std::io::BufWriter::new(sink);
                while let Ok(rec) = rx.recv() {
                    let _ = serde_json::to_writer(&mut w, &rec);
                    let _ = w.write_all(b"\n");
                    // Drain what is queued, then flush once.
                    while let Ok(rec) = rx.try_recv() {
                        let _ = serde_json::to_writer(&mut w, &rec);
                        let _ = w.write_all(b"\n");
                    }
                    let _ = w.flush();
                }
            })?;
        Ok(AccessLog {
            tx: Some(tx),
            dropped: Default::default(),
        })
    }

    /// Queues a record; if the writer is behind by 8,192 lines the record is dropped and
    /// counted rather than stalling a request.
    pub fn write(&self, rec: AccessRecord) {
        if let Some(tx) = &self.tx {
            if let Err(TrySendError::Full(_)) = tx.try_send(rec) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }
}
