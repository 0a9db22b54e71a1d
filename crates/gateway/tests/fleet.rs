//! Fleet state in a real Redis: a rate limit counted across gateways, and what happens when
//! Redis goes away.

mod common;

use common::redis::Redis;
use common::*;
use http_body_util::BodyExt;
use std::time::{Duration, Instant};

/// A gateway whose one route is limited to `limit` (a `rate_limit` table's body), with
/// `[fleet] redis = redis_url, size = 2` and `fleet_extra`.
async fn start_limited(redis_url: &str, limit: &str, fleet_extra: &str) -> Fixture {
    let fleet =
        format!("[fleet]\nredis = \"{redis_url}\"\nsize = 2\n{fleet_extra}\n\n[[listeners]]\n");
    let route =
        format!("[[routes]]\nname = \"api\"\ncluster = \"app\"\nrate_limit = {{ {limit} }}");
    start_edited("", move |text, _| {
        text.replacen("[[listeners]]\n", &fleet, 1)
            .replace("[[routes]]\ncluster = \"app\"", &route)
    })
    .await
}

/// Keep-alive requests to `fx` one after another for `span`: (answered 200, answered 429, the
/// slowest answer).
async fn hammer(
    fx: &Fixture,
    span: Duration,
    headers: &[(&str, &str)],
) -> (usize, usize, Duration) {
    let tls = tls_to(fx, b"\x08http/1.1").await;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let end = Instant::now() + span;
    let (mut ok, mut limited, mut slowest) = (0, 0, Duration::ZERO);
    while Instant::now() < end {
        let mut req = hyper::Request::get("/bytes/1").header("host", "localhost");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let t = Instant::now();
        sender.ready().await.unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let _ = resp.into_body().collect().await;
        slowest = slowest.max(t.elapsed());
        match status {
            200 => ok += 1,
            429 => limited += 1,
            s => panic!("status {s}"),
        }
    }
    (ok, limited, slowest)
}

fn decisions(fx: &Fixture, decision: &str) -> f64 {
    metric_sum(
        &fx.gw().metrics.render(),
        "rampart_fleet_limit_decisions_total",
        &["route=\"api\"", &format!("decision=\"{decision}\"")],
    )
}

/// Waits until the gateway has reached Redis (its first decision by Redis).
async fn until_connected(fx: &Fixture) {
    for _ in 0..100 {
        let (ok, _, _) = hammer(fx, Duration::from_millis(20), &[("x-probe", "1")]).await;
        let _ = ok;
        if decisions(fx, "allowed") + decisions(fx, "limited") > 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the gateway never reached Redis");
}

/// Two gateways, one fleet limit of 100 a second per client: hammered together for two
/// seconds, they admit about 200 requests (100/s), not the 400 two node limits would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_admit_one_fleet_limit_between_them() {
    let redis = Redis::start();
    // A burst of 20 takes up the pauses a busy machine puts between a client's requests (with
    // none, time in which neither client asks is lost to the count).
    let limit = "per_second = 100, burst = 20, scope = \"fleet\", key = { header = \"x-api-key\" }";
    // A deadline a busy test machine meets: this test is about counting across gateways (the
    // 2 ms default's fallback is the next test's).
    let deadline = "deadline = \"100ms\"";
    let (a, b) = (
        start_limited(&redis.url(), limit, deadline).await,
        start_limited(&redis.url(), limit, deadline).await,
    );
    until_connected(&a).await;
    until_connected(&b).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let key = [("x-api-key", "tenant-7")];
    let fallbacks =
        |fx: &Fixture| decisions(fx, "fallback_allowed") + decisions(fx, "fallback_limited");
    let fallbacks_before = fallbacks(&a) + fallbacks(&b);
    let span = Duration::from_secs(2);
    let (ra, rb) = tokio::join!(hammer(&a, span, &key), hammer(&b, span, &key));
    let admitted = ra.0 + rb.0;
    // 100/s for 2 s, ±10%, plus the burst.
    assert!(
        (180..=240).contains(&admitted),
        "admitted {admitted} in 2 s (a: {ra:?}, b: {rb:?})"
    );
    assert!(
        ra.1 > 0 && rb.1 > 0,
        "both gateways were limited: {ra:?} {rb:?}"
    );
    assert!(
        ra.0 > 20 && rb.0 > 20,
        "both admitted a share: {ra:?} {rb:?}"
    );
    // Another key has a count of its own.
    let other = hammer(&a, Duration::from_millis(100), &[("x-api-key", "tenant-8")]).await;
    assert!(other.0 >= 1, "{other:?}");
    // Decided by Redis, not by each gateway alone.
    let fell_back = fallbacks(&a) + fallbacks(&b) - fallbacks_before;
    assert!(fell_back <= 3.0, "{fell_back} decisions fell back");
    // Each decision was one script call in Redis (its keys expire as their counts run out).
    let stats = redis.cli(&["INFO", "commandstats"]);
    let calls: usize = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        calls >= ra.0 + ra.1 + rb.0 + rb.1,
        "{calls} script calls: {stats}"
    );
}

/// Redis goes away: requests keep flowing under each gateway's share of the limit, none
/// waits on Redis past the deadline, and the fallback is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_requests_flow_under_the_fallback_and_nothing_hangs() {
    let mut redis = Redis::start();
    let fx = start_limited(
        &redis.url(),
        "per_second = 40, burst = 1, scope = \"fleet\"",
        "",
    )
    .await;
    until_connected(&fx).await;
    redis.kill();
    // A second's load: this gateway's share is 40 / 2 = 20 a second.
    let (ok, limited, slowest) = hammer(&fx, Duration::from_secs(1), &[]).await;
    assert!(
        (15..=26).contains(&ok),
        "admitted {ok} in 1 s under the fallback ({limited} limited)"
    );
    assert!(limited > 0);
    assert!(
        slowest < Duration::from_millis(250),
        "an answer took {slowest:?}"
    );
    assert!(decisions(&fx, "fallback_allowed") >= 15.0);
    assert!(decisions(&fx, "fallback_limited") >= 1.0);
    let m = fx.gw().metrics.render();
    assert!(
        metric_sum(&m, "rampart_fleet_redis_errors_total", &[]) >= 1.0,
        "{m}"
    );
}

/// A gateway whose Redis is down when it starts still starts, and serves under the fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_starts_and_serves_while_redis_is_down() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let fx = start_limited(
        &format!("redis://{closed}"),
        "per_second = 1000, scope = \"fleet\"",
        "",
    )
    .await;
    let (ok, _, slowest) = hammer(&fx, Duration::from_millis(300), &[]).await;
    assert!(ok > 0);
    assert!(slowest < Duration::from_millis(250), "{slowest:?}");
    assert!(decisions(&fx, "fallback_allowed") > 0.0);
}

/// Gateways with `tls.fleet_ticket_keys` read one list of session-ticket keys from Redis: a
/// session from one resumes on the other, before and after a rotation; a gateway with keys
/// of its own does not resume it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_sharing_fleet_ticket_keys_resume_each_others_sessions() {
    let redis = Redis::start();
    let fleet = redis.fleet_section();
    let shared = "tls.fleet_ticket_keys = true\ntls.ticket_key_rotation = \"2s\"";
    let (a, b, c) = (
        fleet_gateway(&fleet, shared).await,
        fleet_gateway(&fleet, shared).await,
        fleet_gateway(&fleet, "").await,
    );
    // The list is made by whichever gateway comes first; both read it within a quarter
    // period.
    let list = |redis: &Redis| redis.cli(&["GET", "rampart:tickets:https"]);
    let first = redis.wait_for_key("rampart:tickets:https").await;
    assert_eq!(first.lines().count(), 2, "sealing and next keys");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let dir = tempfile::tempdir().unwrap();
    let sess = dir.path().join("sess.pem");
    let sess_s = sess.to_str().unwrap();
    assert_sessions_shared(&a, &b, &c, &sess).await;
    // Across a rotation (every 2 s): just after one, a session sealed now still resumes on
    // the other gateway after the next (its key then the previous one); the next key became
    // the sealing one, and the list holds three (sealing, previous, next).
    let changed = |from: String| {
        let redis = &redis;
        async move {
            for _ in 0..60 {
                let now = list(redis);
                if now != from {
                    return now;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("no rotation within 3 s");
        }
    };
    changed(list(&redis)).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let first = s_client_request(&a, "localhost", &["-tls1_3", "-sess_out", sess_s]).await;
    assert!(first.contains("New,"), "{first}");
    let before = list(&redis);
    let after = changed(before.clone()).await;
    assert_eq!(after.lines().count(), 3, "{after}");
    assert_eq!(
        after.lines().next(),
        before.lines().last(),
        "the next key became the sealing one"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let on_b = s_client_request(&b, "localhost", &["-tls1_3", "-sess_in", sess_s]).await;
    assert!(on_b.contains("Reused,"), "after a rotation, on b:\n{on_b}");
}

/// Over TCP with `tls.early_data`: a client's 0-RTT attempt on gateway a is accepted and
/// recorded; the same bytes (ClientHello and early data) replayed to gateway b have their early
/// data rejected there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_tcp_0rtt_attempt_has_its_early_data_rejected_on_another_gateway() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = Redis::start();
    // A deadline a busy test machine meets (past it the early data would be refused).
    let fleet = format!("{}\ndeadline = \"100ms\"", redis.fleet_section());
    let gateway = || {
        fleet_gateway(
            &fleet,
            "tls.fleet_ticket_keys = true\ntls.early_data = true",
        )
    };
    let (a, b) = (gateway().await, gateway().await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dir = tempfile::tempdir().unwrap();
    let sess = dir.path().join("sess.pem");
    let sess_s = sess.to_str().unwrap();
    let first = s_client_request(&a, "localhost", &["-tls1_3", "-sess_out", sess_s]).await;
    assert!(first.contains("New,"), "{first}");

    // A TCP relay to a that also replays the client's first 50 ms of bytes to b.
    let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_port = relay.local_addr().unwrap().port();
    let (a_port, b_port) = (a.port(), b.port());
    tokio::spawn(async move {
        let (mut client, _) = relay.accept().await.unwrap();
        let mut up = tokio::net::TcpStream::connect(("127.0.0.1", a_port))
            .await
            .unwrap();
        let mut captured = Vec::new();
        let start = std::time::Instant::now();
        let (mut c_buf, mut u_buf) = ([0u8; 16384], [0u8; 16384]);
        loop {
            tokio::select! {
                r = client.read(&mut c_buf) => match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if start.elapsed() < Duration::from_millis(50) {
                            captured.extend_from_slice(&c_buf[..n]);
                        }
                        if up.write_all(&c_buf[..n]).await.is_err() { break; }
                    }
                },
                r = up.read(&mut u_buf) => match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => if client.write_all(&u_buf[..n]).await.is_err() { break; },
                },
                _ = tokio::time::sleep(Duration::from_secs(10)) => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut replay = tokio::net::TcpStream::connect(("127.0.0.1", b_port))
            .await
            .unwrap();
        let _ = replay.write_all(&captured).await;
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_secs(2), replay.read(&mut sink)).await;
    });
    let file = dir.path().join("early.txt");
    std::fs::write(&file, "GET /headers HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let cmd = format!(
        "printf '' | timeout 10 openssl s_client -connect 127.0.0.1:{relay_port} -servername localhost \
         -tls1_3 -sess_in {sess_s} -early_data {} -ign_eof",
        file.display()
    );
    let mut c = std::process::Command::new("sh");
    c.arg("-c").arg(cmd);
    let out = stdout(&run(c).await);
    assert!(out.contains("Early data was accepted"), "{out}");
    assert!(out.contains("\"early-data\": \"1\""), "{out}");
    let checks = |fx: &Fixture, result: &str| {
        metric_sum(
            &fx.gw().metrics.render(),
            "rampart_early_data_replay_checks_total",
            &["listener=\"https\"", &format!("result=\"{result}\"")],
        )
    };
    assert_eq!(checks(&a, "first"), 1.0);
    for _ in 0..50 {
        if checks(&b, "replay") >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        checks(&b, "replay"),
        1.0,
        "the replayed bytes were seen as a replay"
    );
}
