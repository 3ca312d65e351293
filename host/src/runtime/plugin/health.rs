//! A plugin's health check (`baton:leader@0.4.0`'s `health-sync` and
//! `health-async`), called in an instance of its own, beside the task's:
//! a task of the pollable world is inside its `run` and cannot be entered
//! again, so both worlds are checked alike.
//!
//! Invariants: the instance is made for one term, with the plugin's grants
//! and the term's fence and epoch check (as the task's: nothing it does
//! acts after the term's force-stop time), no sooner than it is asked for,
//! and is made again after a trap or a timeout (its state is then
//! unknown); no check is called once the term is over.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use wasmtime::Store;

use super::component::HealthPre;
use super::task::Plugin;
use crate::election::{LeaseView, Term};
use crate::runtime::TaskOutcome;
use crate::runtime::bindings::v0_4::{future_health, pollable_health};
use crate::runtime::engine::EpochTicking;
use crate::runtime::guest::GuestState;
use crate::runtime::trap::Trap;

/// How one call of the health check ended.
#[derive(Debug)]
pub enum CheckOutcome {
    /// It returned `ok`.
    Healthy,
    /// It returned `error`, with this message.
    Unhealthy(String),
    /// It trapped, or its instance could not be made.
    Trapped(Trap),
    /// It did not return within the timeout.
    TimedOut(Duration),
}

impl CheckOutcome {
    /// Its name in metrics: `ok`, `failed`, `trapped` or `timed-out`.
    pub fn as_str(&self) -> &'static str {
        match self {
            CheckOutcome::Healthy => "ok",
            CheckOutcome::Unhealthy(_) => "failed",
            CheckOutcome::Trapped(_) => "trapped",
            CheckOutcome::TimedOut(_) => "timed-out",
        }
    }

    /// Whether it was a success.
    pub fn is_healthy(&self) -> bool {
        matches!(self, CheckOutcome::Healthy)
    }
}

impl std::fmt::Display for CheckOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckOutcome::Healthy => f.write_str("healthy"),
            CheckOutcome::Unhealthy(e) => write!(f, "unhealthy: {e}"),
            CheckOutcome::Trapped(t) => write!(f, "trapped: {t}"),
            CheckOutcome::TimedOut(d) => {
                write!(f, "timed out after {}", crate::support::rounding::human(*d))
            }
        }
    }
}

/// The instance of one world with a health check.
enum Instance {
    Future(future_health::FuturePluginWithHealth),
    Pollable(pollable_health::PollablePluginWithHealth),
}

/// An instance made for checking, with its Store.
struct Checking {
    // Declared before the ticking guard, so dropped before it.
    store: Store<GuestState>,
    instance: Instance,
    _ticking: EpochTicking,
}

/// Calls one plugin's health check in one term.
pub struct HealthChecker<'a> {
    plugin: &'a Plugin,
    pre: &'a HealthPre,
    term: Arc<Term>,
    view: watch::Receiver<LeaseView>,
    instance: Option<Checking>,
}

impl Plugin {
    /// A checker of this plugin's health in `term`; none if its component
    /// exports no health check. No instance is made until the first check.
    pub fn health_checker(
        &self,
        term: Arc<Term>,
        view: watch::Receiver<LeaseView>,
    ) -> Option<HealthChecker<'_>> {
        Some(HealthChecker {
            plugin: self,
            pre: self.health.as_ref()?,
            term,
            view,
            instance: None,
        })
    }
}

impl HealthChecker<'_> {
    /// Calls the check once, within `timeout`, making the instance first
    /// if there is none. After a trap or a timeout the instance is dropped,
    /// and the next check makes a new one (the time to make it counts
    /// towards that check's timeout). Call it only while the term lasts;
    /// dropping the returned future drops the instance.
    pub async fn check(&mut self, timeout: Duration) -> CheckOutcome {
        let outcome = match tokio::time::timeout(timeout, self.call()).await {
            Ok(Ok(Ok(()))) => return CheckOutcome::Healthy,
            Ok(Ok(Err(message))) => return CheckOutcome::Unhealthy(message),
            Ok(Err(e)) => e,
            Err(_) => {
                self.instance = None;
                return CheckOutcome::TimedOut(timeout);
            }
        };
        let trap = match outcome {
            Failure::Setup(reason) => Trap::setup(reason),
            Failure::Guest(error) => {
                let Some(mut checking) = self.instance.take() else {
                    return CheckOutcome::Trapped(Trap::setup(error.to_string()));
                };
                match self.plugin.trapped(&mut checking.store, &self.term, error) {
                    TaskOutcome::Trapped(trap) => trap,
                    other => Trap::setup(other.to_string()),
                }
            }
        };
        self.instance = None;
        CheckOutcome::Trapped(trap)
    }

    /// Makes the instance if there is none, and calls `check` in it.
    async fn call(&mut self) -> Result<Result<(), String>, Failure> {
        if self.instance.is_none() {
            self.instance = Some(instantiate(self.plugin, self.pre, &self.term, &self.view).await?);
        }
        let Some(Checking { store, instance, .. }) = self.instance.as_mut() else {
            unreachable!("made above");
        };
        let returned = match instance {
            Instance::Future(i) => {
                let health = i.baton_leader_health_async();
                store
                    .run_concurrent(async |a| health.call_check(a).await)
                    .await
                    .and_then(|r| r)
            }
            Instance::Pollable(i) => i.baton_leader_health_sync().call_check(&mut *store).await,
        };
        returned.map_err(Failure::Guest)
    }
}

/// A Store with `plugin`'s grants and the fence of `term`, and the
/// component instantiated in it.
async fn instantiate(
    plugin: &Plugin,
    pre: &HealthPre,
    term: &Arc<Term>,
    view: &watch::Receiver<LeaseView>,
) -> Result<Checking, Failure> {
    let ticking = plugin.engine.ticking();
    let setup = |e: &dyn std::fmt::Display| Failure::Setup(e.to_string());
    let mut store = plugin
        .store_for(term.clone(), view.clone())
        .map_err(|e| setup(&e))?;
    plugin.claim_buckets(term, view).await.map_err(|e| setup(&e))?;
    let instance = match pre {
        HealthPre::Future(pre) => {
            Instance::Future(pre.instantiate_async(&mut store).await.map_err(Failure::Guest)?)
        }
        HealthPre::Pollable(pre) => {
            Instance::Pollable(pre.instantiate_async(&mut store).await.map_err(Failure::Guest)?)
        }
    };
    Ok(Checking {
        store,
        instance,
        _ticking: ticking,
    })
}

/// Why a check did not return.
enum Failure {
    /// Its Store could not be made (a missing directory, a bucket claim).
    Setup(String),
    /// The guest trapped, or could not be instantiated.
    Guest(wasmtime::Error),
}
