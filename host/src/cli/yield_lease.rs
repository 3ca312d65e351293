//! `baton yield`: asks the host that leads a lease, through its control
//! socket, to hand the lease over and stay out of contention for a while
//! (the server side is [`crate::daemon::control`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::Config;
use crate::daemon::control::{Request, find_socket, request};

/// How long the host may take to answer: it answers once the tasks are
/// gone (within its grace) and another host took the lease.
const ANSWER_WITHIN: Duration = Duration::from_secs(300);

/// Asks for `lease` to be yielded for `duration` (default: one lease
/// duration of that lease), reaching the host by `socket`, or by the
/// configuration file `config` (and `identity`: which of its hosts);
/// prints the host's answer.
pub async fn execute(
    lease: String,
    duration: Option<Duration>,
    config: Option<PathBuf>,
    identity: Option<String>,
    socket: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let path = match (socket, config) {
        (Some(socket), _) => socket,
        (None, Some(file)) => {
            let cfg = Config::load(&file)?;
            find_socket(&file, cfg.control_socket.as_deref(), identity.as_deref(), &lease).await?
        }
        (None, None) => {
            anyhow::bail!("give --config FILE (or BATON_CONFIG) or --socket PATH to reach the host")
        }
    };
    let for_ms = duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let reply = request(&path, &Request::Yield { lease, for_ms }, ANSWER_WITHIN).await?;
    if !reply.ok {
        anyhow::bail!("{}", reply.message);
    }
    println!("{}", reply.message);
    Ok(ExitCode::SUCCESS)
}
