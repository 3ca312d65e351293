//! `baton run-now`: asks the host that leads a scheduled plugin's lease,
//! through its control socket, for one extra run of the plugin (the server
//! side is [`crate::daemon::control`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::config::Config;
use crate::daemon::control::{Request, find_socket, request};

/// How long the host may take to answer: it answers once the run is
/// asked for, not once it ran.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// Asks for one run of `plugin`, reaching its leader by `socket`, or by the
/// configuration file `config` (and `identity`); prints the host's answer.
pub async fn execute(
    plugin: String,
    config: Option<PathBuf>,
    identity: Option<String>,
    socket: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    let path = match (socket, config) {
        (Some(socket), _) => socket,
        (None, Some(file)) => {
            let cfg = Config::load(&file)?;
            let p = cfg
                .plugins
                .iter()
                .find(|p| p.spec.name == plugin)
                .with_context(|| format!("plugin {plugin:?} is not in {}", file.display()))?;
            if p.schedule.is_none() {
                anyhow::bail!(
                    "plugin {plugin:?} has no schedule (`schedule` or `every`) in {}",
                    file.display()
                );
            }
            find_socket(
                &file,
                cfg.control_socket.as_deref(),
                identity.as_deref(),
                &p.lease,
            )
            .await?
        }
        (None, None) => {
            anyhow::bail!("give --config FILE (or BATON_CONFIG) or --socket PATH to reach the host")
        }
    };
    let reply = request(&path, &Request::RunNow { plugin }, ANSWER_WITHIN).await?;
    if !reply.ok {
        anyhow::bail!("{}", reply.message);
    }
    println!("{}", reply.message);
    Ok(ExitCode::SUCCESS)
}
