//! A test plugin for the `future-plugin` world.
//!
//! Its behaviour is picked by the `PROBE_MODE` environment variable (the
//! host passes the variables a plugin's config grants). Every mode first
//! prints `probe start term=N mode=M`; then:
//!
//! - `cooperative` (also when `PROBE_MODE` is unset): prints
//!   `probe tick term=N` once a second (every `PROBE_TICK_MS` milliseconds,
//!   if set) until the status changes, then `probe stop term=N role=R`
//!   (`R` is the new role) and returns `Ok`.
//! - `busy`: spins forever in a pure-compute loop, ignoring the change
//!   (it never yields to the host).
//! - `block`: awaits `wasi:clocks/monotonic-clock@0.3.0.wait-for` of an
//!   hour, ignoring the change.
//! - `append`: as in the pollable probe (`PROBE_TICK_MS` too): appends `term=N host=H guest=G seq=K at=T`
//!   records to `/data/records` back to back until the status changes (or,
//!   with `PROBE_IGNORE` set, until stopped by force).
//! - `fsops`: changes the directory `/data/ops` back to back, ignoring the
//!   change, each round `K` under names tagged with its term,
//!   `tN.sK` (`N`, `K` zero-padded): creates `tN.sK.new` (`open-at`,
//!   create and truncate), links it as `tN.sK.link`, unlinks that, renames
//!   `tN.sK.new` to `tN.sK`, sets its times (`set-times`, then
//!   `set-times-at`) and creates the directory `tN.sK.d`. Every step
//!   sets the entry's inode change time, so the last step of each entry
//!   that landed can be dated. Until stopped by force; an error returns
//!   `Err`.
//! - `http`: sends `GET PROBE_URL` with the SDK's `http` module (`send_async` raced with `future::until_change`), printing
//!   `probe http status=S term=N` or `probe http error E term=N`, every
//!   100 ms until the status changes; a change while a request waits for
//!   its answer ends the wait at once: `probe http abandoned term=N`. Then
//!   `probe stop term=N role=R`, and returns `Ok`.
//! - `schedule`: prints the run `current-run` gives (`baton:leader@0.3.0`),
//!   `probe schedule due=UNIX_MS attempt=N on_demand=B term=N` or
//!   `probe schedule none term=N`, and returns `Ok`.
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
use baton_guest::http::Request;

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
                let tick = std::env::var("PROBE_TICK_MS")
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .map_or(Duration::from_secs(1), Duration::from_millis);
                let now = loop {
                    match future::timeout(tick, &mut change).await {
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
                let mut change = future::watch(&status);
                let mut seq = 0u64;
                loop {
                    if let Some(tick) = tick
                        && seq > 0
                    {
                        if ignore {
                            future::sleep(tick).await;
                        } else if future::timeout(tick, &mut change).await.is_some() {
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
                    if !ignore && !future::still_leading(term) {
                        break;
                    }
                }
                say(format_args!("probe stop term={term} appended={seq}"));
                Ok(())
            }
            "fsops" => {
                let mut seq = 0;
                loop {
                    file_ops(term, &mut seq)?;
                }
            }
            "http" => {
                let url = std::env::var("PROBE_URL").unwrap_or_default();
                let mut change = future::watch(&status);
                let request = Request::get(url.as_str());
                let now = loop {
                    match future::until_change(&mut change, request.send_async()).await {
                        Ok(Ok(r)) => say(format_args!("probe http status={} term={term}", r.status)),
                        Ok(Err(e)) => say(format_args!("probe http error {e} term={term}")),
                        Err(now) => {
                            say(format_args!("probe http abandoned term={term}"));
                            break now;
                        }
                    }
                    if let Some(now) = future::timeout(Duration::from_millis(100), &mut change).await {
                        break now;
                    }
                };
                say(format_args!("probe stop term={term} role={}", now.role));
                Ok(())
            }
            "schedule" => {
                match baton_guest::schedule::current_run() {
                    Some(run) => say(format_args!(
                        "probe schedule due={} attempt={} on_demand={} term={term}",
                        run.due_unix_millis(),
                        run.attempt,
                        run.on_demand
                    )),
                    None => say(format_args!("probe schedule none term={term}")),
                }
                Ok(())
            }
            "fail" => Err("probe failure on purpose".to_string()),
            "trap" => panic!("probe trap on purpose"),
            "done" => Ok(()),
            other => Err(format!("unknown PROBE_MODE: {other}")),
        }
    }
}

/// One round of `fsops` (see the module docs), the next after `seq`.
fn file_ops(term: u64, seq: &mut u64) -> Result<(), String> {
    *seq += 1;
    let base = format!("/data/ops/t{term:06}.s{:06}", *seq);
    let (new, link) = (format!("{base}.new"), format!("{base}.link"));
    let fail = |what: &str, e: std::io::Error| format!("{what} {base}: {e}");
    std::fs::File::create(&new).map_err(|e| fail("create", e))?;
    std::fs::hard_link(&new, &link).map_err(|e| fail("link", e))?;
    std::fs::remove_file(&link).map_err(|e| fail("unlink", e))?;
    std::fs::rename(&new, &base).map_err(|e| fail("rename", e))?;
    // `set-times` on a descriptor, then `set-times-at` by path.
    std::fs::File::open(&base)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()))
        .map_err(|e| fail("set-times", e))?;
    set_times_at(&base).map_err(|e| fail("set-times-at", e))?;
    std::fs::create_dir(format!("{base}.d")).map_err(|e| fail("mkdir", e))
}

/// `utimensat` of `path` (both times now): `set-times-at`.
fn set_times_at(path: &str) -> std::io::Result<()> {
    let path = std::ffi::CString::new(path).map_err(std::io::Error::other)?;
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::UTIME_NOW,
    };
    // SAFETY: a valid C string and two timespecs, read by the call.
    if unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), [now, now].as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

baton_guest::export_future!(Probe);
