//! A real Redis (Debian's `redis-server`) on a loopback port of its own, without persistence,
//! for the fleet-state tests.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    child: Option<Child>,
    pub port: u16,
}

impl Redis {
    /// Starts one and waits until it answers PING.
    pub fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/install-deps.sh installs it)");
        let r = Redis {
            child: Some(child),
            port,
        };
        let start = Instant::now();
        while r.cli(&["PING"]) != "PONG" {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A `[fleet]` section's line for gateways sharing this Redis.
    pub fn fleet_section(&self) -> String {
        format!("redis = \"{}\"", self.url())
    }

    /// The value at `key` once a gateway has written it (at most 5 s).
    pub async fn wait_for_key(&self, key: &str) -> String {
        for _ in 0..50 {
            let value = self.cli(&["GET", key]);
            if !value.is_empty() {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no gateway wrote {key}");
    }

    /// A command through `redis-cli`; its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Stops it (an outage).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
