//! An example baton plugin for the `future-plugin` world
//! (`baton:leader@0.3.0`).
//!
//! While this host leads, it prints `tick term=T n=N` once a second. It
//! awaits the change future together with the one-second timer, so it
//! notices the end of its term at once, prints `term T over: now ROLE` and
//! returns. It also prints how many hosts take part (`hosts live=N
//! this-host-live=B`) at the start and whenever that changes: a plugin that
//! shares work with the other hosts would size its share by it.

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
        let (hosts, mut hosts_change) = future::current_hosts();
        println!("hosts {hosts}");
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
            // The hosts' signal is checked once a tick; `timeout` with no
            // time polls it without waiting.
            if future::timeout(Duration::ZERO, &mut hosts_change).await.is_some() {
                let (hosts, next) = future::current_hosts();
                println!("hosts {hosts}");
                hosts_change = next;
            }
        };
        println!("term {term} over: now {}", now.role);
        Ok(())
    }
}

baton_guest::export_future!(Ticker);
