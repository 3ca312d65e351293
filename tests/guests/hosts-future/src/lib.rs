//! A test plugin for the `future-plugin` world of `baton:leader@0.4.0`:
//! prints `probe start term=T`, then `probe hosts live=N this-host-live=B
//! term=T` at once and again at every change of the live hosts, until the
//! status changes; then `probe stop term=T role=R` and returns `Ok`.
//!
//! The other probes do not call `current-hosts`, so that their hosts keep
//! no membership record unless they spread leases.

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::task::Poll;

use baton_guest::Status;
use baton_guest::future::{self, LeaderTask};

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

struct Probe;

impl LeaderTask for Probe {
    async fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        say(format_args!("probe start term={term}"));
        let mut change = future::watch(&status);
        let now = loop {
            let (hosts, mut hosts_change) = future::current_hosts();
            say(format_args!(
                "probe hosts live={} this-host-live={} term={term}",
                hosts.live, hosts.this_host_live
            ));
            // Whichever comes first: the status (then stop) or the hosts
            // (then print them again).
            let changed = std::future::poll_fn(|cx| {
                if let Poll::Ready(now) = Pin::new(&mut change).poll(cx) {
                    return Poll::Ready(Some(now));
                }
                Pin::new(&mut hosts_change).poll(cx).map(|_| None)
            })
            .await;
            if let Some(now) = changed {
                break now;
            }
        };
        say(format_args!("probe stop term={term} role={}", now.role));
        Ok(())
    }
}

baton_guest::export_future!(Probe);
