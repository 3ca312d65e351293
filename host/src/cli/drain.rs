//! `baton drain`: asks a running host, through its control socket, to hand
//! over every lease it leads (the graceful way: tasks told, drained, then
//! the lease released) and to take none until `baton resume` or a restart
//! (the server side is [`crate::daemon::control`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::daemon::control::{ClientError, Reply, Request, find_host_socket, request};

/// The socket of the host meant: `socket`, or the one running the
/// configuration file `config` on this machine (of `identity`, if given).
pub async fn socket_of(
    config: Option<PathBuf>,
    identity: Option<String>,
    socket: Option<PathBuf>,
) -> anyhow::Result<PathBuf> {
    match (socket, config) {
        (Some(socket), _) => Ok(socket),
        (None, Some(file)) => {
            let cfg = crate::config::Config::load(&file)?;
            Ok(find_host_socket(&file, cfg.control_socket.as_deref(), identity.as_deref()).await?)
        }
        (None, None) => {
            anyhow::bail!("give --config FILE (or BATON_CONFIG) or --socket PATH to reach the host")
        }
    }
}

/// Drains the host (one lease at a time, or `all_at_once`), waiting at most
/// `wait` for it to lead nothing; prints what it handed over. Fails,
/// naming the lease, if one was not handed over in time.
pub async fn execute(
    all_at_once: bool,
    wait: Duration,
    config: Option<PathBuf>,
    identity: Option<String>,
    socket: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let path = socket_of(config, identity, socket).await?;
    let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    // The host answers by `wait`; a little more for the answer itself.
    let limit = wait + Duration::from_secs(5);
    let reply: Reply = request(&path, &Request::Drain { all_at_once, wait_ms }, limit)
        .await
        .map_err(|e| match e {
            ClientError::Io(p, m) if m.starts_with("no reply") => {
                anyhow::anyhow!(
                    "control socket {}: {m}: the host did not finish draining",
                    p.display()
                )
            }
            e => e.into(),
        })?;
    if !reply.ok {
        anyhow::bail!("{}", reply.message);
    }
    println!("{}", reply.message);
    Ok(ExitCode::SUCCESS)
}
