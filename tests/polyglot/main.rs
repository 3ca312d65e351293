//! End-to-end tests of the guests written in Python, JavaScript and C
//! (`examples/{python,js,c}-*`), built from source with their real
//! toolchains by `scripts/build-polyglot-guests.sh` into
//! `BATON_POLYGLOT_DIR`, and of the `baton new` templates.
//!
//! Each example honours `PROBE_MODE`: `cooperative` (the default: prints
//! `start term=N mode=M`, `tick term=N n=K` once a second, and
//! `stop term=N role=R` once the status changes) or `busy` (ignores the
//! change in a compute loop). The assertions are those of the Rust probes
//! in tests/e2e: a guest runs only while its host leads, sees the term its
//! host leads in, returns on the change itself when it is cooperative (not
//! at its next tick: that would come after the grace, and be a forced
//! stop), and is stopped by force after the grace when it ignores the
//! change. How many milliseconds these take is printed, not judged (a busy
//! machine moves them): `benches/term_start.rs` and `benches/handover.rs`
//! measure them.
//!
//! A missing guest fails the test: scripts/test.sh always builds them.
// Tests may be long; production functions may not (clippy.toml).
#![allow(clippy::too_many_lines)]

#[path = "../e2e/http_server.rs"]
mod http_server;
#[path = "../e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use http_server::Server;
use support::*;

const STARTED: &str = "leader task started";
const STOPPED: &str = "leader task stopped";
const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The folder of the built polyglot guests.
fn polyglot_dir() -> PathBuf {
    let dir = std::env::var_os("BATON_POLYGLOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/baton/polyglot"));
    assert!(
        dir.join("tools.txt").is_file(),
        "polyglot guests not found in {}: run scripts/build-polyglot-guests.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn guest_file(file: &str) -> PathBuf {
    let path = polyglot_dir().join(file);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/build-polyglot-guests.sh",
        path.display()
    );
    path
}

fn plugin<'a>(name: &'a str, file: &str, mode: &'a str) -> PluginDef<'a> {
    PluginDef {
        name,
        path: guest_file(file),
        mode,
    }
}

fn leading(e: &Event) -> bool {
    e.message() == "lease status changed" && e.str("role") == Some("leading")
}

/// What [`cooperative`] saw of the standby's take-over.
struct Takeover {
    /// From winning the lease to the guest's first line, in ms: a figure.
    ms: f64,
    /// The standby's `leader task started` event.
    started: Event,
    /// The standby's `plugin loaded` event and its `leading` one.
    loaded: Event,
    led: Event,
}

/// Two hosts, one cooperative guest: only the leader runs it, with its term;
/// on SIGTERM, sent just after one of its ticks, it returns on the change
/// (a cooperative stop: a guest that noticed only at its next tick, a
/// second after the last, would have been stopped by force at the grace),
/// and the standby takes over in a newer term.
fn cooperative(file: &str) -> Takeover {
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &config(&s.store(), &[plugin("g", file, "cooperative")]),
    );
    let mut a = Host::start("host-a", &cfg);
    let a_start = a.wait_for(SECS(120), "a's guest start", |e| e.guest_line("g", "start term="));
    let a_led = a.wait_for(SECS(1), "a leading", leading);
    let term_a = a_start.guest_term().expect("term in the start line");
    assert_eq!(
        a_led.u64("term"),
        Some(term_a),
        "the guest sees the term its host leads in"
    );
    assert!(
        a_led.at <= a_start.at,
        "the guest started after its host won the lease"
    );
    a.wait_for(SECS(10), "a tick", |e| {
        e.guest_line("g", &format!("tick term={term_a} n=1"))
    });

    let b = Host::start("host-b", &cfg);
    b.wait_for(SECS(120), "b following", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });
    // Room for the standby to prepare its instance while it follows (the
    // warm take-over's mechanism); it runs nothing meanwhile.
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        b.all(|e| e.message() == STARTED).is_empty(),
        "the follower runs nothing"
    );

    // The change just after a tick: the guest's next tick is a second
    // away, twice the grace, so only a guest woken by the change itself
    // returns before it is stopped by force.
    let ticks = a
        .all(|e| e.guest_line("g", &format!("tick term={term_a} n=")))
        .len();
    let tick = a.wait_for(SECS(10), "a's next tick", |e| {
        e.guest_line("g", &format!("tick term={term_a} n={}", ticks + 1))
    });
    let termed = a.sigterm();
    let stopped = a.wait_for(SECS(15), "a's stop", |e| e.is(STOPPED, Some("g")));
    let after = stopped.f64("after_ms").unwrap();
    println!(
        "{file}: returned {after:.2} ms after the change (sent {:.1} ms after a tick)",
        ms_between(tick.at, termed)
    );
    assert_eq!(stopped.str("how"), Some("cooperative"), "{}", a.output());
    assert_eq!(stopped.str("outcome"), Some("ok"), "{}", a.output());
    a.wait_for(SECS(10), "a's guest stop line", |e| {
        e.guest_line("g", &format!("stop term={term_a} role=pending"))
    });
    assert!(a.wait_exit(SECS(15)).success());

    let b_start = b.wait_for(SECS(15), "b's guest start", |e| e.guest_line("g", "start term="));
    let b_led = b.wait_for(SECS(10), "b leading", leading);
    let term_b = b_start.guest_term().unwrap();
    assert!(term_b > term_a, "term {term_b} after {term_a}");
    assert_eq!(b_led.u64("term"), Some(term_b));
    assert!(stopped.at < b_start.at, "a's guest stopped before b's started");
    let started = b.wait_for(SECS(10), "b's leader task started", |e| e.is(STARTED, Some("g")));
    assert_eq!(started.u64("term"), Some(term_b));
    let loaded = b.wait_for(SECS(1), "b's plugin loaded", |e| e.is("plugin loaded", Some("g")));
    let ms = ms_between(b_led.at, b_start.at);
    println!(
        "{file}: first guest line {ms:.1} ms after winning the lease (instance prepared ahead: {})",
        started.json.get("prepared").unwrap_or(&serde_json::Value::Null)
    );
    Takeover {
        ms,
        started,
        loaded,
        led: b_led,
    }
}

/// A guest that ignores the change is stopped by force after the grace.
fn forced(file: &str) {
    let s = Scratch::new();
    let cfg = s.write("baton.toml", &config(&s.store(), &[plugin("g", file, "busy")]));
    let mut h = Host::start("host", &cfg);
    h.wait_for(SECS(120), "guest start", |e| e.guest_line("g", "start term="));
    std::thread::sleep(Duration::from_millis(1000));
    let termed = h.sigterm();
    let stopped = h.wait_for(SECS(15), "stop", |e| e.is(STOPPED, Some("g")));
    let after = stopped.f64("after_ms").unwrap();
    println!("{file}: stopped by force {after:.1} ms after the change");
    // Forced, after the grace, and not stuck (how punctually is a figure:
    // the fence keeps a guest's effects before the force-stop time).
    assert_stopped_by_force(&h, &stopped, GRACE);
    // The force-stop time the host computed is the grace after the term's
    // end, which came after the signal: the grace was given in full.
    let force = humantime::parse_rfc3339(stopped.str("force_stop_at").expect("force_stop_at")).unwrap();
    let given = ms_between(termed, force);
    println!("{file}: force-stop time {given:.1} ms after SIGTERM");
    assert!(
        given >= GRACE.as_secs_f64() * 1e3 - 5.0,
        "force-stop time {given:.1} ms after SIGTERM, less than the grace"
    );
    assert!(
        stopped.at >= force,
        "stopped before its force-stop time: {:?}",
        stopped.json
    );
    assert!(h.wait_exit(SECS(15)).success());
}

macro_rules! guest_tests {
    ($($coop:ident, $busy:ident: $file:literal;)*) => {$(
        #[test]
        fn $coop() {
            cooperative($file);
        }
        #[test]
        fn $busy() {
            forced($file);
        }
    )*};
}

guest_tests! {
    python_pollable_runs_only_while_leading_and_stops_promptly,
        python_pollable_ignoring_the_change_is_stopped_by_force: "python_pollable_ticker.wasm";
    python_future_runs_only_while_leading_and_stops_promptly,
        python_future_ignoring_the_change_is_stopped_by_force: "python_future_ticker.wasm";
    js_pollable_runs_only_while_leading_and_stops_promptly,
        js_pollable_ignoring_the_change_is_stopped_by_force: "js_pollable_ticker.wasm";
    js_future_runs_only_while_leading_and_stops_promptly,
        js_future_ignoring_the_change_is_stopped_by_force: "js_future_ticker.wasm";
    c_pollable_runs_only_while_leading_and_stops_promptly,
        c_pollable_ignoring_the_change_is_stopped_by_force: "c_pollable_ticker.wasm";
}

#[test]
fn a_warm_standby_runs_a_python_guest_in_the_instance_it_prepared_while_following() {
    // Three hand-overs. What makes a Python guest's take-over fast (about
    // 10 ms idle, not the hundreds that compiling and instantiating 18 MB
    // would take) is that the standby did both before it won the lease:
    // the plugin was loaded (compiled) before it led, and its first task
    // ran in the instance prepared while following. That is asserted; the
    // milliseconds are printed (benches/term_start.rs measures them).
    let mut took = Vec::new();
    for _ in 0..3 {
        let t = cooperative("python_pollable_ticker.wasm");
        assert_eq!(
            t.started.json.get("prepared"),
            Some(&serde_json::Value::Bool(true)),
            "the first task did not run in a prepared instance: {:?}",
            t.started.json
        );
        assert!(
            t.loaded.at < t.led.at,
            "loaded after it led: {:?}, {:?}",
            t.loaded.json,
            t.led.json
        );
        took.push(t.ms);
    }
    took.sort_by(f64::total_cmp);
    println!("python takeover, winning the lease to the first guest line: {took:.1?} ms");
}

/// A duration as the log writes it for people (`took=8.41s`, `230.7ms`).
fn human_duration(text: &str) -> Duration {
    match text.strip_suffix("ms") {
        Some(ms) => Duration::from_secs_f64(ms.parse::<f64>().unwrap() / 1e3),
        None => Duration::from_secs_f64(text.strip_suffix('s').unwrap().parse().unwrap()),
    }
}

/// A size as the log writes it, for a file of a few MiB.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[test]
fn a_big_plugin_says_it_is_compiling_and_how_long_it_took_and_a_restart_takes_it_from_the_cache() {
    // An 18 MB Python component, an empty compiled-code cache: seconds of
    // compiling, said as it starts (plugin, file, size) and when it is done.
    let file = guest_file("python_pollable_ticker.wasm");
    let size = mib(std::fs::metadata(&file).unwrap().len());
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &config(
            &s.store(),
            &[plugin("py", "python_pollable_ticker.wasm", "cooperative")],
        ),
    );
    let cache = tempfile::tempdir().unwrap();
    let mut a = Host::start_with("host-a", &cfg, cache.path());
    let compiling = a.wait_for(SECS(60), "compiling", |e| e.message() == "compiling plugin");
    assert_eq!(compiling.str("plugin"), Some("py"), "{}", a.output());
    assert_eq!(compiling.str("path"), file.to_str(), "{}", a.output());
    assert_eq!(compiling.str("size"), Some(size.as_str()), "{}", a.output());
    let compiled = a.wait_for(SECS(180), "compiled", |e| e.message() == "plugin compiled");
    let took = human_duration(compiled.str("took").unwrap());
    assert_eq!(compiled.str("plugin"), Some("py"));
    assert_eq!(compiled.str("cache"), Some("miss"), "{}", a.output());
    let between = compiled.at.duration_since(compiling.at).unwrap();
    println!("python, empty cache: compiled in {took:?} ({between:?} between the two lines)");
    assert!(
        took > Duration::from_millis(500),
        "an 18 MB compile took {took:?}"
    );
    // The two lines bracket the compile it measured (`took` is written to
    // 10 ms), and the compile is most of what lies between them: all but
    // the reading of the file and the cache's look-up, which a busy
    // machine slows as it slows the compile.
    assert!(
        between + Duration::from_millis(20) >= took,
        "took={took:?}, but the lines are only {between:?} apart"
    );
    assert!(
        between.saturating_sub(took) < (took / 10).max(Duration::from_millis(200)),
        "took={took:?}, but the lines are {between:?} apart"
    );
    let loaded = a.wait_for(SECS(30), "loaded", |e| e.is("plugin loaded", Some("py")));
    assert!(loaded.at >= compiled.at);
    a.wait_for(SECS(30), "the guest's start", |e| {
        e.guest_line("py", "start term=")
    });
    a.sigterm();
    assert!(a.wait_exit(SECS(10)).success());

    // Started again: the same lines, the code from the cache.
    let mut b = Host::start_with("host-b", &cfg, cache.path());
    b.wait_for(SECS(60), "compiling", |e| e.is("compiling plugin", Some("py")));
    let again = b.wait_for(SECS(60), "compiled", |e| e.message() == "plugin compiled");
    let warm = human_duration(again.str("took").unwrap());
    println!("python, from the cache: {warm:?}");
    assert_eq!(again.str("cache"), Some("hit"), "{}", b.output());
    assert!(
        warm < took / 4,
        "from the cache in {warm:?}, compiled in {took:?}"
    );
    b.sigterm();
    assert!(b.wait_exit(SECS(10)).success());
}

#[test]
fn baton_check_says_it_is_compiling_a_component_that_is_not_in_the_cache() {
    let file = guest_file("js_future_ticker.wasm");
    let size = mib(std::fs::metadata(&file).unwrap().len());
    let cache = tempfile::tempdir().unwrap();
    let check = || {
        let out = baton()
            .arg("check")
            .arg(&file)
            .env("BATON_CACHE_DIR", cache.path())
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            stdout.contains("ok: targets baton:leader/future-plugin@0.1.0"),
            "{stdout}"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let cold = check();
    println!("{cold}");
    assert!(
        cold.contains(&format!(
            "compiling plugin plugin=\"js_future_ticker\" path={} size={size}",
            file.display()
        )),
        "{cold}"
    );
    let done = cold
        .lines()
        .find(|l| l.contains("plugin compiled plugin=\"js_future_ticker\" took="))
        .unwrap_or_else(|| panic!("no 'plugin compiled' line: {cold}"));
    assert!(done.ends_with("cache=miss"), "{done}");
    let warm = check();
    assert!(warm.contains("cache=hit"), "{warm}");
}

#[test]
fn on_a_terminal_the_start_up_draws_its_progress_below_the_log_lines_then_clears_it() {
    // A terminal as standard error: while the plugins compile, the count
    // of plugins loaded and a spinner per compilation, below the log lines;
    // cleared once the start-up is over.
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &config(
            &s.store(),
            &[
                plugin("js", "js_future_ticker.wasm", "cooperative"),
                plugin("c", "c_pollable_ticker.wasm", "cooperative"),
            ],
        ),
    );
    let size = mib(std::fs::metadata(guest_file("js_future_ticker.wasm"))
        .unwrap()
        .len());
    let cache = tempfile::tempdir().unwrap();
    // Wide enough for every log line: a wrapped line would read as two.
    let (cols, rows) = (400, 300);
    let pty = Pty::open(cols, rows);
    let mut child = pty
        .baton()
        .args(["run", "--config"])
        .arg(&cfg)
        .args(["--identity", "host-a", "--cache-dir"])
        .arg(cache.path())
        .env("BATON_LOG", "info")
        // Plain log lines, to look for in the raw output; the display has
        // no colours either way.
        .env("NO_COLOR", "1")
        .spawn()
        .unwrap();
    let output = pty.record();
    let text = || String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let started = std::time::Instant::now();
    while !text().contains("tick term=1 n=1 plugin=\"js\"") {
        if started.elapsed() > SECS(120) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("the guests did not tick; the terminal got:\n{}", text());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) of the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(child.wait().unwrap().success());
    // The reader ends once the terminal is closed: until it has read the
    // last line (however long a busy machine takes), and a moment more.
    let stopping = std::time::Instant::now();
    while !text().contains("baton stopped") {
        assert!(
            stopping.elapsed() < SECS(10),
            "no \"baton stopped\"; the terminal got:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    let raw = text();
    // Drawn while compiling: the count, and a spinner per compilation
    // naming the plugin, the file and its size.
    assert!(raw.contains("baton starting: 0/2 plugins loaded ["), "{raw}");
    assert!(
        raw.contains(&format!("js: compiling js_future_ticker.wasm ({size}) ")),
        "{raw}"
    );
    // As the terminal shows it at the end: log lines only, each whole (no
    // piece of the display left in or between them), in order.
    let nonzero = |n: u16| std::num::NonZero::new(n).unwrap();
    let mut terminal = vt100::Parser::new(nonzero(rows), nonzero(cols), 0);
    terminal.process(&output.lock().unwrap());
    let screen = terminal.screen().contents();
    let lines: Vec<&str> = screen.lines().filter(|l| !l.trim().is_empty()).collect();
    for line in &lines {
        assert!(
            line.starts_with("20") && line.contains("Z  INFO ") || line.contains("Z  WARN "),
            "not a whole log line: {line:?}; the screen:\n{screen}"
        );
    }
    assert!(!screen.contains("plugins loaded ["), "{screen}");
    let at = |what: &str| {
        lines
            .iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what:?} on the screen:\n{screen}"))
    };
    assert!(at("baton starting") < at("compiling plugin plugin=\"js\""));
    assert!(at("compiling plugin plugin=\"js\"") < at("plugin compiled plugin=\"js\""));
    assert!(at("plugin compiled plugin=\"js\"") < at("plugin loaded plugin=\"js\""));
    assert!(at("plugin loaded plugin=\"js\"") < at("leader task started plugin=\"js\""));
    assert!(at("baton stopped") == lines.len() - 1, "{screen}");
    println!("{screen}");
}

fn baton_check(path: &Path) -> (bool, String) {
    let out = baton().arg("check").arg(path).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn baton_check_names_each_guests_world() {
    // The examples are built against baton:leader@0.1.0 (wit/v0.1.0): the
    // host serves them unchanged.
    for (file, world) in [
        ("python_pollable_ticker.wasm", "pollable-plugin"),
        ("python_future_ticker.wasm", "future-plugin"),
        ("js_pollable_ticker.wasm", "pollable-plugin"),
        ("js_future_ticker.wasm", "future-plugin"),
        ("c_pollable_ticker.wasm", "pollable-plugin"),
    ] {
        let (ok, out) = baton_check(&guest_file(file));
        assert!(ok, "{out}");
        assert!(
            out.contains(&format!("ok: targets baton:leader/{world}@0.1.0")),
            "{out}"
        );
    }
}

#[test]
fn a_js_guest_importing_wasi_http_loads_and_baton_check_names_the_import() {
    // componentize-js adds wasi:http imports unless told not to (`-d http
    // fetch-event`); the host offers wasi:http, so such a guest loads, and
    // `baton check` says it needs `http` grants to reach anything.
    let file = guest_file("js_http_import.wasm");
    let (ok, out) = baton_check(&file);
    assert!(ok, "{out}");
    assert!(
        out.contains("also imports wasi:http/outgoing-handler (needs `http` grants)"),
        "{out}"
    );

    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &config(
            &s.store(),
            &[
                plugin("http", "js_http_import.wasm", "cooperative"),
                plugin("c", "c_pollable_ticker.wasm", "cooperative"),
            ],
        ),
    );
    let mut h = Host::start("host", &cfg);
    h.wait_for(SECS(60), "the C plugin runs", |e| {
        e.guest_line("c", "start term=")
    });
    h.wait_for(SECS(60), "the JS plugin runs", |e| {
        e.message() == "leader task started" && e.str("plugin") == Some("http")
    });
    h.sigterm();
    assert!(h.wait_exit(SECS(15)).success());
}

/// The tools the build script installed, from its tools.txt.
fn tool(name: &str) -> String {
    let text = std::fs::read_to_string(polyglot_dir().join("tools.txt")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in tools.txt"))
        .to_owned()
}

fn new_builds_and_checks(lang: &str, world: &str) {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("my-{lang}-{world}-plugin");
    let out = baton()
        .args(["new", "--lang", lang, "--world", world, &name, "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let root = dir.path().join(&name);
    let build = Command::new(root.join("build.sh"))
        .env("BATON", baton_bin())
        .env("BATON_CACHE_DIR", shared_cache_dir())
        .env("COMPONENTIZE_PY", tool("componentize-py"))
        .env("COMPONENTIZE_JS", tool("componentize-js"))
        .env("JCO", tool("jco"))
        .env("WIT_BINDGEN", tool("wit-bindgen"))
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{lang} template build failed:\n{}{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );
    // Its build script tested it: the contract's scenario and its own.
    let said = String::from_utf8_lossy(&build.stdout);
    println!("{lang} {world}: build.sh said:\n{said}");
    assert!(
        said.contains("9 steps, 0 failed")
            && said.contains(&format!("{name}: the count goes on across a hand-over")),
        "{said}"
    );
    assert_eq!(said.matches(", 0 failed").count(), 2, "{said}");
    let wasm = root.join(format!("{name}.wasm"));
    let (ok, out) = baton_check(&wasm);
    // The Rust templates use the SDK (the newest contract); the others
    // stay on 0.3.0.
    let version = if lang == "rust" { "0.4.0" } else { "0.3.0" };
    assert!(
        ok && out.contains(&format!("ok: targets baton:leader/{world}-plugin@{version}")),
        "{out}"
    );

    // Its own baton.toml runs it, with the two lines its comment suggests
    // set to a server of this test: the variable, and the grant.
    let server = Server::start();
    let port = server.addr.port();
    let cfg = root.join("baton.toml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "env = {{ REPORT_URL = \"http://127.0.0.1:{port}/report\" }}\nhttp = [\"http://127.0.0.1:{port}\"]\n"
    ));
    std::fs::write(&cfg, text).unwrap();
    let mut h = Host::start("host", &cfg);
    let start = h.wait_for(SECS(120), "the new plugin runs", |e| {
        e.guest_line(&name, "start term=")
    });
    let term = start.guest_term().unwrap();
    assert!(term >= 1);
    // Let it do its periodic work, a report over HTTP included, then stop
    // the host: the task ends (the supervisor logs "stopped", or "finished
    // for this term" when the task returned as the term ended) and the
    // host exits cleanly.
    h.wait_for(SECS(15), "a tick", |e| e.guest_line(&name, "tick term="));
    let report = h.wait_for(SECS(10), "a report", |e| e.guest_line(&name, "report "));
    assert!(
        report
            .message()
            .starts_with(&format!("report status=200 term={term} n=")),
        "{}",
        report.message()
    );
    let seen = server.seen();
    let first = seen.first().expect("the server saw the report");
    assert_eq!((first.method.as_str(), first.path.as_str()), ("POST", "/report"));
    assert_eq!(first.headers.get("baton-term"), Some(&term.to_string()));
    assert_eq!(first.headers.get("baton-lease"), Some(&name));
    assert_eq!(
        first.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert!(first.body > 0, "an empty report: {first:?}");
    println!(
        "{lang} {world}: {} ({} bytes to /report)",
        report.message(),
        first.body
    );
    h.sigterm();
    h.wait_for(SECS(15), "the guest's stop line", |e| {
        e.guest_line(&name, "stop term=")
    });
    h.wait_for(SECS(15), "the task's end", |e| {
        e.is(STOPPED, Some(&name)) || e.is("leader task finished for this term", Some(&name))
    });
    assert!(h.wait_exit(SECS(15)).success());

    // Its tick count is in its key-value bucket (the embedded store's,
    // beside the leases): the next host goes on counting, in a newer term.
    let counts = |h: &Host| -> Vec<u64> {
        h.all(|e| e.guest_line(&name, "tick term="))
            .iter()
            .filter_map(|e| e.message().split_whitespace().find_map(|w| w.strip_prefix("n=")))
            .map(|n| n.parse().unwrap())
            .collect()
    };
    let first = counts(&h);
    let last = *first.last().unwrap();
    assert_eq!(first, (1..=last).collect::<Vec<_>>(), "{}", h.output());
    let next = Host::start("host-2", &cfg);
    let tick = next.wait_for(SECS(60), "a tick of the next term", |e| {
        e.guest_line(&name, "tick term=")
    });
    assert!(tick.guest_term().unwrap() > term, "{}", next.output());
    assert_eq!(counts(&next).first(), Some(&(last + 1)), "{}", next.output());
    println!("{lang} {world}: term {term} counted to {last}, the next term went on");
}

#[test]
fn baton_new_rust_builds_checks_and_runs() {
    new_builds_and_checks("rust", "pollable");
}

#[test]
fn baton_new_rust_future_builds_checks_and_runs() {
    new_builds_and_checks("rust", "future");
}

#[test]
fn baton_new_python_builds_checks_and_runs() {
    new_builds_and_checks("python", "pollable");
}

#[test]
fn baton_new_python_future_builds_checks_and_runs() {
    new_builds_and_checks("python", "future");
}

#[test]
fn baton_new_js_builds_checks_and_runs() {
    new_builds_and_checks("js", "pollable");
}

#[test]
fn baton_new_c_builds_checks_and_runs() {
    new_builds_and_checks("c", "pollable");
}

/// The `total` of a kv counter's `tick term=T total=N` line.
fn total(e: &Event) -> Option<u64> {
    e.message()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("total="))
        .and_then(|n| n.parse().ok())
}

/// A kv counter example (`examples/*-kv-counter`) keeps its count in the
/// plugin's bucket across a hand-over: one host counts in its term and is
/// stopped with SIGTERM; another host, with the same store, continues in a
/// newer term from the next total, never from 1.
fn counts_across_terms(path: PathBuf) {
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    let s = Scratch::new();
    let plugin = PluginDef {
        name: "kv",
        path,
        mode: "cooperative",
    };
    let cfg = s.write("baton.toml", &config(&s.store(), &[plugin]));
    let tick = |e: &Event| e.guest_line("kv", "tick term=");

    let mut a = Host::start("host-a", &cfg);
    a.wait_for(SECS(120), "a's second tick", |e| tick(e) && total(e) == Some(2));
    a.sigterm();
    a.wait_for(SECS(15), "a's stop line", |e| e.guest_line("kv", "stop term="));
    assert!(a.wait_exit(SECS(15)).success(), "{}", a.output());
    let a_ticks = a.all(tick);
    let a_totals: Vec<u64> = a_ticks.iter().filter_map(total).collect();
    let last = a_totals.len() as u64;
    assert_eq!(a_totals, (1..=last).collect::<Vec<_>>(), "{}", a.output());
    let term_a = a_ticks[0].guest_term().unwrap();

    let b = Host::start("host-b", &cfg);
    let first = b.wait_for(SECS(120), "b's first tick", tick);
    let term_b = first.guest_term().unwrap();
    assert!(term_b > term_a, "term {term_b} after {term_a}");
    assert_eq!(total(&first), Some(last + 1), "{}", b.output());
    b.wait_for(SECS(10), "b's next tick", |e| {
        tick(e) && total(e) == Some(last + 2)
    });
    println!(
        "{file}: term {term_a} counted to {last}, term {term_b} went on from {}",
        last + 1
    );
}

#[test]
fn a_rust_kv_counter_continues_its_count_in_the_next_term() {
    counts_across_terms(guest("rust_kv_counter.wasm"));
}

#[test]
fn a_python_kv_counter_continues_its_count_in_the_next_term() {
    counts_across_terms(guest_file("python_kv_counter.wasm"));
}

#[test]
fn a_js_kv_counter_continues_its_count_in_the_next_term() {
    counts_across_terms(guest_file("js_kv_counter.wasm"));
}

#[test]
fn a_js_future_kv_counter_continues_its_count_in_the_next_term() {
    counts_across_terms(guest_file("js_future_kv_counter.wasm"));
}

#[test]
fn a_c_kv_counter_continues_its_count_in_the_next_term() {
    counts_across_terms(guest_file("c_kv_counter.wasm"));
}

/// Every example, in every language and world, passes the contract's
/// scenario and its own (`examples/*.scenario.toml`) under `baton test`,
/// three at a time (each waits mostly on the clock). The grace is long
/// enough that a busy machine cannot make a cooperative guest late.
#[test]
fn every_example_passes_its_scenario_under_baton_test() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let tickers = [
        guest("rust_pollable_ticker.wasm"),
        guest("rust_future_ticker.wasm"),
        guest_file("python_pollable_ticker.wasm"),
        guest_file("python_future_ticker.wasm"),
        guest_file("js_pollable_ticker.wasm"),
        guest_file("js_future_ticker.wasm"),
        guest_file("c_pollable_ticker.wasm"),
    ];
    let counters = [
        guest("rust_kv_counter.wasm"),
        guest_file("python_kv_counter.wasm"),
        guest_file("js_kv_counter.wasm"),
        guest_file("js_future_kv_counter.wasm"),
        guest_file("c_kv_counter.wasm"),
    ];
    let runs: Vec<(PathBuf, Option<PathBuf>)> = tickers
        .iter()
        .map(|t| (t, "ticker.scenario.toml"))
        .chain(counters.iter().map(|c| (c, "kv-counter.scenario.toml")))
        .flat_map(|(file, scenario)| [None, Some(examples.join(scenario))].map(|s| (file.clone(), s)))
        .collect();
    let mut failed = Vec::new();
    for batch in runs.chunks(3) {
        let children: Vec<(&PathBuf, std::process::Child)> = batch
            .iter()
            .map(|(file, scenario)| {
                let child = baton()
                    .arg("test")
                    .arg(file)
                    .args(scenario)
                    .args(["--grace", "3s", "--run", "2s"])
                    .env("BATON_CACHE_DIR", shared_cache_dir())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (file, child)
            })
            .collect();
        for (file, child) in children {
            let out = child.wait_with_output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            println!("{name}:\n{said}");
            if !out.status.success() || !said.contains(" steps, 0 failed") {
                failed.push(format!("{name}: {said}{}", String::from_utf8_lossy(&out.stderr)));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
