//! Outgoing HTTP (`wasi:http`): real `baton` processes, the `http-probe`
//! guest built from source, and small HTTP servers run by the test that
//! record every request and every connection's end.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, SystemTime};

use crate::http_server::{Seen, Server};
use crate::support::*;
use crate::witness::force_stop_at;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// A `[[plugin]]` table of the http-probe guest.
fn plugin(name: &str, env: &str, grants: &str) -> String {
    format!(
        "\n[[plugin]]\nname = {name:?}\npath = {:?}\nlease = \"demo\"\nenv = {{ {env} }}\n{grants}\n",
        guest("http_probe.wasm").display().to_string()
    )
}

fn line_of(h: &Host, plugin: &str, prefix: &str) -> Event {
    h.wait_for(SECS(30), prefix, |e| e.guest_line(plugin, prefix))
}

#[test]
fn baton_check_names_the_http_import_of_a_plugin_that_has_one() {
    let check = |file: &str| {
        let out = baton().arg("check").arg(guest(file)).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let http = check("http_probe.wasm");
    println!("{http}");
    assert!(
        http.contains("ok: targets baton:leader/pollable-plugin@0.1.0"),
        "{http}"
    );
    assert!(
        http.contains("also imports wasi:http/outgoing-handler (needs `http` grants)"),
        "{http}"
    );
    let plain = check("rust_pollable_ticker.wasm");
    assert!(!plain.contains("wasi:http"), "{plain}");

    // A grant that is not an origin, and a CA file that is missing, are
    // refused at start, naming the file, plugin and field.
    let s = Scratch::new();
    for (grant, says) in [
        ("http = [\"https://api.example.com/v1\"]", "names no path"),
        ("http = [\"ftp://files.example.com\"]", "is not http or https"),
        (
            "http = [{ url = \"https://api.internal\", ca = \"missing-ca.pem\" }]",
            "cannot read the CA file",
        ),
    ] {
        let bad = s.write(
            "bad.toml",
            &[config(&s.store(), &[]), plugin("bad", "", grant)].concat(),
        );
        let out = baton().args(["run", "--config"]).arg(&bad).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{}", stderr.trim());
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("{}:", bad.display()))
                && stderr.contains("plugin \"bad\": field `http`")
                && stderr.contains(says),
            "{stderr}"
        );
    }
}

#[test]
fn http_requests_reach_only_granted_origins_and_carry_the_term() {
    let server = Server::start();
    let other = Server::start();
    let (p, q) = (server.addr.port(), other.addr.port());
    let s = Scratch::new();
    let text = [
        config(&s.store(), &[]),
        plugin(
            "fetch",
            &format!("HTTP_URL = \"http://127.0.0.1:{p}/hello\", HTTP_TICK_MS = \"100\""),
            &format!("http = [\"http://127.0.0.1:{p}\"]"),
        ),
        plugin(
            "elsewhere",
            &format!("HTTP_URL = \"http://127.0.0.1:{q}/hello\", HTTP_MODE = \"once\""),
            &format!("http = [\"http://127.0.0.1:{p}\"]"),
        ),
        plugin(
            "by-name",
            &format!("HTTP_URL = \"http://localhost:{p}/hello\", HTTP_MODE = \"once\""),
            &format!("http = [\"http://localhost:{p}\"]"),
        ),
        plugin(
            "big-request",
            &format!("HTTP_URL = \"http://127.0.0.1:{p}/upload\", HTTP_MODE = \"once\", HTTP_BODY_BYTES = \"2097152\""),
            &format!("http = [\"http://127.0.0.1:{p}\"]\nhttp-limits = {{ request-body = \"1 MiB\" }}"),
        ),
        plugin(
            "big-response",
            &format!("HTTP_URL = \"http://127.0.0.1:{p}/big\", HTTP_MODE = \"once\""),
            &format!("http = [\"http://127.0.0.1:{p}\"]\nhttp-limits = {{ response-body = \"1 MiB\" }}"),
        ),
        plugin(
            "parallel",
            &format!(
                "HTTP_URL = \"http://127.0.0.1:{p}/hang\", HTTP_MODE = \"parallel\", HTTP_PARALLEL = \"3\", \
                 HTTP_AFTER_URL = \"http://127.0.0.1:{p}/hello\""
            ),
            &format!("http = [\"http://127.0.0.1:{p}\"]\nhttp-limits = {{ concurrent = 2 }}"),
        ),
    ]
    .concat();
    let cfg = s.write("baton.toml", &text);
    let mut a = Host::start("http-a", &cfg);
    let loaded = a.wait_for(SECS(30), "fetch loaded", |e| {
        e.message() == "plugin loaded" && e.str("plugin") == Some("fetch")
    });
    assert_eq!(
        loaded.str("grants").map(str::to_owned),
        Some(format!("env HTTP_TICK_MS,HTTP_URL; http http://127.0.0.1:{p}"))
    );

    // Granted: answered, with the lease and the term set by the host (the
    // guest's forged `baton-term: 999` replaced) and the guest's own header.
    let ok = line_of(&a, "fetch", "http ok");
    assert!(
        ok.message()
            .starts_with("http ok status=200 bytes=5 body=hello term=1"),
        "{}",
        ok.message()
    );
    let first = server
        .seen()
        .into_iter()
        .find(|r| r.path == "/hello")
        .expect("a request");
    println!("a granted request's headers: {:?}", first.headers);
    assert_eq!(first.headers.get("baton-lease").map(String::as_str), Some("demo"));
    assert_eq!(first.headers.get("baton-term").map(String::as_str), Some("1"));
    assert_eq!(first.headers.get("x-probe").map(String::as_str), Some("yes"));

    // Not granted: refused inside the guest, logged with the plugin and
    // the destination, and nothing reaches the other server.
    let refused = line_of(&a, "elsewhere", "http error");
    assert_eq!(
        refused.message(),
        "http error ErrorCode::HttpRequestDenied term=1"
    );
    let logged = a.wait_for(SECS(5), "the refusal in the log", |e| {
        e.message().starts_with("HTTP request refused") && e.str("plugin") == Some("elsewhere")
    });
    assert_eq!(
        logged.str("destination").map(str::to_owned),
        Some(format!("http://127.0.0.1:{q}"))
    );
    // A grant by name never reaches the host's own addresses.
    let by_name = line_of(&a, "by-name", "http error");
    assert_eq!(
        by_name.message(),
        "http error ErrorCode::DestinationIpProhibited term=1"
    );
    println!("refused: {}; {}", refused.message(), by_name.message());
    // Limits: a request body over the limit, a response body over it.
    let big_request = line_of(&a, "big-request", "http error");
    assert!(
        big_request.message().contains("HttpRequestBodySize"),
        "{}",
        big_request.message()
    );
    let big_response = line_of(&a, "big-response", "http error");
    assert!(
        big_response.message().contains("body size exceeds limit"),
        "{}",
        big_response.message()
    );
    println!("limits: {}; {}", big_request.message(), big_response.message());
    // Two requests in flight at most: the third is refused inside the
    // guest, the two others wait (the server never answers `/hang`); once
    // the guest drops them, their places are free again.
    let parallel = line_of(&a, "parallel", "http parallel");
    assert_eq!(
        parallel.message(),
        "http parallel started=3 refused=1 pending=2 errors=0 term=1"
    );
    let after = a.wait_for(SECS(10), "the request after the dropped ones", |e| {
        e.guest_line("parallel", "http ok") || e.guest_line("parallel", "http error")
    });
    assert!(
        after.message().starts_with("http ok status=200"),
        "{}",
        after.message()
    );
    a.wait_for(SECS(5), "the refusal in the log", |e| {
        e.message()
            .starts_with("HTTP request refused: the plugin has as many requests in flight")
            && e.str("plugin") == Some("parallel")
    });
    assert_eq!(
        server.seen().iter().filter(|r| r.path == "/hang").count(),
        2,
        "only the requests within the limit went out"
    );
    println!("concurrency: {}; then {}", parallel.message(), after.message());
    assert!(
        server
            .seen()
            .iter()
            .filter(|r| r.path == "/upload")
            .all(|r| r.method == "POST" && r.body <= 1 << 20),
        "no more than the limit went out"
    );

    // A second host takes over after a SIGTERM: from its first request on,
    // every request carries the new term, none the old one.
    let b = Host::start("http-b", &cfg);
    b.wait_for(SECS(30), "b follows", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    std::thread::sleep(SECS(1));
    a.sigterm();
    assert!(a.wait_exit(SECS(10)).success());
    // Term 2, unless a lost its lead under the suite's load (renew deadline
    // 1 s) and won it again before the SIGTERM: b's term is the one it says.
    let led = b.wait_for(SECS(10), "b leads", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("leading")
    });
    let term_b = led.u64("term").expect("b's term");
    assert!(term_b >= 2, "b leads term {term_b}");
    let ok = line_of(&b, "fetch", "http ok");
    assert!(
        ok.message().ends_with(&format!("term={term_b}")),
        "{}",
        ok.message()
    );
    std::thread::sleep(SECS(1));
    let hellos: Vec<Seen> = server.seen().into_iter().filter(|r| r.path == "/hello").collect();
    let terms: Vec<u64> = hellos
        .iter()
        .map(|r| r.headers["baton-term"].parse().expect("a term number"))
        .collect();
    let first_new = terms
        .iter()
        .position(|t| *t == term_b)
        .unwrap_or_else(|| panic!("term {term_b} reached the server: {terms:?}"));
    assert!(
        terms.windows(2).all(|w| w[0] <= w[1]),
        "a term went back: {terms:?}"
    );
    assert!(
        terms[first_new..].iter().all(|t| *t == term_b),
        "an older term's request after term {term_b} began: {terms:?}"
    );
    println!(
        "{} requests in a's terms, then {} in term {term_b}",
        first_new,
        terms.len() - first_new
    );
    assert!(
        other.seen().is_empty(),
        "the ungranted server saw {:?}",
        other.seen()
    );
}

#[test]
fn an_http_request_in_flight_is_dropped_at_the_force_stop() {
    let server = Server::start();
    let p = server.addr.port();
    let s = Scratch::new();
    let text = [
        config(&s.store(), &[]),
        plugin(
            "hang",
            &format!("HTTP_URL = \"http://127.0.0.1:{p}/hang\", HTTP_MODE = \"hang\""),
            &format!("http = [\"http://127.0.0.1:{p}\"]"),
        ),
    ]
    .concat();
    let cfg = s.write("baton.toml", &text);
    let mut h = Host::start("http-hang", &cfg);
    let until = std::time::Instant::now() + SECS(30);
    while server.seen().is_empty() {
        assert!(std::time::Instant::now() < until, "no request arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The guest waits for an answer that never comes, ignoring the change:
    // a yield ends its term (the host lives on, standing by), and the
    // grace (500 ms) ends the request: the host drops it at the forced
    // stop, while it still runs, rather than closing it at its exit. (How
    // soon after the force-stop time the server saw it closed is a figure.)
    let termed = SystemTime::now();
    let out = crate::yielding::yield_cmd(&[
        "demo".as_ref(),
        "--for".as_ref(),
        "10m".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let stopped = h.wait_for(SECS(30), "the forced stop", |e| {
        e.is("leader task stopped", Some("hang"))
    });
    assert_stopped_by_force(&h, &stopped, GRACE);
    let force_stop = force_stop_at(&stopped);
    let until = std::time::Instant::now() + SECS(30);
    while server.seen().iter().any(|r| r.closed.is_none()) {
        assert!(
            std::time::Instant::now() < until,
            "the request was not dropped at the forced stop: {:?}",
            server.seen()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(h.exited().is_none(), "the host exited: {}", h.output());
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "one request, none after: {seen:?}");
    let closed = seen[0].closed.expect("the connection was closed");
    println!(
        "a request in flight: a yield, then the force-stop {:.0} ms later; the server saw the connection closed {:+.1} ms from the force-stop time",
        ms_between(termed, force_stop),
        ms_between(force_stop, closed)
    );
    assert!(ms_between(termed, closed) >= 450.0, "the grace was honoured");
    h.sigterm();
    assert!(h.wait_exit(SECS(10)).success());
}

/// The Rust SDK's requests give up at a change, in both worlds: a guest
/// waiting for an answer that never comes notices the end of its term at
/// once, drops the request (the server sees the connection closed), and
/// returns long before the grace is over.
#[test]
fn sdk_requests_waiting_for_an_answer_give_up_at_a_change() {
    let server = Server::start();
    let p = server.addr.port();
    let s = Scratch::new();
    let table = |name: &str, file: &str| {
        format!(
            "\n[[plugin]]\nname = {name:?}\npath = {:?}\nlease = \"demo\"\n\
             env = {{ PROBE_MODE = \"http\", PROBE_URL = \"http://127.0.0.1:{p}/hang\" }}\n\
             http = [\"http://127.0.0.1:{p}\"]\n",
            guest(file).display().to_string()
        )
    };
    let text = [
        config(&s.store(), &[]),
        table("pollable", "probe_pollable.wasm"),
        table("future", "probe_future.wasm"),
    ]
    .concat();
    let cfg = s.write("baton.toml", &text);
    let mut h = Host::start("sdk-http", &cfg);
    for plugin in ["pollable", "future"] {
        h.wait_for(SECS(30), "the task runs", |e| e.guest_line(plugin, "probe start"));
    }
    let until = std::time::Instant::now() + SECS(10);
    while server.seen().iter().filter(|r| r.path == "/hang").count() < 2 {
        assert!(std::time::Instant::now() < until, "{:?}", server.seen());
        std::thread::sleep(Duration::from_millis(10));
    }
    let termed = SystemTime::now();
    h.sigterm();
    let mut force_stop = Vec::new();
    for plugin in ["pollable", "future"] {
        let gave_up = h.wait_for(SECS(15), "the guest gives up", |e| {
            e.guest_line(plugin, "probe http abandoned")
        });
        let stopped = h.wait_for(SECS(15), "the task's end", |e| {
            e.is("leader task stopped", Some(plugin))
        });
        // Returned, not stopped at the grace: woken by the change (the
        // pollable world at once; the future world checks it every 5 ms or
        // so while a request waits). How soon is a figure.
        assert_eq!(stopped.str("how"), Some("cooperative"), "{plugin}");
        assert!(gave_up.at <= stopped.at, "{plugin}: gave up after its task ended");
        force_stop.push(force_stop_at(&stopped));
        let took = ms_between(termed, gave_up.at);
        println!("{plugin}: gave up its request {took:.1} ms after the SIGTERM");
    }
    assert!(h.wait_exit(SECS(10)).success());
    // The server's threads note the closing a moment after it.
    let until = std::time::Instant::now() + SECS(10);
    while server.seen().iter().any(|r| r.closed.is_none()) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let closed: Vec<f64> = server
        .seen()
        .iter()
        .filter(|r| r.path == "/hang")
        .map(|r| ms_between(termed, r.closed.expect("the connection was closed")))
        .collect();
    println!("the server saw the connections closed {closed:.1?} ms after the SIGTERM");
    // Closed, by the time the grace would have ended the guests (give or
    // take a busy machine's wake-up of the server's threads).
    let by = force_stop.iter().max().unwrap();
    assert!(
        closed.iter().all(|&ms| ms <= ms_between(termed, *by) + 1000.0),
        "closed {closed:?} ms after the SIGTERM; the force-stop time was {:.0} ms after it",
        ms_between(termed, *by)
    );
}

/// A TLS server (`openssl s_server -www`) on loopback with a certificate
/// for 127.0.0.1 signed by a CA of its own; killed when dropped.
struct TlsServer {
    child: std::process::Child,
    port: u16,
    ca: std::path::PathBuf,
}

impl TlsServer {
    fn start(dir: &std::path::Path) -> TlsServer {
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("openssl (the test suite installs it with the Kubernetes test server)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=baton test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "server.ext",
        ]);
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("openssl")
            .args([
                "s_server",
                "-accept",
                &format!("127.0.0.1:{port}"),
                "-cert",
                "server.pem",
                "-key",
                "server.key",
                "-www",
                "-quiet",
            ])
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + SECS(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < until,
                "openssl s_server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        TlsServer {
            child,
            port,
            ca: dir.join("ca.pem"),
        }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn https_verifies_the_server_against_the_web_roots_and_the_granted_ca() {
    let s = Scratch::new();
    let tls = TlsServer::start(s.dir.path());
    let p = tls.port;
    let url = format!("HTTP_URL = \"https://127.0.0.1:{p}/\", HTTP_MODE = \"once\"");
    let text = [
        config(&s.store(), &[]),
        plugin(
            "trusted",
            &url,
            &format!(
                "http = [{{ url = \"https://127.0.0.1:{p}\", ca = {:?} }}]",
                tls.ca.display().to_string()
            ),
        ),
        plugin("unknown-ca", &url, &format!("http = [\"https://127.0.0.1:{p}\"]")),
    ]
    .concat();
    let cfg = s.write("baton.toml", &text);
    let h = Host::start("https", &cfg);
    let trusted = h.wait_for(SECS(30), "trusted", |e| e.guest_line("trusted", "http "));
    println!("with the CA granted: {}", trusted.message());
    assert!(
        trusted.message().starts_with("http ok status=200"),
        "{}",
        trusted.message()
    );
    let unknown = h.wait_for(SECS(30), "unknown-ca", |e| e.guest_line("unknown-ca", "http "));
    println!("without it: {}", unknown.message());
    assert_eq!(
        unknown.message(),
        "http error ErrorCode::TlsCertificateError term=1"
    );
    h.wait_for(SECS(5), "the reason in the log", |e| {
        e.message()
            .starts_with("HTTP request failed: the server's certificate")
            && e.str("plugin") == Some("unknown-ca")
    });
}
