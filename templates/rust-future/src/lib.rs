//! {{name}}: a baton plugin for the `future-plugin` world.
//!
//! While this host leads, it prints `tick term=T n=N` once a second (the
//! setting `interval-ms` of its `config` table in `baton.toml` changes the
//! period); it awaits the change future together with the timer, so it
//! returns as soon as the term is over.
//!
//! `N` counts the ticks of every term: it is kept in the plugin's own
//! key-value bucket (`default`), which outlives the instance, so the next
//! leader, on this host or another, goes on from where this one stopped.
//! The host refuses a write from a term that is over, and the task then
//! ends with that error. The key-value and config calls are plain blocking
//! calls, in this world too: no `.await`.
//!
//! With `REPORT_URL` set (see `baton.toml`: the variable and an `http`
//! grant), each tick also sends `POST REPORT_URL` with a small JSON body and
//! prints `report status=S term=T n=N` (or `report error E term=T n=N`). The
//! host adds the lease and the term as `Baton-Lease` and `Baton-Term`
//! headers, so the receiver can refuse a stale leader.

use std::time::Duration;

use baton_guest::Status;
use baton_guest::config;
use baton_guest::future::{self, LeaderTask};
use baton_guest::http::Request;
use baton_guest::kv::Bucket;

struct Plugin;

/// The report: `{"lease":"L","term":T,"tick":N}`.
fn report_body(lease: &str, term: u64, n: i64) -> String {
    let (open, close) = ('{', '}');
    format!(r#"{open}"lease":"{lease}","term":{term},"tick":{n}{close}"#)
}

impl LeaderTask for Plugin {
    async fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        println!("start term={term}");
        let report_url = std::env::var("REPORT_URL").ok().filter(|u| !u.is_empty());
        // A setting, with a default when the `config` table has none.
        let interval_ms = config::get("interval-ms")
            .map_err(|e| e.to_string())?
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        // Resolves, with the new status, once the status differs from the
        // one `run` got (at once if it already does).
        let mut change = future::watch(&status);
        let bucket = Bucket::open("default").map_err(|e| e.to_string())?;
        let interval = Duration::from_millis(interval_ms);
        let now = loop {
            // `&mut change` keeps the same change future across rounds.
            if let Some(now) = future::timeout(interval, &mut change).await {
                break now;
            }
            // One atomic step in the store; fails once a newer term has
            // claimed the bucket.
            let n = bucket.increment("ticks", 1).map_err(|e| e.to_string())?;
            println!("tick term={term} n={n}");
            let Some(url) = &report_url else { continue };
            let request = Request::post(url.as_str())
                .header("content-type", "application/json")
                .body(report_body(&status.lease, term, n))
                .timeout(Duration::from_secs(5));
            // The request is dropped if the term ends before its answer.
            match future::until_change(&mut change, request.send_async()).await {
                Ok(Ok(response)) => println!("report status={} term={term} n={n}", response.status),
                Ok(Err(e)) => println!("report error {e} term={term} n={n}"),
                Err(now) => break now,
            }
        };
        println!("stop term={term} role={}", now.role);
        Ok(())
    }
}

baton_guest::export_future!(Plugin);
