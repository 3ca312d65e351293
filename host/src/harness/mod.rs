//! `baton test`'s harness: one plugin, in this process, run by the real
//! supervisor through scripted terms, so its author can see what it does
//! when its host takes and loses the lead.
//!
//! A [`Harness`] stands in for the elector: it publishes the lease's view
//! (leading in a term, then not) to [`run_leader_tasks`], which runs the
//! plugin exactly as `baton run` does (a fresh instance per term, the
//! change signal, the grace, the forced stop), and records what the
//! supervisor reports ([`Recorder`]); what the plugin did is in
//! [`record`]. A scheduled plugin runs by a [`VirtualTime`] that the
//! scenario moves on. [`scenario`] holds the contract's own scenario,
//! [`script`] reads a scenario file and [`steps`] runs it, with a
//! [`Verdict`](scenario::Verdict) per step and expectation.
//!
//! Invariant: a term's view is published only after the previous term's
//! task has ended (returned or stopped), as an elector never starts a
//! term while one of its own is draining.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{Notify, mpsc, watch};

use crate::election::{LeaseView, Role, Status, Term, TermClock};
use crate::runtime::Plugin;
use crate::schedule::{Schedule, ScheduledRun};
use crate::store::buckets::BucketStore;
use crate::supervisor::time::{HostTime, VirtualTime};
use crate::supervisor::{Scheduling, Supervision, TaskEnd, TaskObserver, run_leader_tasks_of};

pub mod expect;
pub mod record;
pub mod scenario;
pub mod script;
pub mod steps;
pub mod verdict;

/// What the supervisor reported, in order, with when.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// An instance started.
    Started,
    /// A run ended so.
    Ended(TaskEnd),
    /// A run was gone `after` its term ended: by itself, or stopped by the
    /// host (`forced`).
    Stopped {
        /// Stopped by the host at the force-stop time.
        forced: bool,
        /// How long after the end of its term.
        after: Duration,
    },
    /// A scheduled run ended, its end recorded.
    Ran {
        /// Its due time (when it was asked, for `run-now`).
        due: SystemTime,
        /// Whether `baton run-now` asked for it.
        on_demand: bool,
        /// `ok`, `failed`, `trapped`.
        outcome: &'static str,
    },
}

/// The supervisor's reports, kept.
#[derive(Default)]
pub struct Recorder {
    events: Mutex<Vec<(Instant, Event)>>,
    news: Notify,
}

impl Recorder {
    fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Instant::now(), event));
        self.news.notify_waiters();
    }

    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.iter().map(|(_, e)| e.clone()).collect()
    }

    /// When the `index`th event came.
    pub fn time_of(&self, index: usize) -> Option<Instant> {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.get(index).map(|(at, _)| *at)
    }

    /// Waits up to `limit` for an event after the first `seen` that
    /// `wanted` accepts; returns it with its index.
    pub async fn wait_for(
        &self,
        seen: usize,
        limit: Duration,
        wanted: impl Fn(&Event) -> bool,
    ) -> Option<(usize, Event)> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let news = self.news.notified();
            let found = self
                .events()
                .into_iter()
                .enumerate()
                .skip(seen)
                .find(|(_, e)| wanted(e));
            if found.is_some() {
                return found;
            }
            if tokio::time::timeout_at(deadline, news).await.is_err() {
                return None;
            }
        }
    }
}

impl TaskObserver for Recorder {
    fn started(&self, _: &str) {
        self.push(Event::Started);
    }

    fn ended(&self, _: &str, end: TaskEnd) {
        self.push(Event::Ended(end));
    }

    fn stopped(&self, _: &str, forced: bool, after: Duration) {
        self.push(Event::Stopped { forced, after });
    }

    fn scheduled_run(&self, _: &str, run: &ScheduledRun, outcome: &'static str, _: Duration) {
        self.push(Event::Ran {
            due: run.due,
            on_demand: run.on_demand,
            outcome,
        });
    }
}

/// What the harness runs a plugin with.
pub struct Setup {
    /// The plugin, loaded with the harness's grants.
    pub plugin: Arc<Plugin>,
    /// Its lease's name.
    pub lease: String,
    /// The grace each term gets.
    pub grace: Duration,
    /// How long the lease lasts unrenewed: how long after a crash another
    /// host may lead.
    pub lease_duration: Duration,
    /// Its schedule, if it runs on one.
    pub schedule: Option<Schedule>,
    /// Where its buckets (and a schedule's progress) are.
    pub buckets: Arc<dyn BucketStore>,
    /// The time its schedule runs by.
    pub time: HostTime,
}

/// The stand-in elector of one plugin's lease.
pub struct Harness {
    lease: String,
    grace: Duration,
    lease_duration: Duration,
    clock: TermClock,
    view: watch::Sender<LeaseView>,
    term: Option<Arc<Term>>,
    number: u64,
    /// What the supervisor reported.
    pub recorder: Arc<Recorder>,
    supervisor: tokio::task::JoinHandle<()>,
    plugin: Arc<Plugin>,
    run_now: Option<mpsc::UnboundedSender<()>>,
    _schedule: Option<watch::Sender<Option<Schedule>>>,
    /// The time the schedule runs by.
    pub time: HostTime,
    /// Each term that ended, with when its change fired.
    pub ended: Vec<(u64, Instant)>,
}

impl Harness {
    /// `setup`'s plugin under its lease; nobody leads yet.
    pub fn start(setup: Setup) -> Harness {
        let Setup {
            plugin,
            lease,
            grace,
            lease_duration,
            schedule,
            buckets,
            time,
        } = setup;
        let clock = TermClock::system();
        let (view, rx) = watch::channel(LeaseView {
            status: Status::initial(&lease),
            term: None,
            since: clock.now(),
            yielded: None,
            holder_address: None,
        });
        let recorder = Arc::new(Recorder::default());
        let observer: Arc<dyn TaskObserver> = recorder.clone();
        let (mut run_now, mut schedule_tx, mut scheduling) = (None, None, None);
        if schedule.is_some() {
            let (tx, asked) = mpsc::unbounded_channel();
            let (sender, receiver) = watch::channel(schedule);
            scheduling = Some(Scheduling {
                schedule: receiver,
                store: buckets,
                host: "baton-test".into(),
                run_now: Arc::new(tokio::sync::Mutex::new(asked)),
            });
            (run_now, schedule_tx) = (Some(tx), Some(sender));
        }
        let (_keep, versions) = watch::channel(plugin.clone());
        // No intent: a failing health check hands nothing over here (a
        // `health` step calls the check itself).
        let supervision = Supervision {
            scheduling,
            time: time.clone(),
            ..Supervision::default()
        };
        let supervisor = tokio::spawn(async move {
            let _keep = _keep;
            run_leader_tasks_of(versions, rx, observer, supervision).await
        });
        Harness {
            lease,
            grace,
            lease_duration,
            clock,
            view,
            term: None,
            number: 0,
            recorder,
            supervisor,
            plugin,
            run_now,
            _schedule: schedule_tx,
            time,
            ended: Vec::new(),
        }
    }

    /// The term this host leads now, if any.
    pub fn term(&self) -> Option<u64> {
        self.term.as_ref().map(|t| t.number())
    }

    /// The newest term's number (0 before the first).
    pub fn newest(&self) -> u64 {
        self.number
    }

    /// The plugin.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// Whether the plugin runs on a schedule.
    pub fn scheduled(&self) -> bool {
        self.run_now.is_some()
    }

    /// The virtual time, if the schedule runs by one.
    pub fn virtual_time(&self) -> Option<&Arc<VirtualTime>> {
        match &self.time {
            HostTime::Virtual(v) => Some(v),
            HostTime::System => None,
        }
    }

    /// This host leads in a new term, numbered above every earlier one.
    pub fn lead(&mut self) -> u64 {
        self.number += 1;
        let now = self.clock.now();
        let term = Term::begin(
            &self.lease,
            self.number,
            self.grace,
            self.clock.clone(),
            now + Duration::from_secs(365 * 24 * 3600),
        );
        self.view.send_replace(LeaseView {
            status: Status {
                role: Role::Leading,
                holder: Some("baton-test".into()),
                lease: self.lease.clone(),
                term: self.number,
            },
            term: Some(term.clone()),
            since: now,
            yielded: None,
            holder_address: None,
        });
        self.term = Some(term);
        self.number
    }

    /// This host loses the lead: the term ends now (the change fires), its
    /// task has the grace to return, then is stopped by force.
    pub fn lose(&mut self) {
        self.end(false);
    }

    /// The host stops at once (a crash, or a pause past its lease): the
    /// term ends with no grace, its task is stopped by force now.
    pub fn stop_at_once(&mut self) {
        self.end(true);
    }

    fn end(&mut self, at_once: bool) {
        let now = self.clock.now();
        if let Some(term) = self.term.take() {
            if at_once {
                term.end_without_grace(now);
            } else {
                term.end(now);
            }
            self.ended.push((term.number(), Instant::now()));
        }
        self.view.send_replace(LeaseView {
            status: Status {
                role: Role::Following,
                holder: Some("another-host".into()),
                lease: self.lease.clone(),
                term: self.number,
            },
            term: None,
            since: now,
            yielded: None,
            holder_address: None,
        });
    }

    /// The view of the lease, as the plugin's tasks get it.
    pub fn view(&self) -> watch::Receiver<LeaseView> {
        self.view.subscribe()
    }

    /// The term leading now, if any.
    pub fn leading(&self) -> Option<&Arc<Term>> {
        self.term.as_ref()
    }

    /// `baton run-now`; `false` if the plugin has no schedule.
    pub fn run_now(&self) -> bool {
        self.run_now.as_ref().is_some_and(|tx| tx.send(()).is_ok())
    }

    /// The grace each term gets.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// How long the lease lasts unrenewed.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// The lease's name.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// Ends the harness: the lead lost if held, then the supervisor sees
    /// the elector gone and returns once no task runs.
    pub async fn finish(mut self) {
        if self.term.is_some() {
            self.lose();
        }
        let Harness { view, supervisor, .. } = self;
        drop(view);
        let _ = supervisor.await;
    }
}
