//! The fleet control plane against a real etcd: objects written through one gateway's admin
//! API (or straight into etcd) reach every gateway watching the prefix; invalid objects are
//! refused with their key and field while the rest apply; etcd going away stops no traffic;
//! writers cannot overwrite each other unseen; the API takes only its token.

mod common;

use common::etcd::Etcd;
use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

use common::etcd::{member, member_config, member_in, member_with, TOKEN};

/// One admin API call: (status, JSON body). `headers` are `name: value` lines.
async fn api(
    fx: &Fixture,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[&str],
) -> (u16, Value) {
    let admin = fx.gw().admin.unwrap();
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "--max-time",
        "10",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    c.args(["-H", &format!("Authorization: Bearer {TOKEN}")]);
    for h in headers {
        c.args(["-H", h]);
    }
    if let Some(b) = body {
        c.args(["--data-binary", b]);
    }
    c.arg(format!("http://{admin}{path}"));
    let out = run(c).await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (json, status) = text.rsplit_once('\n').expect("a status line");
    let status: u16 = status.trim().parse().unwrap_or(0);
    (
        status,
        serde_json::from_str(json).unwrap_or(Value::String(json.into())),
    )
}

/// The route that served a GET of `path` through `fx` (its `x-route` header; "" for none).
async fn served_by(fx: &Fixture, path: &str) -> String {
    response_header(fx, path, "x-route").await
}

/// Waits until `path` through `fx` is served by route `route`; how long it took.
async fn until_served(fx: &Fixture, path: &str, route: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if served_by(fx, path).await == route {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{path} not served by route {route:?} within {limit:?}");
}

const EDGE: &str = r#"{"name": "edge", "endpoints": ["UPSTREAM"]}"#;

fn route(name: &str, prefix: &str) -> String {
    format!(
        r#"{{"path_prefix": "{prefix}", "cluster": "edge", "response_headers": {{"set": {{"x-route": "{name}"}}}}}}"#
    )
}

/// Creates cluster `edge` (`fx`'s upstream) and route `api` (`/bytes/` to it) through `fx`'s
/// API; the route's revision.
async fn edge_and_api(fx: &Fixture) -> i64 {
    let edge = EDGE.replace("UPSTREAM", &fx.upstream.to_string());
    let (s, body) = api(fx, "PUT", "/config/clusters/edge", Some(&edge), &[]).await;
    assert_eq!(s, 201, "{body}");
    let api_route = route("api", "/bytes/");
    let (s, body) = api(fx, "PUT", "/config/routes/api", Some(&api_route), &[]).await;
    assert_eq!(s, 201, "{body}");
    body["revision"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_written_through_one_gateway_reaches_three_within_a_second() {
    let etcd = Etcd::start();
    let fleet = [
        member(&etcd).await,
        member(&etcd).await,
        member(&etcd).await,
    ];
    let revision = edge_and_api(&fleet[0]).await;
    let written = Instant::now();
    // The gateway written through answers once the route is in force there.
    assert_eq!(served_by(&fleet[0], "/bytes/10").await, "api");
    for fx in &fleet[1..] {
        until_served(fx, "/bytes/10", "api", Duration::from_secs(1)).await;
    }
    assert!(
        written.elapsed() < Duration::from_secs(1),
        "{:?}",
        written.elapsed()
    );
    // Each reports the same applied revision and the objects; the file's route still serves.
    let (_, st) = api(&fleet[2], "GET", "/status", None, &[]).await;
    assert_eq!(st["control"]["source"], "etcd", "{st}");
    assert_eq!(st["control"]["etcd"]["connected"], true, "{st}");
    assert_eq!(st["control"]["objects"]["routes"], 1, "{st}");
    assert_eq!(st["control"]["applied_revision"], revision, "{st}");
    assert_eq!(served_by(&fleet[1], "/").await, "");
    let m = fleet[1].gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_control_objects", &["kind=\"routes\""]),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "rampart_control_etcd_connected", &[]),
        1.0,
        "{m}"
    );

    // Two writers replacing the same revision: one wins, the other gets 409 and nothing of
    // its version is in force.
    let (_, got) = api(&fleet[1], "GET", "/config/routes/api", None, &[]).await;
    let rev = got["revision"].as_i64().unwrap();
    let if_match = format!("If-Match: \"{rev}\"");
    let (one, two) = (route("one", "/bytes/"), route("two", "/bytes/"));
    let headers = [if_match.as_str()];
    let (a, b) = tokio::join!(
        api(&fleet[1], "PUT", "/config/routes/api", Some(&one), &headers),
        api(&fleet[2], "PUT", "/config/routes/api", Some(&two), &headers),
    );
    let mut statuses = [a.0, b.0];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{} / {}", a.1, b.1);
    let winner = if a.0 == 200 { "one" } else { "two" };
    for fx in &fleet {
        until_served(fx, "/bytes/10", winner, Duration::from_secs(1)).await;
    }
    // A create of an existing object conflicts too; a delete of the cluster a route uses is
    // refused; deleting the route, then the cluster, goes through everywhere.
    let (s, _) = api(
        &fleet[0],
        "PUT",
        "/config/routes/api",
        Some(&route("x", "/bytes/")),
        &[],
    )
    .await;
    assert_eq!(s, 409);
    let (s, body) = api(&fleet[0], "DELETE", "/config/clusters/edge", None, &[]).await;
    assert_eq!(s, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("routes/api"),
        "{body}"
    );
    let (s, _) = api(&fleet[0], "DELETE", "/config/routes/api", None, &[]).await;
    assert_eq!(s, 200);
    let (s, _) = api(&fleet[0], "DELETE", "/config/clusters/edge", None, &[]).await;
    assert_eq!(s, 200);
    for fx in &fleet {
        until_served(fx, "/bytes/10", "", Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_object_is_refused_with_its_key_and_field_and_the_others_apply() {
    let etcd = Etcd::start();
    let fleet = [member(&etcd).await, member(&etcd).await];
    let edge = EDGE.replace("UPSTREAM", &fleet[0].upstream.to_string());
    // Straight into etcd, in one revision: a good cluster and route, and a bad route.
    etcd.put_all(&[
        ("/rampart/clusters/edge", &edge),
        ("/rampart/routes/good", &route("good", "/bytes/")),
        (
            "/rampart/routes/bad",
            r#"{"path_prefix": "/headers", "cluster": "edge", "rate_limit": {"per_second": 0}}"#,
        ),
    ]);
    for fx in &fleet {
        until_served(fx, "/bytes/10", "good", Duration::from_secs(2)).await;
        let (_, st) = api(fx, "GET", "/status", None, &[]).await;
        let refused = &st["control"]["refused"];
        assert_eq!(refused.as_array().map(Vec::len), Some(1), "{st}");
        assert_eq!(refused[0]["key"], "/rampart/routes/bad", "{st}");
        assert_eq!(refused[0]["field"], "rate_limit.per_second", "{st}");
        assert_eq!(
            refused[0]["message"], "a number of requests greater than zero",
            "{st}"
        );
        let m = fx.gw().metrics.render();
        assert_eq!(
            metric_sum(&m, "rampart_control_objects_refused", &[]),
            1.0,
            "{m}"
        );
        assert_eq!(
            metric_sum(
                &m,
                "rampart_control_changes_total",
                &["kind=\"routes\"", "result=\"refused\""]
            ),
            1.0,
            "{m}"
        );
    }
    // The refused route is listed, not in force; the API refuses the same object itself.
    let (_, list) = api(&fleet[0], "GET", "/config/routes", None, &[]).await;
    let bad = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "bad")
        .unwrap();
    assert_eq!(bad["in_force"], false, "{list}");
    let (s, body) = api(
        &fleet[0],
        "PUT",
        "/config/routes/other",
        Some(r#"{"cluster": "edge", "rate_limit": {"per_second": 0}}"#),
        &[],
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(body["error"]["field"], "rate_limit.per_second", "{body}");
    assert_eq!(body["error"]["key"], "/rampart/routes/other", "{body}");
    // Fixed in etcd, it applies.
    etcd.put_all(&[("/rampart/routes/bad", &route("bad", "/headers"))]);
    for fx in &fleet {
        until_served(fx, "/headers", "bad", Duration::from_secs(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_going_away_stops_no_traffic_and_a_restart_serves_from_the_snapshot() {
    let mut etcd = Etcd::start();
    let fleet = [member(&etcd).await, member(&etcd).await];
    edge_and_api(&fleet[0]).await;
    until_served(&fleet[1], "/bytes/10", "api", Duration::from_secs(1)).await;

    // Under load, etcd dies: every request is still served, by the routes in force.
    let load = |fx: &Fixture| {
        let mut c = curl(fx, &["-w", "%{http_code}\n"]);
        for _ in 0..600 {
            c.args(["-o", "/dev/null", &fx.url("/bytes/100")]);
        }
        run(c)
    };
    let (a, b, _) = tokio::join!(load(&fleet[0]), load(&fleet[1]), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        etcd.kill();
    });
    for out in [a, b] {
        let codes = stdout(&out);
        assert_eq!(
            codes.lines().filter(|l| *l == "200").count(),
            600,
            "{codes}"
        );
    }
    for fx in &fleet {
        eventually_metric(fx, "rampart_control_etcd_connected", &[], 0.0).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (_, st) = api(fx, "GET", "/status", None, &[]).await;
            if st["control"]["etcd"]["connected"] == false {
                break;
            }
            assert!(Instant::now() < deadline, "still connected: {st}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(served_by(fx, "/bytes/10").await, "api");
    }
    // A write while etcd is down is refused with 503, nothing changed.
    let (s, _) = api(
        &fleet[0],
        "PUT",
        "/config/routes/new",
        Some(&route("new", "/headers")),
        &[],
    )
    .await;
    assert_eq!(s, 503);

    // A gateway restarted while etcd is down serves the objects of its snapshot.
    let [mut restarted, stayed] = fleet;
    let dir = std::mem::replace(&mut restarted.dir, tempfile::tempdir().unwrap());
    restarted.gw.take().unwrap().shutdown().await;
    let again = member_in(&etcd, dir).await;
    assert_eq!(served_by(&again, "/bytes/10").await, "api");
    let (_, st) = api(&again, "GET", "/status", None, &[]).await;
    assert_eq!(st["control"]["source"], "snapshot", "{st}");

    // etcd returns: both gateways reconnect (the one that stayed up resuming its watch, the
    // restarted one reading everything) and a change made now reaches both.
    etcd.restart();
    etcd.put_all(&[("/rampart/routes/new", &route("new", "/headers"))]);
    for fx in [&again, &stayed] {
        until_served(fx, "/headers", "new", Duration::from_secs(10)).await;
        let (_, st) = api(fx, "GET", "/status", None, &[]).await;
        assert_eq!(st["control"]["source"], "etcd", "{st}");
        assert_eq!(st["control"]["etcd"]["connected"], true, "{st}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_takes_only_its_token_and_names_what_is_wrong_with_an_object() {
    let etcd = Etcd::start();
    let fx = member(&etcd).await;
    let admin = fx.gw().admin.unwrap();
    let status = |auth: Option<&str>| {
        let mut c = Command::new("curl");
        c.args(["-s", "-o", "/dev/null", "-w", "%{http_code}"]);
        if let Some(a) = auth {
            c.args(["-H", a]);
        }
        c.arg(format!("http://{admin}/status"));
        run(c)
    };
    assert_eq!(stdout(&status(None).await), "401");
    assert_eq!(
        stdout(&status(Some("Authorization: Bearer wrong-token-000000")).await),
        "401"
    );
    assert_eq!(
        stdout(&status(Some(&format!("Authorization: Bearer {TOKEN}"))).await),
        "200"
    );
    // /metrics and /healthz stay open on loopback.
    let mut c = Command::new("curl");
    c.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://{admin}/metrics"),
    ]);
    assert_eq!(stdout(&run(c).await), "200");

    let (s, body) = api(&fx, "PUT", "/config/routes/r", Some("{\"cluster\": "), &[]).await;
    assert_eq!(s, 400, "{body}");
    assert!(body["error"]["line"].is_number(), "{body}");
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/routes/r",
        Some(r#"{"cluster": "app", "colour": 1}"#),
        &[],
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(body["error"]["field"], "colour", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field"),
        "{body}"
    );
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/routes/r",
        Some(r#"{"cluster": "nowhere"}"#),
        &[],
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(body["error"]["field"], "cluster", "{body}");
    // The file's objects are not the control plane's to replace.
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/clusters/app",
        Some(r#"{"name": "app", "endpoints": ["127.0.0.1:1"]}"#),
        &[],
    )
    .await;
    assert_eq!(s, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not replace"),
        "{body}"
    );
    let (s, _) = api(&fx, "PUT", "/config/widgets/w", Some("{}"), &[]).await;
    assert_eq!(s, 404);
    let (s, _) = api(
        &fx,
        "PUT",
        "/config/routes/r",
        Some(r#"{"cluster": "app"}"#),
        &["If-Match: soon"],
    )
    .await;
    assert_eq!(s, 400);
    // TOML is taken as well as JSON, and read back as JSON.
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/routes/t",
        Some("cluster = \"app\"\npath_prefix = \"/t/\""),
        &[],
    )
    .await;
    assert_eq!(s, 201, "{body}");
    let (s, got) = api(&fx, "GET", "/config/routes/t", None, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(got["object"]["path_prefix"], "/t/", "{got}");
    assert_eq!(got["in_force"], true, "{got}");
    // The file's route is listed, as the file has it.
    let (_, list) = api(&fx, "GET", "/config/clusters", None, &[]).await;
    assert_eq!(list["items"][0]["source"], "file", "{list}");
    assert_eq!(
        list["items"][0]["object"]["connect_timeout"], "2s",
        "{list}"
    );
}

/// A cluster's endpoint list changed through the API while requests run: none fails. The
/// carried-over pools serve until the new generation is in force; requests in flight finish on
/// the cluster they started on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_endpoints_change_under_load_loses_no_request() {
    let etcd = Etcd::start();
    let fx = member(&etcd).await;
    let second = gateway::demo::spawn_upstream("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let edge = |eps: &[std::net::SocketAddr]| {
        let eps: Vec<String> = eps.iter().map(|a| format!("\"{a}\"")).collect();
        format!(r#"{{"name": "edge", "endpoints": [{}]}}"#, eps.join(", "))
    };
    let (s, _) = api(
        &fx,
        "PUT",
        "/config/clusters/edge",
        Some(&edge(&[fx.upstream])),
        &[],
    )
    .await;
    assert_eq!(s, 201);
    let (s, _) = api(
        &fx,
        "PUT",
        "/config/routes/api",
        Some(&route("api", "/bytes/")),
        &[],
    )
    .await;
    assert_eq!(s, 201);
    let mut c = curl(&fx, &["-w", "%{http_code}\n"]);
    for _ in 0..600 {
        c.args(["-o", "/dev/null", &fx.url("/bytes/100")]);
    }
    let load = run(c);
    let changes = async {
        for eps in [vec![fx.upstream, second], vec![second], vec![fx.upstream]] {
            tokio::time::sleep(Duration::from_millis(60)).await;
            let (_, got) = api(&fx, "GET", "/config/clusters/edge", None, &[]).await;
            let rev = format!("If-Match: \"{}\"", got["revision"]);
            let (s, body) = api(
                &fx,
                "PUT",
                "/config/clusters/edge",
                Some(&edge(&eps)),
                &[&rev],
            )
            .await;
            assert_eq!(s, 200, "{body}");
        }
    };
    let (out, _) = tokio::join!(load, changes);
    let codes = stdout(&out);
    assert_eq!(
        codes.lines().filter(|l| *l == "200").count(),
        600,
        "{codes}"
    );
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &m,
            "rampart_control_changes_total",
            &["kind=\"clusters\"", "result=\"applied\""]
        ),
        4.0,
        "{m}"
    );
}

/// A listener's access lists as an object: an address range shut out on the gateway at once
/// (new connections refused before any handshake), and let in again when the object goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_access_list_in_etcd_shuts_clients_out_and_back_in() {
    let etcd = Etcd::start();
    let fx = member(&etcd).await;
    let ok = |fx: &Fixture| {
        let c = curl(
            fx,
            &["-o", "/dev/null", "-w", "%{http_code}", &fx.url("/bytes/1")],
        );
        run(c)
    };
    assert_eq!(stdout(&ok(&fx).await), "200");
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/listeners/https",
        Some(r#"{"deny": ["127.0.0.0/8"]}"#),
        &[],
    )
    .await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(
        stdout(&ok(&fx).await),
        "000",
        "a denied client gets no answer"
    );
    let (_, list) = api(&fx, "GET", "/config/listeners", None, &[]).await;
    assert_eq!(list["items"][0]["source"], "etcd", "{list}");
    assert_eq!(
        list["items"][0]["object"]["deny"][0], "127.0.0.0/8",
        "{list}"
    );
    // Only the file's listeners can be named; the field path of a bad block is given.
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/listeners/nope",
        Some(r#"{"deny": []}"#),
        &[],
    )
    .await;
    assert_eq!(s, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expected one of: https"),
        "{body}"
    );
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/listeners/https",
        Some(r#"{"deny": ["10.0.0.0/40"]}"#),
        &["If-Match: \"1\""],
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(body["error"]["field"], "deny[0]", "{body}");
    let (s, _) = api(&fx, "DELETE", "/config/listeners/https", None, &[]).await;
    assert_eq!(s, 200);
    assert_eq!(stdout(&ok(&fx).await), "200", "the file's lists again");
}

/// The subject of the certificate `fx` presents to `name`.
async fn subject(fx: &Fixture, name: &str) -> String {
    presented_subject(&s_client(fx, name, &[]).await)
}

/// A certificate in etcd (its chain in the object, its key a file on the node) is served to its
/// server name by a running gateway; a key that does not match the chain is refused when it is
/// built (written, but reported not in force); a key's PEM in place of a path is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_in_etcd_is_served_to_its_name_without_a_restart() {
    let etcd = Etcd::start();
    let quic = "[listeners.quic]\nenabled = true";
    let fx = member_with(&etcd, tempfile::tempdir().unwrap(), quic).await;
    let dir = fx.dir.path();
    gateway::demo::ensure_self_signed(
        dir,
        "new",
        gateway::demo::CertKind::EcdsaP256,
        &["new.test"],
    )
    .unwrap();
    let chain = std::fs::read_to_string(dir.join("new.crt")).unwrap();
    let object = |key: &str| {
        serde_json::json!({
            "listener": "https",
            "server_names": ["new.test"],
            "ecdsa": { "chain": chain, "key": key },
        })
        .to_string()
    };
    assert!(
        !subject(&fx, "new.test").await.contains("new.test"),
        "not served before"
    );
    // The wrong key (another certificate's): written, refused when built, nothing changes.
    let wrong = dir.join("localhost-ecdsa.key");
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/certificates/new",
        Some(&object(wrong.to_str().unwrap())),
        &[],
    )
    .await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(body["in_force"], false, "{body}");
    assert!(
        body["refused"]["message"]
            .as_str()
            .unwrap()
            .contains("does not build"),
        "{body}"
    );
    assert!(!subject(&fx, "new.test").await.contains("new.test"));
    // The right key: served from now on.
    let (_, got) = api(&fx, "GET", "/config/certificates/new", None, &[]).await;
    let rev = format!("If-Match: \"{}\"", got["revision"]);
    let right = dir.join("new.key");
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/certificates/new",
        Some(&object(right.to_str().unwrap())),
        &[&rev],
    )
    .await;
    assert_eq!((s, body["in_force"].clone()), (200, true.into()), "{body}");
    assert!(
        subject(&fx, "new.test").await.contains("new.test"),
        "served"
    );
    let (_, st) = api(&fx, "GET", "/status", None, &[]).await;
    assert_eq!(
        st["control"]["refused"].as_array().map(Vec::len),
        Some(0),
        "{st}"
    );
    // Keys stay out of etcd; a chain must be one.
    let key_pem = std::fs::read_to_string(&right).unwrap();
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/certificates/k",
        Some(&object(&key_pem)),
        &[],
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(body["error"]["field"], "ecdsa.key", "{body}");
    let bad_chain = object(right.to_str().unwrap()).replace("BEGIN CERTIFICATE", "BEGIN NOTHING");
    let (s, body) = api(&fx, "PUT", "/config/certificates/c", Some(&bad_chain), &[]).await;
    assert_eq!(s, 400);
    assert_eq!(body["error"]["field"], "ecdsa.chain", "{body}");
    // Deleted, the name falls back to the listener's default certificate.
    let (s, _) = api(&fx, "DELETE", "/config/certificates/new", None, &[]).await;
    assert_eq!(s, 200);
    assert!(!subject(&fx, "new.test").await.contains("new.test"));
}

/// etcd with authentication on: a gateway with the user and its password file reads, watches
/// and writes; one with a wrong password reaches nothing, says why, and serves its file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_with_authentication_is_used_with_its_credentials() {
    let etcd = Etcd::start();
    etcd.enable_auth("s3cret-pass");
    let with = |password: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("etcd.password"), format!("{password}\n")).unwrap();
        member_config(
            &etcd,
            dir,
            "",
            "username = \"root\"\npassword_file = \"etcd.password\"",
        )
    };
    let good = with("s3cret-pass").await;
    edge_and_api(&good).await;
    assert_eq!(served_by(&good, "/bytes/10").await, "api");
    let bad = with("wrong").await;
    let (_, st) = api(&bad, "GET", "/status", None, &[]).await;
    assert_eq!(st["control"]["etcd"]["connected"], false, "{st}");
    assert!(st["control"]["etcd"]["error"].is_string(), "{st}");
    assert_eq!(
        served_by(&bad, "/bytes/10").await,
        "",
        "only its file's route"
    );
}

/// etcd over TLS that requires client certificates: a gateway with the CA and its client
/// certificate and key uses it; objects written straight into etcd reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_over_tls_with_client_certificates_is_used() {
    let etcd = Etcd::start_tls();
    let tls = format!(
        "ca = {:?}\ncert = {:?}\nkey = {:?}",
        etcd.pki("ca.pem"),
        etcd.pki("client.pem"),
        etcd.pki("client.key")
    );
    let fx = member_config(&etcd, tempfile::tempdir().unwrap(), "", &tls).await;
    let edge = EDGE.replace("UPSTREAM", &fx.upstream.to_string());
    etcd.put_all(&[
        ("/rampart/clusters/edge", &edge),
        ("/rampart/routes/api", &route("api", "/bytes/")),
    ]);
    until_served(&fx, "/bytes/10", "api", Duration::from_secs(2)).await;
    let (_, st) = api(&fx, "GET", "/status", None, &[]).await;
    assert_eq!(st["control"]["etcd"]["connected"], true, "{st}");
    assert_eq!(st["control"]["source"], "etcd", "{st}");
}

/// The admin API over TLS ([admin.tls]): served over HTTPS with the token; plain HTTP gets no
/// answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_is_served_over_tls_when_configured() {
    let etcd = Etcd::start();
    // A table of its own, after [control.etcd]'s keys.
    let admin_tls = "\n[admin.tls]\ncert = \"localhost-ecdsa.crt\"\nkey = \"localhost-ecdsa.key\"";
    let fx = member_config(&etcd, tempfile::tempdir().unwrap(), "", admin_tls).await;
    let admin = fx.gw().admin.unwrap();
    let call = |scheme: &str, token: &str| {
        let mut c = Command::new("curl");
        c.args([
            "-s",
            "--insecure",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("{scheme}://{admin}/status"));
        run(c)
    };
    assert_eq!(stdout(&call("https", TOKEN).await), "200");
    assert_eq!(stdout(&call("https", "wrong-token-0000000").await), "401");
    assert_eq!(stdout(&call("http", TOKEN).await), "000");
}

/// A certificate object in etcd with its own client-certificate settings (client CA and CRL
/// as PEM in the object): its name requires a client certificate from that CA, revoked ones
/// refused; the listener's other names ask for none. A CA that is not PEM is refused with the
/// field named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_object_can_require_client_certificates_for_its_name() {
    let etcd = Etcd::start();
    let fx = member_with(&etcd, tempfile::tempdir().unwrap(), "").await;
    let dir = fx.dir.path();
    gateway::demo::ensure_self_signed(
        dir,
        "mtls",
        gateway::demo::CertKind::EcdsaP256,
        &["mtls.test"],
    )
    .unwrap();
    let clients = client_certs();
    let c = |f: &str| clients.path().join(f).display().to_string();
    let read = |f: &str| std::fs::read_to_string(clients.path().join(f)).unwrap();
    let object = serde_json::json!({
        "listener": "https",
        "server_names": ["mtls.test"],
        "ecdsa": { "chain": std::fs::read_to_string(dir.join("mtls.crt")).unwrap(),
                   "key": dir.join("mtls.key").to_str().unwrap() },
        "client_auth": "required",
        "client_ca": read("ca.pem"),
        "client_crl": read("ca.crl"),
    });
    let (s, body) = api(
        &fx,
        "PUT",
        "/config/certificates/mtls",
        Some(&object.to_string()),
        &[],
    )
    .await;
    assert_eq!((s, body["in_force"].clone()), (201, true.into()), "{body}");
    let resolve = format!("mtls.test:{}:127.0.0.1", fx.port());
    let url = format!("https://mtls.test:{}/bytes/10", fx.port());
    let fxr = &fx;
    let status = |extra: Vec<String>| {
        let mut args = vec!["--resolve".to_string(), resolve.clone()];
        args.extend(extra);
        args.push(url.clone());
        async move {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            curl_status(fxr, &refs).await
        }
    };
    let cert = |who: &str| {
        vec![
            "--cert".into(),
            c(&format!("{who}.pem")),
            "--key".into(),
            c(&format!("{who}.key")),
        ]
    };
    assert_eq!(status(vec![]).await, "000", "no certificate: refused");
    assert_eq!(status(cert("bob")).await, "000", "revoked: refused");
    assert_eq!(status(cert("alice")).await, "200");
    assert_eq!(
        stdout(
            &run(curl(
                &fx,
                &[
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    &fx.url("/bytes/10")
                ]
            ))
            .await
        ),
        "200",
        "localhost asks for none"
    );
    let bad = object
        .to_string()
        .replace("BEGIN CERTIFICATE-----\\n", "BEGIN NOTHING-----\\n");
    let (s, body) = api(&fx, "PUT", "/config/certificates/bad", Some(&bad), &[]).await;
    assert_eq!(s, 400, "{body}");
    assert!(
        body["error"]["field"] == "client_ca" || body["error"]["field"] == "ecdsa.chain",
        "{body}"
    );
}
