//! `baton run` at the edge: the configuration read with the command line's
//! settings (and read again so for each reload), reloads asked for by
//! SIGHUP or by the watcher of the files, and [`serve_opts`] until the
//! shutdown. The daemon itself is [`crate::daemon`]; the signal handlers
//! are the binary's (`main.rs`), which drive the [`Triggers`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Overrides};
use crate::daemon::reload::{Cause, Loader, Reload};
use crate::daemon::serve::{ServeOptions, serve_opts};

/// What stops a run or asks it to reload.
pub struct Triggers {
    /// Cancelled to shut down (SIGTERM, SIGINT).
    pub shutdown: CancellationToken,
    /// Where reloads are asked for (SIGHUP; the watcher, when it runs).
    pub reload: mpsc::UnboundedSender<Cause>,
    /// Where the run receives them.
    pub requests: mpsc::UnboundedReceiver<Cause>,
}

impl Triggers {
    /// A shutdown not yet asked for, and a channel of reload requests.
    pub fn new() -> Triggers {
        let (reload, requests) = mpsc::unbounded_channel();
        Triggers {
            shutdown: CancellationToken::new(),
            reload,
            requests,
        }
    }
}

impl Default for Triggers {
    fn default() -> Self {
        Triggers::new()
    }
}

/// `baton run`: serves the configuration in `config` (with the command
/// line's `overrides`) until `triggers.shutdown`, reloading it when asked
/// and, with `watch` (or `watch = true` in the file), when its files
/// change. `stall_election_after` is a test hook (see [`ServeOptions`]).
pub async fn execute(
    config: PathBuf,
    overrides: Overrides,
    watch: bool,
    stall_election_after: Option<Duration>,
    triggers: Triggers,
) -> anyhow::Result<ExitCode> {
    let cfg = Config::load_with_overrides(&config, &overrides)?;
    let load: Loader = Arc::new(move || Config::load_with_overrides(&config, &overrides));
    let reload = Reload {
        load,
        requests: triggers.requests,
        watch: (watch || cfg.watch).then(|| triggers.reload.clone()),
    };
    let options = ServeOptions {
        stall_election_after,
        reload: Some(reload),
        ..Default::default()
    };
    serve_opts(cfg, options, triggers.shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
