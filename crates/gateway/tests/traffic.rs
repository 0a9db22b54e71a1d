//! Traffic policy through a running gateway: routes chosen by method, headers, query and
//! cookies; retries within the cluster's budget; request mirroring to a shadow cluster.

mod common;

use common::*;
use std::time::{Duration, Instant};

/// A gateway whose only route is `route` (a `[[routes]]` table's body) and whose extra
/// clusters are `clusters` (name, endpoints, more lines).
async fn start_routed(
    routes: &str,
    clusters: &[(&str, Vec<std::net::SocketAddr>, &str)],
) -> Fixture {
    let mut extra = String::new();
    for (name, eps, more) in clusters {
        let eps: Vec<String> = eps.iter().map(|a| format!("\"{a}\"")).collect();
        extra += &format!(
            "\n[[clusters]]\nname = \"{name}\"\nendpoints = [{}]\n{more}\n",
            eps.join(", ")
        );
    }
    let routes = routes.to_string();
    start_edited("", move |text, _| {
        text.replace("[[routes]]\ncluster = \"app\"", &routes) + &extra
    })
    .await
}

/// The `x-server` a request reached ("" when none answered).
async fn served_by(fx: &Fixture, args: &[&str]) -> String {
    let mut all = vec!["-o", "/dev/null", "-D", "-"];
    all.extend_from_slice(args);
    let out = stdout(&run(curl(fx, &all)).await);
    out.lines()
        .find_map(|l| l.strip_prefix("x-server: "))
        .unwrap_or("")
        .trim()
        .to_string()
}

fn metric(fx: &Fixture, name: &str, labels: &[&str]) -> f64 {
    metric_sum(&fx.gw().metrics.render(), name, labels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_match_on_method_headers_query_cookies_and_path_patterns() {
    let (a, b, c) = (
        spawn_scripted_upstream("a", 200).await,
        spawn_scripted_upstream("b", 200).await,
        spawn_scripted_upstream("c", 200).await,
    );
    let routes = r#"
[[routes]]
name = "default"
cluster = "a"

[[routes]]
name = "users"
path_regex = "/users/[0-9]+"
methods = ["GET", "HEAD"]
cluster = "b"

[[routes]]
name = "beta"
cookies = [{ name = "beta", exact = "1" }]
query = [{ name = "debug", present = false }]
cluster = "c"

[[routes]]
name = "canary"
headers = [{ name = "x-canary", regex = "yes|1" }]
priority = 10
cluster = "c"
"#;
    let fx = start_routed(
        routes,
        &[
            ("a", vec![a.addr], ""),
            ("b", vec![b.addr], ""),
            ("c", vec![c.addr], ""),
        ],
    )
    .await;
    let by = |args: Vec<&'static str>| {
        let fx = &fx;
        async move {
            let url = fx.url(args[0]);
            let mut all: Vec<&str> = args[1..].to_vec();
            all.push(&url);
            served_by(fx, &all).await
        }
    };
    assert_eq!(by(vec!["/other"]).await, "a");
    assert_eq!(by(vec!["/users/42"]).await, "b");
    assert_eq!(
        by(vec!["/users/42/x"]).await,
        "a",
        "the pattern is the whole path"
    );
    assert_eq!(by(vec!["/users/42", "-X", "DELETE"]).await, "a", "method");
    assert_eq!(by(vec!["/other", "-b", "beta=1"]).await, "c");
    assert_eq!(
        by(vec!["/other?debug=1", "-b", "beta=1"]).await,
        "a",
        "query absent"
    );
    assert_eq!(
        by(vec!["/other?%64ebug=1", "-b", "beta=1"]).await,
        "a",
        "a spelled-around parameter is the same parameter"
    );
    assert_eq!(
        by(vec!["/users/42", "-H", "x-canary: yes"]).await,
        "c",
        "the higher priority wins over the more specific path"
    );
    assert_eq!(by(vec!["/users/42", "-H", "x-canary: no"]).await, "b");
    // Each request was counted by the route that took it.
    let m = fx.gw().metrics.render();
    for (route, n) in [
        ("default", 5.0),
        ("users", 2.0),
        ("beta", 1.0),
        ("canary", 1.0),
    ] {
        assert_eq!(
            metric_sum(
                &m,
                "rampart_http_requests_total",
                &[&format!("route=\"{route}\"")]
            ),
            n,
            "{route}: {m}"
        );
    }
}

/// One endpoint of three answers 503: every idempotent request succeeds by a retry on
/// another (its small body replayed whole); a POST is not repeated after a send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_bad_endpoint_of_three_idempotent_requests_succeed_by_retry() {
    let ups = [
        spawn_scripted_upstream("good1", 200).await,
        spawn_scripted_upstream("bad", 503).await,
        spawn_scripted_upstream("good2", 200).await,
    ];
    let routes = r#"[[routes]]
name = "api"
cluster = "pool"
retry = { attempts = 2, backoff_base = "1ms", backoff_max = "5ms" }"#;
    let eps = ups.iter().map(|u| u.addr).collect();
    // A budget that never refuses here (the default, 3 retries in flight, can be reached by
    // 4 clients whose first tries all met the bad endpoint): this test is about the retries.
    let budget = "retry_budget = { percent = 100, min_concurrent = 10 }";
    let fx = start_routed(routes, &[("pool", eps, budget)]).await;
    let codes = curl_parallel(&fx, 30, 4, &[&fx.url("/x")]).await;
    assert!(codes.iter().all(|c| c == "200"), "{codes:?}");
    // A PUT's body goes again whole on the retry.
    for _ in 0..6 {
        let out = stdout(
            &run(curl(
                &fx,
                &[
                    "-D",
                    "-",
                    "-o",
                    "/dev/null",
                    "-X",
                    "PUT",
                    "--data-binary",
                    &"x".repeat(1000),
                    &fx.url("/put"),
                ],
            ))
            .await,
        );
        assert!(out.starts_with("HTTP/2 200"), "{out}");
        assert!(out.contains("x-body-bytes: 1000"), "{out}");
    }
    let retried = metric(
        &fx,
        "rampart_upstream_retries_total",
        &["cluster=\"pool\"", "reason=\"5xx\""],
    );
    assert_eq!(
        retried as usize,
        ups[1].hits(),
        "every 503 was retried, and counted"
    );
    assert!(ups[1].hits() >= 5, "round robin reached the bad endpoint");
    // POSTs are not repeated: some reach the bad endpoint and get its 503.
    let codes = curl_parallel(&fx, 12, 1, &["-d", "x", &fx.url("/post")]).await;
    assert!(codes.iter().any(|c| c == "503"), "{codes:?}");
    assert_eq!(
        metric(&fx, "rampart_upstream_retries_total", &["cluster=\"pool\""]),
        retried,
        "no POST was retried"
    );
}

/// An endpoint that takes 3 s to answer: with `per_try_timeout` and `on = ["timeout"]`, each
/// request that reaches it goes again to the other after 200 ms, and every client gets its
/// answer long before the slow one would have come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_past_its_timeout_goes_again_to_another_endpoint() {
    let slow = spawn_scripted_upstream("slow", 200).await;
    slow.delay_ms
        .store(3000, std::sync::atomic::Ordering::Relaxed);
    let quick = spawn_scripted_upstream("quick", 200).await;
    let routes = r#"[[routes]]
name = "api"
cluster = "pool"
retry = { attempts = 1, on = ["timeout"], per_try_timeout = "200ms", backoff_base = "1ms", backoff_max = "1ms" }"#;
    let fx = start_routed(routes, &[("pool", vec![slow.addr, quick.addr], "")]).await;
    let t = Instant::now();
    for _ in 0..4 {
        assert_eq!(served_by(&fx, &[&fx.url("/x")]).await, "quick");
    }
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    assert!(slow.hits() >= 1, "round robin reached the slow endpoint");
    assert_eq!(
        metric(
            &fx,
            "rampart_upstream_retries_total",
            &["reason=\"timeout\""]
        ) as usize,
        slow.hits()
    );
}

/// Every endpoint answers 503: the route would retry each request three times, but the
/// cluster's budget keeps retries to a share of the requests in flight, so the upstreams see
/// far less than four times the requests. With a budget that allows everything, they do see
/// four times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stay_within_the_budget_when_every_endpoint_fails() {
    const REQUESTS: usize = 120;
    for (budget, bounded) in [
        ("retry_budget = { percent = 20, min_concurrent = 1 }", true),
        (
            "retry_budget = { percent = 100, min_concurrent = 100 }",
            false,
        ),
    ] {
        let ups = [
            spawn_scripted_upstream("a", 503).await,
            spawn_scripted_upstream("b", 503).await,
            spawn_scripted_upstream("c", 503).await,
        ];
        for u in &ups {
            u.delay_ms.store(20, std::sync::atomic::Ordering::Relaxed);
        }
        let routes = r#"[[routes]]
name = "api"
cluster = "pool"
retry = { attempts = 3, backoff_base = "1ms", backoff_max = "2ms" }"#;
        let eps = ups.iter().map(|u| u.addr).collect();
        let fx = start_routed(
            routes,
            &[("pool", eps, &format!("max_requests = 200\n{budget}"))],
        )
        .await;
        let codes = curl_parallel(&fx, REQUESTS, 20, &[&fx.url("/x")]).await;
        assert_eq!(codes.len(), REQUESTS);
        assert!(codes.iter().all(|c| c == "503"), "{codes:?}");
        let hits: usize = ups.iter().map(|u| u.hits()).sum();
        let retries = metric(&fx, "rampart_upstream_retries_total", &["cluster=\"pool\""]) as usize;
        let refused = metric(
            &fx,
            "rampart_upstream_retries_refused_total",
            &["cluster=\"pool\""],
        );
        assert_eq!(hits, REQUESTS + retries, "every retry is counted");
        if bounded {
            // At most 20% of the ~20 requests in flight are retries: far from 4x.
            assert!(
                hits <= REQUESTS * 3 / 2,
                "{hits} upstream requests for {REQUESTS}"
            );
            assert!(refused >= (REQUESTS / 2) as f64, "refused {refused}");
        } else {
            assert_eq!(
                hits,
                REQUESTS * 4,
                "an unbounded budget lets every retry go"
            );
            assert_eq!(refused, 0.0);
        }
    }
}

/// Half of a route's requests are copied to a shadow cluster (its `Host` marked), whose
/// answers nobody waits for: a slow shadow delays no client, a dead one fails none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_is_mirrored_and_a_slow_or_dead_shadow_changes_nothing() {
    let main = spawn_scripted_upstream("main", 200).await;
    let shadow = spawn_scripted_upstream("shadow", 500).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let routes = r#"[[routes]]
name = "half"
path_prefix = "/half/"
cluster = "main"
mirror = { cluster = "shadow", percent = 50 }

[[routes]]
name = "all"
path_prefix = "/all/"
cluster = "main"
mirror = { cluster = "shadow" }

[[routes]]
name = "dead"
path_prefix = "/dead/"
cluster = "main"
mirror = { cluster = "dead" }
"#;
    let fx = start_routed(
        routes,
        &[
            ("main", vec![main.addr], ""),
            ("shadow", vec![shadow.addr], ""),
            ("dead", vec![dead], "connect_timeout = \"200ms\""),
        ],
    )
    .await;
    const N: usize = 400;
    let codes = curl_parallel(&fx, N, 8, &[&fx.url("/half/x")]).await;
    assert!(
        codes.iter().all(|c| c == "200"),
        "the shadow's 500s reach no client"
    );
    eventually_metric(
        &fx,
        "rampart_mirror_requests_total",
        &["route=\"half\"", "result=\"answered\""],
        160.0,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 50% of 400: 200 ± 4 standard deviations (10 each).
    let n = shadow.hits();
    assert!((160..=240).contains(&n), "{n} of {N} copied");
    assert_eq!(main.hits(), N);
    let host = shadow.hosts.lock().unwrap()[0].clone();
    assert_eq!(host, format!("localhost-shadow:{}", fx.port()));

    // A shadow that takes 3 s: clients still get their answers at once.
    shadow
        .delay_ms
        .store(3000, std::sync::atomic::Ordering::Relaxed);
    let t = Instant::now();
    let codes = curl_parallel(&fx, 10, 2, &[&fx.url("/all/x")]).await;
    assert!(codes.iter().all(|c| c == "200"), "{codes:?}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "slowed by the shadow: {:?}",
        t.elapsed()
    );

    // A dead shadow: every client request succeeds, the copies are counted as failed.
    let codes = curl_parallel(&fx, 10, 2, &[&fx.url("/dead/x")]).await;
    assert!(codes.iter().all(|c| c == "200"), "{codes:?}");
    eventually_metric(
        &fx,
        "rampart_mirror_requests_total",
        &["route=\"dead\"", "result=\"failed\""],
        10.0,
    )
    .await;
}
