//! A test plugin for the `future-plugin` world.
//!
//! Its behaviour is picked by the `PROBE_MODE` environment variable (the
//! host passes the variables a plugin's config grants). Every mode first
//! prints `probe start term=N mode=M`; then:
//!
//! - `cooperative` (also when `PROBE_MODE` is unset): prints
//!   `probe tick term=N` once a second until the status changes, then
//!   `probe stop term=N role=R` (`R` is the new role) and returns `Ok`.
//! - `busy`: spins forever in a pure-compute loop, ignoring the change
//!   (it never yields to the host).
//! - `block`: awaits `wasi:clocks/monotonic-clock@0.3.0.wait-for` of an
//!   hour, ignoring the change.
//! - `fail`: returns `Err("probe failure on purpose")`.
//! - `trap`: panics (`probe trap on purpose`), i.e. traps.
//! - `done`: returns `Ok` at once.
//!
//! Any other mode returns `Err("unknown PROBE_MODE: M")` after the start
//! line. Each line is flushed as soon as it is printed.

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use baton_guest::Status;
use baton_guest::future::{self, LeaderTask};

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

struct Probe;

impl LeaderTask for Probe {
    async fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        let mode = std::env::var("PROBE_MODE").unwrap_or_else(|_| "cooperative".to_string());
        say(format_args!("probe start term={term} mode={mode}"));
        match mode.as_str() {
            "cooperative" => {
                let mut change = future::watch(&status);
                let now = loop {
                    match future::timeout(Duration::from_secs(1), &mut change).await {
                        Some(now) => break now,
                        None => say(format_args!("probe tick term={term}")),
                    }
                };
                say(format_args!("probe stop term={term} role={}", now.role));
                Ok(())
            }
            "busy" => {
                let mut x = black_box(term);
                loop {
                    x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
            "block" => {
                future::sleep(Duration::from_secs(3600)).await;
                say(format_args!("probe block over term={term}"));
                Ok(())
            }
            "fail" => Err("probe failure on purpose".to_string()),
            "trap" => panic!("probe trap on purpose"),
            "done" => Ok(()),
            other => Err(format!("unknown PROBE_MODE: {other}")),
        }
    }
}

baton_guest::export_future!(Probe);
