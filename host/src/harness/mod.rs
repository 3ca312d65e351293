//! `baton test`'s harness: one plugin, in this process, run by the real
//! supervisor through scripted terms, so its author can see what it does
//! when its host takes and loses the lead.
//!
//! A [`Harness`] stands in for the elector: it publishes the lease's view
//! (leading in a term, then not) to [`run_leader_tasks`], which runs the
//! plugin exactly as `baton run` does (a fresh instance per term, the
//! change signal, the grace, the forced stop), and records what the
//! supervisor reports ([`Recorder`]). [`scenario`] holds the steps and the
//! verdicts; [`default_scenario`](scenario::default_scenario) is the
//! contract's own.
//!
//! Invariant: a term's view is published only after the previous term's
//! task has ended (returned or stopped), as an elector never starts a
//! term while one of its own is draining.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use crate::election::{LeaseView, Role, Status, Term, TermClock};
use crate::runtime::Plugin;
use crate::supervisor::{TaskEnd, TaskObserver, run_leader_tasks};

pub mod scenario;

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
}

/// The stand-in elector of one plugin's lease.
pub struct Harness {
    lease: String,
    grace: Duration,
    clock: TermClock,
    view: watch::Sender<LeaseView>,
    term: Option<Arc<Term>>,
    number: u64,
    /// What the supervisor reported.
    pub recorder: Arc<Recorder>,
    supervisor: tokio::task::JoinHandle<()>,
}

impl Harness {
    /// `plugin` under `lease`, its terms given `grace` to stop; nobody leads
    /// yet.
    pub fn start(plugin: Arc<Plugin>, lease: &str, grace: Duration) -> Harness {
        let clock = TermClock::system();
        let (view, rx) = watch::channel(LeaseView {
            status: Status::initial(lease),
            term: None,
            since: clock.now(),
            yielded: None,
            holder_address: None,
        });
        let recorder = Arc::new(Recorder::default());
        let observer: Arc<dyn TaskObserver> = recorder.clone();
        let supervisor = tokio::spawn(run_leader_tasks(plugin, rx, observer));
        Harness {
            lease: lease.to_owned(),
            grace,
            clock,
            view,
            term: None,
            number: 0,
            recorder,
            supervisor,
        }
    }

    /// The term this host leads now, if any.
    pub fn term(&self) -> Option<u64> {
        self.term.as_ref().map(|t| t.number())
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
            now + Duration::from_secs(3600),
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
        let now = self.clock.now();
        if let Some(term) = self.term.take() {
            term.end(now);
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

    /// The grace each term gets.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Ends the harness: the supervisor sees the elector gone and returns
    /// once no task runs.
    pub async fn finish(self) {
        let Harness { view, supervisor, .. } = self;
        drop(view);
        let _ = supervisor.await;
    }
}
