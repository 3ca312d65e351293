//! `baton test` with scenario files (`tests/scenarios/`): real guests,
//! each built to behave or to misbehave, through scripted terms, virtual
//! time, stubs and expectations; each fault gets the verdict that names
//! it.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Instant;

use serde_json::Value;

use crate::support::{Scratch, baton, guest, shared_cache_dir};

/// The scenario file `name` of `tests/scenarios/`.
fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/scenarios")
        .join(name)
}

/// A configuration with the one plugin `probe` of `file`, its table's
/// `extra` lines; its lease's grace 500 ms.
pub(crate) fn config(s: &Scratch, file: &str, extra: &str) -> PathBuf {
    let path = s.dir.path().join("baton.toml");
    let text = format!(
        "[store]\nkind = \"embedded\"\ndir = \"{}\"\n[[lease]]\nname = \"demo\"\ngrace = \"500ms\"\n\
         [[plugin]]\nname = \"probe\"\npath = \"{}\"\nlease = \"demo\"\n{extra}\n",
        s.store().display(),
        guest(file).display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `baton test` of `file` under `cfg` with `scenarios`, as JSON.
fn test(file: &str, cfg: &Path, scenarios: &[&str]) -> (Output, Value) {
    let out = baton()
        .arg("test")
        .arg(guest(file))
        .arg("--config")
        .arg(cfg)
        .args(scenarios.iter().map(|s| scenario(s)))
        .args(["--format", "json"])
        .env("BATON_CACHE_DIR", shared_cache_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}{}", String::from_utf8_lossy(&out.stderr)));
    (out, json)
}

/// Every verdict, as (step, passed, detail).
fn verdicts(json: &Value) -> Vec<(String, bool, String)> {
    json.as_array()
        .unwrap()
        .iter()
        .flat_map(|o| o["verdicts"].as_array().unwrap().clone())
        .map(|v| {
            (
                v["step"].as_str().unwrap().to_owned(),
                v["passed"].as_bool().unwrap(),
                v["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn failed(json: &Value) -> Vec<(String, bool, String)> {
    verdicts(json).into_iter().filter(|v| !v.1).collect()
}

#[test]
fn a_bucket_goes_on_from_the_last_acknowledged_write() {
    let s = Scratch::new();
    let cfg = config(&s, "kv_counter.wasm", "env = { KV_MODE = \"once\" }");
    let (out, json) = test("kv_counter.wasm", &cfg, &["kv-carry-over.toml"]);
    println!("{json:#}");
    assert!(out.status.success(), "{:?}", failed(&json));
    let all = verdicts(&json);
    assert!(
        all.iter()
            .any(|v| v.0.ends_with("kv count = \"42 2\"") && v.2 == "it is \"42 2\""),
        "{all:?}"
    );
}

#[test]
fn a_plugin_that_writes_after_the_change_is_told_so() {
    let s = Scratch::new();
    let cfg = config(&s, "kv_counter.wasm", "env = { KV_MODE = \"stubborn\" }");
    let (out, json) = test("kv_counter.wasm", &cfg, &["writes-after-change.toml"]);
    println!("{json:#}");
    assert_eq!(out.status.code(), Some(1));
    let faults = failed(&json);
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert!(
        faults[0].2.starts_with("ignored the change: stopped by force"),
        "{faults:?}"
    );
    assert!(
        faults[1].0.ends_with("no effect after a term's change")
            && faults[1].2.starts_with("term 1 wrote to its bucket ")
            && faults[1].2.contains(" times after its change fired ("),
        "{faults:?}"
    );
}

#[test]
fn http_requests_are_answered_by_stubs_and_carry_the_term() {
    let s = Scratch::new();
    let cfg = config(
        &s,
        "http_probe.wasm",
        "env = { HTTP_MODE = \"once\", HTTP_URL = \"https://api.example.com/items\" }",
    );
    let (out, json) = test("http_probe.wasm", &cfg, &["http-stub.toml"]);
    println!("{json:#}");
    assert!(out.status.success(), "{:?}", failed(&json));
    let all = verdicts(&json);
    let http = all.iter().find(|v| v.0.ends_with("1 HTTP requests")).unwrap();
    assert_eq!(
        http.2, "it sent 1: GET https://api.example.com/items (Baton-Term 1)",
        "the host's term, not the guest's forged 999"
    );
}

#[test]
fn a_health_check_that_hangs_is_told_it_did_not_answer() {
    let s = Scratch::new();
    let dir = s.dir.path().join("health");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("unhealthy-baton-test"), "hang").unwrap();
    let cfg = config(
        &s,
        "health_probe.wasm",
        &format!(
            "dirs = [{{ host = {:?}, guest = \"/health\" }}]\nhealth-check = {{ period = \"2s\", timeout = \"500ms\" }}",
            dir.display().to_string()
        ),
    );
    let (out, json) = test("health_probe.wasm", &cfg, &["health-hangs.toml"]);
    println!("{json:#}");
    assert_eq!(out.status.code(), Some(1));
    let faults = failed(&json);
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert_eq!(
        faults[0].2,
        "it did not answer within its timeout (500ms): a check must return"
    );
}

#[test]
fn a_nightly_schedule_runs_each_due_time_once_over_a_week_across_both_dst_changes() {
    let s = Scratch::new();
    let cfg = config(
        &s,
        "sched_probe.wasm",
        "schedule = \"30 2 * * *\"\ntime-zone = \"Europe/Berlin\"",
    );
    let began = Instant::now();
    let (out, json) = test(
        "sched_probe.wasm",
        &cfg,
        &["nightly-dst-spring.toml", "nightly-dst-autumn.toml"],
    );
    println!("{json:#}");
    // A figure, not judged: two weeks of virtual time in milliseconds
    // (docs/testing-plugins.md).
    println!("two simulated weeks in {:?} of real time", began.elapsed());
    assert!(out.status.success(), "{:?}", failed(&json));
    let once: Vec<_> = verdicts(&json)
        .into_iter()
        .filter(|v| v.0 == "each due time completed once")
        .collect();
    assert_eq!(
        once.iter().map(|v| v.2.as_str()).collect::<Vec<_>>(),
        ["7 due times, each once", "7 due times, each once"]
    );
}

#[test]
fn a_scheduled_run_that_says_ok_when_cut_off_is_told_so() {
    let mut said = Vec::new();
    for mode in ["slow", "liar"] {
        let s = Scratch::new();
        let cfg = config(
            &s,
            "sched_probe.wasm",
            &format!(
                "schedule = \"0 3 * * *\"\nenv = {{ SCHED_MODE = \"{mode}\", SCHED_RUN_MS = \"10000\" }}"
            ),
        );
        let (out, json) = test("sched_probe.wasm", &cfg, &["cut-off-run.toml"]);
        println!("{mode}: {json:#}");
        let lose = verdicts(&json)
            .into_iter()
            .find(|v| v.0.contains(": lose the lead"))
            .unwrap();
        said.push((mode, out.status.code(), lose));
    }
    let (_, code, lose) = &said[0];
    assert_eq!(*code, Some(0), "{said:?}");
    assert!(lose.1 && lose.2.starts_with("returned by itself"), "{said:?}");
    let (_, code, lose) = &said[1];
    assert_eq!(*code, Some(1), "{said:?}");
    assert!(
        !lose.1
            && lose.2.starts_with("its run for ")
            && lose.2.contains("returned `ok`")
            && lose.2.ends_with("a run the change cuts off must return an error"),
        "{said:?}"
    );
}
