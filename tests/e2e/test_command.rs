//! `baton test`: the contract's scenario run on real guests in one
//! process; a guest that ignores the change, or fails while leading, gets
//! the verdict that names its fault, and exit status 1.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::support::{Scratch, baton, guest, shared_cache_dir};

/// A configuration with one plugin, `probe`, of `file` in `mode`, its
/// lease's grace 500 ms.
fn config(s: &Scratch, file: &str, mode: &str) -> std::path::PathBuf {
    crate::test_scenarios::config(s, file, &format!("env = {{ PROBE_MODE = \"{mode}\" }}"))
}

/// `baton test` of `file` with `args`.
fn test(file: &Path, args: &[&str]) -> Output {
    baton()
        .arg("test")
        .arg(file)
        .args(args)
        .env("BATON_CACHE_DIR", shared_cache_dir())
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_cooperative_plugin_passes_the_contracts_scenario_in_both_worlds() {
    for file in ["probe_pollable.wasm", "probe_future.wasm"] {
        let out = test(&guest(file), &[]);
        let text = stdout(&out);
        println!("{file}:\n{text}");
        assert!(
            out.status.success(),
            "{file}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("lead in term 2: a fresh instance starts: started"),
            "{text}"
        );
        assert!(text.contains("returned by itself"), "{text}");
        assert!(
            text.contains("past the lease (15s): the term ends during the pause: term 2 over; its task was stopped at once"),
            "{text}"
        );
        assert!(text.contains("9 steps, 0 failed"), "{text}");
    }
}

#[test]
fn a_plugin_that_ignores_the_change_is_told_it_was_stopped_by_force() {
    let s = Scratch::new();
    let cfg = config(&s, "probe_pollable.wasm", "busy");
    let out = test(
        &guest("probe_pollable.wasm"),
        &["--config", cfg.to_str().unwrap(), "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let outcomes: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let lose = outcomes[0]["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["step"].as_str().unwrap().contains(": lose the lead"))
        .unwrap();
    println!("{lose}");
    assert_eq!(lose["passed"], false);
    let detail = lose["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("ignored the change: stopped by force"),
        "{detail}"
    );
    assert!(detail.contains("(the grace is 500ms)"), "{detail}");
}

#[test]
fn a_plugin_that_fails_while_leading_is_told_so() {
    let s = Scratch::new();
    let cfg = config(&s, "probe_pollable.wasm", "fail");
    let out = test(
        &guest("probe_pollable.wasm"),
        &["--config", cfg.to_str().unwrap(), "--plugin", "probe"],
    );
    let text = stdout(&out);
    println!("{text}");
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("FAIL  step 2: wait 1s while leading: no error, no trap: the task returned an error"),
        "{text}"
    );
    // The same as JUnit XML: a case per step, the failed ones with the
    // verdict as their failure.
    let out = test(
        &guest("probe_pollable.wasm"),
        &["--config", cfg.to_str().unwrap(), "--format", "junit"],
    );
    let xml = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{xml}");
    assert!(
        xml.starts_with("<?xml") && xml.contains("<testsuites tests=\"9\" failures=\"3\">"),
        "{xml}"
    );
    let failure = "<failure message=\"the task returned an error while its term lasted\">";
    assert_eq!(xml.matches(failure).count(), 3, "{xml}");
}

/// How a real host stopped `mode`'s task when it lost the lead (`baton
/// yield`, no other host to take it): `cooperative` or `forced`.
fn on_a_real_host(mode: &str) -> String {
    let s = Scratch::new();
    let cfg = config(&s, "probe_pollable.wasm", mode);
    let h = crate::support::Host::start("host-a", &cfg);
    h.wait_for(std::time::Duration::from_secs(60), "the probe's start", |e| {
        e.guest_line("probe", "probe start")
    });
    let out = crate::yielding::yield_cmd(&[
        "demo".as_ref(),
        "--for".as_ref(),
        "30s".as_ref(),
        "--config".as_ref(),
        cfg.as_os_str(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let stopped = h.wait_for(std::time::Duration::from_secs(30), "the task's stop", |e| {
        e.is(crate::STOPPED, Some("probe"))
    });
    stopped.str("how").unwrap().to_owned()
}

#[test]
fn the_verdicts_match_what_the_same_plugin_does_on_real_hosts() {
    for (mode, real) in [("cooperative", "cooperative"), ("busy", "forced")] {
        let how = on_a_real_host(mode);
        let s = Scratch::new();
        let cfg = config(&s, "probe_pollable.wasm", mode);
        let out = test(
            &guest("probe_pollable.wasm"),
            &["--config", cfg.to_str().unwrap(), "--format", "json"],
        );
        let outcomes: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let loses: Vec<&Value> = outcomes[0]["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["step"].as_str().unwrap().contains(": lose the lead"))
            .collect();
        println!("{mode}: a real host stopped it {how}; baton test: {loses:?}");
        assert_eq!(how, real, "{mode} on a real host");
        for lose in loses {
            let (passed, detail) = (
                lose["passed"].as_bool().unwrap(),
                lose["detail"].as_str().unwrap(),
            );
            match how.as_str() {
                "cooperative" => assert!(passed && detail.starts_with("returned by itself"), "{lose}"),
                _ => assert!(
                    !passed && detail.starts_with("ignored the change: stopped by force"),
                    "{lose}"
                ),
            }
        }
    }
}
