//! An example baton plugin for the `pollable-plugin` world.
//!
//! While this host leads, it prints `tick term=T n=N` once a second. It
//! waits on the change signal together with the one-second timer, so it
//! notices the end of its term at once, prints `term T over: now ROLE` and
//! returns.

use std::time::Duration;

use baton_guest::Status;
use baton_guest::pollable::{self, LeaderTask};

struct Ticker;

impl LeaderTask for Ticker {
    fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        println!("leading {status}");
        // Ready once the status differs from the one we were started with,
        // including a change that happened before `run` was called.
        let change = pollable::watch(&status);
        let mut n: u64 = 0;
        while !change.wait_timeout(Duration::from_secs(1)) {
            n += 1;
            println!("tick term={term} n={n}");
        }
        let (now, _) = pollable::current_status();
        println!("term {term} over: now {}", now.role);
        Ok(())
    }
}

baton_guest::export_pollable!(Ticker);
