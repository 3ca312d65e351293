//! `baton check`: says which world each component targets, or exactly why
//! it cannot run, compiling it as `baton run` would (so a checked plugin is
//! in the compiled-code cache for the run).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::registry::RegistryArgs;

use crate::runtime::{
    DEFAULT_MEMORY_LIMIT, EngineOptions, Plugin, PluginEngine, PluginRuntime, default_cache_dir,
};

/// Checks each of `plugins` (files, or `oci://` references pulled first
/// as `registry` says) and prints the result on standard output; fails
/// (exit status 1) if any cannot run.
pub async fn execute(plugins: Vec<PathBuf>, registry: &RegistryArgs) -> anyhow::Result<ExitCode> {
    let runtime = PluginRuntime::new(engine()?)?;
    let mut ok = true;
    for given in plugins {
        let text = given.to_string_lossy().into_owned();
        let (path, name) = if text.starts_with(crate::oci::SCHEME) {
            match super::registry::pull_reference(&text, None, registry).await {
                Ok(pulled) => {
                    println!("{text}: {} ({})", pulled.digest, pulled.component.display());
                    let name = pulled
                        .reference
                        .repository()
                        .rsplit('/')
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                    (pulled.component, name)
                }
                Err(e) => {
                    ok = false;
                    println!("{text}: cannot pull: {e:#}");
                    continue;
                }
            }
        } else {
            let name = given.file_stem().map(|s| s.to_string_lossy().into_owned());
            (given, name.unwrap_or_default())
        };
        let result = tokio::task::block_in_place(|| runtime.check(&name, &path));
        // Its log lines (compiling, compiled) before its result.
        crate::ops::logging::written(Duration::from_millis(500));
        match result {
            Ok(plugin) => print_checked(&text, &plugin),
            Err(e) => {
                ok = false;
                println!("{text}: cannot run: {}", e.reason);
            }
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The engine, on the compiled-code cache of `BATON_CACHE_DIR` or the
/// default one.
pub(super) fn engine() -> anyhow::Result<PluginEngine> {
    let cache = std::env::var_os("BATON_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(default_cache_dir);
    PluginEngine::new(EngineOptions {
        cache_dir: Some(cache),
        // As `baton run` with plugins of the default limit: the same
        // compiled code, so a checked plugin is in the cache for the run.
        largest_memory: Some(DEFAULT_MEMORY_LIMIT),
        ..EngineOptions::default()
    })
    .context("wasm engine")
}

/// What a component that can run targets and asks for.
fn print_checked(given: &str, plugin: &Plugin) {
    println!("{given}: ok: targets {}", plugin.wit_world());
    if plugin.uses_hosts() {
        println!(
            "  asks for the live hosts (current-hosts): its host keeps a membership record even without spreading"
        );
    }
    if plugin.exports_health_check() {
        println!(
            "  exports a health check ({}): a `health-check` table in its configuration has the host call it while it leads",
            plugin.health_export().unwrap_or_default()
        );
    } else if plugin.contract().has_health_check() {
        println!("  exports no health check: its lease is kept while its host renews it");
    }
    for c in plugin.capabilities() {
        println!("  also imports {}", c.describe());
    }
}
