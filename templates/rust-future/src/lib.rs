//! {{name}}: a baton plugin for the `future-plugin` world.
//!
//! While this host leads, it prints `tick term=T n=N` once a second; it
//! awaits the change future together with the timer, so it returns as soon
//! as the term is over.

use std::time::Duration;

use baton_guest::Status;
use baton_guest::future::{self, LeaderTask};

struct Plugin;

impl LeaderTask for Plugin {
    async fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        println!("start term={term}");
        // Resolves, with the new status, once the status differs from the
        // one `run` got (at once if it already does).
        let mut change = future::watch(&status);
        let mut n: u64 = 0;
        let now = loop {
            // `&mut change` keeps the same change future across rounds.
            match future::timeout(Duration::from_secs(1), &mut change).await {
                Some(now) => break now,
                None => {
                    n += 1;
                    println!("tick term={term} n={n}");
                }
            }
        };
        println!("stop term={term} role={}", now.role);
        Ok(())
    }
}

baton_guest::export_future!(Plugin);
