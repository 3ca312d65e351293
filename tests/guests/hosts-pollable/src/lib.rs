//! A test plugin for the `pollable-plugin` world of `baton:leader@0.2.0`,
//! kept on that version (built with wit-bindgen against `wit/v0.2.0`, not
//! with the SDK, which targets the newest) to prove that hosts serve
//! 0.2.0's live hosts unchanged: prints `probe start term=T`, then `probe
//! hosts live=N this-host-live=B term=T` at once and again at every change
//! of the live hosts, until the status changes; then `probe stop term=T
//! role=R` and returns `Ok`.
//!
//! The other probes do not call `current-hosts`, so that their hosts keep
//! no membership record unless they spread leases.

wit_bindgen::generate!({
    world: "baton:leader/pollable-plugin@0.2.0",
    path: "../../../wit/v0.2.0",
    additional_derives: [PartialEq],
    generate_all,
});

use std::io::Write;

use baton::leader::hosts_pollable::current_hosts;
use baton::leader::status_pollable::current_status;
use baton::leader::types::Role;
use exports::baton::leader::task_sync::{Guest, Status};
use wasi::io::poll;

fn say(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Pending => "pending",
        Role::Leading => "leading",
        Role::Following => "following",
    }
}

struct Probe;

impl Guest for Probe {
    fn run(status: Status) -> Result<(), String> {
        let term = status.term;
        say(format_args!("probe start term={term}"));
        let (now, change) = current_status();
        let changed_before = now != status;
        loop {
            let (hosts, hosts_change) = current_hosts();
            say(format_args!(
                "probe hosts live={} this-host-live={} term={term}",
                hosts.live, hosts.this_host_live
            ));
            if changed_before {
                break;
            }
            poll::poll(&[&change, &hosts_change]);
            if change.ready() {
                break;
            }
        }
        let (now, _) = current_status();
        say(format_args!(
            "probe stop term={term} role={}",
            role_name(now.role)
        ));
        Ok(())
    }
}

export!(Probe);
