//! The `baton` command: run leases and plugins, check a plugin, create
//! one, show the leases of a store, make a host yield a lease. Here: the
//! command line, the dispatch to each command's module in
//! [`baton::cli`], and `baton run`'s signals.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use baton::cli;
use baton::cli::run::Triggers;
use baton::config::Overrides;
use baton::daemon::reload::Cause;
use baton::daemon::serve::Setup;
use baton::ops::logging::{LogFormat, ProgressMode};

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
    Run(RunArgs),
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
    /// Make a running host hand over every lease it leads (drain each, then
    /// release it) and take none until `baton resume` or a restart; waits
    /// until it leads nothing. Reached through its control socket.
    Drain {
        /// Hand every lease over at once (default: one by one, each
        /// released before the next).
        #[arg(long)]
        all_at_once: bool,
        /// How long to wait for the host to lead nothing; past it, fails
        /// naming the leases still led.
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        /// Find the host's control socket from its configuration file.
        #[arg(long, short, env = "BATON_CONFIG")]
        config: Option<PathBuf>,
        /// With --config: the host of this identity (default: the only host
        /// of the file on this machine).
        #[arg(long, env = "BATON_IDENTITY")]
        identity: Option<String>,
        /// The host's control socket (over --config).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Make a draining host contend for its leases again.
    Resume {
        /// Find the host's control socket from its configuration file.
        #[arg(long, short, env = "BATON_CONFIG")]
        config: Option<PathBuf>,
        /// With --config: the host of this identity.
        #[arg(long, env = "BATON_IDENTITY")]
        identity: Option<String>,
        /// The host's control socket (over --config).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Asks the host that leads a scheduled plugin's lease for one extra
    /// run of it now.
    RunNow {
        /// The plugin.
        plugin: String,
        #[arg(long, short, env = "BATON_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long, env = "BATON_IDENTITY")]
        identity: Option<String>,
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Say which world each component targets, or exactly why it cannot run.
    Check {
        /// Component files, or oci:// references (pulled first).
        #[arg(required = true)]
        plugins: Vec<PathBuf>,
        #[command(flatten)]
        registry: cli::registry::RegistryArgs,
    },
    /// Pull a component from a registry into the cache; print its digest.
    Pull {
        /// oci://REGISTRY/REPOSITORY:TAG or …@sha256:HEX.
        reference: String,
        /// Require a signature by this public key (cosign, PEM).
        #[arg(long)]
        verify_key: Option<PathBuf>,
        #[command(flatten)]
        registry: cli::registry::RegistryArgs,
    },
    /// Publish a component to a registry under a tag; print its digest.
    Push {
        /// The component file.
        file: PathBuf,
        /// oci://REGISTRY/REPOSITORY:TAG.
        reference: String,
        /// Sign it with this private key (PKCS#8 PEM, P-256), as cosign does.
        #[arg(long)]
        sign_key: Option<PathBuf>,
        #[command(flatten)]
        registry: cli::registry::RegistryArgs,
    },
    /// Create ./NAME: a new plugin with a build script and a configuration.
    New {
        /// The plugin's language.
        #[arg(long)]
        lang: cli::scaffold::Lang,
        /// The world it targets (future: Rust and Python only).
        #[arg(long, value_enum, default_value_t)]
        world: cli::scaffold::World,
        /// The plugin's name (lower-case letters, digits and '-').
        name: String,
        /// Create it in this folder instead of the current one.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Run one plugin in this process through scripted terms: lead, run,
    /// lose the lead (it must return within the grace), lead again in a
    /// newer term; print a verdict per step (exit status 1 if one failed).
    Test(cli::test_plugin::TestArgs),
    /// Lists, reads and writes the plugins' key-value buckets, on the
    /// configured store; writes are made in a term of their own, which
    /// fences the plugin's older terms.
    Kv {
        #[command(subcommand)]
        action: cli::kv::KvAction,
    },
    /// Show each lease of the store (embedded, kubernetes or etcd): holder, term,
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
        output: cli::status::OutputFormat,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = match cli.command {
        Command::Status { .. }
        | Command::Yield { .. }
        | Command::Kv { .. }
        | Command::RunNow { .. }
        | Command::Drain { .. }
        | Command::Resume { .. }
        | Command::Pull { .. }
        | Command::Push { .. } => baton::ops::logging::QUIET_FILTER,
        _ => baton::ops::logging::DEFAULT_FILTER,
    };
    // Only `baton run` draws progress: the other commands print their
    // results on standard output, where a display on the same terminal
    // would be in the way.
    let progress = match cli.command {
        Command::Run(_) => cli.progress,
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

/// The arguments of `baton run`.
#[derive(clap::Args)]
struct RunArgs {
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
    /// The endpoints of an etcd store, comma-separated (overrides the
    /// file and ETCDCTL_ENDPOINTS).
    #[arg(long, env = "BATON_ETCD_ENDPOINTS", value_delimiter = ',')]
    etcd_endpoints: Option<Vec<String>>,
    /// Serve /metrics, /healthz and /readyz on this address, such as
    /// 127.0.0.1:9090 (overrides the file; off by default).
    #[arg(long, env = "BATON_ADMIN_ADDRESS")]
    admin_address: Option<String>,
    /// How others reach this host's service, such as 10.1.2.3:8080 or
    /// http://node-a:8080, published with its leases (overrides the
    /// file; default: the POD_IP variable if set, else none).
    #[arg(long, env = "BATON_ADVERTISE_ADDRESS")]
    advertise_address: Option<String>,
    /// Test hook, in a build with the `test-hooks` feature only: block the
    /// election runtime's thread this long after start (a stalled runtime,
    /// for tests of /healthz). Never in production: the host stops
    /// renewing its leases.
    #[cfg(feature = "test-hooks")]
    #[arg(long, hide = true, value_parser = humantime::parse_duration)]
    test_stall_election_runtime: Option<std::time::Duration>,
    /// This host's control socket, for `baton yield` (overrides the file).
    #[arg(long, env = "BATON_CONTROL_SOCKET")]
    control_socket: Option<PathBuf>,
    /// Reload when the configuration file or a plugin file changes (as
    /// on SIGHUP; `watch = true` in the file does the same).
    #[arg(long, env = "BATON_WATCH")]
    watch: bool,
}

/// Runs `command`.
async fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::Run(args) => run_with(args).await,
        Command::Check { plugins, registry } => cli::check::execute(plugins, &registry).await,
        Command::Test(args) => cli::test_plugin::execute(args).await,
        Command::Pull {
            reference,
            verify_key,
            registry,
        } => cli::registry::pull(&reference, verify_key.as_deref(), &registry).await,
        Command::Push {
            file,
            reference,
            sign_key,
            registry,
        } => cli::registry::push(&file, &reference, sign_key.as_deref(), &registry).await,
        Command::RunNow {
            plugin,
            config,
            identity,
            socket,
        } => cli::run_now::execute(plugin, config, identity, socket).await,
        Command::Kv { action } => cli::kv::execute(action).await,
        Command::Drain {
            all_at_once,
            timeout,
            config,
            identity,
            socket,
        } => cli::drain::execute(all_at_once, timeout, config, identity, socket).await,
        Command::Resume {
            config,
            identity,
            socket,
        } => cli::resume::execute(config, identity, socket).await,
        Command::Yield {
            lease,
            duration,
            config,
            identity,
            socket,
        } => cli::yield_lease::execute(lease, duration, config, identity, socket).await,
        Command::New {
            lang,
            world,
            name,
            dir,
        } => cli::scaffold::execute(lang, world, &name, &dir),
        Command::Status {
            config,
            store_dir,
            kubeconfig,
            output,
        } => cli::status::execute(config.as_deref(), store_dir, kubeconfig, output).await,
    }
}

/// `baton run` with its arguments.
async fn run_with(args: RunArgs) -> Result<ExitCode> {
    let RunArgs {
        config,
        identity,
        store_dir,
        cache_dir,
        coredump_dir,
        kubeconfig,
        etcd_endpoints,
        admin_address,
        advertise_address,
        #[cfg(feature = "test-hooks")]
        test_stall_election_runtime,
        control_socket,
        watch,
    } = args;
    let overrides = Overrides {
        identity,
        store_dir,
        cache_dir,
        coredump_dir,
        kubeconfig,
        etcd_endpoints,
        admin_address,
        control_socket,
        advertise_address,
    };
    // The reloads are set by `cli::run`.
    let setup = Setup {
        reload: None,
        #[cfg(feature = "test-hooks")]
        hooks: baton::daemon::serve::TestHooks {
            stall_election_after: test_stall_election_runtime,
            ..Default::default()
        },
    };
    run(config, overrides, watch, setup).await
}

/// `baton run`, its signals handled: SIGTERM and SIGINT shut down
/// gracefully, SIGHUP reloads.
async fn run(config: PathBuf, overrides: Overrides, watch: bool, setup: Setup) -> Result<ExitCode> {
    // First: from here on SIGHUP reloads (its default action would end the
    // process), and SIGTERM/SIGINT shut down gracefully.
    let signals = Signals::install();
    let triggers = Triggers::new();
    tokio::spawn(wait_for_signal(
        signals,
        triggers.shutdown.clone(),
        triggers.reload.clone(),
    ));
    cli::run::execute(config, overrides, watch, setup, triggers).await
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
    reload: tokio::sync::mpsc::UnboundedSender<Cause>,
) {
    loop {
        tokio::select! {
            _ = signals.term.recv() => tracing::info!("SIGTERM received"),
            _ = signals.int.recv() => tracing::info!("SIGINT received"),
            _ = signals.hup.recv() => {
                tracing::info!("SIGHUP received: reloading");
                let _ = reload.send(Cause::Signal);
                continue;
            }
        }
        break;
    }
    shutdown.cancel();
}
