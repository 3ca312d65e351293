//! Health: what `/healthz` (liveness) and `/readyz` (readiness) answer on
//! the admin address (see [`admin`](crate::ops::admin)).
//!
//! **Liveness** fails (the host should be restarted) only for what a
//! restart cures, never for an unreachable store: restarting every host
//! while the API server is away would only add restarts to the outage, and
//! a host that cannot reach its store stops leading by itself at its renew
//! deadline. It fails when
//!
//! - a tokio runtime is stalled: each runtime this host depends on (the
//!   guests' and the election's) runs a watchdog task that must be fed
//!   every [`WATCHDOG_PERIOD`]; a runtime whose workers are blocked cannot
//!   run it, and one not fed for [`RUNTIME_STALL_AFTER`] is stalled;
//! - an elector is stuck: it began its current step longer ago than any
//!   step lasts when nothing is wrong
//!   ([`Heartbeat::longest_step`](crate::election::Heartbeat));
//! - a leader's renewals are overdue: it still says it leads a term whose
//!   renew deadline passed more than [`RENEWAL_OVERDUE_AFTER`] ago, without
//!   stepping down (client-go's `HealthzAdaptor`: a leader that failed to
//!   renew and did not give up). Its tasks are stopped regardless (the
//!   term's deadline does not wait for the elector); the host is not well.
//!
//! The checks read atomics and locks that the watched runtimes hold for
//! nanoseconds, and are answered from the admin thread, which is none of
//! the watched runtimes.
//!
//! **Readiness** succeeds once the configuration is loaded (always, by the
//! time anything is served), every plugin has been compiled or refused
//! (refusals are listed), and the store has answered every lease's elector
//! at least once. It stays ready after that.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::election::{Heartbeat, LeaseView, TermClock};

/// How often a runtime's watchdog task is fed.
pub const WATCHDOG_PERIOD: Duration = Duration::from_millis(250);

/// A runtime whose watchdog was not fed for this long is stalled.
pub const RUNTIME_STALL_AFTER: Duration = Duration::from_secs(5);

/// A leader whose term's renew deadline passed this long ago without its
/// elector stepping down is overdue (its elector steps down the moment the
/// deadline passes, when it runs).
pub const RENEWAL_OVERDUE_AFTER: Duration = Duration::from_secs(2);

/// One answer of a health endpoint: whether it passes, and its body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the check passes (200; 503 if not).
    pub ok: bool,
    /// The body: `ok`, or each reason on a line of its own.
    pub body: String,
}

/// A runtime's watchdog: when it was last fed.
#[derive(Debug)]
struct Watchdog {
    runtime: &'static str,
    /// Nanoseconds after [`Health::origin`].
    fed: Arc<AtomicU64>,
}

/// An elector being watched.
struct WatchedLease {
    lease: String,
    heartbeat: Arc<Heartbeat>,
    view: watch::Receiver<LeaseView>,
    clock: TermClock,
}

#[derive(Default)]
struct Readiness {
    /// `Some` once every plugin was compiled or refused: the refusals,
    /// `plugin: reason`.
    plugins: Option<Vec<String>>,
    /// Plugins configured.
    configured: usize,
}

/// The health of one `baton run`; see the [module documentation](self).
pub struct Health {
    origin: Instant,
    watchdogs: Mutex<Vec<Watchdog>>,
    leases: Mutex<Vec<WatchedLease>>,
    readiness: Mutex<Readiness>,
}

impl Default for Health {
    fn default() -> Self {
        Health::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl Health {
    /// Nothing watched yet: live, and not ready.
    pub fn new() -> Health {
        Health {
            origin: Instant::now(),
            watchdogs: Mutex::new(Vec::new()),
            leases: Mutex::new(Vec::new()),
            readiness: Mutex::new(Readiness::default()),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Starts a watchdog task on `runtime`, named `name` in reasons. The
    /// task runs until the runtime shuts down.
    pub fn watch_runtime(self: &Arc<Self>, name: &'static str, runtime: &tokio::runtime::Handle) {
        let fed = Arc::new(AtomicU64::new(self.now()));
        lock(&self.watchdogs).push(Watchdog {
            runtime: name,
            fed: fed.clone(),
        });
        let origin = self.origin;
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(WATCHDOG_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                fed.store(origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        });
    }

    /// Watches the elector of `lease`: its heartbeat, and what it publishes.
    pub fn watch_lease(
        &self,
        lease: &str,
        heartbeat: Arc<Heartbeat>,
        view: watch::Receiver<LeaseView>,
        clock: TermClock,
    ) {
        lock(&self.leases).push(WatchedLease {
            lease: lease.to_owned(),
            heartbeat,
            view,
            clock,
        });
    }

    /// Each watched lease with what its elector last published, for
    /// `/leases` ([`crate::ops::leases`]).
    pub fn views(&self) -> Vec<(String, LeaseView)> {
        lock(&self.leases)
            .iter()
            .map(|l| (l.lease.clone(), l.view.borrow().clone()))
            .collect()
    }

    /// Stops watching `lease` (a reload removed it).
    pub fn unwatch_lease(&self, lease: &str) {
        lock(&self.leases).retain(|l| l.lease != lease);
    }

    /// `configured` plugins are being loaded.
    pub fn loading(&self, configured: usize) {
        lock(&self.readiness).configured = configured;
    }

    /// Every plugin was compiled or refused; `refused` names the refused
    /// ones with the reason (`plugin: reason`).
    pub fn loaded(&self, refused: Vec<String>) {
        lock(&self.readiness).plugins = Some(refused);
    }

    /// The liveness answer; see the [module documentation](self).
    pub fn live(&self) -> Verdict {
        let mut reasons = Vec::new();
        let now = self.now();
        for w in lock(&self.watchdogs).iter() {
            let since = Duration::from_nanos(now.saturating_sub(w.fed.load(Ordering::Relaxed)));
            if since > RUNTIME_STALL_AFTER {
                reasons.push(format!(
                    "the {} runtime is stalled: its watchdog task was last fed {} ago (limit {}; it is fed every {} ms)",
                    w.runtime,
                    secs(since),
                    secs(RUNTIME_STALL_AFTER),
                    WATCHDOG_PERIOD.as_millis()
                ));
            }
        }
        for l in lock(&self.leases).iter() {
            let step = tokio::time::Instant::now().saturating_duration_since(l.heartbeat.last_step());
            if step > l.heartbeat.longest_step() {
                reasons.push(format!(
                    "lease {:?}: its elector is stuck: its current step began {} ago (no step lasts longer than {} when nothing is wrong)",
                    l.lease,
                    secs(step),
                    secs(l.heartbeat.longest_step())
                ));
            }
            let view = l.view.borrow();
            if let (true, Some(term)) = (view.status.is_leading(), &view.term) {
                let now = l.clock.now();
                let past = now.since(term.lead_until());
                if past > RENEWAL_OVERDUE_AFTER {
                    reasons.push(format!(
                        "lease {:?}: this host still leads term {} but its renewals are overdue: the renew deadline passed {} ago and it has not stepped down",
                        l.lease,
                        term.number(),
                        secs(past)
                    ));
                }
            }
        }
        if reasons.is_empty() {
            Verdict {
                ok: true,
                body: "ok\n".into(),
            }
        } else {
            Verdict {
                ok: false,
                body: format!("unhealthy:\n{}\n", reasons.join("\n")),
            }
        }
    }

    /// The readiness answer; see the [module documentation](self).
    pub fn ready(&self) -> Verdict {
        let readiness = lock(&self.readiness);
        let Some(refused) = &readiness.plugins else {
            return Verdict {
                ok: false,
                body: format!(
                    "not ready: compiling the {} configured plugins\n",
                    readiness.configured
                ),
            };
        };
        let refusals = if refused.is_empty() {
            String::new()
        } else {
            format!(
                "refused plugins ({} of {}):\n{}\n",
                refused.len(),
                readiness.configured,
                refused.join("\n")
            )
        };
        let waiting: Vec<String> = lock(&self.leases)
            .iter()
            .filter(|l| !l.heartbeat.answered())
            .map(|l| format!("{:?}", l.lease))
            .collect();
        if !waiting.is_empty() {
            return Verdict {
                ok: false,
                body: format!(
                    "not ready: the store has not answered yet for lease(s) {}\n{refusals}",
                    waiting.join(", ")
                ),
            };
        }
        Verdict {
            ok: true,
            body: format!("ready\n{refusals}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_waits_for_the_plugins_and_lists_refusals() {
        let h = Health::new();
        h.loading(3);
        let v = h.ready();
        assert!(
            !v.ok && v.body.contains("compiling the 3 configured plugins"),
            "{v:?}"
        );
        h.loaded(vec!["bad: not a WebAssembly file".into()]);
        let v = h.ready();
        assert!(v.ok, "{v:?}");
        assert!(
            v.body
                .contains("refused plugins (1 of 3):\nbad: not a WebAssembly file"),
            "{v:?}"
        );
        assert!(h.live().ok);
    }

    #[test]
    fn a_runtime_that_stops_feeding_its_watchdog_is_stalled() {
        let h = Arc::new(Health::new());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        h.watch_runtime("test", rt.handle());
        // Fed while the runtime runs.
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(300)).await });
        assert!(h.live().ok);
        // A watchdog last fed longer ago than the limit.
        let h = Health {
            origin: Instant::now() - RUNTIME_STALL_AFTER - Duration::from_secs(1),
            ..Health::new()
        };
        lock(&h.watchdogs).push(Watchdog {
            runtime: "blocked",
            fed: Arc::new(AtomicU64::new(0)),
        });
        let v = h.live();
        assert!(!v.ok, "{v:?}");
        assert!(v.body.contains("the blocked runtime is stalled"), "{v:?}");
    }

    #[test]
    fn a_leader_past_its_renew_deadline_and_a_stuck_elector_fail_liveness() {
        use crate::election::{Role, Status, Term};
        let clock = TermClock::system();
        let now = clock.now();
        let status = Status {
            role: Role::Leading,
            holder: Some("me".into()),
            lease: "demo".into(),
            term: 7,
        };
        let term = Term::begin("demo", 7, Duration::from_millis(500), clock.clone(), now);
        let (_tx, view) = watch::channel(LeaseView {
            status: status.clone(),
            term: Some(term),
            since: now,
            yielded: None,
            holder_address: None,
        });
        let h = Health::new();
        h.watch_lease(
            "demo",
            Arc::new(Heartbeat::new(Duration::from_secs(60))),
            view,
            clock.clone(),
        );
        // Its renew deadline is now: not overdue yet.
        assert!(h.live().ok, "{:?}", h.live());
        // One that passed long ago, and an elector whose step outlasts its bound.
        let old = Term::begin(
            "demo",
            7,
            Duration::from_millis(500),
            clock.clone(),
            now - Duration::from_secs(3),
        );
        let (_tx2, view) = watch::channel(LeaseView {
            status,
            term: Some(old),
            since: now,
            yielded: None,
            holder_address: None,
        });
        let stuck = Arc::new(Heartbeat::new(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(5));
        h.watch_lease("other", stuck, view, clock);
        let v = h.live();
        assert!(!v.ok, "{v:?}");
        assert!(v.body.contains("lease \"other\": its elector is stuck"), "{v:?}");
        assert!(
            v.body
                .contains("lease \"other\": this host still leads term 7 but its renewals are overdue"),
            "{v:?}"
        );
        assert!(!v.body.contains("lease \"demo\""), "{v:?}");
        // Readiness: the store answered neither.
        h.loaded(Vec::new());
        let r = h.ready();
        assert!(!r.ok && r.body.contains("\"demo\", \"other\""), "{r:?}");
    }
}
