//! `baton kv`: an operator's view of the plugins' buckets, and writes to
//! them in a term of the operator's own (see
//! [`operator`](crate::store::buckets::operator)), on either store.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use base64::Engine as _;
use clap::{Args, Subcommand};

use crate::cli::status::OutputFormat;
use crate::config::Config;
use crate::store::buckets::operator::Operator;
use crate::store::buckets::{BucketName, BucketStore, Op};

/// What `baton kv` does.
#[derive(Subcommand)]
pub enum KvAction {
    /// Lists the buckets (of a lease, with --lease), or the keys of one
    /// (with --bucket or --plugin).
    List {
        /// Which store, lease and bucket.
        #[command(flatten)]
        target: Target,
    },
    /// Prints a key's value.
    Get {
        /// Which store, lease and bucket.
        #[command(flatten)]
        target: Target,
        /// The key.
        key: String,
    },
    /// Sets a key, in a term of its own that fences the plugin's older
    /// terms.
    Put {
        /// Which store, lease and bucket.
        #[command(flatten)]
        target: Target,
        /// The key.
        key: String,
        /// The value; `-` reads it from standard input.
        value: String,
        /// Write even while a host leads the lease: the lease is then kept
        /// from every host for one lease duration.
        #[arg(long)]
        force: bool,
    },
    /// Deletes a key, in a term of its own.
    Delete {
        /// Which store, lease and bucket.
        #[command(flatten)]
        target: Target,
        /// The key.
        key: String,
        /// Write even while a host leads the lease (see `put`).
        #[arg(long)]
        force: bool,
    },
}

/// Which store, lease and bucket.
#[derive(Args)]
pub struct Target {
    /// The configuration whose store to use.
    #[arg(long, short, env = "BATON_CONFIG")]
    config: PathBuf,
    /// The lease (default: the configuration's only lease).
    #[arg(long)]
    lease: Option<String>,
    /// The bucket as stored: a plugin's own bucket is stored under the
    /// plugin's name.
    #[arg(long, conflicts_with = "plugin")]
    bucket: Option<String>,
    /// The plugin whose own bucket to use (default, with neither: the
    /// lease's only plugin's).
    #[arg(long)]
    plugin: Option<String>,
    /// Text or JSON.
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

/// Runs `baton kv ACTION`.
pub async fn execute(action: KvAction) -> anyhow::Result<ExitCode> {
    match action {
        KvAction::List { target } => list(&target).await,
        KvAction::Get { target, key } => get(&target, &key).await,
        KvAction::Put {
            target,
            key,
            value,
            force,
        } => {
            let value = if value == "-" {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)?;
                bytes
            } else {
                value.into_bytes()
            };
            write(&target, Op::Set { key, value }, force).await
        }
        KvAction::Delete { target, key, force } => write(&target, Op::Delete { key }, force).await,
    }
}

/// The configuration, and its stores opened.
struct Opened {
    config: Config,
    leases: std::sync::Arc<dyn crate::store::LeaseStore>,
    buckets: std::sync::Arc<dyn BucketStore>,
}

async fn open(file: &Path) -> anyhow::Result<Opened> {
    let config = Config::load(file)?;
    let (leases, buckets) = crate::daemon::open_stores(&config).await?;
    Ok(Opened {
        config,
        leases,
        buckets,
    })
}

/// The lease named, or the configuration's only one.
fn lease_of(config: &Config, target: &Target) -> anyhow::Result<String> {
    let names: Vec<&str> = config.leases.iter().map(|l| l.name.as_str()).collect();
    match (&target.lease, names.as_slice()) {
        (Some(l), _) if names.contains(&l.as_str()) => Ok(l.clone()),
        (Some(l), _) => bail!(
            "lease {l:?} is not in the configuration (its leases: {})",
            names.join(", ")
        ),
        (None, [only]) => Ok((*only).to_owned()),
        (None, _) => bail!(
            "the configuration has {} leases ({}): name one with --lease",
            names.len(),
            names.join(", ")
        ),
    }
}

/// The bucket named, the plugin's own, or the lease's only plugin's own.
fn bucket_of(config: &Config, target: &Target) -> anyhow::Result<BucketName> {
    let lease = lease_of(config, target)?;
    if let Some(b) = &target.bucket {
        return Ok(BucketName::new(&lease, b));
    }
    let plugins: Vec<&str> = config
        .plugins
        .iter()
        .filter(|p| p.lease == lease)
        .map(|p| p.spec.name.as_str())
        .collect();
    let plugin = match (&target.plugin, plugins.as_slice()) {
        (Some(p), _) if plugins.contains(&p.as_str()) => p.clone(),
        (Some(p), _) => bail!(
            "plugin {p:?} is not under lease {lease:?} (its plugins: {})",
            plugins.join(", ")
        ),
        (None, [only]) => (*only).to_owned(),
        (None, _) => bail!(
            "lease {lease:?} has {} plugins ({}): name one with --plugin, or --bucket",
            plugins.len(),
            plugins.join(", ")
        ),
    };
    Ok(BucketName::new(&lease, &plugin))
}

async fn list(target: &Target) -> anyhow::Result<ExitCode> {
    let opened = open(&target.config).await?;
    if target.bucket.is_none() && target.plugin.is_none() {
        let lease = target
            .lease
            .as_ref()
            .map(|_| lease_of(&opened.config, target))
            .transpose()?;
        let all = opened.buckets.buckets(lease.as_deref()).await?;
        if target.output == OutputFormat::Json {
            let json: Vec<_> = all
                .iter()
                .map(|b| serde_json::json!({"lease": b.name.lease, "bucket": b.name.bucket, "fence": b.fence, "entries": b.entries, "bytes": b.bytes}))
                .collect();
            println!("{}", serde_json::to_string_pretty(&json)?);
        } else {
            println!(
                "{:<24} {:<24} {:>8} {:>8} {:>10}",
                "LEASE", "BUCKET", "FENCE", "ENTRIES", "BYTES"
            );
            for b in &all {
                println!(
                    "{:<24} {:<24} {:>8} {:>8} {:>10}",
                    b.name.lease, b.name.bucket, b.fence, b.entries, b.bytes
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let bucket = bucket_of(&opened.config, target)?;
    let mut keys = Vec::new();
    loop {
        let page = opened
            .buckets
            .list_keys(&bucket, keys.last().map(String::as_str), 1000)
            .await?;
        let done = page.len() < 1000;
        keys.extend(page);
        if done {
            break;
        }
    }
    if target.output == OutputFormat::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"lease": bucket.lease, "bucket": bucket.bucket, "keys": keys})
            )?
        );
    } else {
        for k in keys {
            println!("{k}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn get(target: &Target, key: &str) -> anyhow::Result<ExitCode> {
    let opened = open(&target.config).await?;
    let bucket = bucket_of(&opened.config, target)?;
    let Some(entry) = opened.buckets.get(&bucket, key).await? else {
        eprintln!("bucket {bucket}: no key {key:?}");
        return Ok(ExitCode::from(2));
    };
    if target.output == OutputFormat::Json {
        let value = match std::str::from_utf8(&entry.value) {
            Ok(text) => serde_json::json!({"value": text}),
            Err(_) => {
                serde_json::json!({"value_base64": base64::engine::general_purpose::STANDARD.encode(&entry.value)})
            }
        };
        let mut json = serde_json::json!({"lease": bucket.lease, "bucket": bucket.bucket, "key": key, "version": entry.version});
        json.as_object_mut()
            .context("an object")?
            .extend(value.as_object().cloned().unwrap_or_default());
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        use std::io::Write as _;
        std::io::stdout().write_all(&entry.value)?;
        if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            println!();
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn write(target: &Target, op: Op, force: bool) -> anyhow::Result<ExitCode> {
    let opened = open(&target.config).await?;
    let bucket = bucket_of(&opened.config, target)?;
    let lease = opened
        .config
        .leases
        .iter()
        .find(|l| l.name == bucket.lease)
        .context("the lease")?;
    let limits = opened
        .config
        .plugins
        .iter()
        .find(|p| {
            p.lease == bucket.lease
                && p.spec
                    .grants
                    .keyvalue
                    .stored(&bucket.lease, &p.spec.name)
                    .contains(&bucket)
        })
        .map_or_else(Default::default, |p| p.spec.grants.keyvalue.limits);
    let operator = Operator {
        leases: &*opened.leases,
        buckets: &*opened.buckets,
        identity: format!("baton-kv@{}", opened.config.identity),
        lease_duration: lease.timings.lease_duration,
        force,
    };
    let written = operator.write(&bucket, vec![op], limits).await?;
    let note = match &written.displaced {
        Some(h) => format!(
            "; {h} was displaced, and no host leads {} for {}",
            bucket.lease,
            humantime::format_duration(lease.timings.lease_duration)
        ),
        None => String::new(),
    };
    if target.output == OutputFormat::Json {
        println!(
            "{}",
            serde_json::json!({"lease": bucket.lease, "bucket": bucket.bucket, "term": written.term, "displaced": written.displaced})
        );
    } else {
        println!("written to bucket {bucket} in term {}{note}", written.term);
    }
    Ok(ExitCode::SUCCESS)
}
