//! A test plugin for the health check (`pollable-plugin-with-health` of
//! `baton:leader@0.4.0`), with a directory granted as `/health`.
//!
//! - `run` prints `health start term=T holder=H at=A` (`A`: the holder's
//!   address it is told, `-` when none), then appends `term=T host=H
//!   at=MICROS` (wall clock) to `/health/records` every `HEALTH_TICK_MS`
//!   milliseconds (default 100) until the status changes; then prints
//!   `health stop term=T role=R` and returns `Ok`.
//! - `check` reads the status (it runs in an instance of its own) and
//!   looks for `/health/unhealthy-H`, `H` the holder (this host, while it
//!   leads): absent, it prints `health check ok term=T holder=H at=A` and
//!   says healthy; present, it acts on the file's first word: `trap`
//!   panics, `hang` blocks for an hour (or until the status changes),
//!   `spin` runs a busy loop that ends only when the host stops it,
//!   anything else returns
//!   `Err("marker /health/unhealthy-H")` (after printing `health check
//!   unhealthy term=T`).
//!
//! Each line is flushed as soon as it is printed.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use baton_guest::Status;
use baton_guest::pollable::{self, LeaderTask};

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `term=T holder=H at=A`.
fn described(status: &Status) -> String {
    format!(
        "term={} holder={} at={}",
        status.term,
        status.holder.as_deref().unwrap_or("-"),
        status.holder_address.as_deref().unwrap_or("-")
    )
}

fn tick() -> Duration {
    let ms = std::env::var("HEALTH_TICK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    Duration::from_millis(ms)
}

/// Appends one record of `term` by `host`.
fn record(term: u64, host: &str) -> Result<(), String> {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open("/health/records")
        .map_err(|e| format!("open /health/records: {e}"))?;
    file.write_all(format!("term={term} host={host} at={micros}\n").as_bytes())
        .map_err(|e| format!("append to /health/records: {e}"))
}

struct Health;

impl LeaderTask for Health {
    fn run(status: Status) -> Result<(), String> {
        say(format_args!("health start {}", described(&status)));
        let host = status.holder.clone().unwrap_or_default();
        let change = pollable::watch(&status);
        loop {
            record(status.term, &host)?;
            if change.wait_timeout(tick()) {
                break;
            }
        }
        let (now, _) = pollable::current_status();
        say(format_args!("health stop term={} role={}", status.term, now.role));
        Ok(())
    }

    fn check() -> Result<(), String> {
        let (status, _) = pollable::current_status();
        let marker = format!("/health/unhealthy-{}", status.holder.as_deref().unwrap_or("-"));
        let Ok(text) = std::fs::read_to_string(&marker) else {
            say(format_args!("health check ok {}", described(&status)));
            return Ok(());
        };
        match text.split_whitespace().next() {
            Some("trap") => panic!("health check trap on purpose"),
            Some("spin") => loop {
                std::hint::black_box(0u64);
            },
            Some("hang") => {
                let (_, change) = pollable::current_status();
                change.wait_timeout(Duration::from_secs(3600));
                Err("woke from the hang".into())
            }
            _ => {
                say(format_args!("health check unhealthy term={}", status.term));
                Err(format!("marker {marker}"))
            }
        }
    }
}

baton_guest::export_pollable!(Health);
