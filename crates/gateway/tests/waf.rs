//! The web application firewall through a running gateway: ModSecurity v3 with Debian's OWASP
//! Core Rule Set in front of a real upstream, over HTTP/1.1 and HTTP/2 with curl.

mod common;
use common::*;
use std::path::Path;

/// Routes: `/detect` reports only; `/search` blocks but exempts `q` from 942100 (libinjection's
/// SQL injection check); everything else blocks, inspecting at most 64 KiB of a body. Matches
/// go to `waf.log` and requests to `access.log` in the config's folder.
fn waf_routes(text: String, dir: &Path) -> String {
    let routes = format!(
        r#"
[waf]
log = "{log}"
threads = 2

[[routes]]
name = "detect"
path_prefix = "/detect"
cluster = "app"
waf = {{ mode = "detect" }}

[[routes]]
name = "search"
path_prefix = "/search"
cluster = "app"
waf = {{ mode = "block", exclusions = [{{ rules = [942100], path_prefix = "/search", argument = "q" }}] }}

[[routes]]
name = "site"
cluster = "app"
waf = {{ mode = "block", paranoia = 1, anomaly_threshold = 5, body_limit = 65536 }}
"#,
        log = dir.join("waf.log").display()
    );
    log_to_file(text, dir).replace("[[routes]]\ncluster = \"app\"\n", &routes)
}

async fn start_waf() -> Fixture {
    start_edited("", waf_routes).await
}

/// A request's status and body.
async fn get(fx: &Fixture, args: &[&str]) -> (String, String) {
    let mut all = vec!["-w", "\n%{http_code}"];
    all.extend_from_slice(args);
    let out = stdout(&run(curl(fx, &all)).await);
    let (body, status) = out.rsplit_once('\n').unwrap_or(("", &out));
    (status.to_string(), body.to_string())
}

/// The WAF log's lines, once there are at least `want` (it is written by the inspection
/// threads).
async fn waf_log(fx: &Fixture, want: usize) -> Vec<serde_json::Value> {
    let path = fx.dir.path().join("waf.log");
    for _ in 0..250 {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= want {
            return lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("fewer than {want} WAF log lines");
}

/// A gateway whose `[waf]` logs to `waf.log` in its folder, followed by `rest` (more `[waf]`
/// settings, then its `[[routes]]` and any `[[clusters]]`) in place of the default route; the
/// access log goes to `access.log` there too.
async fn start_with_waf(rest: &str) -> Fixture {
    let rest = rest.to_string();
    start_edited("", move |text, dir| {
        let waf = format!(
            "\n[waf]\nlog = \"{}\"\n{rest}",
            dir.join("waf.log").display()
        );
        log_to_file(text, dir).replace("[[routes]]\ncluster = \"app\"\n", &waf)
    })
    .await
}

/// Asserts `rampart_waf_requests_total` for each (route, result): exactly that many.
fn assert_waf_results(fx: &Fixture, want: &[(&str, &str, f64)]) {
    let m = fx.gw().metrics.render();
    for (route, result, n) in want {
        let labels = [format!("route=\"{route}\""), format!("result=\"{result}\"")];
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        assert_eq!(
            metric_sum(&m, "rampart_waf_requests_total", &labels),
            *n,
            "{route} {result}: {m}"
        );
    }
}

/// The tests of this file run one at a time: one of them bounds this process's memory while
/// it streams 200 MB, and the others' gateways would count against it.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SQLI: &str = "/search?id=1%27%20OR%20%271%27%3D%271";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_are_blocked_with_the_request_id_and_ordinary_requests_pass() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_waf().await;
    let attacks: &[(&str, &[&str])] = &[
        ("sql injection", &[SQLI]),
        (
            "xss",
            &["/comment?text=%3Cscript%3Ealert(document.cookie)%3C%2Fscript%3E"],
        ),
        (
            "path traversal",
            &["/files?name=..%2F..%2F..%2Fetc%2Fpasswd"],
        ),
        (
            "scanner",
            &["-A", "sqlmap/1.7.2#stable (https://sqlmap.org)", "/"],
        ),
        (
            "sql injection in a form",
            &[
                "--data",
                "user=admin&pass=x%27%20UNION%20SELECT%20password%20FROM%20users--",
                "/login",
            ],
        ),
        (
            "sql injection in a JSON body",
            &[
                "-H",
                "content-type: application/json",
                "--data",
                r#"{"user":"admin","pass":"x' UNION SELECT password FROM users--"}"#,
                "/api/login",
            ],
        ),
        (
            "sql injection in an XML body",
            &[
                "-H",
                "content-type: text/xml",
                "--data",
                "<login><pass>x' UNION SELECT password FROM users--</pass></login>",
                "/soap",
            ],
        ),
    ];
    for http in ["--http1.1", "--http2"] {
        for (what, args) in attacks {
            let mut a = vec![http, "-H", "X-Request-Id: waf-test-1"];
            let path = fx.url(args.last().unwrap());
            a.extend_from_slice(&args[..args.len() - 1]);
            a.push(&path);
            let (status, body) = get(&fx, &a).await;
            assert_eq!(status, "403", "{http} {what}: {body}");
            assert!(
                body.contains("web application firewall") && body.contains("waf-test-1"),
                "{http} {what}: {body}"
            );
        }
        // Browser-like and API requests pass, their bodies reach the upstream whole.
        let json = r#"{"item":"sku-1234","quantity":2,"note":"leave at the door"}"#;
        let ordinary: Vec<(Vec<String>, &str, &str)> = vec![
            (vec![fx.url("/")], "200", ""),
            (
                vec![fx.url("/products?category=shoes&sort=price_asc&page=2")],
                "404",
                "",
            ),
            (
                vec![
                    "-H".into(),
                    "Content-Type: application/json".into(),
                    "--data".into(),
                    json.into(),
                    fx.url("/echo"),
                ],
                "200",
                json,
            ),
            (
                vec![
                    "--data".into(),
                    "name=Jane+Doe&email=jane%40example.com&message=Hello+there".into(),
                    fx.url("/echo"),
                ],
                "200",
                "name=Jane+Doe",
            ),
            (
                vec![
                    "-F".into(),
                    "file=@/etc/hostname;filename=photo.jpg;type=image/jpeg".into(),
                    fx.url("/discard"),
                ],
                "200",
                "",
            ),
        ];
        for (args, want, body_has) in ordinary {
            let mut a = vec![http];
            a.extend(args.iter().map(String::as_str));
            let (status, body) = get(&fx, &a).await;
            assert_eq!(status, want, "{http} {args:?}: {body}");
            assert!(body.contains(body_has), "{http} {args:?}: {body}");
        }
        // A JSON body the WAF cannot parse is one it did not inspect: refused.
        let broken = [
            "-H",
            "content-type: application/json",
            "--data",
            r#"{"pass":"x"#,
        ];
        let mut a = vec![http];
        a.extend(broken);
        let url = fx.url("/echo");
        a.push(&url);
        let (status, body) = get(&fx, &a).await;
        assert_eq!(status, "400", "{http}: {body}");
    }
    // Each block logged with its rules and the variable's name, never the client's value.
    let lines = waf_log(&fx, 2).await;
    let sqli = lines
        .iter()
        .find(|l| l["rule"] == 942100)
        .expect("942100 in the WAF log");
    assert_eq!(sqli["variable"], "ARGS:id");
    assert_eq!(sqli["action"], "blocked");
    assert_eq!(sqli["request_id"], "waf-test-1");
    assert_eq!(sqli["route"], "search");
    assert!(lines.iter().any(|l| l["rule"] == 949110));
    let text = std::fs::read_to_string(fx.dir.path().join("waf.log")).unwrap();
    assert!(
        !text.contains("'1'='1") && !text.contains("UNION SELECT"),
        "{text}"
    );
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_waf_requests_total", &["result=\"blocked\""]),
        16.0,
        "{m}"
    );
    assert!(metric_sum(&m, "rampart_waf_rule_matches_total", &["rule=\"942100\""]) >= 2.0);
    assert_eq!(
        metric_sum(&m, "rampart_waf_requests_total", &["result=\"pass\""]),
        10.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detect_mode_passes_and_an_exclusion_exempts_exactly_its_argument() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_waf().await;
    // Detection only: the attack reaches the upstream (404 there), and is logged.
    let (status, _) = get(&fx, &[&fx.url("/detect?id=1%27%20OR%20%271%27%3D%271")]).await;
    assert_eq!(status, "404");
    let lines = waf_log(&fx, 1).await;
    assert!(lines
        .iter()
        .any(|l| l["rule"] == 942100 && l["action"] == "logged" && l["route"] == "detect"));
    // /search exempts q from 942100 (the only rule this payload trips): it passes there, and
    // the same payload in another argument is still blocked.
    let (status, _) = get(&fx, &[&fx.url("/search?q=1%27%20OR%20%271%27%3D%271")]).await;
    assert_eq!(status, "404", "q is exempt");
    let (status, _) = get(&fx, &[&fx.url(SQLI)]).await;
    assert_eq!(status, "403", "id is not");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &m,
            "rampart_waf_requests_total",
            &["route=\"detect\"", "result=\"detected\""]
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(
            &m,
            "rampart_waf_requests_total",
            &["route=\"search\"", "result=\"pass\""]
        ),
        1.0,
        "{m}"
    );
    let log = access_log(&fx, 3).await;
    assert!(
        log.iter()
            .all(|r| r["waf"] == "inspected" || r["waf"] == "blocked"),
        "{log:?}"
    );
}

/// A 100 MB upload through a WAF route: the first 64 KiB inspected, the rest streamed upstream
/// uninspected (counted and logged as partial) with memory bounded by the limit, not the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_upload_streams_past_the_inspected_prefix_in_bounded_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_waf().await;
    const SIZE: u64 = 100 * 1024 * 1024;
    let rss = RssPeak::start();
    // A file upload as a browser sends one (multipart; CRS 3.3 allows no raw body types).
    let file = fx.dir.path().join("big.bin");
    std::fs::File::create(&file).unwrap().set_len(SIZE).unwrap();
    let field = format!(
        "file=@{};filename=big.bin;type=application/octet-stream",
        file.display()
    );
    for http in ["--http1.1", "--http2"] {
        let (status, body) = get(&fx, &[http, "-F", &field, &fx.url("/discard")]).await;
        let log = std::fs::read_to_string(fx.dir.path().join("waf.log")).unwrap_or_default();
        assert_eq!(status, "200", "{http}: {body} {log}");
        // The upstream counted the whole multipart body: the file and its framing.
        let got: u64 = body.trim().parse().unwrap();
        assert!((SIZE..SIZE + 1024).contains(&got), "{http}: {got}");
    }
    let grew_mib = rss.grew_mib();
    assert!(
        grew_mib < 48,
        "memory grew {grew_mib} MiB for 100 MB uploads"
    );
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(&m, "rampart_waf_partial_bodies_total", &["route=\"site\""]),
        2.0,
        "{m}"
    );
    let log = access_log(&fx, 2).await;
    assert!(log.iter().all(|r| r["waf"] == "partial"), "{log:?}");
}

/// Overload: one inspection thread behind a one-request queue, and 48 form posts at once on
/// one HTTP/2 connection. The blocking route refuses what it cannot inspect with 503 and
/// `Retry-After`; the detecting route passes it on uninspected; the access log and the metric
/// say so for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_inspection_queue_refuses_on_blocking_routes_and_passes_on_detecting_ones() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_edited("", |text, dir| {
        // The client's share above the queue: the queue itself fills (one client here).
        waf_routes(text, dir).replace(
            "threads = 2",
            "threads = 1\nqueue = 1\nqueue_per_client = 64",
        )
    })
    .await;
    let form = format!("comment={}", "a".repeat(32 * 1024));
    const N: usize = 48;
    let mut statuses = Vec::new();
    for path in ["/detect/discard", "/discard"] {
        let url = fx.url(path);
        let mut args = vec!["--http2", "-Z", "--parallel-max", "64"];
        args.extend(["-w", "%{http_code} %header{retry-after}\n", "--data", &form]);
        for _ in 0..N {
            args.extend(["-o", "/dev/null", url.as_str()]);
        }
        let out = stdout(&run(curl(&fx, &args)).await);
        let got: Vec<String> = out.lines().map(|l| l.trim().to_string()).collect();
        assert_eq!(got.len(), N, "{path}: {out}");
        statuses.push(got);
    }
    let (detect, block) = (&statuses[0], &statuses[1]);
    assert!(
        detect.iter().all(|s| !s.starts_with("503")),
        "the detecting route passes what it cannot inspect: {detect:?}"
    );
    assert!(
        block.iter().any(|s| s == "503 1"),
        "the blocking route refuses with 503 and Retry-After: {block:?}"
    );
    let m = fx.gw().metrics.render();
    for route in ["detect", "site"] {
        let route_label = format!("route=\"{route}\"");
        let overloaded = metric_sum(
            &m,
            "rampart_waf_requests_total",
            &[&route_label, "result=\"overloaded\""],
        );
        assert!(overloaded >= 1.0, "{route}: {m}");
    }
    let log = access_log(&fx, 2 * N).await;
    let unavailable = |route: &str| {
        log.iter()
            .filter(|r| r["route"] == route && r["waf"] == "unavailable")
            .count()
    };
    assert!(unavailable("detect") >= 1, "{log:?}");
    let refused = block.iter().filter(|s| s.starts_with("503")).count();
    assert_eq!(unavailable("site"), refused, "{log:?}");
}

/// `waf.response_headers`: a route's own phase-3 rule (here: an upstream 404 withheld as 502)
/// runs on the upstream's response in the transaction its request opened. Blocking routes
/// replace the response with the request id; detecting ones log and pass it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_are_inspected_when_the_route_asks() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_edited("", |text, dir| {
        let rule = dir.join("responses.conf");
        std::fs::write(
            &rule,
            "SecRule RESPONSE_STATUS \"@streq 404\" \"id:10001,phase:3,deny,status:502,log,msg:'upstream 404 withheld'\"\n\
             SecRule REQUEST_URI \"@beginsWith /dead\" \"id:10002,phase:5,pass,log,msg:'logging phase'\"\n",
        )
        .unwrap();
        let routes = format!(
            r#"
[waf]
log = "{log}"

[[routes]]
name = "detect"
path_prefix = "/detect"
cluster = "app"
waf = {{ mode = "detect", response_headers = true, rules = ["{rule}"] }}

[[routes]]
name = "dead"
path_prefix = "/dead"
cluster = "dead"
waf = {{ mode = "block", response_headers = true, rules = ["{rule}"] }}

[[routes]]
name = "site"
cluster = "app"
waf = {{ mode = "block", response_headers = true, rules = ["{rule}"] }}

[[clusters]]
name = "dead"
endpoints = ["127.0.0.1:9"]
"#,
            log = dir.join("waf.log").display(),
            rule = rule.display(),
        );
        log_to_file(text, dir).replace("[[routes]]\ncluster = \"app\"\n", &routes)
    })
    .await;
    let (status, _) = get(&fx, &[&fx.url("/headers")]).await;
    assert_eq!(status, "200", "a 200 passes");
    let (status, body) = get(&fx, &["-H", "x-request-id: waf-resp-1", &fx.url("/nope")]).await;
    assert_eq!(status, "502", "{body}");
    assert!(body.contains("waf-resp-1"), "{body}");
    let (status, _) = get(&fx, &[&fx.url("/detect/nope")]).await;
    assert_eq!(status, "404", "detect mode passes the response");
    // The request phases still run first: an attack never reaches the upstream.
    let (status, _) = get(&fx, &[&fx.url(SQLI)]).await;
    assert_eq!(status, "403");
    // An exchange that fails (nothing listens for "dead"): the kept transaction still gets
    // its logging phase, whose match is logged.
    let (status, _) = get(&fx, &["-H", "x-request-id: waf-dead-1", &fx.url("/dead/x")]).await;
    assert_eq!(status, "502");
    let lines = waf_log(&fx, 4).await;
    assert!(
        lines.iter().any(|l| l["phase"] == "logging"
            && l["rule"] == 10002
            && l["request_id"] == "waf-dead-1"),
        "{lines:?}"
    );
    let response_lines: Vec<_> = lines.iter().filter(|l| l["phase"] == "response").collect();
    assert_eq!(response_lines.len(), 2, "{lines:?}");
    assert!(response_lines.iter().any(|l| l["rule"] == 10001
        && l["route"] == "site"
        && l["action"] == "blocked"
        && l["request_id"] == "waf-resp-1"
        && l["status"] == 404));
    assert!(response_lines
        .iter()
        .any(|l| l["rule"] == 10001 && l["route"] == "detect" && l["action"] == "logged"));
    assert_waf_results(
        &fx,
        &[
            ("site", "response_blocked", 1.0),
            ("detect", "response_detected", 1.0),
        ],
    );
    let log = access_log(&fx, 5).await;
    assert!(
        log.iter().any(|r| r["waf"] == "response_blocked"),
        "{log:?}"
    );
}

/// An SQL error page, as a failing application would leak it (CRS 951230, MySQL).
const SEEN_PAGE: &str = "<html><body>12 parcels left the warehouse today.</body></html>\n";

fn gzip(b: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

const SQL_LEAK: &str = "<html><body>Query failed: You have an error in your SQL syntax; \
    check the manual that corresponds to your MySQL server version</body></html>\n";

/// An upstream for response bodies, one response per connection, named by the path's last
/// segment: `/leak` (an SQL error page,
/// with a length), `/split` (the same page in two chunks, split inside the message), `/page`
/// (an ordinary page), `/late` (100 KiB of page, then the leak, chunked), `/gzip` (the leak
/// gzipped, whatever the request accepts), `/br` (the leak marked `Content-Encoding: br`),
/// `/seen` (an ordinary page, gzipped when the request accepts gzip, naming the
/// `Accept-Encoding` it got in `x-seen-accept-encoding`), `/png` (the leak as an image),
/// `/stall` (headers and a first chunk, then nothing for 30 s).
async fn spawn_leaky_upstream() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let accept_encoding = head
                    .lines()
                    .filter_map(|l| l.split_once(':'))
                    .find(|(n, _)| n.eq_ignore_ascii_case("accept-encoding"))
                    .map_or("(none)".to_string(), |(_, v)| v.trim().to_string());
                // The last segment names the response (`/detect/leak` is `/leak`).
                let target = head.split_whitespace().nth(1).unwrap_or("");
                let path = format!("/{}", target.rsplit('/').next().unwrap_or(""));
                let whole = |ct: &str, extra: &str, body: &[u8]| {
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    r.extend_from_slice(body);
                    r
                };
                let chunked = |parts: &[&[u8]]| {
                    let mut r = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
                    for p in parts {
                        r.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
                        r.extend_from_slice(p);
                        r.extend_from_slice(b"\r\n");
                    }
                    r.extend_from_slice(b"0\r\n\r\n");
                    r
                };
                let leak = SQL_LEAK.as_bytes();
                let filler = vec![b'a'; 100 * 1024];
                let resp = match path.as_str() {
                    "/leak" => whole("text/html; charset=utf-8", "", leak),
                    "/split" => chunked(&[&leak[..40], &leak[40..]]),
                    "/page" => whole(
                        "text/html",
                        "",
                        b"<html><body>3 orders shipped today.</body></html>\n",
                    ),
                    "/late" => chunked(&[&filler[..50 * 1024], &filler[50 * 1024..], leak]),
                    "/gzip" => whole("text/html", "content-encoding: gzip\r\n", &gzip(leak)),
                    "/br" => whole("text/html", "content-encoding: br\r\n", leak),
                    "/seen" => {
                        let page = SEEN_PAGE.as_bytes();
                        let seen = format!("x-seen-accept-encoding: {accept_encoding}\r\n");
                        if accept_encoding.contains("gzip") {
                            whole(
                                "text/html",
                                &format!("{seen}content-encoding: gzip\r\n"),
                                &gzip(page),
                            )
                        } else {
                            whole("text/html", &seen, page)
                        }
                    }
                    "/png" => whole("image/png", "", leak),
                    "/stall" => {
                        let first = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
                        let _ = s.write_all(first).await;
                        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                        return;
                    }
                    _ => {
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            .to_vec()
                    }
                };
                let _ = s.write_all(&resp).await;
            });
        }
    });
    addr
}

/// `waf.response_body`: the Core Rule Set's data-leak rules read response bodies (phase 4).
/// An SQL error page is withheld on a blocking route (also when the message is split across
/// chunks, over HTTP/2, and gzipped by an upstream that was not asked for gzip) and logged on
/// a detecting one; an ordinary page passes whole; the upstream is asked only for codings the
/// inspection reads through; a leak past `response_body_limit`, in a body of a coding it
/// cannot read or in an image passes, the first two counted; a body that stalls before the
/// limit is a 502, not a cut page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_bodies_that_leak_are_withheld_when_the_route_asks() {
    let _one = ONE_AT_A_TIME.lock().await;
    let leaky = spawn_leaky_upstream().await;
    let fx = start_with_waf(&format!(
        r#"
[[clusters]]
name = "leaky"
endpoints = ["{leaky}"]
body_timeout = "1s"

[[routes]]
name = "detect"
path_prefix = "/detect/"
cluster = "leaky"
waf = {{ mode = "detect", response_body = true }}

[[routes]]
name = "site"
cluster = "leaky"
waf = {{ mode = "block", response_body = true, response_body_limit = 65536 }}
"#
    ))
    .await;
    let (status, body) = get(&fx, &["-H", "x-request-id: leak-1", &fx.url("/leak")]).await;
    assert_eq!(status, "403", "{body}");
    assert!(body.contains("leak-1") && !body.contains("SQL"), "{body}");
    let (status, body) = get(&fx, &["--http2", &fx.url("/split")]).await;
    assert_eq!(status, "403", "{body}");
    let (status, body) = get(&fx, &[&fx.url("/page")]).await;
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("200", "<html><body>3 orders shipped today.</body></html>\n")
    );
    let (status, body) = get(&fx, &[&fx.url("/detect/leak")]).await;
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("200", SQL_LEAK),
        "detect mode passes it"
    );
    // Past the limit: the first 64 KiB inspected and sent ahead, then the rest; all of it.
    let (status, body) = get(&fx, &[&fx.url("/late")]).await;
    assert_eq!(status, "200");
    assert_eq!(body.len(), 100 * 1024 + SQL_LEAK.len());
    assert!(body.ends_with(SQL_LEAK));
    let (status, body) = get(&fx, &["--compressed", &fx.url("/gzip")]).await;
    assert_eq!(status, "403", "decoded and read: {body}");
    let (status, body) = get(&fx, &[&fx.url("/br")]).await;
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("200", SQL_LEAK),
        "not read"
    );
    // What the upstream is asked for, and what the client gets: curl's `--compressed` accepts
    // deflate, gzip, br and zstd; the upstream hears only the first two and gzips, and the
    // page reaches the client gzipped, as it left the upstream.
    for (accepts, upstream_heard, coding) in [
        (None, "deflate, gzip", "gzip"),
        (
            Some("accept-encoding: br;q=1, gzip;q=0.5"),
            "gzip;q=0.5",
            "gzip",
        ),
        (Some("accept-encoding: br, zstd"), "identity", ""),
    ] {
        let mut args = vec![
            "--compressed",
            "-w",
            "\n%header{x-seen-accept-encoding}\n%header{content-encoding}\n%{http_code}",
        ];
        args.extend(accepts.iter().flat_map(|h| ["-H", *h]));
        let url = fx.url("/seen");
        args.push(&url);
        let (status, out) = get(&fx, &args).await;
        assert_eq!(status, "200", "{out}");
        let lines: Vec<&str> = out.rsplitn(3, '\n').collect();
        assert_eq!(
            (lines[2], lines[1], lines[0]),
            (SEEN_PAGE, upstream_heard, coding),
            "{accepts:?}"
        );
    }
    let (status, _) = get(&fx, &[&fx.url("/png")]).await;
    assert_eq!(status, "200");
    let (status, body) = get(&fx, &[&fx.url("/stall")]).await;
    assert_eq!(status, "502", "{body}");
    let lines = waf_log(&fx, 4).await;
    let leaks: Vec<_> = lines
        .iter()
        .filter(|l| l["phase"] == "response" && l["rule"] == 951230)
        .collect();
    assert_eq!(leaks.len(), 4, "{lines:?}");
    assert!(leaks
        .iter()
        .any(|l| l["route"] == "detect" && l["action"] == "logged"));
    assert!(leaks.iter().any(|l| l["request_id"] == "leak-1"
        && l["action"] == "blocked"
        && l["body_inspected"] == SQL_LEAK.len()));
    assert_waf_results(
        &fx,
        &[
            ("site", "response_blocked", 3.0),
            ("detect", "response_detected", 1.0),
            ("site", "response_partial", 1.0),
            ("site", "response_encoded", 1.0),
        ],
    );
    let log = access_log(&fx, 12).await;
    for want in ["response_blocked", "response_partial", "response_encoded"] {
        assert!(log.iter().any(|r| r["waf"] == want), "{want}: {log:?}");
    }
}

/// A request body the client content-codes. The Core Rule Set refuses `Content-Encoding` on
/// requests (920450); on routes that exempt it, as an API taking compressed uploads must:
/// gzip and deflate are inspected decoded (an attack compressed is still an attack) and reach
/// the upstream as sent; one that expands far past `body_limit` is read only that far; a
/// coding the WAF cannot read is refused with 415 and the codings it can on a blocking route
/// (the application might decode it), and passes, counted, on a detecting one; a coding named
/// over no body changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coded_request_bodies_are_inspected_decoded_or_refused() {
    use std::io::Write;
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_with_waf(
        r#"
[[routes]]
name = "detect"
path_prefix = "/detect"
cluster = "app"
waf = { mode = "detect", exclusions = [{ rules = [920450] }] }

[[routes]]
name = "site"
cluster = "app"
waf = { mode = "block", body_limit = 65536, exclusions = [{ rules = [920450] }] }

[[routes]]
name = "strict"
path_prefix = "/strict/"
cluster = "app"
waf = { mode = "block" }
"#,
    )
    .await;
    let dir = fx.dir.path();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        format!("@{}", path.display())
    };
    let attack = b"user=admin&pass=x%27%20UNION%20SELECT%20password%20FROM%20users--";
    let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    zlib.write_all(attack).unwrap();
    let gz_attack = write("attack.gz", &gzip(attack));
    let zlib_attack = write("attack.zlib", &zlib.finish().unwrap());
    let plain_attack = write("attack.txt", attack);
    let form = b"name=Jane+Doe&email=jane%40example.com&message=Hello+there";
    let gz_form = gzip(form);
    let gz_form_file = write("form.gz", &gz_form);
    // 8 MiB of a harmless form value in about 8 KiB: read as far as body_limit (64 KiB).
    let mut big = b"message=".to_vec();
    big.resize(8 << 20, b'a');
    let gz_big = write("big.gz", &gzip(&big));
    let echoed = dir.join("echoed.bin");
    let echoed_arg = echoed.display().to_string();
    let post = |coding: &'static str, file: &str, path: &str| {
        vec![
            "-H".to_string(),
            format!("content-encoding: {coding}"),
            "-H".into(),
            "content-type: application/x-www-form-urlencoded".into(),
            "--data-binary".into(),
            file.to_string(),
            fx.url(path),
        ]
    };
    for http in ["--http1.1", "--http2"] {
        for (coding, file) in [("gzip", &gz_attack), ("deflate", &zlib_attack)] {
            let mut a = vec![http.to_string()];
            a.extend(post(coding, file, "/login"));
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let (status, body) = get(&fx, &a).await;
            assert_eq!(status, "403", "{http} {coding}: {body}");
        }
        // The upstream gets the gzip bytes the client sent.
        let mut a = vec![http.to_string(), "-o".into(), echoed_arg.clone()];
        a.extend(post("gzip", &gz_form_file, "/echo"));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let (status, _) = get(&fx, &a).await;
        assert_eq!(status, "200", "{http}");
        assert_eq!(std::fs::read(&echoed).unwrap(), gz_form, "{http}");
    }
    let mut a = post("gzip", &gz_big, "/discard");
    a.extend(["-o".into(), "/dev/null".into()]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let (status, _) = get(&fx, &a).await;
    assert_eq!(status, "200");
    // A coding the WAF cannot read: refused where it blocks, passed where it detects.
    let mut a = post("br", &plain_attack, "/login");
    a.extend(["-w".into(), "%{http_code} %header{accept-encoding}".into()]);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = stdout(&run(curl(&fx, &a)).await);
    assert!(
        out.contains("cannot read a request body in this content coding"),
        "{out}"
    );
    assert!(out.ends_with("415 gzip, deflate"), "{out}");
    let a = post("br", &plain_attack, "/detect");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let (status, _) = get(&fx, &a).await;
    assert_eq!(status, "404", "the upstream's answer");
    let (status, _) = get(&fx, &["-H", "content-encoding: br", &fx.url("/")]).await;
    assert_eq!(status, "200", "no body, nothing hidden");
    // Without the exemption, the Core Rule Set refuses a coded request body outright.
    let a = post("gzip", &gz_form_file, "/strict/echo");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let (status, _) = get(&fx, &a).await;
    assert_eq!(status, "403");
    let lines = waf_log(&fx, 1).await;
    assert!(lines
        .iter()
        .any(|l| l["rule"] == 920450 && l["route"] == "strict"));
    assert_waf_results(
        &fx,
        &[
            ("site", "blocked", 4.0),
            ("site", "encoded", 1.0),
            ("detect", "encoded", 1.0),
        ],
    );
    let log = access_log(&fx, 11).await;
    let waf_of = |path: &str| -> Vec<String> {
        log.iter()
            .filter(|r| r["path"] == path)
            .map(|r| r["waf"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(waf_of("/discard"), ["partial"]);
    assert_eq!(waf_of("/detect"), ["encoded"]);
    assert!(waf_of("/login").contains(&"encoded".to_string()));
}

/// `body_past_limit`: an attack placed past `body_limit` behind harmless padding passes a
/// route that inspects the prefix (counted as partial) and is refused with 413 by one that
/// refuses: at once when `Content-Length` says so, after the limit's worth of a chunked
/// body, and when a gzip body decodes past it; bodies within the limit pass as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_limit_is_refused_where_the_route_says_so() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_with_waf(
        r#"
[[routes]]
name = "lenient"
cluster = "app"
headers = [{ name = "x-route", exact = "lenient" }]
waf = { mode = "block", body_limit = 65536 }

[[routes]]
name = "strict"
cluster = "app"
waf = { mode = "block", body_limit = 65536, body_past_limit = "refuse", exclusions = [{ rules = [920450] }] }
"#,
    )
    .await;
    let dir = fx.dir.path();
    let mut padded = b"note=".to_vec();
    padded.resize(70 * 1024, b'a');
    padded.extend_from_slice(b"&pass=x%27%20UNION%20SELECT%20password%20FROM%20users--");
    let padded_file = dir.join("padded.txt");
    std::fs::write(&padded_file, &padded).unwrap();
    let padded_arg = format!("@{}", padded_file.display());
    let gz_file = dir.join("padded.gz");
    std::fs::write(&gz_file, gzip(&padded)).unwrap();
    let gz_arg = format!("@{}", gz_file.display());
    let form = ["-H", "content-type: application/x-www-form-urlencoded"];
    let post = |extra: &[&str], data: &str| {
        let mut a: Vec<String> = form.iter().chain(extra).map(|s| s.to_string()).collect();
        a.extend([
            "--data-binary".into(),
            data.to_string(),
            "-o".into(),
            "/dev/null".into(),
            fx.url("/discard"),
        ]);
        a
    };
    let fx = &fx;
    let status = |args: Vec<String>| async move {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        get(fx, &a).await.0
    };
    assert_eq!(
        status(post(&["-H", "x-route: lenient"], &padded_arg)).await,
        "200",
        "past the inspected prefix"
    );
    for http in ["--http1.1", "--http2"] {
        assert_eq!(status(post(&[http], &padded_arg)).await, "413", "{http}");
    }
    // No length declared: refused once the limit's worth has been read.
    let chunked = ["--http1.1", "-H", "transfer-encoding: chunked"];
    assert_eq!(status(post(&chunked, &padded_arg)).await, "413");
    // Small when sent, past the limit once decoded.
    let gz = ["-H", "content-encoding: gzip"];
    assert_eq!(status(post(&gz, &gz_arg)).await, "413");
    // Within the limit: inspected and passed.
    assert_eq!(status(post(&[], "note=hello")).await, "200");
    assert_waf_results(
        fx,
        &[("strict", "too_large", 4.0), ("lenient", "pass", 1.0)],
    );
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &m,
            "rampart_waf_partial_bodies_total",
            &["route=\"lenient\""]
        ),
        1.0
    );
    let log = access_log(fx, 6).await;
    let too_large = log.iter().filter(|r| r["waf"] == "too_large").count();
    assert_eq!(too_large, 4, "{log:?}");
}

/// `[waf] queue_per_client`: one client's requests waiting for or in inspection are bounded,
/// so a client sending slow-to-inspect requests cannot fill the queue for everyone. Past its
/// share it gets 429 with `Retry-After` on a blocking route (counted as `client_share`),
/// while another client (127.0.0.2) is still inspected and served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_fill_the_inspection_queue() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_with_waf(
        r#"threads = 1
queue = 16
queue_per_client = 2

[[routes]]
name = "site"
cluster = "app"
waf = { mode = "block", body_limit = 4194304 }
"#,
    )
    .await;
    // One long form value: every CRS rule on ARGS scans its 1 MiB (most of a second in
    // ModSecurity, a release build whatever this test's profile).
    let slow = fx.dir.path().join("slow.txt");
    let mut body = b"note=".to_vec();
    body.resize(1 << 20, b'a');
    std::fs::write(&slow, &body).unwrap();
    let slow_arg = format!("@{}", slow.display());
    let post = |source: &str, data: &str| {
        let args = [
            "--interface",
            source,
            "--data-binary",
            data,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %header{retry-after}",
        ];
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.push(fx.url("/discard"));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        run(curl(&fx, &a))
    };
    let first = tokio::spawn(post("127.0.0.1", &slow_arg));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let second = tokio::spawn(post("127.0.0.1", &slow_arg));
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let third = stdout(&post("127.0.0.1", "note=hello").await);
    let other = tokio::spawn(post("127.0.0.2", "note=hello"));
    let (first, second) = (
        stdout(&first.await.unwrap()),
        stdout(&second.await.unwrap()),
    );
    let other = stdout(&other.await.unwrap());
    assert_eq!(third, "429 1", "past its share");
    assert_eq!((first.as_str(), second.as_str()), ("200 ", "200 "));
    assert_eq!(other, "200 ", "another client");
    let m = fx.gw().metrics.render();
    assert_eq!(
        metric_sum(
            &m,
            "rampart_waf_requests_total",
            &["result=\"client_share\""]
        ),
        1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_file_that_fails_to_load_is_refused_naming_the_route_and_file() {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    std::fs::write(
        dir.path().join("custom.conf"),
        "SecRule ARGS \"@rx x\" \"id:77,phase:2,deny\"\nSecNoSuchDirective on\n",
    )
    .unwrap();
    let text = config_text(&["127.0.0.1:9".parse().unwrap()], "", "").replace(
        "[[routes]]\ncluster = \"app\"\n",
        "[[routes]]\nname = \"api\"\ncluster = \"app\"\nwaf = { mode = \"block\", rules = [\"custom.conf\"] }\n",
    );
    let e = start_refused(dir.path(), &text).await;
    assert!(
        e.contains("routes[0].waf (api)") && e.contains("custom.conf"),
        "{e}"
    );
    // A missing file is a config error with the field's path.
    let text = text.replace("custom.conf", "missing.conf");
    let e = gateway::config::Config::parse(&text, "rampart.toml", dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("routes[0].waf.rules[0]") && e.contains("missing.conf"),
        "{e}"
    );
}

/// Over HTTP/3 (aioquic) the same phase inspects: the attack gets 403 with the request id
/// (its Host from `:authority`), an ordinary request passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_requests_are_inspected_too() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = start_edited("[listeners.quic]\nenabled = true", waf_routes).await;
    let port = fx.gw().quic_listeners[0].1.port().to_string();
    let h3 = |path: &str| {
        let mut c = std::process::Command::new("python3");
        c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/h3_client.py"))
            .args([
                "--port",
                &port,
                "--path",
                path,
                "--header",
                "x-request-id: waf-h3-1",
            ]);
        c
    };
    let lines = |out: std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap()
    };
    let r = lines(run(h3(SQLI)).await);
    assert_eq!(r["status"], 403, "{r}");
    assert!(r["body"].as_str().unwrap().contains("waf-h3-1"), "{r}");
    // An upload larger than the inspected prefix: the read frames, then the rest, reach the
    // upstream whole.
    let mut up = h3("/discard");
    up.args(["--method", "POST", "--body-size", "3000000"]);
    let r = lines(run(up).await);
    assert_eq!(
        (r["status"].clone(), r["body"].clone()),
        (200.into(), "3000000\n".into()),
        "{r}"
    );
    let r = lines(run(h3("/bytes/100")).await);
    let log = std::fs::read_to_string(fx.dir.path().join("waf.log")).unwrap_or_default();
    assert_eq!(r["status"], 200, "{r}\n{log}");
}
