//! `baton pull` and `baton push`, and the registry settings every command
//! that reaches a registry shares ([`RegistryArgs`]: `baton check` of a
//! reference too): the `[registry]` of a configuration file if given, with
//! the command line's settings over it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::config::Config;
use crate::oci::{Artifact, Pulled, Reference, Registry, SigningKey, VerifyKey};
use crate::runtime::default_cache_dir;

/// How to reach registries, on the command line.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct RegistryArgs {
    /// Take `[registry]` (and `cache-dir`) from this configuration file.
    #[arg(long, short, env = "BATON_CONFIG")]
    pub config: Option<PathBuf>,
    /// A Docker config.json with the credentials (else the usual places).
    #[arg(long, env = "BATON_REGISTRY_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// A CA certificate (PEM) to trust besides the web's roots.
    #[arg(long, env = "BATON_REGISTRY_CA")]
    pub ca: Option<PathBuf>,
    /// A registry (host:port) to speak plain HTTP to; repeatable.
    #[arg(long, value_name = "REGISTRY")]
    pub plain_http: Vec<String>,
    /// How long one registry operation may take.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
}

impl RegistryArgs {
    /// The registries as configured, and the configuration if one was
    /// given.
    pub fn registry(&self) -> anyhow::Result<(Registry, Option<Config>)> {
        let config = match &self.config {
            Some(file) => Some(Config::load(file)?),
            None => None,
        };
        let compiled = config
            .as_ref()
            .and_then(|c| c.cache_dir.clone())
            .or_else(|| std::env::var_os("BATON_CACHE_DIR").map(PathBuf::from))
            .unwrap_or_else(default_cache_dir);
        let mut settings = config
            .as_ref()
            .map(|c| c.registry.clone())
            .unwrap_or_default()
            .settings(&compiled);
        if let Some(f) = &self.auth_file {
            settings.auth_file = Some(f.clone());
        }
        if let Some(f) = &self.ca {
            settings.ca = Some(f.clone());
        }
        settings.plain_http.extend(self.plain_http.iter().cloned());
        if let Some(t) = self.timeout {
            settings.timeout = t;
        }
        Ok((Registry::new(settings), config))
    }
}

/// Pulls `reference` into the cache, its signature verified with `key` (or
/// the configuration's `[registry] verify-key`); prints its digest and
/// file.
pub async fn pull(reference: &str, key: Option<&Path>, args: &RegistryArgs) -> anyhow::Result<ExitCode> {
    let pulled = pull_reference(reference, key, args).await?;
    println!("{}", pulled.digest);
    println!("  {}", pulled.component.display());
    if let Some(why) = &pulled.stale {
        println!("  from the cache: the registry cannot be asked ({why})");
    }
    Ok(ExitCode::SUCCESS)
}

/// Pulls `reference` (see [`pull`]).
pub async fn pull_reference(
    reference: &str,
    key: Option<&Path>,
    args: &RegistryArgs,
) -> anyhow::Result<Pulled> {
    let reference = Reference::parse(reference)?;
    let (registry, config) = args.registry()?;
    let key = match key {
        Some(k) => Some(VerifyKey::read(k)?),
        None => config.and_then(|c| c.registry.verify_key),
    };
    Ok(registry.pull(&reference, key.as_ref()).await?)
}

/// Publishes the component `file` as `reference` (a tag), signed with
/// `sign_key` if given; prints the manifest's digest.
pub async fn push(
    file: &Path,
    reference: &str,
    sign_key: Option<&Path>,
    args: &RegistryArgs,
) -> anyhow::Result<ExitCode> {
    let reference = Reference::parse(reference)?;
    anyhow::ensure!(
        !reference.is_pinned(),
        "{reference}: push to a tag; the digest is the registry's to say"
    );
    let key = sign_key.map(SigningKey::read).transpose()?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    // Decoded for its config; the layer is titled with the file's name.
    let artifact = Artifact::new(file, bytes, &reference)?;
    let (registry, _) = args.registry()?;
    let pushed = registry.push(artifact, &reference, key.as_ref()).await?;
    println!("{}", pushed.digest);
    println!("  {}", reference.at(&pushed.digest));
    if let Some(tag) = pushed.signature {
        println!("  signed: {}", reference.tagged(&tag));
    }
    Ok(ExitCode::SUCCESS)
}
