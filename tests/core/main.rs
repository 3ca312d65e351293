//! The safety core in one process: `serve` with real guest components (built
//! from source by `scripts/build-guests.sh`) on the in-memory store, whose
//! faults (hangs, latency, a panic) cannot be produced on demand in a real
//! store. The end-to-end tests cover the same paths with real processes
//! where a real fault exists.
//!
//! Timings: lease 2 s, renew deadline 1 s, retry period 200 ms, grace
//! 500 ms, request timeout 200 ms.
// Tests may be long; production functions may not (clippy.toml).
#![allow(clippy::too_many_lines)]

mod bucket_conformance;
#[path = "../bucket_contract.rs"]
mod bucket_contract;
#[path = "../store_contract.rs"]
mod store_contract;
#[path = "../e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use baton::config::Config;
use baton::daemon::serve::{ServeError, serve_with};
use baton::election::TermClock;
use baton::store::memory::MemoryStore;

const IDENTITY: &str = "core-host";
const RENEW_DEADLINE: Duration = Duration::from_secs(1);
const GRACE: Duration = Duration::from_millis(500);
/// A forced stop lands within this of its time (an epoch tick and
/// scheduling; the timing rule allows 50 ms).
const STOP_ALLOWANCE_MS: f64 = 50.0;

/// Every log event of this test binary, parsed as the lines arrive.
fn log() -> &'static Mutex<Log> {
    static LOG: OnceLock<Mutex<Log>> = OnceLock::new();
    LOG.get_or_init(|| {
        struct Sink;
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                log().lock().unwrap().take(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_env_filter("info")
            .with_writer(|| Sink)
            .init();
        Mutex::new(Log::default())
    })
}

#[derive(Default)]
struct Log {
    partial: Vec<u8>,
    events: Vec<support::Event>,
}

impl Log {
    fn take(&mut self, buf: &[u8]) {
        self.partial.extend_from_slice(buf);
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let Ok(json) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            let at = json
                .get("timestamp")
                .and_then(Value::as_str)
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .unwrap_or_else(SystemTime::now);
            self.events.push(support::Event { json, at });
        }
    }
}

/// The events logged so far whose `plugin` or `lease` field names one of
/// `names` (so tests do not see each other's events).
fn events(names: &[&str]) -> Vec<support::Event> {
    log()
        .lock()
        .unwrap()
        .events
        .iter()
        .filter(|e| {
            ["plugin", "lease"]
                .iter()
                .any(|k| e.str(k).is_some_and(|v| names.contains(&v)))
        })
        .cloned()
        .collect()
}

async fn wait_for_event(
    names: &[&str],
    what: &str,
    pred: impl Fn(&support::Event) -> bool,
) -> support::Event {
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = events(names).into_iter().find(|e| pred(e)) {
            return e;
        }
        assert!(
            std::time::Instant::now() < until,
            "no {what}; events: {:?}",
            events(names)
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// A configuration with one lease and the given probe plugins
/// (name, world, mode).
fn config(lease: &str, plugins: &[(&str, &str, &str)]) -> Config {
    let mut text = format!(
        "identity = {IDENTITY:?}\ncache-dir = {:?}\n[defaults]\nlease-duration = \"2s\"\nrenew-deadline = \"1s\"\n\
         retry-period = \"200ms\"\ngrace = \"500ms\"\n[[lease]]\nname = {lease:?}\n",
        support::shared_cache_dir().display().to_string()
    );
    for (name, world, mode) in plugins {
        text.push_str(&format!(
            "[[plugin]]\nname = {name:?}\npath = {:?}\nlease = {lease:?}\nenv = {{ PROBE_MODE = {mode:?} }}\n",
            support::guest(&format!("probe_{world}.wasm")).display().to_string()
        ));
    }
    Config::parse(&text, None).unwrap()
}

struct Serving {
    store: MemoryStore,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<usize, ServeError>>,
}

fn serve(config: Config) -> Serving {
    log();
    let store = MemoryStore::new();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve_with(
        config,
        Some(Arc::new(store.client())),
        TermClock::system(),
        shutdown.clone(),
    ));
    Serving {
        store,
        shutdown,
        task,
    }
}

async fn started(plugins: &[&str]) {
    for p in plugins {
        wait_for_event(&[p], "guest start", |e| e.guest_line(p, "probe start")).await;
    }
}

fn stopped(e: &support::Event, plugin: &str) -> bool {
    e.is("leader task stopped", Some(plugin))
}

/// Checks a stop event against the force-stop time it carries.
fn assert_on_time(e: &support::Event) {
    let force = e.str("force_stop_at").expect("force_stop_at");
    let force = humantime::parse_rfc3339(force).unwrap();
    let late = support::ms_between(force, e.at);
    assert!(
        late <= STOP_ALLOWANCE_MS,
        "stopped {late:.1} ms after its force-stop time: {:?}",
        e.json
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_elector_stops_its_tasks_and_fails_without_releasing_the_lease() {
    let lease = "dies";
    let s = serve(config(
        lease,
        &[
            ("dies-coop", "pollable", "cooperative"),
            ("dies-block", "future", "block"),
        ],
    ));
    started(&["dies-coop", "dies-block"]).await;
    s.store.panic_next_update();
    let result = timeout(Duration::from_secs(10), s.task)
        .await
        .expect("serve returned")
        .unwrap();
    match result {
        Err(ServeError::ElectorFailed { lease: l, reason }) => {
            assert_eq!(l, lease);
            assert!(reason.contains("injected panic"), "{reason}");
        }
        other => panic!("expected the elector's failure, got {other:?}"),
    }
    // Its tasks were stopped before serve returned: the cooperative one at
    // once, the one that ignores the change by force.
    let names = ["dies", "dies-coop", "dies-block"];
    let coop = events(&names)
        .into_iter()
        .find(|e| stopped(e, "dies-coop"))
        .expect("coop stopped");
    assert_eq!(coop.str("how"), Some("cooperative"));
    let block = events(&names)
        .into_iter()
        .find(|e| stopped(e, "dies-block"))
        .expect("block stopped");
    assert_eq!(block.str("how"), Some("forced"));
    assert_on_time(&block);
    assert!(
        events(&names)
            .iter()
            .any(|e| e.message().starts_with("an elector failed")),
        "the failure was logged"
    );
    // Not released: the record still names this host, and expires by itself.
    let record = s.store.peek(lease).unwrap().record;
    assert_eq!(record.holder(), Some(IDENTITY));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_store_cannot_keep_a_guest_past_the_deadline_plus_grace() {
    let s = serve(config(
        "hangs",
        &[
            ("hangs-busy", "pollable", "busy"),
            ("hangs-block", "future", "block"),
        ],
    ));
    started(&["hangs-busy", "hangs-block"]).await;
    let hung_at = SystemTime::now();
    s.store.hang(true);
    for p in ["hangs-busy", "hangs-block"] {
        let e = wait_for_event(&[p], "forced stop", |e| stopped(e, p)).await;
        assert_eq!(e.str("how"), Some("forced"), "{p}");
        assert_on_time(&e);
        // The force-stop time is at most the deadline of the last renewal
        // that was confirmed before the hang, plus the grace.
        let force = humantime::parse_rfc3339(e.str("force_stop_at").unwrap()).unwrap();
        let bound = (RENEW_DEADLINE + GRACE).as_secs_f64() * 1e3;
        let after_hang = support::ms_between(hung_at, force);
        assert!(
            after_hang <= bound,
            "{p}: force-stop {after_hang:.0} ms after the hang (bound {bound} ms)"
        );
        println!(
            "store hang: {p} stopped {:.0} ms after the hang",
            support::ms_between(hung_at, e.at)
        );
    }
    s.store.hang(false);
    s.shutdown.cancel();
    let result = timeout(Duration::from_secs(10), s.task)
        .await
        .expect("serve returned")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_store_delays_the_release_until_after_every_guest_is_gone() {
    let names = ["slow", "slow-coop", "slow-block"];
    let s = serve(config(
        "slow",
        &[
            ("slow-coop", "pollable", "cooperative"),
            ("slow-block", "pollable", "block"),
        ],
    ));
    started(&["slow-coop", "slow-block"]).await;
    // Every request now takes most of the request timeout.
    s.store.set_latency(Duration::from_millis(150));
    sleep(Duration::from_millis(500)).await;
    s.shutdown.cancel();
    let result = timeout(Duration::from_secs(10), s.task)
        .await
        .expect("serve returned")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    let all = events(&names);
    let released = all
        .iter()
        .find(|e| e.message() == "released the lease")
        .expect("released");
    for p in ["slow-coop", "slow-block"] {
        let stop = all.iter().find(|e| stopped(e, p)).expect("stopped");
        assert!(stop.at <= released.at, "{p} stopped after the release");
    }
    assert_eq!(s.store.peek("slow").unwrap().record.holder(), None);
}

/// A port on loopback that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn get(addr: &str, path: &'static str) -> (u16, String) {
    let addr = addr.to_owned();
    tokio::task::spawn_blocking(move || support::http_get(&addr, path).expect("an answer"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_never_fails_liveness_and_its_errors_are_counted() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cfg = config("unanswered", &[("unanswered-coop", "pollable", "cooperative")]);
    cfg.admin_address = Some(addr.parse().unwrap());
    let s = serve(cfg);
    started(&["unanswered-coop"]).await;
    assert_eq!(get(&addr, "/readyz").await, (200, "ready\n".to_owned()));
    assert_eq!(get(&addr, "/healthz").await, (200, "ok\n".to_owned()));

    // The store hangs for longer than the lease: the leader steps down and
    // its guest stops, and liveness never fails (a restart cures nothing).
    s.store.hang(true);
    let hung = std::time::Instant::now();
    let mut polls = 0;
    while hung.elapsed() < Duration::from_secs(3) {
        let (status, body) = get(&addr, "/healthz").await;
        assert_eq!(status, 200, "after {:?} of a hung store: {body}", hung.elapsed());
        polls += 1;
        sleep(Duration::from_millis(100)).await;
    }
    wait_for_event(&["unanswered-coop"], "the guest's stop", |e| {
        stopped(e, "unanswered-coop")
    })
    .await;
    let (_, text) = get(&addr, "/metrics").await;
    let leading = support::metric(&text, "baton_lease_role{lease=\"unanswered\",role=\"leading\"}");
    assert_eq!(leading, Some(0.0), "stepped down:\n{text}");
    let timeouts = support::metric(
        &text,
        "baton_lease_store_errors_total{lease=\"unanswered\",kind=\"timeout\"}",
    )
    .unwrap_or(0.0);
    assert!(timeouts >= 1.0, "the timed-out requests are counted:\n{text}");
    // Unavailable instead of hanging: the same.
    s.store.hang(false);
    s.store.set_unavailable(true);
    for _ in 0..10 {
        assert_eq!(get(&addr, "/healthz").await.0, 200);
        sleep(Duration::from_millis(100)).await;
    }
    let (_, text) = get(&addr, "/metrics").await;
    assert!(
        support::metric_sum(&text, "baton_lease_store_errors_total", &["kind=\"unavailable\""]) >= 1.0,
        "{text}"
    );
    println!("/healthz answered 200 {polls} times while the store hung, and while it refused");
    s.store.set_unavailable(false);
    s.shutdown.cancel();
    let result = timeout(Duration::from_secs(10), s.task)
        .await
        .expect("serve returned")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    // The admin endpoints are gone with serve.
    sleep(Duration::from_millis(100)).await;
    assert!(support::http_get(&addr, "/healthz").is_err());
}

/// The store contract (`tests/store_contract.rs`) on the stores that need
/// no server: each rule on a new, empty store.
mod conformance {
    /// On the memory store: every client another [`MemoryStore::client`].
    mod memory {
        use baton::store::memory::MemoryStore;

        macro_rules! on_memory {
            ($rule:ident) => {
                #[tokio::test]
                async fn $rule() {
                    let store = MemoryStore::new();
                    crate::store_contract::$rule(|| store.client()).await;
                }
            };
        }

        crate::store_contract::for_each_rule!(on_memory);
    }

    /// On the embedded store in a temporary directory: every client a store
    /// opened on it anew.
    mod embedded {
        use baton::store::embedded::EmbeddedStore;

        macro_rules! on_embedded {
            ($rule:ident) => {
                #[tokio::test]
                async fn $rule() {
                    let dir = tempfile::tempdir().unwrap();
                    let leases = dir.path().join("leases");
                    crate::store_contract::$rule(|| EmbeddedStore::open(&leases).unwrap()).await;
                }
            };
        }

        crate::store_contract::for_each_rule!(on_embedded);
    }
}
