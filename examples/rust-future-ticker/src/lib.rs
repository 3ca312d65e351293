//! An example baton plugin for the `future-plugin` world.
//!
//! While this host leads, it prints `tick term=T n=N` once a second. It
//! awaits the change future together with the one-second timer, so it
//! notices the end of its term at once, prints `term T over: now ROLE` and
//! returns.

use std::time::Duration;

use baton_guest::Status;
use baton_guest::future::{self, LeaderTask};

struct Ticker;

impl LeaderTask for Ticker {
    async fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        println!("leading {status}");
        // Resolves once the status differs from the one we were started
        // with, including a change that happened before `run` was called.
        let mut change = future::watch(&status);
        let mut n: u64 = 0;
        let now = loop {
            // `&mut change` keeps the change future across rounds.
            match future::timeout(Duration::from_secs(1), &mut change).await {
                Some(now) => break now,
                None => {
                    n += 1;
                    println!("tick term={term} n={n}");
                }
            }
        };
        println!("term {term} over: now {}", now.role);
        Ok(())
    }
}

baton_guest::export_future!(Ticker);
