//! The leases and plugins `baton run` serves: one elector per lease on the
//! election runtime, one supervisor per plugin, and the spreader, started
//! at start-up and by reloads ([`Launcher`]), with what each needs to be
//! handed over, removed or changed later ([`LeaseRun`], [`PluginRun`]).

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, LeaseConfig, PluginConfig};
use crate::daemon::control::{ControlledLease, SharedLeases};
use crate::election::LeaseClaims;
use crate::election::spread::{LeaseChange, Placement, SpreadConfig, Spreader, SteeredLease, unsteer};
use crate::election::{
    ClaimGate, DRAIN_ALLOWANCE, ElectionObserver, Elector, ElectorConfig, ElectorError, HostHandle, Hosts,
    Intent, LeaseView, TermClock, Timings,
};
use crate::ops::health::Health;
use crate::runtime::Plugin;
use crate::schedule::Schedule;
use crate::store::LeaseStore;
use crate::store::buckets::BucketStore;
use crate::supervisor::time::HostTime;
use crate::supervisor::{Admission, Scheduling, Supervision, TaskObserver, run_leader_tasks_of};
use crate::support::rounding::human;

/// Why an elector failed: it ended without being told to, or did not end
/// in time.
#[derive(Debug, thiserror::Error)]
pub(super) enum ElectorFailure {
    /// It returned its own error.
    #[error("{0}")]
    Error(ElectorError),
    /// It panicked, with this message.
    #[error("it panicked: {0}")]
    Panicked(String),
    /// It returned `Ok` without being told to.
    #[error("it stopped on its own")]
    StoppedOnItsOwn,
    /// At shutdown, it did not hand its lease over within this bound.
    #[error("it did not hand the lease over within {}", human(*.0))]
    NoHandover(Duration),
}

/// An elector's end, as it reports it: its lease, and `Err` if it failed.
pub(super) type ElectorEnd = (String, Result<(), ElectorFailure>);

/// One lease being served.
pub(super) struct LeaseRun {
    pub(super) intent: watch::Sender<Intent>,
    pub(super) view: watch::Receiver<LeaseView>,
    pub(super) supervisors: JoinSet<()>,
    pub(super) timings: Timings,
    /// Where a reload sends new timings (for the next term).
    pub(super) new_timings: watch::Sender<Timings>,
    /// How long its elector may take to hand the lease over at shutdown,
    /// by the longest timings it had: after a reload the current term
    /// keeps the timings it began with, which may be the longer ones.
    pub(super) handover_bound: Duration,
    /// Its elector has returned.
    pub(super) ended: bool,
    /// A reload removed it: its elector hands it over and returns.
    pub(super) retiring: bool,
    /// The plugins this host claims under it (see
    /// [`crate::election::claims`]).
    pub(super) claims: LeaseClaims,
    /// Its `prefer` and `avoid` hosts, as the spreader steers it.
    pub(super) placement: Placement,
}

/// How long an elector with timings `t` may take to hand its lease over
/// (drain, release); see [`DRAIN_ALLOWANCE`]. Only a bug makes one take
/// longer.
pub(super) fn handover_bound(t: &Timings) -> Duration {
    t.grace + t.renew_deadline + DRAIN_ALLOWANCE + t.request_timeout * 2
}

impl LeaseRun {
    /// Its elector failed: says so, and ends its term (the tasks are told,
    /// then stopped by force); the lease is not released.
    pub(super) fn failed(&mut self, lease: &str, failure: &ElectorFailure, clock: &TermClock) {
        self.ended = true;
        let reason = failure.to_string();
        tracing::error!(
            lease,
            reason = reason.as_str(),
            "an elector failed: its lease's tasks are stopped and the lease is not released; baton will exit with status 1"
        );
        let term = self.view.borrow().term.clone();
        if let Some(term) = term {
            term.end(clock.now());
        }
    }

    /// Waits for the lease's supervisors to return (each returns once its
    /// task is gone and the elector is), at most until the current term's
    /// force-stop time plus [`DRAIN_ALLOWANCE`]. `false` if they did not.
    pub(super) async fn wait_for_tasks(&mut self, lease: &str, clock: &TermClock) -> bool {
        let term = self.view.borrow().term.clone();
        let left = term.map_or(self.timings.grace, |t| t.stop_at() - clock.now()) + DRAIN_ALLOWANCE;
        let all = async { while self.supervisors.join_next().await.is_some() {} };
        if tokio::time::timeout(left, all).await.is_err() {
            tracing::error!(
                lease,
                tasks = self.supervisors.len(),
                "leader tasks are not confirmed stopped"
            );
            self.supervisors.abort_all();
            return false;
        }
        true
    }
}

/// The message of a caught panic.
pub(super) fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// What starting a lease or a plugin needs, kept for reloads.
pub(super) struct Launcher {
    pub(super) store: Arc<dyn LeaseStore>,
    pub(super) clock: TermClock,
    pub(super) election: tokio::runtime::Handle,
    pub(super) election_observer: Arc<dyn ElectionObserver>,
    pub(super) task_observer: Arc<dyn TaskObserver>,
    pub(super) health: Option<Arc<Health>>,
    pub(super) identity: String,
    pub(super) ended: mpsc::UnboundedSender<ElectorEnd>,
    /// Where a spreader publishes the live hosts (for guests).
    pub(super) hosts: watch::Sender<Hosts>,
    /// The running spreader, if any.
    pub(super) spread: Option<Spreading>,
    /// Checks, before a plugin's task starts, that no other lease claims
    /// the plugin.
    pub(super) gate: Arc<ClaimGate>,
    /// The store's buckets, where scheduled plugins keep their progress.
    pub(super) buckets: Option<Arc<dyn BucketStore>>,
    /// What this host says of itself in every record it holds.
    pub(super) host: HostHandle,
    /// This host's pod, if a lease asks for a route label.
    pub(super) routing: Option<super::route::Routing>,
}

/// A running spreader (see [`Launcher::respread`]).
pub(super) struct Spreading {
    /// Its settings.
    pub(super) cfg: SpreadConfig,
    /// Where a reload sends the leases it adds and removes, if it steers
    /// the leases (otherwise it only keeps the membership record, for
    /// plugins that count the live hosts).
    pub(super) changes: Option<mpsc::UnboundedSender<LeaseChange>>,
    /// Stops it: it releases the membership record and returns.
    pub(super) stop: CancellationToken,
    pub(super) task: tokio::task::JoinHandle<()>,
}

/// What spreader a host runs: its settings, and whether it steers the
/// leases (spreading on) or only keeps the membership record (for plugins
/// that count the live hosts).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct SpreadPlan {
    /// Its settings.
    pub(super) cfg: SpreadConfig,
    /// Whether it steers the leases.
    pub(super) steers: bool,
}

impl Spreading {
    /// The plan it runs.
    pub(super) fn plan(&self) -> SpreadPlan {
        SpreadPlan {
            cfg: self.cfg,
            steers: self.changes.is_some(),
        }
    }
}

/// The spreader `config` calls for, for the leases of `runs` and the
/// plugins of `plugins`: see [`spread_for`].
pub(super) fn wanted_spread(
    config: &Config,
    runs: &BTreeMap<String, LeaseRun>,
    plugins: &BTreeMap<String, PluginRun>,
) -> Option<SpreadPlan> {
    let serving = runs.values().any(|r| !r.retiring);
    let wants_hosts = plugins.values().any(|p| p.version.borrow().uses_hosts());
    spread_for(config, serving, wants_hosts)
}

/// The spreader `config` calls for, the same rule at start and after every
/// reload: its settings and whether it steers the leases (spreading on:
/// `[spread]`, by default with more than one lease), or, with spreading
/// off, one that only keeps the membership record while a plugin counts
/// the live hosts (`wants_hosts`); none while the host serves no lease
/// (its record would count it among the hosts that share the leads).
pub(super) fn spread_for(config: &Config, serving: bool, wants_hosts: bool) -> Option<SpreadPlan> {
    if !serving {
        return None;
    }
    match config.spread {
        Some(cfg) => Some(SpreadPlan { cfg, steers: true }),
        None => config
            .membership
            .filter(|_| wants_hosts)
            .map(|cfg| SpreadPlan { cfg, steers: false }),
    }
}

impl Launcher {
    /// Starts contending for `lease` (its plugins are added with
    /// [`Launcher::plugin`]), with the intent `initial` if given.
    pub(super) fn lease(&self, lease: &LeaseConfig, initial: Option<Intent>) -> LeaseRun {
        let cfg = ElectorConfig {
            lease: lease.name.clone(),
            identity: self.identity.clone(),
            timings: lease.timings,
            host: self.host.subscribe(),
        };
        // Built inside the election runtime: its subscription's task runs
        // there.
        let (mut elector, view, intent) = {
            let _inside = self.election.enter();
            Elector::new(cfg, self.store.clone(), self.clock.clone())
        };
        if let Some(initial) = initial {
            intent.send_replace(initial);
        }
        // Added while the host drains: it takes it only after `baton resume`.
        if self.host.get().draining {
            intent.send_replace(Intent::Drain);
        }
        elector.set_observer(self.election_observer.clone());
        let claims = LeaseClaims::new();
        elector.set_claims(&claims);
        let (new_timings, timings_rx) = watch::channel(lease.timings);
        elector.set_timings_source(timings_rx);
        if let Some(health) = &self.health {
            health.watch_lease(&lease.name, elector.heartbeat(), view.clone(), self.clock.clone());
        }
        if let Some(routing) = self.routing.as_ref().filter(|_| lease.route_label) {
            let route = routing.route(&lease.name, lease.timings.request_timeout);
            elector.set_before_release(route.clone());
            self.election.spawn(super::route::follow(route, view.clone()));
        }
        let (name, ended_tx) = (lease.name.clone(), self.ended.clone());
        self.election.spawn(async move {
            // Ok: it returned as told; Err: why it failed (its own error or
            // a panic).
            let result = match AssertUnwindSafe(elector.run()).catch_unwind().await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(ElectorFailure::Error(e)),
                Err(panic) => Err(ElectorFailure::Panicked(panic_message(panic))),
            };
            let _ = ended_tx.send((name, result));
        });
        LeaseRun {
            intent,
            view,
            supervisors: JoinSet::new(),
            timings: lease.timings,
            new_timings,
            handover_bound: handover_bound(&lease.timings),
            ended: false,
            retiring: false,
            claims,
            placement: lease.placement.clone(),
        }
    }

    /// Starts contending for `lease`, added by a reload whose
    /// configuration spreads the leads with the settings `spread`: then
    /// deferring at first, and steered from its start by the spreader (it
    /// is told to contend at once if this host prefers the lease). A
    /// spreader that the reload starts takes it in at its start
    /// ([`Launcher::respread`]).
    pub(super) fn added_lease(&self, lease: &LeaseConfig, spread: Option<&SpreadConfig>) -> LeaseRun {
        let initial = spread.map(|s| Intent::Defer {
            head_start: s.head_start,
        });
        let run = self.lease(lease, initial);
        if let Some(changes) = self.spread.as_ref().and_then(|s| s.changes.as_ref()) {
            let _ = changes.send(LeaseChange::Add(steered(&lease.name, &run)));
        }
        run
    }

    /// Starts a spreader running `plan` (steering the leases of `runs` if
    /// it steers).
    pub(super) fn start_spreader(&self, plan: SpreadPlan, runs: &BTreeMap<String, LeaseRun>) -> Spreading {
        let SpreadPlan { cfg, steers } = plan;
        let leases = runs
            .iter()
            .filter(|(_, run)| steers && !run.retiring)
            .map(|(name, run)| steered(name, run))
            .collect();
        let spreader = Spreader::new(
            &self.identity,
            self.store.clone(),
            cfg,
            leases,
            self.hosts.clone(),
        )
        .with_host(self.host.clone());
        // Leases a reload adds or removes, while it steers.
        let (spreader, changes) = if steers {
            let (changes, rx) = mpsc::unbounded_channel();
            (spreader.follow(rx), Some(changes))
        } else {
            (spreader, None)
        };
        let stop = CancellationToken::new();
        let task = self
            .election
            .spawn(spreader.run(self.clock.clone(), stop.clone()));
        Spreading {
            cfg,
            changes,
            stop,
            task,
        }
    }

    /// Makes the running spreader do `wanted` (see [`spread_for`]): at
    /// start, and after every applied reload. If it does something else (or
    /// none runs), it is replaced: the old one is stopped and awaited (its
    /// membership record released), the leases it steered are set back to
    /// [`Intent::Contend`] if the new one does not steer ([`unsteer`]:
    /// never over a stop, or a stand-by whose time is not up), and a new
    /// one is started with the leases of `runs` not being removed. It
    /// steers them from its first listing; until then they go on with the
    /// intents they had. Returns what changed, if anything.
    ///
    /// Between the two, this host's membership record is released and
    /// taken again (a few store writes): another host that lists the
    /// records then sees this host absent, and spreads the leases without
    /// it until its next listing. That is harmless: spreading decides only
    /// who tries first for a lease that is free (released, absent or
    /// expired), never who may take one, so at worst a lease freed in that
    /// moment goes to a host that does not prefer it and is handed over
    /// later; and a lease led here is handed over only after the view of
    /// the live hosts has been steady for the settle time (two retry
    /// periods), longer than the gap.
    pub(super) async fn respread(
        &mut self,
        wanted: Option<SpreadPlan>,
        runs: &BTreeMap<String, LeaseRun>,
    ) -> Option<&'static str> {
        let running = self.spread.as_ref().map(Spreading::plan);
        if running == wanted {
            return None;
        }
        let steered = running.is_some_and(|p| p.steers);
        let steers = wanted.is_some_and(|p| p.steers);
        if let Some(old) = self.spread.take() {
            old.stop.cancel();
            let _ = old.task.await;
        }
        if steered && !steers {
            for run in runs.values().filter(|r| !r.retiring) {
                unsteer(&run.intent);
            }
        }
        if wanted.is_none() {
            // As on a host started without a spreader (no guest asks).
            self.hosts.send_replace(Hosts::default());
        }
        self.spread = wanted.map(|plan| self.start_spreader(plan, runs));
        let what = match (steered, steers, wanted) {
            (false, true, _) => "spreading on",
            (true, true, _) => "spreading: new settings",
            (true, false, _) => "spreading off",
            (false, false, Some(_)) if running.is_some() => "membership record: new settings",
            (false, false, Some(_)) => "membership record kept: a plugin counts the live hosts",
            (false, false, None) => "membership record released: no plugin counts the live hosts",
        };
        match &self.spread {
            Some(s) if s.changes.is_some() => {
                tracing::info!(leases = runs.values().filter(|r| !r.retiring).count(), spreading = %s.cfg, "{what}: the spreader steers the leases from its first listing")
            }
            Some(s) => {
                tracing::info!(spreading = %s.cfg, "{what}: a spreader keeps the membership record, steering no lease")
            }
            None => tracing::info!("{what}: no spreader; every lease is contended for"),
        }
        Some(what)
    }

    /// Stops contending for `lease`, removed by a reload: its elector hands
    /// it over (drain, release) and returns; the spreader no longer steers it.
    pub(super) fn removed_lease(&self, lease: &str, run: &LeaseRun) {
        run.intent.send_replace(Intent::Stop);
        if let Some(changes) = self.spread.as_ref().and_then(|s| s.changes.as_ref()) {
            let _ = changes.send(LeaseChange::Remove(lease.to_owned()));
        }
    }

    /// Runs `plugin` (configured as `p`, its file's content hash `hash`)
    /// in every term of `run`.
    pub(super) fn plugin(
        &self,
        run: &mut LeaseRun,
        p: &PluginConfig,
        plugin: Arc<Plugin>,
        hash: Option<u64>,
        after: Option<CancellationToken>,
    ) -> PluginRun {
        let (version, versions) = watch::channel(plugin);
        let gone = CancellationToken::new();
        let (view, observer, done) = (run.view.clone(), self.task_observer.clone(), gone.clone());
        let intent = run.intent.clone();
        let name = p.spec.name.clone();
        // Claimed from now until no task of it runs here.
        run.claims.add(&name);
        let admission = Admission {
            gate: self.gate.clone(),
            claims: run.claims.clone(),
            poll: run.timings.retry_period / 2,
        };
        let (schedule, scheduled) = watch::channel(p.schedule.clone());
        let (run_now, asked) = mpsc::unbounded_channel();
        let scheduling = self.buckets.clone().map(|store| Scheduling {
            schedule: scheduled,
            store,
            host: self.identity.clone(),
            run_now: Arc::new(tokio::sync::Mutex::new(asked)),
        });
        run.supervisors.spawn(async move {
            let _done = done.drop_guard();
            let claims = admission.claims.clone();
            // A plugin of this name that a reload removed (or moved from
            // another lease) may still run its task in a term that is
            // being handed over: never beside it.
            if let Some(before) = after {
                before.cancelled().await;
            }
            let supervision = Supervision {
                admission: Some(admission),
                scheduling,
                intent: Some(intent),
                time: HostTime::System,
            };
            run_leader_tasks_of(versions, view, observer, supervision).await;
            claims.remove(&name);
        });
        PluginRun {
            lease: p.lease.clone(),
            version,
            spec: spec_key(p),
            hash,
            gone,
            schedule,
            run_now,
        }
    }
}

/// `run`, lease `name`, as a spreader steers it.
pub(super) fn steered(name: &str, run: &LeaseRun) -> SteeredLease {
    SteeredLease {
        name: name.to_owned(),
        intent: run.intent.clone(),
        view: run.view.clone(),
        placement: run.placement.clone(),
    }
}

/// One plugin being served.
pub(super) struct PluginRun {
    pub(super) lease: String,
    /// Its current version; dropped, its supervisor returns once its task
    /// is gone.
    pub(super) version: watch::Sender<Arc<Plugin>>,
    /// Its settings as configured (see [`spec_key`]).
    pub(super) spec: String,
    /// Its file's content hash when loaded.
    pub(super) hash: Option<u64>,
    /// Cancelled once its supervisor has returned: no task of it runs.
    pub(super) gone: CancellationToken,
    /// Its schedule, as configured (a reload sends a new one).
    pub(super) schedule: watch::Sender<Option<Schedule>>,
    /// `baton run-now`: one extra run of a scheduled plugin each.
    pub(super) run_now: mpsc::UnboundedSender<()>,
}

/// A plugin's settings, compared by reloads: every field of its spec.
pub(super) fn spec_key(p: &PluginConfig) -> String {
    format!("{:?}", p.spec)
}

/// The control socket's leases: those of `runs` not being removed.
pub(super) fn sync_controlled(
    controlled: &SharedLeases,
    runs: &BTreeMap<String, LeaseRun>,
    plugins: &BTreeMap<String, PluginRun>,
) {
    let leases = runs
        .iter()
        .filter(|(_, r)| !r.retiring)
        .map(|(name, run)| {
            let lease = ControlledLease {
                intent: run.intent.clone(),
                view: run.view.clone(),
                timings: run.timings,
                handover_bound: run.handover_bound,
                run_now: plugins
                    .iter()
                    .filter(|(_, p)| &p.lease == name && p.schedule.borrow().is_some())
                    .map(|(plugin, p)| (plugin.clone(), p.run_now.clone()))
                    .collect(),
            };
            (name.clone(), lease)
        })
        .collect();
    *controlled.write().unwrap_or_else(|e| e.into_inner()) = leases;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::parse(text, None).unwrap()
    }

    #[test]
    fn the_spreader_wanted_follows_the_configuration_the_leases_and_the_plugins() {
        let none = "identity = \"a\"\n";
        let one = format!("{none}[[lease]]\nname = \"x\"\n");
        let two = format!("{one}[[lease]]\nname = \"y\"\n");
        let off = format!("{two}[spread]\nenabled = false\n");
        let on = format!("{one}[spread]\nenabled = true\nsettle = \"9s\"\n");
        let steers =
            |text: &str, serving, wants_hosts| spread_for(&cfg(text), serving, wants_hosts).map(|p| p.steers);
        // Spreading on (more than one lease, or enabled): it steers.
        assert_eq!(steers(&two, true, false), Some(true));
        assert_eq!(steers(&two, true, true), Some(true));
        let plan = spread_for(&cfg(&on), true, false).unwrap();
        assert_eq!(plan.cfg.settle, Duration::from_secs(9));
        // Off (one lease, or disabled): a record only for a plugin that
        // counts the live hosts, with the same settings, steering nothing.
        assert_eq!(steers(&one, true, false), None);
        assert_eq!(steers(&off, true, false), None);
        assert_eq!(steers(&one, true, true), Some(false));
        assert_eq!(
            spread_for(&cfg(&off), true, true),
            cfg(&two).spread.map(|cfg| SpreadPlan { cfg, steers: false })
        );
        // No lease served (none configured, or all being removed): none.
        assert_eq!(steers(none, false, true), None);
        assert_eq!(steers(&two, false, false), None);
    }
}
