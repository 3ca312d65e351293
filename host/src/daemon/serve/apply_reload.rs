//! A reload applied to the running [`Daemon`] (whose struct and lifecycle
//! are in the parent module, [`serve`](super)): the new configuration read
//! and checked against the running one, every new or changed plugin
//! compiled, and only if all of that succeeds the changes made (what may
//! change and what needs a restart: [`reload`]).
//!
//! Invariant: a plugin removed from a lease, or moved to another, starts
//! again (under any lease) only once its old supervisor has returned, so
//! that no two tasks of it run on this host at once; across hosts, a
//! plugin moved to another lease starts only once no other lease claims it
//! ([`crate::election::claims`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;

use super::Daemon;
use crate::config::own_files::OwnFilesGranted;
use crate::config::{Config, LoadError, PluginConfig, ReloadMode};
use crate::daemon::leases::{handover_bound, spec_key, steered, wanted_spread};
use crate::daemon::{pull, reload};
use crate::election::Intent;
use crate::election::spread::LeaseChange;
use crate::runtime::{Plugin, PluginError};

/// Why a reload was refused (nothing was changed).
#[derive(Debug, thiserror::Error)]
pub(super) enum ReloadRefused {
    /// The configuration, or a command-line setting over it, is broken.
    #[error("{0}")]
    Unreadable(LoadError),
    /// Reading it panicked.
    #[error("reading the configuration panicked: {0}")]
    ReadPanicked(JoinError),
    /// It cannot be applied now: each reason, after the file's name.
    #[error("{file}: {}", join(.reasons))]
    Refused {
        /// The configuration file.
        file: String,
        /// Why not.
        reasons: Vec<Refusal>,
    },
    /// A new or changed plugin cannot run.
    #[error("{0}")]
    Plugin(PluginError),
    /// Components of plugins that do not run yet cannot be pulled (those
    /// that run keep their version instead).
    #[error("{}", unpulled(.0))]
    Unpulled(Vec<pull::Unpulled>),
    /// Loading a new or changed plugin panicked.
    #[error("plugin {plugin:?}: loading it panicked: {error}")]
    LoadPanicked {
        /// The plugin.
        plugin: String,
        /// The panic.
        error: JoinError,
    },
}

/// One reason a configuration cannot be applied now.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    /// A setting changed that needs a restart ([`reload::needs_restart`]).
    #[error("{0}")]
    NeedsRestart(String),
    /// The lease is declared again before its handing over is done.
    #[error(
        "lease {0:?} is still being handed over after a reload removed it; reload again once \
         \"lease removed by a reload\" is logged"
    )]
    StillHandedOver(String),
    /// A `dirs` grant reaches the host's own files.
    #[error("{0}")]
    OwnFiles(OwnFilesGranted),
}

fn unpulled(list: &[pull::Unpulled]) -> String {
    let words: Vec<String> = list.iter().map(|(p, e)| format!("plugin {p:?}: {e}")).collect();
    words.join("; ")
}

fn join(reasons: &[Refusal]) -> String {
    let words: Vec<String> = reasons.iter().map(Refusal::to_string).collect();
    words.join("; ")
}

/// A new or changed plugin, compiled: its configuration, its file's
/// content hash, the plugin.
type Fresh = (PluginConfig, Option<u64>, Arc<Plugin>);

impl Daemon {
    /// One reload: `Ok(None)`: nothing changed; `Ok(Some(new))`: applied;
    /// `Err`: refused (nothing changed), and why.
    pub(super) async fn reload_once(
        &mut self,
        cause: &reload::Cause,
        load: &reload::Loader,
    ) -> Result<Option<Config>, ReloadRefused> {
        tracing::info!(cause = %cause, "reloading: reading the configuration and plugin files again");
        let mut new = self.read_again(load).await?;
        let reasons = self.refusals(&new);
        if !reasons.is_empty() {
            let file = new
                .source
                .as_ref()
                .map(|f| f.display().to_string())
                .unwrap_or_default();
            return Err(ReloadRefused::Refused { file, reasons });
        }
        // Within the caller's select! on the shutdown: never cancelled here.
        let running = Some(&self.config);
        let cache = &self.fixed.cache_dir;
        let unpulled = pull::pull_plugins(&mut new, cache, running, &CancellationToken::new()).await;
        if !unpulled.is_empty() {
            return Err(ReloadRefused::Unpulled(unpulled));
        }
        let fresh = self.compile_changed(&new).await?;
        let old = &self.config;
        let lease_changes = old.leases != new.leases;
        let spread_changes =
            old.spread != new.spread || old.membership != new.membership || old.weight != new.weight;
        let schedule_changes = new.plugins.iter().any(|p| {
            self.plugins
                .get(&p.spec.name)
                .is_some_and(|r| *r.schedule.borrow() != p.schedule)
        });
        if fresh.is_empty()
            && !lease_changes
            && !spread_changes
            && !schedule_changes
            && self.plugins.len() == new.plugins.len()
        {
            tracing::info!(cause = %cause, "reload: nothing changed");
            return Ok(Some(new));
        }
        let summary = self.apply(&new, fresh).await;
        tracing::info!(cause = %cause, changes = %summary.join("; "), "reload applied");
        Ok(Some(new))
    }

    /// Reads the configuration again, off the runtime's threads.
    async fn read_again(&self, load: &reload::Loader) -> Result<Config, ReloadRefused> {
        let load = load.clone();
        let mut new = tokio::task::spawn_blocking(move || load())
            .await
            .map_err(ReloadRefused::ReadPanicked)?
            .map_err(ReloadRefused::Unreadable)?;
        if !new.identity_declared && !self.config.identity_declared {
            // Made up at random each time it is read: the running one stays.
            new.identity = self.config.identity.clone();
        }
        Ok(new)
    }

    /// Why `new` cannot be applied now; empty if it can.
    fn refusals(&self, new: &Config) -> Vec<Refusal> {
        let mut why: Vec<Refusal> = reload::needs_restart(&self.config, new, &self.fixed)
            .into_iter()
            .map(Refusal::NeedsRestart)
            .collect();
        // A lease a reload removed is contended for again only once its
        // elector has handed it over and returned.
        for lease in &new.leases {
            if self.runs.get(&lease.name).is_some_and(|r| r.retiring) {
                why.push(Refusal::StillHandedOver(lease.name.clone()));
            }
        }
        let fixed = &self.fixed;
        if let Err(e) =
            crate::config::own_files::check_grants(new, &fixed.cache_dir, fixed.control_socket.as_deref())
        {
            why.push(Refusal::OwnFiles(e));
        }
        why
    }

    /// Compiles every plugin of `new` that is new, changed (file, lease or
    /// settings), before anything changes.
    async fn compile_changed(&self, new: &Config) -> Result<Vec<Fresh>, ReloadRefused> {
        let mut fresh = Vec::new();
        for p in &new.plugins {
            let hash = reload::content_hash(&p.spec.path);
            if let Some(r) = self.plugins.get(&p.spec.name)
                && r.lease == p.lease
                && r.spec == spec_key(p)
                && hash.is_some()
                && r.hash == hash
            {
                continue;
            }
            let (rt, spec) = (self.runtime.clone(), p.spec.clone());
            let started_at = std::time::Instant::now();
            let plugin = tokio::task::spawn_blocking(move || rt.load(&spec))
                .await
                .map_err(|error| ReloadRefused::LoadPanicked {
                    plugin: p.spec.name.clone(),
                    error,
                })?
                .map_err(ReloadRefused::Plugin)?;
            tracing::info!(plugin = %p.spec.name, lease = %p.lease, world = plugin.wit_world(), digest = plugin.digest(), load_ms = crate::support::rounding::ms(started_at.elapsed()), "new plugin version loaded");
            // What was compiled, which may be newer than what was hashed.
            let hash = Some(plugin.content_hash());
            fresh.push((p.clone(), hash, Arc::new(plugin)));
        }
        Ok(fresh)
    }

    /// Applies `new`, whose new and changed plugins are `fresh`. Nothing
    /// here fails. Returns what changed, in words.
    async fn apply(&mut self, new: &Config, fresh: Vec<Fresh>) -> Vec<String> {
        let mut summary = Vec::new();
        let mut handover = BTreeSet::new();
        self.remove_leases(new, &mut summary);
        self.remove_plugins(new, &mut handover, &mut summary);
        self.change_timings(new, &mut summary);
        self.change_placement(new, &mut summary);
        // The weight: the spreader reads it from the handle at once, the
        // other hosts from the next renewal of the membership record.
        if self.launcher.host.modify(|h| h.weight = new.weight) {
            summary.push(format!("weight {}", new.weight));
        }
        self.add_leases(new, &mut summary);
        self.add_plugins(fresh, &mut handover, &mut summary);
        self.reschedule(new, &mut summary);
        self.hand_over(handover);
        // Spreading, for the leases and plugins as they are now: the
        // spreader is replaced if it should do something else.
        let wanted = wanted_spread(new, &self.runs, &self.plugins);
        if let Some(what) = self.launcher.respread(wanted, &self.runs).await {
            summary.push(what.to_owned());
        }
        summary
    }

    /// Leases `new` has not: handed over (drain, release), then no longer
    /// contended for.
    fn remove_leases(&mut self, new: &Config, summary: &mut Vec<String>) {
        for (name, run) in self.runs.iter_mut() {
            if !run.retiring && !new.leases.iter().any(|l| &l.name == name) {
                run.retiring = true;
                self.launcher.removed_lease(name, run);
                if let Some(h) = &self.launcher.health {
                    h.unwatch_lease(name);
                }
                summary.push(format!("lease {name} removed"));
            }
        }
    }

    /// Plugins `new` has not under the same lease (removed, or moved): no
    /// new term of them; a lease that runs one now is handed over so that
    /// it stops.
    fn remove_plugins(&mut self, new: &Config, handover: &mut BTreeSet<String>, summary: &mut Vec<String>) {
        let moved: Vec<String> = self
            .plugins
            .iter()
            .filter(|(name, r)| {
                !new.plugins
                    .iter()
                    .any(|p| &p.spec.name == *name && p.lease == r.lease)
            })
            .map(|(name, _)| name.clone())
            .collect();
        self.removed.retain(|_, gone| !gone.is_cancelled());
        for name in moved {
            let r = self.plugins.remove(&name).expect("present");
            self.removed.insert(name.clone(), r.gone.clone());
            handover.insert(r.lease.clone());
            summary.push(format!("plugin {name} removed from lease {}", r.lease));
        }
    }

    /// New timings: from each lease's next term.
    fn change_timings(&mut self, new: &Config, summary: &mut Vec<String>) {
        for lease in &new.leases {
            if let Some(run) = self.runs.get_mut(&lease.name).filter(|r| !r.retiring)
                && run.timings != lease.timings
            {
                run.timings = lease.timings;
                run.new_timings.send_replace(lease.timings);
                run.handover_bound = run.handover_bound.max(handover_bound(&lease.timings));
                summary.push(format!("lease {}: new timings from its next term", lease.name));
            }
        }
    }

    /// New `prefer` and `avoid` hosts: the spreader spreads the leases
    /// again with them.
    fn change_placement(&mut self, new: &Config, summary: &mut Vec<String>) {
        for lease in &new.leases {
            if let Some(run) = self.runs.get_mut(&lease.name).filter(|r| !r.retiring)
                && run.placement != lease.placement
            {
                run.placement = lease.placement.clone();
                if let Some(changes) = self.launcher.spread.as_ref().and_then(|s| s.changes.as_ref()) {
                    let _ = changes.send(LeaseChange::Add(steered(&lease.name, run)));
                }
                summary.push(format!("lease {}: new prefer and avoid", lease.name));
            }
        }
    }

    /// Leases new in `new`: contended for (deferring at first when the
    /// leads are spread).
    fn add_leases(&mut self, new: &Config, summary: &mut Vec<String>) {
        for lease in &new.leases {
            if !self.runs.contains_key(&lease.name) {
                let run = self.launcher.added_lease(lease, new.spread.as_ref());
                self.runs.insert(lease.name.clone(), run);
                summary.push(format!("lease {} added", lease.name));
            }
        }
    }

    /// New and changed plugins: a changed one runs its new version from its
    /// lease's next term (or at once, handing the lease over, with
    /// `reload = "now"`); a new one (or one moved here) starts once its
    /// old supervisor, if any, has returned.
    fn add_plugins(&mut self, fresh: Vec<Fresh>, handover: &mut BTreeSet<String>, summary: &mut Vec<String>) {
        for (p, hash, plugin) in fresh {
            let name = p.spec.name.clone();
            if let Some(r) = self.plugins.get_mut(&name) {
                r.version.send_replace(plugin);
                r.spec = spec_key(&p);
                r.hash = hash;
                let when = match p.reload {
                    ReloadMode::NextTerm => "from the lease's next term",
                    ReloadMode::Now => {
                        handover.insert(p.lease.clone());
                        "at once (reload = \"now\": the lease is handed over and contended for again)"
                    }
                };
                tracing::info!(plugin = %name, lease = %p.lease, reload = ?p.reload, "plugin changed: its new version runs {when}");
                summary.push(format!("plugin {name} changed"));
                continue;
            }
            let Some(run) = self.runs.get_mut(&p.lease) else {
                continue;
            };
            let after = self.removed.get(&name).filter(|g| !g.is_cancelled()).cloned();
            let supervised = self.launcher.plugin(run, &p, plugin, hash, after);
            self.plugins.insert(name.clone(), supervised);
            summary.push(format!("plugin {name} added to lease {}", p.lease));
        }
    }

    /// Sends each plugin its schedule as `new` configures it: a reload
    /// suspends, resumes or changes a schedule at once.
    fn reschedule(&self, new: &Config, summary: &mut Vec<String>) {
        for p in &new.plugins {
            let Some(run) = self.plugins.get(&p.spec.name) else {
                continue;
            };
            let changed = run.schedule.send_if_modified(|s| {
                let changed = *s != p.schedule;
                *s = p.schedule.clone();
                changed
            });
            if changed {
                let what = p.schedule.as_ref().map_or("none".into(), |s| {
                    format!("{}{}", s.when, if s.suspend { " (suspended)" } else { "" })
                });
                tracing::info!(plugin = %p.spec.name, schedule = %what, "schedule changed");
                summary.push(format!("plugin {} schedule: {what}", p.spec.name));
            }
        }
    }

    /// Hands each lease of `leases` led here over, and contends for it
    /// again: its tasks are told, then drained, and the lease released.
    fn hand_over(&self, leases: BTreeSet<String>) {
        for lease in leases {
            let Some(run) = self.runs.get(&lease).filter(|r| !r.retiring) else {
                continue;
            };
            let Some(term) = run.view.borrow().leading_term().map(|t| t.number()) else {
                continue;
            };
            let until = tokio::time::Instant::now() + run.timings.retry_period;
            let set = run.intent.send_if_modified(|intent| {
                // A draining host hands it over anyway, and takes none.
                if matches!(*intent, Intent::Stop | Intent::Drain) {
                    return false;
                }
                *intent = Intent::StandBy { until };
                true
            });
            if set {
                tracing::info!(
                    lease,
                    term,
                    "reload: handing the lease over (its tasks are told, then drained; the lease released) and contending for it again"
                );
            }
        }
    }
}
