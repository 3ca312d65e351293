//! {{name}}: a baton plugin for the `pollable-plugin` world.
//!
//! While this host leads, it prints `tick term=T n=N` once a second (the
//! setting `interval-ms` of its `config` table in `baton.toml` changes the
//! period); it waits on the change signal together with the timer, so it
//! returns as soon as the term is over.
//!
//! `N` counts the ticks of every term: it is kept in the plugin's own
//! key-value bucket (`default`), which outlives the instance, so the next
//! leader, on this host or another, goes on from where this one stopped.
//! The host refuses a write from a term that is over, and the task then
//! ends with that error.
//!
//! With `REPORT_URL` set (see `baton.toml`: the variable and an `http`
//! grant), each tick also sends `POST REPORT_URL` with a small JSON body and
//! prints `report status=S term=T n=N` (or `report error E term=T n=N`). The
//! host adds the lease and the term as `Baton-Lease` and `Baton-Term`
//! headers, so the receiver can refuse a stale leader.

use std::time::Duration;

use baton_guest::Status;
use baton_guest::config;
use baton_guest::http::{Error, Request};
use baton_guest::kv::Bucket;
use baton_guest::pollable::{self, Change, LeaderTask};

struct Plugin;

/// Sends one report; gives up at once if the term ends meanwhile.
fn report(url: &str, change: &Change, status: &Status, n: i64) -> Result<u16, Error> {
    let (open, close) = ('{', '}');
    let body = format!(
        r#"{open}"lease":"{}","term":{},"tick":{n}{close}"#,
        status.lease, status.term
    );
    let response = Request::post(url)
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(5))
        .send_until(change)?;
    Ok(response.status)
}

impl LeaderTask for Plugin {
    fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        println!("start term={term}");
        let report_url = std::env::var("REPORT_URL").ok().filter(|u| !u.is_empty());
        // A setting, with a default when the `config` table has none.
        let interval_ms = config::get("interval-ms")
            .map_err(|e| e.to_string())?
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        // Ready once the status differs from the one `run` got.
        let change = pollable::watch(&status);
        let bucket = Bucket::open("default").map_err(|e| e.to_string())?;
        while !change.wait_timeout(Duration::from_millis(interval_ms)) {
            // One atomic step in the store; fails once a newer term has
            // claimed the bucket.
            let n = bucket.increment("ticks", 1).map_err(|e| e.to_string())?;
            println!("tick term={term} n={n}");
            if let Some(url) = &report_url {
                match report(url, &change, &status, n) {
                    Ok(code) => println!("report status={code} term={term} n={n}"),
                    Err(Error::StatusChanged) => break,
                    Err(e) => println!("report error {e} term={term} n={n}"),
                }
            }
        }
        let (now, _) = pollable::current_status();
        println!("stop term={term} role={}", now.role);
        Ok(())
    }
}

baton_guest::export_pollable!(Plugin);
