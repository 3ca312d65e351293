//! The `baton` command: run leases and plugins, check a plugin, create
//! one, show the leases of a store, make a host yield a lease.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use baton::config::{Config, StoreConfig};
use baton::ops::logging::{LogFormat, ProgressMode};
use baton::runtime::{EngineOptions, PluginEngine, PluginRuntime, default_cache_dir};

/// Runs WebAssembly plugin leader tasks only while this host holds a lease.
#[derive(Parser)]
#[command(name = "baton", version, about)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "BATON_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// The start-up's progress below the log lines (plugins loaded, each
    /// compilation in flight): `auto` draws it when standard error is a
    /// terminal and the log is text; `never` does not.
    #[arg(long, global = true, env = "BATON_PROGRESS", value_enum, default_value_t)]
    progress: ProgressMode,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the configured leases and plugins until SIGTERM or SIGINT;
    /// reload on SIGHUP.
    Run {
        /// The configuration file.
        #[arg(long, short, env = "BATON_CONFIG")]
        config: PathBuf,
        /// This host's identity (overrides the file; must be unique per process).
        #[arg(long, env = "BATON_IDENTITY")]
        identity: Option<String>,
        /// The embedded store's directory (overrides the file).
        #[arg(long, env = "BATON_STORE_DIR")]
        store_dir: Option<PathBuf>,
        /// Where compiled code is cached (overrides the file).
        #[arg(long, env = "BATON_CACHE_DIR")]
        cache_dir: Option<PathBuf>,
        /// Where to write a core dump (linear memory included) of each
        /// instance that traps (overrides the file; off by default).
        #[arg(long, env = "BATON_COREDUMP_DIR")]
        coredump_dir: Option<PathBuf>,
        /// The kubeconfig of a kubernetes store (overrides the file, KUBECONFIG
        /// and ~/.kube/config).
        #[arg(long, env = "BATON_KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// Serve /metrics, /healthz and /readyz on this address, such as
        /// 127.0.0.1:9090 (overrides the file; off by default).
        #[arg(long, env = "BATON_ADMIN_ADDRESS")]
        admin_address: Option<String>,
        /// Test hook: block the election runtime's thread this long after
        /// start (a stalled runtime, for tests of /healthz). Never in
        /// production: the host stops renewing its leases.
        #[arg(long, hide = true, value_parser = humantime::parse_duration)]
        test_stall_election_runtime: Option<std::time::Duration>,
        /// This host's control socket, for `baton yield` (overrides the file).
        #[arg(long, env = "BATON_CONTROL_SOCKET")]
        control_socket: Option<PathBuf>,
        /// Reload when the configuration file or a plugin file changes (as
        /// on SIGHUP; `watch = true` in the file does the same).
        #[arg(long, env = "BATON_WATCH")]
        watch: bool,
    },
    /// Make the host that leads LEASE hand it over (drain its tasks, then
    /// release it) and not contend for it for a while; reached through its
    /// control socket.
    Yield {
        /// The lease.
        lease: String,
        /// How long the host does not contend for the lease (default: one
        /// lease duration of that lease).
        #[arg(long = "for", value_name = "DURATION", value_parser = humantime::parse_duration)]
        duration: Option<std::time::Duration>,
        /// Find the host's control socket from its configuration file.
        #[arg(long, short, env = "BATON_CONFIG")]
        config: Option<PathBuf>,
        /// With --config: the host of this identity (default: the one of
        /// the file's hosts on this machine that leads the lease).
        #[arg(long, env = "BATON_IDENTITY")]
        identity: Option<String>,
        /// The host's control socket (over --config).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Say which world each component targets, or exactly why it cannot run.
    Check {
        /// Component files.
        #[arg(required = true)]
        plugins: Vec<PathBuf>,
    },
    /// Create ./NAME: a new plugin with a build script and a configuration.
    New {
        /// The plugin's language.
        #[arg(long)]
        lang: baton::cli::scaffold::Lang,
        /// The world it targets (future: Rust and Python only).
        #[arg(long, value_enum, default_value_t)]
        world: baton::cli::scaffold::World,
        /// The plugin's name (lower-case letters, digits and '-').
        name: String,
        /// Create it in this folder instead of the current one.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Show each lease of the store (embedded or kubernetes): holder, term,
    /// expiry, the preferred holder while the leads are spread, and the
    /// hosts' membership records.
    Status {
        /// Take the store from this configuration file.
        #[arg(long, short, env = "BATON_CONFIG")]
        config: Option<PathBuf>,
        /// An embedded store's directory (overrides the file).
        #[arg(long, env = "BATON_STORE_DIR")]
        store_dir: Option<PathBuf>,
        /// The kubeconfig of a kubernetes store (overrides the file, KUBECONFIG
        /// and ~/.kube/config).
        #[arg(long, env = "BATON_KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// Tables for people, or one JSON document (its shape is in
        /// docs/configuration.md).
        #[arg(long, short, value_enum, default_value_t)]
        output: baton::cli::status::OutputFormat,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match cli.command {
        Command::Status { .. } | Command::Yield { .. } => baton::ops::logging::QUIET_FILTER,
        _ => baton::ops::logging::DEFAULT_FILTER,
    };
    // Only `baton run` draws progress: the other commands print their
    // results on standard output, where a display on the same terminal
    // would be in the way.
    let progress = match cli.command {
        Command::Run { .. } => cli.progress,
        _ => ProgressMode::Never,
    };
    let logging = baton::ops::logging::init_with(cli.log_format, filter, progress);
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    let code = match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // A guest stuck in a host call (inline file I/O on a hung disk) must not
    // hold up the exit: its term's lease is not released and will expire.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    drop(logging);
    code
}

async fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Run {
            config,
            identity,
            store_dir,
            cache_dir,
            coredump_dir,
            kubeconfig,
            admin_address,
            test_stall_election_runtime,
            control_socket,
            watch,
        } => {
            let overrides = Overrides {
                identity,
                store_dir,
                cache_dir,
                coredump_dir,
                kubeconfig,
                admin_address,
                control_socket,
            };
            run(config, overrides, watch, test_stall_election_runtime).await
        }
        Command::Check { plugins } => check(plugins).await,
        Command::Yield {
            lease,
            duration,
            config,
            identity,
            socket,
        } => yield_lease(lease, duration, config, identity, socket).await,
        Command::New {
            lang,
            world,
            name,
            dir,
        } => {
            let root = baton::cli::scaffold::new_plugin(lang, world, &name, &dir)?;
            println!(
                "created {}: build it with {}/build.sh",
                root.display(),
                root.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            config,
            store_dir,
            kubeconfig,
            output,
        } => {
            let target = baton::cli::status::open(config.as_deref(), store_dir, kubeconfig).await?;
            let report = baton::cli::status::collect(&target).await?;
            match output {
                baton::cli::status::OutputFormat::Text => print!("{}", report.text()),
                baton::cli::status::OutputFormat::Json => print!("{}", report.json()),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `baton run`: serves the configuration in `config` (with the command
/// line's `overrides`) until SIGTERM or SIGINT, reloading it on SIGHUP and,
/// with `watch`, when its files change.
async fn run(
    config: PathBuf,
    overrides: Overrides,
    watch: bool,
    stall_election_after: Option<std::time::Duration>,
) -> Result<ExitCode> {
    // First: from here on SIGHUP reloads (its default action would end the
    // process), and SIGTERM/SIGINT shut down gracefully.
    let signals = Signals::install();
    let cfg = load_config(&config, &overrides)?;
    let (reload_tx, requests) = tokio::sync::mpsc::unbounded_channel();
    let load: baton::daemon::reload::Loader =
        std::sync::Arc::new(move || load_config(&config, &overrides).map_err(|e| format!("{e:#}")));
    let reload = baton::daemon::reload::Reload {
        load,
        requests,
        watch: (watch || cfg.watch).then(|| reload_tx.clone()),
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(wait_for_signal(signals, shutdown.clone(), reload_tx));
    let options = baton::daemon::serve::ServeOptions {
        stall_election_after,
        reload: Some(reload),
        ..Default::default()
    };
    baton::daemon::serve::serve_opts(cfg, options, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// The signals `baton run` handles, installed at its start.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals {
            term: signal(SignalKind::terminate()).expect("install the SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("install the SIGINT handler"),
            hup: signal(SignalKind::hangup()).expect("install the SIGHUP handler"),
        }
    }
}

/// Until SIGTERM or SIGINT (then `shutdown` is cancelled), each SIGHUP
/// asks for a reload: SIGHUP never ends the process.
async fn wait_for_signal(
    mut signals: Signals,
    shutdown: CancellationToken,
    reload: tokio::sync::mpsc::UnboundedSender<baton::daemon::reload::Cause>,
) {
    loop {
        tokio::select! {
            _ = signals.term.recv() => tracing::info!("SIGTERM received"),
            _ = signals.int.recv() => tracing::info!("SIGINT received"),
            _ = signals.hup.recv() => {
                tracing::info!("SIGHUP received: reloading");
                let _ = reload.send(baton::daemon::reload::Cause::Signal);
                continue;
            }
        }
        break;
    }
    shutdown.cancel();
}

/// `baton run`'s command-line settings over the file's.
struct Overrides {
    identity: Option<String>,
    store_dir: Option<PathBuf>,
    cache_dir: Option<PathBuf>,
    coredump_dir: Option<PathBuf>,
    kubeconfig: Option<PathBuf>,
    admin_address: Option<String>,
    control_socket: Option<PathBuf>,
}

/// Reads the configuration file, then applies `o` (at start, and at each
/// reload: the command line still wins).
fn load_config(config: &std::path::Path, o: &Overrides) -> Result<Config> {
    let mut cfg = Config::load(config)?;
    if let Some(path) = &o.control_socket {
        cfg.control_socket = Some(path.clone());
    }
    if let Some(identity) = &o.identity {
        anyhow::ensure!(
            !identity.trim().is_empty(),
            "--identity (or BATON_IDENTITY) is empty"
        );
        cfg.identity = identity.clone();
        cfg.identity_declared = true;
    }
    if let Some(dir) = &o.store_dir {
        cfg.store = StoreConfig::Embedded { dir: dir.clone() };
    }
    if let Some(dir) = &o.cache_dir {
        cfg.cache_dir = Some(dir.clone());
    }
    if let Some(dir) = &o.coredump_dir {
        cfg.coredump_dir = Some(dir.clone());
    }
    if let Some(path) = &o.kubeconfig {
        match &mut cfg.store {
            StoreConfig::Kubernetes { kubeconfig, .. } => *kubeconfig = Some(path.clone()),
            StoreConfig::Embedded { .. } => anyhow::bail!(
                "--kubeconfig (or BATON_KUBECONFIG) applies to a kubernetes store, but the \
                 configuration uses the embedded store"
            ),
        }
    }
    if let Some(address) = &o.admin_address {
        cfg.admin_address = Some(
            baton::config::parse_admin_address(address)
                .map_err(|e| anyhow::anyhow!("--admin-address (or BATON_ADMIN_ADDRESS): {e}"))?,
        );
    }
    Ok(cfg)
}

/// `baton yield`: asks the host's control socket, prints its answer.
async fn yield_lease(
    lease: String,
    duration: Option<std::time::Duration>,
    config: Option<PathBuf>,
    identity: Option<String>,
    socket: Option<PathBuf>,
) -> Result<ExitCode> {
    use baton::daemon::control::{Request, find_socket, request};
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
    // The host answers once the tasks are gone (within its grace) and
    // another host took the lease.
    let reply = request(
        &path,
        &Request::Yield { lease, for_ms },
        std::time::Duration::from_secs(300),
    )
    .await?;
    if !reply.ok {
        anyhow::bail!("{}", reply.message);
    }
    println!("{}", reply.message);
    Ok(ExitCode::SUCCESS)
}

async fn check(plugins: Vec<PathBuf>) -> Result<ExitCode> {
    let cache = std::env::var_os("BATON_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(default_cache_dir);
    let engine = PluginEngine::new(EngineOptions {
        cache_dir: Some(cache),
        // As `baton run` with plugins of the default limit: the same
        // compiled code, so a checked plugin is in the cache for the run.
        largest_memory: Some(baton::runtime::DEFAULT_MEMORY_LIMIT),
        ..EngineOptions::default()
    })
    .context("wasm engine")?;
    let runtime = PluginRuntime::new(engine)?;
    let mut ok = true;
    for path in plugins {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let p = path.clone();
        let result = tokio::task::block_in_place(|| runtime.check(&name, &p));
        // Its log lines (compiling, compiled) before its result.
        baton::ops::logging::written(std::time::Duration::from_millis(500));
        match result {
            Ok(plugin) => {
                println!("{}: ok: targets {}", path.display(), plugin.wit_world());
                if plugin.uses_hosts() {
                    println!(
                        "  asks for the live hosts (current-hosts): its host keeps a membership record even without spreading"
                    );
                }
                for c in plugin.capabilities() {
                    println!("  also imports {}", c.describe());
                }
            }
            Err(e) => {
                ok = false;
                println!("{}: cannot run: {}", path.display(), e.reason);
            }
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
