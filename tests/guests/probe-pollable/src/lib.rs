//! A test plugin for the `pollable-plugin` world.
//!
//! Its behaviour is picked by the `PROBE_MODE` environment variable (the
//! host passes the variables a plugin's config grants). Every mode first
//! prints `probe start term=N mode=M`; then:
//!
//! - `cooperative` (also when `PROBE_MODE` is unset): prints
//!   `probe tick term=N` once a second (every `PROBE_TICK_MS` milliseconds,
//!   if set) until the status changes, then `probe stop term=N role=R`
//!   (`R` is the new role) and returns `Ok`.
//! - `append`: appends records `term=N host=H guest=G seq=K at=T` (`H` is `PROBE_HOST`,
//!   `G` is `PROBE_TAG`, `T` the wall-clock time in microseconds)
//!   to `/data/records` (opened for appending) back to back (or one every
//!   `PROBE_TICK_MS` milliseconds, if set), until the status changes; with
//!   `PROBE_IGNORE` set it ignores the change and appends until it is
//!   stopped by force.
//! - `flood`: prints lines of 1 MiB in a loop, ignoring the change.
//! - `lookup`: resolves `tN.PROBE_LOOKUP` (`N`: its term) over and over,
//!   ignoring the change, printing `probe lookup NAME ok|failed: E term=N`
//!   after each.
//! - `stream`: connects to `PROBE_CONNECT` over TCP, prints
//!   `probe stream connected term=N`, then writes records of 1 KiB
//!   (`term=N seq=K `, padded with dots, ending in a newline) back to back,
//!   ignoring the change, until a write fails (`probe stream ended term=N
//!   sent=K: E`, then returns `Err`) or it is stopped by force.
//! - `oom`: allocates 1 MiB blocks until an allocation fails (which
//!   aborts).
//! - `recurse`: recurses without end (a stack overflow).
//! - `busy`: spins forever in a pure-compute loop, ignoring the change.
//! - `block`: blocks for an hour on a `wasi:clocks/monotonic-clock`
//!   pollable, ignoring the change.
//! - `http`: sends `GET PROBE_URL` with the SDK's `http` module (`send_until`), printing
//!   `probe http status=S term=N` or `probe http error E term=N`, every
//!   100 ms until the status changes; a change while a request waits for
//!   its answer ends the wait at once: `probe http abandoned term=N`. Then
//!   `probe stop term=N role=R`, and returns `Ok`.
//! - `fail`: returns `Err("probe failure on purpose")`.
//! - `trap`: panics (`probe trap on purpose`), i.e. traps.
//! - `done`: returns `Ok` at once.
//! - `sandbox`: reports what the sandbox lets it see, one line each:
//!   `probe env K=V` for every variable, `probe read PATH ok|denied: E` for
//!   `/data/hello.txt` and `/etc/hostname`, `probe write PATH ok|denied: E`
//!   for `/data/out.txt`; if `PROBE_CONNECT` names an address, connects to
//!   it over TCP, sends `term=N` and prints `probe connect ADDR ok` or
//!   `probe connect ADDR denied: E`; if `PROBE_LOOKUP` names a host, resolves
//!   it and prints `probe lookup NAME ok` or `probe lookup NAME denied: E`;
//!   if `PROBE_SERVE` is set, tries to listen on TCP and to bind UDP and
//!   prints `probe listen ok|denied: E` and `probe udp ok|denied: E`; then
//!   returns `Ok`.
//! - `memory`: tries to grow its memory by 64 MiB and prints
//!   `probe memory grew` or `probe memory refused`, then returns `Ok`.
//!
//! Any other mode returns `Err("unknown PROBE_MODE: M")` after the start
//! line. Each line is flushed as soon as it is printed.

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use baton_guest::Status;
use baton_guest::http::{Error, Request};
use baton_guest::pollable::{self, LeaderTask};

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

struct Probe;

impl LeaderTask for Probe {
    fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        let mode = std::env::var("PROBE_MODE").unwrap_or_else(|_| "cooperative".to_string());
        say(format_args!("probe start term={term} mode={mode}"));
        match mode.as_str() {
            "cooperative" => {
                let change = pollable::watch(&status);
                let tick = std::env::var("PROBE_TICK_MS")
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .map_or(Duration::from_secs(1), Duration::from_millis);
                while !change.wait_timeout(tick) {
                    say(format_args!("probe tick term={term}"));
                }
                let (now, _) = pollable::current_status();
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
                pollable::sleep(Duration::from_secs(3600));
                say(format_args!("probe block over term={term}"));
                Ok(())
            }
            "append" => {
                let host = std::env::var("PROBE_HOST").unwrap_or_default();
                let tag = std::env::var("PROBE_TAG").unwrap_or_default();
                let ignore = std::env::var("PROBE_IGNORE").is_ok();
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open("/data/records")
                    .map_err(|e| format!("cannot open /data/records: {e}"))?;
                let tick = std::env::var("PROBE_TICK_MS")
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .map(Duration::from_millis);
                let change = pollable::watch(&status);
                let mut seq = 0u64;
                while ignore || !change.is_ready() {
                    if let Some(tick) = tick
                        && seq > 0
                    {
                        if ignore {
                            pollable::sleep(tick);
                        } else if change.wait_timeout(tick) {
                            break;
                        }
                    }
                    seq += 1;
                    let at = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_micros());
                    let record = format!("term={term} host={host} guest={tag} seq={seq} at={at}\n");
                    file.write_all(record.as_bytes())
                        .map_err(|e| format!("cannot append: {e}"))?;
                }
                say(format_args!("probe stop term={term} appended={seq}"));
                Ok(())
            }
            "stream" => {
                let addr = std::env::var("PROBE_CONNECT").unwrap_or_default();
                let mut conn = std::net::TcpStream::connect(&addr)
                    .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
                say(format_args!("probe stream connected term={term}"));
                let mut seq = 0u64;
                loop {
                    let mut record = format!("term={term} seq={seq} ").into_bytes();
                    record.resize(1023, b'.');
                    record.push(b'\n');
                    if let Err(e) = conn.write_all(&record) {
                        say(format_args!("probe stream ended term={term} sent={seq}: {e}"));
                        return Err(format!("stream ended: {e}"));
                    }
                    seq += 1;
                }
            }
            "lookup" => {
                use std::net::ToSocketAddrs;
                let name = format!("t{term}.{}", std::env::var("PROBE_LOOKUP").unwrap_or_default());
                loop {
                    match (name.as_str(), 80).to_socket_addrs() {
                        Ok(_) => say(format_args!("probe lookup {name} ok term={term}")),
                        Err(e) => say(format_args!("probe lookup {name} failed: {e} term={term}")),
                    }
                }
            }
            "flood" => {
                let line = "x".repeat(1 << 20);
                loop {
                    say(format_args!("{line}"));
                }
            }
            "oom" => {
                let mut blocks: Vec<Vec<u8>> = Vec::new();
                loop {
                    blocks.push(vec![1u8; 1 << 20]);
                    black_box(&blocks);
                }
            }
            "recurse" => {
                // Recurses without end on purpose (a stack overflow).
                #[allow(unconditional_recursion)]
                fn down(n: u64) -> u64 {
                    black_box(down(black_box(n) + 1)) + 1
                }
                Ok(black_box(down(0)).to_string()).map(|_| ())
            }
            "http" => {
                let url = std::env::var("PROBE_URL").unwrap_or_default();
                let change = pollable::watch(&status);
                loop {
                    match Request::get(url.as_str()).send_until(&change) {
                        Ok(r) => say(format_args!("probe http status={} term={term}", r.status)),
                        Err(Error::StatusChanged) => {
                            say(format_args!("probe http abandoned term={term}"));
                            break;
                        }
                        Err(e) => say(format_args!("probe http error {e} term={term}")),
                    }
                    if change.wait_timeout(Duration::from_millis(100)) {
                        break;
                    }
                }
                let (now, _) = pollable::current_status();
                say(format_args!("probe stop term={term} role={}", now.role));
                Ok(())
            }
            "fail" => Err("probe failure on purpose".to_string()),
            "trap" => panic!("probe trap on purpose"),
            "done" => Ok(()),
            "sandbox" => {
                for (k, v) in std::env::vars() {
                    say(format_args!("probe env {k}={v}"));
                }
                for path in ["/data/hello.txt", "/etc/hostname"] {
                    match std::fs::read_to_string(path) {
                        Ok(text) => say(format_args!("probe read {path} ok: {}", text.trim())),
                        Err(e) => say(format_args!("probe read {path} denied: {e}")),
                    }
                }
                match std::fs::write("/data/out.txt", "written") {
                    Ok(()) => say(format_args!("probe write /data/out.txt ok")),
                    Err(e) => say(format_args!("probe write /data/out.txt denied: {e}")),
                }
                if let Ok(addr) = std::env::var("PROBE_CONNECT") {
                    let sent = std::net::TcpStream::connect(&addr)
                        .and_then(|mut s| s.write_all(format!("term={term}\n").as_bytes()));
                    match sent {
                        Ok(()) => say(format_args!("probe connect {addr} ok")),
                        Err(e) => say(format_args!("probe connect {addr} denied: {e}")),
                    }
                }
                if std::env::var("PROBE_SERVE").is_ok() {
                    match std::net::TcpListener::bind("0.0.0.0:0") {
                        Ok(_) => say(format_args!("probe listen ok")),
                        Err(e) => say(format_args!("probe listen denied: {e}")),
                    }
                    match std::net::UdpSocket::bind("0.0.0.0:0") {
                        Ok(_) => say(format_args!("probe udp ok")),
                        Err(e) => say(format_args!("probe udp denied: {e}")),
                    }
                }
                if let Ok(name) = std::env::var("PROBE_LOOKUP") {
                    use std::net::ToSocketAddrs;
                    match (name.as_str(), 80).to_socket_addrs() {
                        Ok(_) => say(format_args!("probe lookup {name} ok")),
                        Err(e) => say(format_args!("probe lookup {name} denied: {e}")),
                    }
                }
                Ok(())
            }
            "memory" => {
                let mut v: Vec<u8> = Vec::new();
                match v.try_reserve_exact(64 * 1024 * 1024) {
                    Ok(()) => {
                        v.resize(64 * 1024 * 1024, 1);
                        say(format_args!("probe memory grew {}", black_box(&v).len()))
                    }
                    Err(_) => say(format_args!("probe memory refused")),
                }
                Ok(())
            }
            other => Err(format!("unknown PROBE_MODE: {other}")),
        }
    }
}

baton_guest::export_pollable!(Probe);
