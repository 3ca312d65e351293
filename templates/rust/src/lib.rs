//! {{name}}: a baton plugin for the `pollable-plugin` world.
//!
//! While this host leads, it prints `tick term=T n=N` once a second; it
//! waits on the change signal together with the timer, so it returns as soon
//! as the term is over.

use std::time::Duration;

use baton_guest::Status;
use baton_guest::pollable::{self, LeaderTask};

struct Plugin;

impl LeaderTask for Plugin {
    fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        println!("start term={term}");
        // Ready once the status differs from the one `run` got.
        let change = pollable::watch(&status);
        let mut n: u64 = 0;
        while !change.wait_timeout(Duration::from_secs(1)) {
            n += 1;
            println!("tick term={term} n={n}");
        }
        let (now, _) = pollable::current_status();
        println!("stop term={term} role={}", now.role);
        Ok(())
    }
}

baton_guest::export_pollable!(Plugin);
