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
    let path = s.dir.path().join("baton.toml");
    let text = format!(
        "[store]\nkind = \"embedded\"\ndir = \"{}\"\n[[lease]]\nname = \"demo\"\ngrace = \"500ms\"\n\
         [[plugin]]\nname = \"probe\"\npath = \"{}\"\nlease = \"demo\"\nenv = {{ PROBE_MODE = \"{mode}\" }}\n",
        s.store().display(),
        guest(file).display()
    );
    std::fs::write(&path, text).unwrap();
    path
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
        assert!(text.contains("6 steps, 0 failed"), "{text}");
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
    let verdicts: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let lose = verdicts
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["step"].as_str().unwrap().starts_with("lose the lead"))
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
        text.contains("FAIL  run ")
            && text.contains("while leading: no error, no trap: the task returned an error"),
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
        xml.starts_with("<?xml") && xml.contains("<testsuites tests=\"6\" failures=\"2\">"),
        "{xml}"
    );
    let failure = "<failure message=\"the task returned an error while its term lasted\">";
    assert_eq!(xml.matches(failure).count(), 2, "{xml}");
}
