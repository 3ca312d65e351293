//! {{name}}: a baton plugin for the `pollable-plugin` world.
//!
//! While this host leads, it prints `tick term=T n=N` once a second; it
//! waits on the change signal together with the timer, so it returns as soon
//! as the term is over.
//!
//! With `REPORT_URL` set (see `baton.toml`: the variable and an `http`
//! grant), each tick also sends `POST REPORT_URL` with a small JSON body and
//! prints `report status=S term=T n=N` (or `report error E term=T n=N`). The
//! host adds the lease and the term as `Baton-Lease` and `Baton-Term`
//! headers, so the receiver can refuse a stale leader.

use std::time::Duration;

use baton_guest::Status;
use baton_guest::http::{Error, Request};
use baton_guest::pollable::{self, Change, LeaderTask};

struct Plugin;

/// Sends one report; gives up at once if the term ends meanwhile.
fn report(url: &str, change: &Change, status: &Status, n: u64) -> Result<u16, Error> {
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
        // Ready once the status differs from the one `run` got.
        let change = pollable::watch(&status);
        let mut n: u64 = 0;
        while !change.wait_timeout(Duration::from_secs(1)) {
            n += 1;
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
