//! `baton resume`: asks a draining host, through its control socket, to
//! contend for its leases again (see [`super::drain`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::daemon::control::{Request, request};

/// Resumes the host reached by `socket`, or by the configuration file
/// `config` (and `identity`); prints its answer.
pub async fn execute(
    config: Option<PathBuf>,
    identity: Option<String>,
    socket: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let path = super::drain::socket_of(config, identity, socket).await?;
    let reply = request(&path, &Request::Resume, Duration::from_secs(10)).await?;
    if !reply.ok {
        anyhow::bail!("{}", reply.message);
    }
    println!("{}", reply.message);
    Ok(ExitCode::SUCCESS)
}
