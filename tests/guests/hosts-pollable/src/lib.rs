//! A test plugin for the `pollable-plugin` world of `baton:leader@0.2.0`:
//! prints `probe start term=T`, then `probe hosts live=N this-host-live=B
//! term=T` at once and again at every change of the live hosts, until the
//! status changes; then `probe stop term=T role=R` and returns `Ok`.
//!
//! The other probes do not call `current-hosts`, so that their hosts keep
//! no membership record unless they spread leases.

use std::io::Write;

use baton_guest::Status;
use baton_guest::pollable::{self, LeaderTask};

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

struct Probe;

impl LeaderTask for Probe {
    fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        say(format_args!("probe start term={term}"));
        let change = pollable::watch(&status);
        loop {
            let (hosts, hosts_change) = pollable::current_hosts();
            say(format_args!(
                "probe hosts live={} this-host-live={} term={term}",
                hosts.live, hosts.this_host_live
            ));
            pollable::poll_with(&[change.as_pollable(), hosts_change.as_pollable()]);
            if change.is_ready() {
                break;
            }
        }
        let (now, _) = pollable::current_status();
        say(format_args!("probe stop term={term} role={}", now.role));
        Ok(())
    }
}

baton_guest::export_pollable!(Probe);
