//! The admin endpoints of real hosts: `/metrics` through a hand-over and a
//! forced stop, `/healthz` of a host whose election runtime stalls.

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use crate::support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;
const ADMIN: [&str; 2] = ["--admin-address", "127.0.0.1:0"];

fn start(name: &str, cfg: &std::path::Path, more: &[&str]) -> Host {
    let args: Vec<&OsStr> = ADMIN.iter().chain(more).map(OsStr::new).collect();
    Host::start_opts(
        name,
        cfg,
        Opts {
            args: &args,
            ..Opts::default()
        },
    )
}

fn value(text: &str, series: &str) -> f64 {
    metric(text, series).unwrap_or(0.0)
}

/// Scrapes `h` until `pred` holds of its metrics, for up to `within`.
fn scrape_until(h: &Host, within: Duration, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + within;
    loop {
        let text = h.scrape();
        if pred(&text) {
            return text;
        }
        assert!(
            Instant::now() < until,
            "host {}: {what} not seen within {within:?}; its metrics:\n{text}\nits log:\n{}",
            h.name,
            tail(&h.output(), 40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn metrics_follow_a_sigterm_hand_over() {
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &config(&s.store(), &[probe("probe", "pollable", "cooperative")]),
    );
    let mut a = start("host-a", &cfg, &[]);
    let first = a.wait_for(SECS(30), "a's guest start", |e| {
        e.guest_line("probe", "probe start")
    });
    let term = first.guest_term().unwrap() as f64;
    let b = start("host-b", &cfg, &[]);
    b.wait_for(SECS(30), "b following", |e| {
        e.message() == "lease status changed" && e.str("role") == Some("following")
    });

    // The leader: leading in the term its guest got, the task running, one
    // plugin loaded, renewals timed.
    let before_a = scrape_until(&a, SECS(5), "a renewal", |t| {
        value(t, "baton_lease_renewal_seconds_count{lease=\"demo\"}") >= 1.0
    });
    assert_eq!(
        value(&before_a, "baton_lease_role{lease=\"demo\",role=\"leading\"}"),
        1.0
    );
    assert_eq!(value(&before_a, "baton_lease_term{lease=\"demo\"}"), term);
    assert_eq!(
        value(
            &before_a,
            "baton_lease_leadership_changes_total{lease=\"demo\",change=\"gained\"}"
        ),
        1.0
    );
    // Renewed within a lease duration (a leader that does not renew within
    // its renew deadline steps down; a busy machine delays the scrape).
    let since = value(&before_a, "baton_lease_seconds_since_renewal{lease=\"demo\"}");
    assert!(
        since < LEASE_DURATION.as_secs_f64(),
        "{since} s since the last renewal"
    );
    assert_eq!(
        value(
            &before_a,
            "baton_plugin_task_state{plugin=\"probe\",state=\"running\"}"
        ),
        1.0
    );
    assert_eq!(
        value(&before_a, "baton_plugin_task_starts_total{plugin=\"probe\"}"),
        1.0
    );
    assert_eq!(value(&before_a, "baton_plugins_loaded"), 1.0);
    assert!(
        value(&before_a, "baton_plugin_memory_bytes{plugin=\"probe\"}") > 0.0,
        "a running instance has memory:\n{before_a}"
    );
    assert_eq!(
        value(&before_a, "baton_compiled_cache_hits_total")
            + value(&before_a, "baton_compiled_cache_misses_total"),
        1.0,
        "{before_a}"
    );
    // The standby: following, the same term, never led.
    let before_b = b.scrape();
    assert_eq!(
        value(&before_b, "baton_lease_role{lease=\"demo\",role=\"following\"}"),
        1.0
    );
    assert_eq!(value(&before_b, "baton_lease_term{lease=\"demo\"}"), term);
    let gained = "baton_lease_leadership_changes_total{lease=\"demo\",change=\"gained\"}";
    assert_eq!(value(&before_b, gained), 0.0);
    assert_eq!(
        value(
            &before_b,
            "baton_plugin_task_state{plugin=\"probe\",state=\"waiting\"}"
        ),
        1.0
    );
    for h in [&a, &b] {
        assert_eq!(h.admin_get("/healthz"), (200, "ok\n".to_owned()), "{}", h.name);
        assert_eq!(h.admin_get("/readyz"), (200, "ready\n".to_owned()), "{}", h.name);
    }

    // SIGTERM: b takes over in the next term, once more a leader.
    a.sigterm();
    b.wait_for(SECS(15), "b's guest start", |e| {
        e.guest_line("probe", "probe start")
    });
    let after_b = b.scrape();
    assert_eq!(
        value(&after_b, "baton_lease_term{lease=\"demo\"}"),
        term + 1.0,
        "{after_b}"
    );
    assert_eq!(
        value(&after_b, gained),
        value(&before_b, gained) + 1.0,
        "{after_b}"
    );
    assert_eq!(
        value(&after_b, "baton_lease_role{lease=\"demo\",role=\"leading\"}"),
        1.0
    );
    assert_eq!(
        value(&after_b, "baton_plugin_task_starts_total{plugin=\"probe\"}"),
        1.0
    );
    assert!(a.wait_exit(SECS(15)).success());
}

#[test]
fn a_forced_stop_is_counted_on_the_host_that_handed_its_lease_over() {
    // Two leases, two hosts: a leads both until b comes, then hands one
    // over; its guests ignore the change, so that one is stopped by force.
    let s = Scratch::new();
    let stuck = guest("probe_pollable.wasm");
    let mut text = format!(
        "[store]\nkind = \"embedded\"\ndir = {:?}\n\n[defaults]\nlease-duration = \"2s\"\nrenew-deadline = \"1s\"\n\
         retry-period = \"200ms\"\ngrace = \"500ms\"\n",
        s.store().display().to_string()
    );
    for lease in ["alpha", "beta"] {
        text.push_str(&format!(
            "\n[[lease]]\nname = \"{lease}\"\n\n[[plugin]]\nname = \"stuck-{lease}\"\npath = {:?}\nlease = \"{lease}\"\n\
             env = {{ PROBE_MODE = \"block\" }}\n",
            stuck.display().to_string()
        ));
    }
    let cfg = s.write("baton.toml", &text);
    let a = start("host-a", &cfg, &[]);
    for p in ["stuck-alpha", "stuck-beta"] {
        a.wait_for(SECS(30), "a's guests", |e| e.guest_line(p, "probe start"));
    }
    let before = a.scrape();
    assert_eq!(metric_sum(&before, "baton_plugin_forced_stops_total", &[]), 0.0);
    let b = start("host-b", &cfg, &[]);
    let moved = b.wait_for(SECS(30), "b's guest start", |e| {
        e.str("target") == Some("guest") && e.message().starts_with("probe start")
    });
    let plugin = moved.str("plugin").unwrap().to_owned();
    let lease = plugin.strip_prefix("stuck-").unwrap().to_owned();
    let stop = a.wait_for(SECS(15), "a's forced stop", |e| {
        e.is("leader task stopped", Some(&plugin))
    });
    assert_eq!(stop.str("how"), Some("forced"));

    let after = a.scrape();
    let forced = format!("baton_plugin_forced_stops_total{{plugin=\"{plugin}\"}}");
    assert_eq!(value(&after, &forced), 1.0, "{after}");
    assert_eq!(
        metric_sum(&after, "baton_plugin_forced_stops_total", &[]),
        1.0,
        "only the handed-over lease's guest:\n{after}"
    );
    let stops = format!("baton_plugin_stop_seconds_count{{plugin=\"{plugin}\",how=\"forced\"}}");
    assert_eq!(value(&after, &stops), 1.0, "{after}");
    let lost = format!("baton_lease_leadership_changes_total{{lease=\"{lease}\",change=\"lost\"}}");
    assert_eq!(value(&after, &lost), 1.0, "{after}");
    let term_a = value(&before, &format!("baton_lease_term{{lease=\"{lease}\"}}"));
    let on_b = scrape_until(&b, SECS(2), "b leading", |t| {
        value(
            t,
            &format!("baton_lease_role{{lease=\"{lease}\",role=\"leading\"}}"),
        ) == 1.0
    });
    assert_eq!(
        value(&on_b, &format!("baton_lease_term{{lease=\"{lease}\"}}")),
        term_a + 1.0
    );
    assert_eq!(
        value(
            &on_b,
            &format!("baton_lease_leadership_changes_total{{lease=\"{lease}\",change=\"gained\"}}")
        ),
        1.0
    );
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "stalls the election runtime: needs a build with --features test-hooks"
)]
fn healthz_fails_naming_the_stalled_election_runtime_and_metrics_still_answer() {
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &config(&s.store(), &[probe("probe", "pollable", "cooperative")]),
    );
    let a = start("host-a", &cfg, &["--test-stall-election-runtime", "3s"]);
    a.wait_for(SECS(30), "a's guest start", |e| {
        e.guest_line("probe", "probe start")
    });
    assert_eq!(a.admin_get("/healthz").0, 200);
    assert_eq!(a.admin_get("/readyz").0, 200);
    let stalled = a.wait_for(SECS(10), "the test hook", |e| {
        e.message().starts_with("test hook")
    });
    // First the leader's overdue renewals (renew deadline 1 s, then 2 s of
    // tolerance), then the stalled runtime (5 s without its watchdog).
    let until = Instant::now() + SECS(15);
    let mut failed = None;
    let body = loop {
        let (status, body) = a.admin_get("/healthz");
        match status {
            503 => {
                failed.get_or_insert_with(|| {
                    println!(
                        "/healthz failed {:.1} s after the election runtime stalled:\n{body}",
                        ms_between(stalled.at, std::time::SystemTime::now()) / 1e3
                    )
                });
            }
            _ => assert_eq!(status, 200, "{body}"),
        }
        if body.contains("the election runtime is stalled") {
            break body;
        }
        assert!(
            Instant::now() < until,
            "/healthz does not name the stalled runtime: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "/healthz named the stalled runtime {:.1} s after it stalled:\n{body}",
        ms_between(stalled.at, std::time::SystemTime::now()) / 1e3
    );
    assert!(body.starts_with("unhealthy:"), "{body}");
    // The leader's renewals are overdue too (its tasks were stopped
    // meanwhile: the term does not wait for the elector).
    assert!(
        body.contains("lease \"demo\": this host still leads term"),
        "{body}"
    );
    a.wait_for(SECS(1), "the guest's stop", |e| {
        e.is("leader task stopped", Some("probe"))
    });
    // The guests' runtime is fine, and so is the admin thread.
    assert!(!body.contains("the guest runtime"), "{body}");
    assert!(a.scrape().contains("baton_lease_term{lease=\"demo\"}"));
    assert_eq!(a.admin_get("/readyz").0, 200);
}

/// The text log of `baton run`, written to `stderr`, up to the line that
/// says it leads (or everything it wrote in 60 s).
fn text_log_until_leading(
    cfg: &std::path::Path,
    stderr: std::process::Stdio,
    no_color: bool,
) -> std::process::Child {
    let mut command = baton();
    command
        .args(["--log-format", "text", "run", "--config"])
        .arg(cfg)
        .args(["--identity", "plain", "--cache-dir"])
        .arg(shared_cache_dir())
        .env("BATON_LOG", "info")
        .env("TERM", "xterm")
        // The start-up's progress display moves the cursor, colours or not.
        .env("BATON_PROGRESS", "never")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    if no_color {
        command.env("NO_COLOR", "1");
    }
    command.spawn().expect("start baton")
}

#[test]
fn the_text_log_has_colours_only_on_a_terminal_and_never_under_no_color() {
    use std::io::Read;
    let s = Scratch::new();
    let cfg = s.write(
        "baton.toml",
        &config(&s.store(), &[probe("probe", "pollable", "cooperative")]),
    );
    let escape = |text: &[u8]| text.contains(&0x1b);
    let leads = |text: &[u8]| String::from_utf8_lossy(text).contains("leading");
    // A pipe (a file, journald, `kubectl logs`): plain lines.
    let mut child = text_log_until_leading(&cfg, std::process::Stdio::piped(), false);
    let mut pipe = child.stderr.take().unwrap();
    let (mut text, mut buf) = (Vec::new(), [0u8; 4096]);
    let until = Instant::now() + SECS(60);
    while !leads(&text) && Instant::now() < until {
        match pipe.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        leads(&text),
        "the host did not lead; its log:\n{}",
        String::from_utf8_lossy(&text)
    );
    assert!(
        !escape(&text),
        "escape codes in a piped log:\n{:?}",
        String::from_utf8_lossy(&text)
    );
    // A terminal: coloured, unless NO_COLOR says otherwise.
    for no_color in [false, true] {
        let pty = Pty::open(200, 50);
        let mut child = text_log_until_leading(&cfg, pty.terminal.try_clone().unwrap().into(), no_color);
        let out = pty.record();
        let until = Instant::now() + SECS(60);
        while !leads(&out.lock().unwrap()) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        let text = out.lock().unwrap().clone();
        assert!(
            leads(&text),
            "the host did not lead on a terminal; it wrote:\n{}",
            String::from_utf8_lossy(&text)
        );
        assert_eq!(
            escape(&text),
            !no_color,
            "NO_COLOR set: {no_color}; the terminal got:\n{:?}",
            String::from_utf8_lossy(&text)
        );
    }
}

#[test]
fn a_relative_cache_dir_is_taken_from_the_configurations_folder() {
    use std::io::BufRead;
    // `--config run.toml` from the file's own folder, `cache-dir =
    // "compiled"` in it, no `--cache-dir` nor `BATON_CACHE_DIR`: the
    // compiled code goes to that folder's `compiled`.
    let s = Scratch::new();
    let folder = s.dir.path().join("etc");
    std::fs::create_dir(&folder).unwrap();
    let text = format!(
        "cache-dir = \"compiled\"\n{}",
        config(&s.store(), &[probe("probe", "pollable", "cooperative")])
    );
    std::fs::write(folder.join("run.toml"), text).unwrap();
    let mut child = baton()
        .args([
            "--log-format",
            "json",
            "run",
            "--config",
            "run.toml",
            "--identity",
            "rel",
        ])
        .current_dir(&folder)
        .env_remove("BATON_CACHE_DIR")
        .env("BATON_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start baton");
    let mut seen = Vec::new();
    let mut compiled = false;
    for line in std::io::BufReader::new(child.stderr.take().unwrap()).lines() {
        let Ok(line) = line else { break };
        compiled |= line.contains("plugin compiled");
        let leads = line.contains("lease status changed") && line.contains("\"leading\"");
        seen.push(line);
        if leads {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = seen.join("\n");
    assert!(compiled, "the plugin was not compiled; the log:\n{log}");
    assert!(
        log.contains(&format!("\"cache\":\"{}\"", folder.join("compiled").display())),
        "the cache is not the configuration folder's: {log}"
    );
    let cached = std::fs::read_dir(folder.join("compiled"))
        .map(Iterator::count)
        .unwrap_or(0);
    assert!(cached > 0, "nothing in {}", folder.join("compiled").display());
}
