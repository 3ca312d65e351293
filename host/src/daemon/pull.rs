//! Plugins from registries, at the edge: before the plugins load, and
//! before a reload compiles, every plugin whose `path` is an `oci://`
//! reference is pulled ([`pull_plugins`], several at once) and its
//! `spec.path` set to the checked file in the cache; with `--watch`,
//! [`watch_tags`] asks each tag's registry where it points, every `poll`,
//! and asks for a reload when a tag moved.
//!
//! Invariants: a plugin whose pull fails keeps the version it runs (on a
//! reload) or is not loaded (at start), and the others go on; the new
//! version of a plugin runs from its lease's next term, as a changed file
//! does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::reload::Cause;
use crate::config::{Config, OciSource, PluginConfig};
use crate::oci::{PullError, Registry};

/// A plugin whose component could not be pulled, and why.
pub(super) type Unpulled = (String, PullError);

/// The registries of `config`, with pulled components beside `compiled`
/// (the compiled-code cache).
pub(super) fn registry(config: &Config, compiled: &Path) -> Registry {
    Registry::new(config.registry.settings(compiled))
}

/// Pulls the component of every plugin of `config` from a registry, and
/// sets its `spec.path` and digest. A plugin that cannot be pulled keeps
/// what `running` ran (the same reference's path and digest), if anything;
/// otherwise it is returned with why. `shutdown` ends this at once.
pub(super) async fn pull_plugins(
    config: &mut Config,
    compiled: &Path,
    running: Option<&Config>,
    shutdown: &CancellationToken,
) -> Vec<Unpulled> {
    let registry = registry(config, compiled);
    let pulls = config.plugins.iter().filter_map(|p| {
        let source = p.source.as_ref()?;
        let registry = registry.clone();
        Some(async move {
            let pulled = registry.pull(&source.reference, source.verify_key.as_ref()).await;
            (p.spec.name.clone(), pulled)
        })
    });
    let results = tokio::select! {
        _ = shutdown.cancelled() => return Vec::new(),
        results = futures::future::join_all(pulls) => results,
    };
    let mut unpulled = Vec::new();
    for (name, result) in results {
        let p = config
            .plugins
            .iter_mut()
            .find(|p| p.spec.name == name)
            .expect("pulled for a configured plugin");
        let source = p.source.as_mut().expect("a registry plugin");
        match result {
            Ok(pulled) => {
                if let Some(why) = &pulled.stale {
                    tracing::warn!(plugin = %name, reference = %pulled.reference, digest = %pulled.digest, error = %why, "the registry cannot be asked: running the digest this tag last resolved to here");
                } else {
                    tracing::info!(plugin = %name, reference = %pulled.reference, digest = %pulled.digest, from = if pulled.asked { "registry" } else { "cache" }, "component pulled");
                }
                p.spec.path = pulled.component;
                p.spec.digest = Some(pulled.digest.clone());
                source.digest = Some(pulled.digest);
            }
            Err(error) => match kept(running, &name, source) {
                Some((path, digest)) => {
                    tracing::error!(plugin = %name, error = %error, digest = %digest, "cannot pull the plugin's component; the version it runs stays");
                    p.spec.path = path;
                    p.spec.digest = Some(digest.clone());
                    source.digest = Some(digest);
                }
                None => unpulled.push((name, error)),
            },
        }
    }
    unpulled
}

/// The file and digest of the plugin `name` as `running` runs it, if it
/// came from the same reference.
fn kept(running: Option<&Config>, name: &str, source: &OciSource) -> Option<(PathBuf, String)> {
    let p = running?.plugins.iter().find(|p| p.spec.name == name)?;
    let old = p.source.as_ref().filter(|s| s.reference == source.reference)?;
    Some((p.spec.path.clone(), old.digest.clone()?))
}

/// The digest each registry plugin of `plugins` runs, by plugin (what the
/// host publishes in its records, and the metrics show).
pub(super) fn versions(plugins: &[PluginConfig]) -> BTreeMap<String, String> {
    plugins
        .iter()
        .filter_map(|p| Some((p.spec.name.clone(), p.source.as_ref()?.digest.clone()?)))
        .collect()
}

/// What [`watch_tags`] watches: the registries' settings, and each tag
/// with the digest the host runs.
#[derive(Clone, Debug, Default)]
pub(super) struct Tags {
    registry: Option<Registry>,
    tags: Vec<(crate::oci::Reference, Option<String>)>,
}

impl Tags {
    /// The tags of `config`'s registry plugins (not those pinned by digest).
    pub(super) fn of(config: &Config, compiled: &Path) -> Tags {
        let mut tags: Vec<_> = config
            .plugins
            .iter()
            .filter_map(|p| p.source.as_ref())
            .filter(|s| !s.reference.is_pinned())
            .map(|s| (s.reference.clone(), s.digest.clone()))
            .collect();
        tags.sort();
        tags.dedup();
        Tags {
            registry: (!tags.is_empty()).then(|| registry(config, compiled)),
            tags,
        }
    }
}

/// Every `poll`, asks where each tag of `tags` points; when one points
/// elsewhere than the digest the host runs, asks for a reload (once per
/// new digest: a refused reload is not asked again until the tag moves
/// again or the host's configuration changes).
pub(super) async fn watch_tags(
    mut tags: watch::Receiver<Tags>,
    requests: mpsc::UnboundedSender<Cause>,
    stop: CancellationToken,
) {
    let mut told: BTreeMap<crate::oci::Reference, String> = BTreeMap::new();
    loop {
        let current = tags.borrow_and_update().clone();
        let poll = current
            .registry
            .as_ref()
            .map_or(crate::oci::DEFAULT_POLL, |r| r.settings().poll);
        if let Some(registry) = &current.registry {
            let mut moved = Vec::new();
            for (reference, runs) in &current.tags {
                match registry.resolve(reference).await {
                    Ok(now) if Some(&now) != runs.as_ref() && told.get(reference) != Some(&now) => {
                        tracing::info!(reference = %reference, digest = %now, "a tag moved");
                        told.insert(reference.clone(), now.clone());
                        moved.push(format!("{reference} ({now})"));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot ask where a tag points; asking again later")
                    }
                }
            }
            if !moved.is_empty() && requests.send(Cause::Moved(moved)).is_err() {
                return;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
            changed = tags.changed() => {
                if changed.is_err() {
                    return;
                }
                told.clear();
            }
        }
    }
}

/// Tells the others what `config`'s registry plugins run: the host's
/// records (`versions`), the tag watcher, and the metrics.
pub(super) fn publish(
    config: &Config,
    compiled: &Path,
    host: &crate::election::HostHandle,
    tags: &watch::Sender<Tags>,
    metrics: Option<&crate::ops::metrics::Metrics>,
) {
    let versions = versions(&config.plugins);
    host.modify(|h| h.versions.clone_from(&versions));
    tags.send_replace(Tags::of(config, compiled));
    if let Some(m) = metrics {
        let sources = config
            .plugins
            .iter()
            .filter_map(|p| {
                let s = p.source.as_ref()?;
                Some((p.spec.name.clone(), s.reference.to_string(), s.digest.clone()?))
            })
            .collect();
        m.sources(sources);
    }
}
