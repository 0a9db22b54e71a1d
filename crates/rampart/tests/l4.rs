//! `rampart l4` in front of three gateways, every node in its own network namespace on one
//! bridged link (veth pairs), the client in its own: a 50 MB HTTP/3 download (aioquic, an
//! independent client) whose client moves to another address mid-transfer completes on the
//! gateway it began on when the balancer routes by QUIC-LB server ID, and does not when it
//! routes by the client's address and port as a plain UDP balancer does.
//!
//! Needs root (network namespaces, and the balancer's packet socket).

use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VIP: &str = "10.77.1.1";
const L4_ADDR: &str = "10.77.0.2";
const CLIENT_ADDR: &str = "10.77.0.10";
/// The address the client moves to mid-transfer (its "Wi-Fi").
const CLIENT_NEW_ADDR: &str = "10.77.0.11";
const GATEWAYS: [&str; 3] = ["10.77.0.21", "10.77.0.22", "10.77.0.23"];
const DOWNLOAD: usize = 50 << 20;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {} (this test needs root and network namespaces)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces, bridge and processes of one test; all removed on drop.
struct Fleet {
    tag: String,
    dir: tempfile::TempDir,
    children: Vec<Child>,
}

impl Fleet {
    fn ns(&self, node: &str) -> String {
        format!("{}-{node}", self.tag)
    }

    /// A bridge in a namespace of its own, and every node's `eth0` plugged into it.
    fn new(tag: &str) -> Fleet {
        let fleet = Fleet {
            tag: format!("rl4{}{tag}", std::process::id() % 100_000),
            dir: tempfile::tempdir().unwrap(),
            children: Vec::new(),
        };
        let sw = fleet.ns("sw");
        ip(&["netns", "add", &sw]);
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        let mut nodes = vec![("client", CLIENT_ADDR), ("l4", L4_ADDR)];
        for (i, g) in GATEWAYS.iter().enumerate() {
            nodes.push((["gw1", "gw2", "gw3"][i], g));
        }
        for (node, addr) in nodes {
            let ns = fleet.ns(node);
            let port = format!("p-{node}");
            ip(&["netns", "add", &ns]);
            ip(&[
                "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ]);
            fleet.sysctl(
                node,
                &[
                    "net.ipv4.conf.all.rp_filter=0",
                    "net.ipv4.conf.eth0.rp_filter=0",
                ],
            );
        }
        // The client reaches the VIP through the balancer; it has a second address to move to.
        ip(&[
            "-n",
            &fleet.ns("client"),
            "addr",
            "add",
            &format!("{CLIENT_NEW_ADDR}/24"),
            "dev",
            "eth0",
        ]);
        ip(&[
            "-n",
            &fleet.ns("client"),
            "route",
            "add",
            &format!("{VIP}/32"),
            "via",
            L4_ADDR,
        ]);
        // The balancer and every gateway own the VIP; the gateways never answer ARP for it.
        ip(&[
            "-n",
            &fleet.ns("l4"),
            "addr",
            "add",
            &format!("{VIP}/32"),
            "dev",
            "lo",
        ]);
        for g in ["gw1", "gw2", "gw3"] {
            ip(&[
                "-n",
                &fleet.ns(g),
                "addr",
                "add",
                &format!("{VIP}/32"),
                "dev",
                "lo",
            ]);
            fleet.sysctl(
                g,
                &[
                    "net.ipv4.conf.all.arp_ignore=1",
                    "net.ipv4.conf.all.arp_announce=2",
                ],
            );
        }
        fleet
    }

    fn sysctl(&self, node: &str, settings: &[&str]) {
        ip(&[
            &["netns", "exec", &self.ns(node), "sysctl", "-qw"][..],
            settings,
        ]
        .concat());
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `rampart ARGS` in `node`'s namespace, its stderr to `<name>.log`.
    fn spawn(&mut self, node: &str, name: &str, args: &[&str]) {
        let log = std::fs::File::create(self.path(&format!("{name}.log"))).unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns(node),
                env!("CARGO_BIN_EXE_rampart"),
            ])
            .args(args)
            .env("RAMPART_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(child);
    }

    /// A command's stdout in `node`'s namespace.
    fn exec(&self, node: &str, cmd: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns(node)])
            .args(cmd)
            .output()
            .unwrap()
    }

    /// `/metrics` of the admin listener on 127.0.0.1:`port` in `node`, once it answers.
    fn metrics(&self, node: &str, port: u16) -> String {
        let url = format!("http://127.0.0.1:{port}/metrics");
        let out = self.exec(node, &["curl", "-sS", "--max-time", "5", &url]);
        assert!(
            out.status.success(),
            "scrape {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn wait_for(&self, what: &str, mut ok: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ok() {
            if Instant::now() > deadline {
                let logs: Vec<String> = std::fs::read_dir(self.dir.path())
                    .unwrap()
                    .filter_map(|e| {
                        let p = e.ok()?.path();
                        (p.extension()? == "log").then(|| {
                            format!(
                                "--- {}\n{}",
                                p.display(),
                                std::fs::read_to_string(&p).unwrap_or_default()
                            )
                        })
                    })
                    .collect();
                panic!("{what} never happened\n{}", logs.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Three gateways (each with its own upstream) and the balancer, `routing` as given.
    fn start(&mut self, routing: &str) -> String {
        let d = self.dir.path().to_path_buf();
        gateway::demo::ensure_self_signed(
            &d,
            "site",
            gateway::demo::CertKind::EcdsaP256,
            &["localhost"],
        )
        .unwrap();
        for (i, g) in ["gw1", "gw2", "gw3"].iter().enumerate() {
            self.spawn(
                g,
                &format!("{g}-upstream"),
                &["upstream", "--listen", "127.0.0.1:8080"],
            );
            let cfg = self.path(&format!("{g}.toml"));
            std::fs::write(&cfg, gateway_config(&d, i + 1)).unwrap();
            self.spawn(g, g, &["run", "--config", cfg.to_str().unwrap()]);
        }
        for g in ["gw1", "gw2", "gw3"] {
            self.wait_for(&format!("{g} ready"), || {
                self.exec(g, &["curl", "-sf", "http://127.0.0.1:9901/healthz"])
                    .status
                    .success()
            });
        }
        let text = l4_config(routing);
        let cfg = self.path("l4.toml");
        std::fs::write(&cfg, &text).unwrap();
        self.spawn("l4", "l4", &["l4", "--config", cfg.to_str().unwrap()]);
        self.wait_for("every gateway up at the balancer", || {
            let out = self.exec("l4", &["curl", "-sf", "http://127.0.0.1:9903/metrics"]);
            let m = String::from_utf8_lossy(&out.stdout);
            out.status.success() && metric_sum(&m, "rampart_l4_backend_up", &[]) == 3.0
        });
        text
    }

    /// The HTTP/3 download from the client's namespace: starts from `CLIENT_ADDR:port`, moves
    /// to `CLIENT_NEW_ADDR:new_port` after 10 MB. The client's JSON line, or its failure.
    fn download(&self, port: u16, new_port: u16) -> (bool, serde_json::Value, String) {
        let client = concat!(env!("CARGO_MANIFEST_DIR"), "/../gateway/tests/h3_client.py");
        let out = self.exec(
            "client",
            &[
                "timeout",
                "90",
                "python3",
                client,
                "--server",
                VIP,
                "--port",
                "443",
                "--local-port",
                &port.to_string(),
                "--path",
                &format!("/bytes/{DOWNLOAD}"),
                "--migrate-after-bytes",
                &(10usize << 20).to_string(),
                "--migrate-bind",
                &format!("{CLIENT_NEW_ADDR}:{new_port}"),
                "--idle-timeout",
                "5",
                "--timeout",
                "60",
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().last().unwrap_or("{}");
        let v = serde_json::from_str(line).unwrap_or(serde_json::Value::Null);
        (
            out.status.success(),
            v,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn access_log(&self, gw: &str) -> String {
        std::fs::read_to_string(self.path(&format!("{gw}-access.log"))).unwrap_or_default()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for node in ["client", "l4", "gw1", "gw2", "gw3", "sw"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(node)])
                .status();
        }
    }
}

fn gateway_config(dir: &Path, n: usize) -> String {
    format!(
        r#"
[server]
access_log = "{log}"
worker_threads = 1
[admin]
listen = "127.0.0.1:9901"
[[listeners]]
name = "https"
listen = "0.0.0.0:443"
[listeners.quic]
enabled = true
retry = "never"
direct_server_return = true
[listeners.quic.lb]
server_id = "0{n}"
nonce_len = 8
key = "{LB_KEY}"
[[listeners.certificates]]
server_names = ["localhost"]
ecdsa = {{ cert = "{dir}/site.crt", key = "{dir}/site.key" }}
[[routes]]
cluster = "local"
[[clusters]]
name = "local"
endpoints = ["127.0.0.1:8080"]
"#,
        log = dir.join(format!("gw{n}-access.log")).display(),
        dir = dir.display(),
    )
}

const LB_KEY: &str = "8f95f09245765f80256934e50c66207f";

fn l4_config(routing: &str) -> String {
    format!(
        r#"
[l4]
listen = "{VIP}:443"
workers = 1
routing = "{routing}"
[l4.lb]
nonce_len = 8
key = "{LB_KEY}"
[[l4.backends]]
server_id = "01"
address = "{}"
[[l4.backends]]
server_id = "02"
address = "{}"
[[l4.backends]]
server_id = "03"
address = "{}"
[l4.health]
interval = "200ms"
timeout = "150ms"
[admin]
listen = "127.0.0.1:9903"
"#,
        GATEWAYS[0], GATEWAYS[1], GATEWAYS[2]
    )
}

/// The sum of a metric's samples whose labels contain every one of `labels`.
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Datagrams the balancer forwarded to each gateway, in order.
fn forwarded(m: &str) -> Vec<f64> {
    GATEWAYS
        .iter()
        .map(|g| metric_sum(m, "rampart_l4_datagrams_total", &[&format!("@{g}\"")]))
        .collect()
}

/// Client ports such that a balancer hashing addresses and ports sends the client's packets
/// from before and after the move to different gateways.
fn ports_that_split(cfg: &str) -> (u16, u16) {
    let c = l4::L4Config::parse(cfg, "l4.toml").unwrap();
    let (_, backends) = c.build().unwrap();
    let before: SocketAddrV4 = format!("{CLIENT_ADDR}:40000").parse().unwrap();
    let first = l4::route::four_tuple_choice(&backends, before);
    let new_port = (40001..41000)
        .find(|&p| {
            let after = SocketAddrV4::new(CLIENT_NEW_ADDR.parse().unwrap(), p);
            l4::route::four_tuple_choice(&backends, after) != first
        })
        .unwrap();
    (40000, new_port)
}

#[test]
fn a_client_that_moves_keeps_its_gateway_when_the_balancer_routes_by_quic_lb() {
    let mut f = Fleet::new("q");
    let cfg = f.start("quic_lb");
    let (port, new_port) = ports_that_split(&cfg.replace("quic_lb", "four_tuple"));
    let (ok, r, err) = f.download(port, new_port);
    assert!(ok, "download failed: {r} {err}");
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(r["body_len"], DOWNLOAD, "{r}");
    assert!(r["migrated_at"].as_u64().unwrap() >= 10 << 20, "{r}");
    assert_eq!(
        r["local_addr"],
        format!("{CLIENT_NEW_ADDR}:{new_port}"),
        "{r}"
    );
    // Every datagram went to one gateway, before and after the move, and it logged the
    // request; the others saw none of it.
    let m = f.metrics("l4", 9903);
    let sent = forwarded(&m);
    let served: Vec<usize> = (0..3).filter(|&i| sent[i] > 0.0).collect();
    assert_eq!(served.len(), 1, "datagrams per gateway {sent:?}\n{m}");
    let gw = ["gw1", "gw2", "gw3"][served[0]];
    // Client to gateway: the handshake, the request and the ACKs of 50 MB (aioquic sends
    // about one per 25 packets); the download itself goes straight to the client.
    assert!(sent[served[0]] > 500.0, "{sent:?}");
    assert!(
        metric_sum(&m, "rampart_l4_hashed_total", &["client_chosen_id"]) >= 1.0,
        "{m}"
    );
    for (i, g) in ["gw1", "gw2", "gw3"].iter().enumerate() {
        let log = f.access_log(g);
        assert_eq!(
            log.contains(&format!("/bytes/{DOWNLOAD}")),
            i == served[0],
            "{g}: {log}"
        );
    }
    // The serving gateway moved the connection to the client's new path (counted when the
    // connection closes).
    f.wait_for(
        "the serving gateway counting the client's migration",
        || {
            metric_sum(
                &f.metrics(gw, 9901),
                "rampart_quic_path_migrations_total",
                &[],
            ) >= 1.0
        },
    );
}

#[test]
fn a_client_that_moves_loses_its_connection_when_the_balancer_hashes_addresses() {
    let mut f = Fleet::new("t");
    let cfg = f.start("four_tuple");
    let (port, new_port) = ports_that_split(&cfg);
    let (ok, r, err) = f.download(port, new_port);
    assert!(!ok, "the download survived a move to another gateway: {r}");
    assert!(
        r["body_len"].as_u64().unwrap_or(0) < DOWNLOAD as u64,
        "{r} {err}"
    );
    // After the move, datagrams went to a second gateway, which knew nothing of them.
    let sent = forwarded(&f.metrics("l4", 9903));
    assert_eq!(sent.iter().filter(|&&n| n > 0.0).count(), 2, "{sent:?}");
}
