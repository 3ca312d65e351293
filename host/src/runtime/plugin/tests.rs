//! Tests of [`plugin`](super).

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::*;
use crate::runtime::{CacheUse, Compile, CompileObserver, DirGrant, EngineOptions, Grants, PluginEngine};

/// A test guest built by `scripts/build-guests.sh`, found through
/// `BATON_GUESTS_DIR` (set by `scripts/test.sh`).
pub(crate) use crate::support::test_guests::guest;

#[test]
fn a_file_named_again_is_read_again_only_when_it_changed() {
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugin.wasm");
    std::fs::copy(guest("probe_pollable.wasm"), &path).unwrap();
    assert_eq!(runtime.check("a", &path).unwrap().world(), World::Pollable);
    // Unchanged: the same compilation, not read again.
    assert_eq!(runtime.check("b", &path).unwrap().world(), World::Pollable);
    assert_eq!(runtime.files.lock().unwrap().len(), 1);
    assert_eq!(runtime.components(), 1);
    // Rewritten in place: read again, and judged by its new bytes.
    std::fs::write(&path, b"not a component").unwrap();
    let e = runtime.check("c", &path).err().expect("garbage is refused");
    assert!(e.to_string().contains("not a WebAssembly file"), "{e}");
    // Replaced by another component: that one's world.
    std::fs::copy(guest("probe_future.wasm"), &path).unwrap();
    assert_eq!(runtime.check("d", &path).unwrap().world(), World::Future);
    assert_eq!(runtime.components(), 2);
}

/// One thing a [`CompileObserver`] was told: the plugin, the size, and
/// `None` for a start or `Some` with the end's cache use.
type Event = (String, u64, Option<Option<CacheUse>>);

/// What a [`CompileObserver`] was told, in order.
#[derive(Default)]
struct Told(Mutex<Vec<Event>>);

impl CompileObserver for Told {
    fn compiling(&self, c: &Compile) {
        self.0.lock().unwrap().push((c.plugin.to_string(), c.bytes, None));
    }
    fn compiled(&self, c: &Compile, _: std::time::Duration, cache: Option<CacheUse>) {
        self.0
            .lock()
            .unwrap()
            .push((c.plugin.to_string(), c.bytes, Some(cache)));
    }
}

#[test]
fn each_compilation_is_announced_with_where_its_code_came_from() {
    let cache = tempfile::tempdir().unwrap();
    let runtime = |cache_dir: Option<&Path>| {
        let engine = PluginEngine::new(EngineOptions {
            cache_dir: cache_dir.map(Path::to_owned),
            ..EngineOptions::default()
        })
        .unwrap();
        let mut runtime = PluginRuntime::new(engine).unwrap();
        let told = Arc::new(Told::default());
        runtime.set_compile_observer(told.clone());
        (runtime, told)
    };
    let file = guest("probe_pollable.wasm");
    let bytes = std::fs::metadata(&file).unwrap().len();
    let (first, told) = runtime(Some(cache.path()));
    first.check("a", &file).unwrap();
    // Named again, or by another plugin: compiled once.
    first.check("b", &file).unwrap();
    let miss = vec![
        ("a".to_owned(), bytes, None),
        ("a".to_owned(), bytes, Some(Some(CacheUse::Miss))),
    ];
    assert_eq!(*told.0.lock().unwrap(), miss);
    // Another process (engine) on the same cache: from the cache.
    let (second, told) = runtime(Some(cache.path()));
    second.check("c", &file).unwrap();
    assert_eq!(
        told.0.lock().unwrap().last(),
        Some(&("c".to_owned(), bytes, Some(Some(CacheUse::Hit))))
    );
    // Without a cache.
    let (third, told) = runtime(None);
    third.check("d", &file).unwrap();
    assert_eq!(
        told.0.lock().unwrap().last(),
        Some(&("d".to_owned(), bytes, Some(Some(CacheUse::Off))))
    );
    // A component that does not compile: announced, and ended without
    // a cache use (its error says why).
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"\0asm\x0d\x00\x01\x00garbage").unwrap();
    assert!(third.check("e", &bad).is_err());
    assert_eq!(
        told.0.lock().unwrap().last(),
        Some(&("e".to_owned(), 15, Some(None)))
    );
}

#[test]
fn every_version_of_the_contract_is_served_and_told_apart() {
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    // Built with the SDK: the newest, 0.4.0, with a health check;
    // `hosts_future` calls `current-hosts`, the probes do not (and so do
    // not import it).
    for (file, world, hosts) in [
        ("hosts_future.wasm", World::Future, true),
        ("probe_pollable.wasm", World::Pollable, false),
        ("probe_future.wasm", World::Future, false),
        ("sched_probe.wasm", World::Pollable, false),
        ("health_probe.wasm", World::Pollable, false),
    ] {
        let p = runtime.check(file, &guest(file)).unwrap();
        assert_eq!(
            (p.world(), p.contract(), p.uses_hosts()),
            (world, Contract::V0_4, hosts),
            "{file}"
        );
        assert_eq!(p.wit_world(), world.wit_name_in(Contract::V0_4));
        assert_eq!(p.wit_world(), world.wit_name());
        let flavour = match world {
            World::Future => "baton:leader/health-async@0.4.0",
            World::Pollable => "baton:leader/health-sync@0.4.0",
        };
        assert_eq!(p.health_export(), Some(flavour), "{file}");
    }
    // Built with wit-bindgen against wit/v0.3.0: no health check.
    let p = runtime.check("v03", &guest("probe_v03.wasm")).unwrap();
    assert_eq!(
        (p.world(), p.contract(), p.exports_health_check()),
        (World::Pollable, Contract::V0_3, false)
    );
    assert_eq!(p.wit_world(), "baton:leader/pollable-plugin@0.3.0");
    // Built with wit-bindgen against wit/v0.2.0, calling `current-hosts`.
    let p = runtime.check("hosts", &guest("hosts_pollable.wasm")).unwrap();
    assert_eq!(
        (p.world(), p.contract(), p.uses_hosts()),
        (World::Pollable, Contract::V0_2, true)
    );
    assert_eq!(p.wit_world(), "baton:leader/pollable-plugin@0.2.0");
    // Built with wit-bindgen against wit/v0.1.0.
    let p = runtime.check("http", &guest("http_probe.wasm")).unwrap();
    assert_eq!(
        (p.world(), p.contract(), p.uses_hosts()),
        (World::Pollable, Contract::V0_1, false)
    );
    assert_eq!(p.wit_world(), "baton:leader/pollable-plugin@0.1.0");
    // The SDK's ticker does not call `current-hosts`: not imported.
    let p = runtime
        .check("ticker", &guest("rust_pollable_ticker.wasm"))
        .unwrap();
    assert_eq!((p.contract(), p.uses_hosts()), (Contract::V0_4, false));
    assert!(Contract::V0_3.tells_scheduled_run() && !Contract::V0_2.tells_scheduled_run());
    assert!(Contract::V0_4.has_health_check() && !Contract::V0_3.has_health_check());
}

/// What the guests print while `f` runs on this thread (a current-thread
/// runtime), one log message a line.
pub(crate) fn guest_lines<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) -> String {
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f());
    String::from_utf8(sink.0.lock().unwrap().clone()).unwrap()
}

/// A lease led in term `number` for a minute, as a task is given it.
fn led(
    number: u64,
) -> (
    Arc<crate::election::Term>,
    tokio::sync::watch::Receiver<crate::election::LeaseView>,
) {
    led_at(number, None)
}

/// [`led`], this host advertising `address`.
fn led_at(
    number: u64,
    address: Option<&str>,
) -> (
    Arc<crate::election::Term>,
    tokio::sync::watch::Receiver<crate::election::LeaseView>,
) {
    use crate::election::{LeaseView, Role, Status, Term, TermClock};
    let clock = TermClock::system();
    let now = clock.now();
    let term = Term::begin(
        "sched",
        number,
        std::time::Duration::from_millis(500),
        clock,
        now + std::time::Duration::from_secs(60),
    );
    let view = LeaseView {
        status: Status {
            role: Role::Leading,
            holder: Some("me".into()),
            lease: "sched".into(),
            term: number,
        },
        term: Some(term.clone()),
        since: now,
        yielded: None,
        holder_address: address.map(str::to_owned),
    };
    let (tx, rx) = tokio::sync::watch::channel(view);
    // The elector stays: a closed channel is not a change.
    std::mem::forget(tx);
    (term, rx)
}

/// A lease another host leads, as a following host sees it.
fn followed() -> tokio::sync::watch::Receiver<crate::election::LeaseView> {
    use crate::election::{LeaseView, Role, Status, TermClock};
    let view = LeaseView {
        status: Status {
            role: Role::Following,
            holder: Some("other".into()),
            lease: "sched".into(),
            term: 5,
        },
        term: None,
        since: TermClock::system().now(),
        yielded: None,
        holder_address: None,
    };
    let (tx, rx) = tokio::sync::watch::channel(view);
    std::mem::forget(tx);
    rx
}

/// A spec for the test guest `file` with the variables `env` and, if
/// given, a directory granted as `/records`.
pub(crate) fn spec_of(file: &str, env: &[(&str, &str)], records: Option<&Path>) -> PluginSpec {
    PluginSpec {
        name: file.trim_end_matches(".wasm").replace('_', "-"),
        path: guest(file),
        digest: None,
        memory_limit: DEFAULT_MEMORY_LIMIT,
        grants: Grants {
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            files: records
                .map(|host| DirGrant {
                    host: host.to_owned(),
                    guest: "/records".into(),
                    read_only: false,
                })
                .into_iter()
                .collect(),
            ..Grants::default()
        },
        health_check: None,
    }
}

/// Both worlds' probes of `current-run`: `sched-probe` (pollable), which
/// appends each run to `records`, and `probe-future` in its `schedule`
/// mode.
fn schedule_probes(records: &Path) -> (Plugin, Plugin) {
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    let env = [("SCHED_RECORDS", "/records"), ("SCHED_HOST", "h1")];
    let pollable = runtime
        .load(&spec_of("sched_probe.wasm", &env, Some(records)))
        .unwrap();
    let future = runtime
        .load(&spec_of("probe_future.wasm", &[("PROBE_MODE", "schedule")], None))
        .unwrap();
    (pollable, future)
}

#[test]
fn a_scheduled_run_is_told_to_its_instance_and_none_to_a_run_per_term() {
    use std::time::{Duration, UNIX_EPOCH};

    use crate::runtime::ScheduledRun;
    let records = tempfile::tempdir().unwrap();
    let (pollable, future) = schedule_probes(records.path());
    let run = ScheduledRun {
        due: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        attempt: 2,
        on_demand: true,
    };
    let lines = guest_lines(|| async {
        for plugin in [&pollable, &future] {
            let (term, view) = led(5);
            let outcome = plugin.run_scheduled(term, view, run.clone()).await;
            assert!(matches!(outcome, TaskOutcome::Finished), "{outcome}");
            let (term, view) = led(6);
            let outcome = plugin.run_task(term, view).await;
            assert!(matches!(outcome, TaskOutcome::Finished), "{outcome}");
        }
    });
    // The pollable world (sched-probe), with its record of each run.
    assert!(
        lines.contains("sched run due=1700000000123 attempt=2 on_demand=true term=5"),
        "{lines}"
    );
    assert!(lines.contains("sched done due=1700000000123 term=5"), "{lines}");
    assert!(lines.contains("sched run none term=6"), "{lines}");
    assert!(lines.contains("sched done due=none term=6"), "{lines}");
    let written = std::fs::read_to_string(records.path().join("records")).unwrap();
    assert_eq!(written, "1700000000123 5 h1\nnone 6 h1\n");
    // The future world (probe-future).
    assert!(
        lines.contains("probe schedule due=1700000000123 attempt=2 on_demand=true term=5"),
        "{lines}"
    );
    assert!(lines.contains("probe schedule none term=6"), "{lines}");
}

#[test]
fn a_health_check_runs_in_an_instance_of_its_own_and_each_failure_is_told_apart() {
    use std::time::Duration;

    use crate::runtime::CheckOutcome;
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec_of("health_probe.wasm", &[], None);
    spec.grants.files = vec![DirGrant {
        host: dir.path().to_owned(),
        guest: "/health".into(),
        read_only: false,
    }];
    let plugin = runtime.load(&spec).unwrap();
    let marker = dir.path().join("unhealthy-me");
    // The checks that answer get a timeout that only a hung check reaches
    // (a busy machine can take a second to instantiate); the one that
    // hangs gets a short one.
    let timeout = Duration::from_secs(30);
    let hang_timeout = Duration::from_millis(500);
    let lines = guest_lines(|| async {
        let (term, view) = led_at(7, Some("10.1.2.3:8080"));
        let mut checker = plugin.health_checker(term, view).unwrap();
        let outcome = checker.check(timeout).await;
        assert!(matches!(outcome, CheckOutcome::Healthy), "{outcome}");
        std::fs::write(&marker, "down").unwrap();
        let outcome = checker.check(timeout).await;
        assert!(
            matches!(&outcome, CheckOutcome::Unhealthy(m) if m == "marker /health/unhealthy-me"),
            "{outcome}"
        );
        std::fs::write(&marker, "trap").unwrap();
        let outcome = checker.check(timeout).await;
        assert!(
            matches!(&outcome, CheckOutcome::Trapped(t) if t.to_string().contains("health check trap on purpose")),
            "{outcome}"
        );
        assert_eq!(outcome.as_str(), "trapped");
        std::fs::write(&marker, "hang").unwrap();
        let started = std::time::Instant::now();
        let outcome = checker.check(hang_timeout).await;
        assert!(matches!(outcome, CheckOutcome::TimedOut(_)), "{outcome}");
        // Given its timeout, and not waited for beyond it (the guest hangs
        // for ever: any end proves that; 10 s catches one that waits).
        let took = started.elapsed();
        println!("a hung health check ended {took:?} after it began (timeout {hang_timeout:?})");
        assert!(took >= hang_timeout, "{took:?}");
        assert!(took < Duration::from_secs(10), "{took:?}");
        // After a trap and a timeout, a new instance answers.
        std::fs::remove_file(&marker).unwrap();
        let outcome = checker.check(timeout).await;
        assert!(matches!(outcome, CheckOutcome::Healthy), "{outcome}");
    });
    // The future world's check (`health-async`, the SDK's default).
    let future = runtime.load(&spec_of("probe_future.wasm", &[], None)).unwrap();
    guest_lines(|| async {
        let (term, view) = led(8);
        let mut checker = future.health_checker(term, view).unwrap();
        let outcome = checker.check(timeout).await;
        assert!(matches!(outcome, CheckOutcome::Healthy), "{outcome}");
    });
    // The check sees the status, with the holder's address.
    assert_eq!(
        lines
            .matches("health check ok term=7 holder=me at=10.1.2.3:8080")
            .count(),
        2,
        "{lines}"
    );
    assert!(lines.contains("health check unhealthy term=7"), "{lines}");
}

#[test]
fn a_health_check_table_needs_a_component_that_exports_one() {
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    let mut spec = spec_of("probe_v03.wasm", &[], None);
    spec.health_check = Some(crate::runtime::HealthCheck::DEFAULT);
    let error = runtime.load(&spec).err().expect("refused").to_string();
    assert!(error.contains("probe-v03"), "{error}");
    assert!(
        error.contains("has a `health-check` table, but its component exports no health check")
            && error.contains("baton:leader/pollable-plugin@0.3.0"),
        "{error}"
    );
}

#[test]
fn an_instance_prepared_ahead_runs_only_in_the_term_it_starts_in() {
    let records = tempfile::tempdir().unwrap();
    let (pollable, future) = schedule_probes(records.path());
    let lines = guest_lines(|| async {
        for plugin in [&pollable, &future] {
            let prepared = plugin.prepare(&followed()).await.expect("an instance prepared");
            assert_eq!(plugin.memory_bytes(), 0, "counted only once it runs");
            let (term, view) = led(6);
            let outcome = plugin.run_task_in(Some(prepared), term, view).await;
            assert!(matches!(outcome, TaskOutcome::Finished), "{outcome}");
            assert_eq!(plugin.memory_bytes(), 0, "not counted once gone");
        }
    });
    // Run in the term it was started in, and nothing before it.
    assert!(lines.contains("sched run none term=6"), "{lines}");
    let written = std::fs::read_to_string(records.path().join("records")).unwrap();
    assert_eq!(written, "none 6 h1\n");
    assert!(lines.contains("probe schedule none term=6"), "{lines}");
}

/// What the start function of [`starting_component`]'s core module does
/// when the component is instantiated.
#[derive(Clone, Copy, Debug)]
enum Start {
    /// There is none.
    Nothing,
    /// Calls `wasi:clocks/monotonic-clock`'s `now`: a host call.
    CallsHost,
    /// Loops for ever.
    Loops,
}

/// A `pollable-plugin` component whose `run` returns `ok` at once, and
/// whose core module's start function does `start`.
fn starting_component(start: Start) -> Vec<u8> {
    let start = match start {
        Start::Nothing => "",
        Start::CallsHost => "(func $start (drop (call $now))) (start $start)",
        Start::Loops => "(func $start (loop (br 0))) (start $start)",
    };
    let text = r#"(component
  (import "wasi:clocks/monotonic-clock@0.2.12" (instance $clock
    (export "now" (func (result u64)))))
  (import "baton:leader/types@0.4.0" (instance $types
    (type $r (enum "pending" "leading" "following"))
    (export "role" (type $role (eq $r)))
    (type $s (record (field "role" $role) (field "holder" (option string)) (field "lease" string)
      (field "term" u64) (field "holder-address" (option string))))
    (export "status" (type (eq $s)))))
  (alias export $types "status" (type $status))
  (core module $m
    (import "host" "now" (func $now (result i64)))
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 1024))
    START
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (global.get $heap))
      (global.set $heap (i32.add (global.get $heap) (i32.add (local.get 3) (i32.const 8))))
      (local.get $p))
    (func (export "run") (param i32 i32 i32 i32 i32 i32 i64 i32 i32 i32) (result i32)
      (i32.store (i32.const 16) (i32.const 0))
      (i32.const 16)))
  (core func $now (canon lower (func $clock "now")))
  (core instance $host (export "now" (func $now)))
  (core instance $i (instantiate $m (with "host" (instance $host))))
  (func $run (param "status" $status) (result (result (error string)))
    (canon lift (core func $i "run") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (instance $task (export "run" (func $run)))
  (export "baton:leader/task-sync@0.4.0" (instance $task)))"#;
    wat::parse_str(text.replace("START", start)).expect("the test component's text")
}

#[test]
fn a_component_whose_start_calls_the_host_or_never_returns_is_not_prepared() {
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugin = |start: Start| {
        let path = dir.path().join(format!("{start:?}.wasm"));
        std::fs::write(&path, starting_component(start)).unwrap();
        let mut spec = spec_of("probe_pollable.wasm", &[], None);
        (spec.name, spec.path) = (format!("{start:?}"), path);
        runtime.load(&spec).unwrap()
    };
    let (quiet, calling, looping) = (
        plugin(Start::Nothing),
        plugin(Start::CallsHost),
        plugin(Start::Loops),
    );
    guest_lines(|| async {
        assert!(quiet.prepare(&followed()).await.is_some());
        // Its start function's host call trapped: no instance kept.
        assert!(calling.prepare(&followed()).await.is_none());
        // In its term, the host call is allowed and the task runs.
        let (term, view) = led(7);
        let outcome = calling.run_task_in(None, term, view).await;
        assert!(matches!(outcome, TaskOutcome::Finished), "{outcome}");
        // A start function that never returns traps at the epoch bound
        // (10 ticks of 10 ms), instead of holding the supervisor.
        let bound = std::time::Duration::from_secs(5);
        let prepared = tokio::time::timeout(bound, looping.prepare(&followed())).await;
        assert!(matches!(prepared, Ok(None)), "still preparing after {bound:?}");
    });
}
