//! A test plugin for the `pollable-plugin` world of `baton:leader@0.3.0`,
//! kept on that version (built with wit-bindgen against `wit/v0.3.0`, not
//! with the SDK, which targets the newest) to prove that hosts serve 0.3.0
//! unchanged: prints `probe start term=T holder=H run=none` (`run`: what
//! `current-run` gives, `none` without a schedule), then waits for the
//! status to change; then prints `probe stop term=T role=R` and returns
//! `Ok`.

wit_bindgen::generate!({
    world: "baton:leader/pollable-plugin@0.3.0",
    path: "../../../wit/v0.3.0",
    additional_derives: [PartialEq],
    generate_all,
});

use std::io::Write;

use baton::leader::schedule::current_run;
use baton::leader::status_pollable::current_status;
use baton::leader::types::Role;
use exports::baton::leader::task_sync::{Guest, Status};

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
        let run = current_run().map_or("none".to_owned(), |r| r.due.seconds.to_string());
        say(format_args!(
            "probe start term={term} holder={} run={run}",
            status.holder.as_deref().unwrap_or("-")
        ));
        let (now, change) = current_status();
        if now == status {
            change.block();
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
