//! `baton run` at the edge: the configuration read with the command line's
//! settings (and read again so for each reload), reloads asked for by
//! SIGHUP or by the watcher of the files, and [`serve`] until the
//! shutdown. The daemon itself is [`crate::daemon`]; the signal handlers
//! are the binary's (`main.rs`), which drive the [`Triggers`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Overrides};
use crate::daemon::reload::{Cause, Loader, Reload};
use crate::daemon::serve::{Setup, serve};

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
/// change. `setup` is what the command line sets beyond the configuration
/// (in a build with the `test-hooks` feature, its test hooks); its reloads
/// are set here.
pub async fn execute(
    config: PathBuf,
    overrides: Overrides,
    watch: bool,
    mut setup: Setup,
    triggers: Triggers,
) -> anyhow::Result<ExitCode> {
    let cfg = Config::load_with_overrides(&config, &overrides)?;
    let load: Loader = Arc::new(move || Config::load_with_overrides(&config, &overrides));
    setup.reload = Some(Reload {
        load,
        requests: triggers.requests,
        watch: (watch || cfg.watch).then(|| triggers.reload.clone()),
    });
    serve(cfg, setup, triggers.shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
