//! An example baton plugin for the `pollable-plugin` world that keeps its
//! state across hand-overs in the plugin's key-value bucket.
//!
//! While this host leads, it adds one to the counter `ticks` of its
//! `default` bucket once a second and prints `tick term=T total=N`. Each
//! term runs in a fresh instance, so nothing in memory survives a
//! hand-over; the bucket does: when another host takes over, its first tick
//! prints the next total, never 1 again. A write from a term that is over
//! is refused by the host, so the count never goes back.
//!
//! Run it (from the repository's root; `docs/state.md` explains it):
//!
//! ```sh
//! scripts/build-guests.sh
//! mkdir -p .baton/plugins
//! cp ~/.cache/baton/target/wasm32-wasip2/release/rust_kv_counter.wasm .baton/plugins/
//! cargo run -p baton -- run --config examples/kv-counter.toml  # in two terminals
//! ```
//!
//! Stop the leader with Ctrl-C: the other host takes over and goes on
//! counting from where the first stopped.

use std::time::Duration;

use baton_guest::Status;
use baton_guest::kv::Bucket;
use baton_guest::pollable::{self, LeaderTask};

struct Counter;

impl LeaderTask for Counter {
    fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        println!("start term={term}");
        let change = pollable::watch(&status);
        // The plugin's own bucket: granted without configuration.
        let bucket = Bucket::open("default").map_err(|e| format!("open: {e}"))?;
        while !change.wait_timeout(Duration::from_secs(1)) {
            // A failed write (above all one refused because a newer term
            // has claimed the bucket) ends the term's work.
            let total = bucket
                .increment("ticks", 1)
                .map_err(|e| format!("increment: {e}"))?;
            println!("tick term={term} total={total}");
        }
        let (now, _) = pollable::current_status();
        println!("stop term={term} role={}", now.role);
        Ok(())
    }
}

baton_guest::export_pollable!(Counter);
