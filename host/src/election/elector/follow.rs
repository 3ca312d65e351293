//! Following: waiting for the lease to be free, and taking it.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rand::Rng;
use tokio::time::{Instant, sleep_until, timeout};

use super::decide::{Decision, contend_after, follower_decision};
use super::{Elector, ElectorError, Following, Lead, State, cadence, longest_step, timings_changed};
use crate::election::clock::Moment;
use crate::election::report::StoreErrorKind;
use crate::election::status::{Role, Status};
use crate::election::term::Term;
use crate::store::{LeaseRecord, StoreError, Versioned};
use crate::support::rounding::human;

impl Elector {
    /// Following: wait for the lease to be free, then try to take it.
    pub(super) async fn follow(&mut self, f: Following) -> State {
        self.take_sighting();
        self.take_new_timings();
        if self.failure.is_some() {
            return State::Stopped;
        }
        let now = Instant::now();
        let retry_period = self.cfg.timings.retry_period;
        let Some(not_before) = contend_after(
            self.intent(),
            self.known.as_ref(),
            &self.me,
            f.not_before,
            retry_period,
        ) else {
            return State::Stopped;
        };
        let wake = match &self.known {
            // Nothing is known yet: the subscription reads or watches.
            None => None,
            Some(known) => match follower_decision(known, &self.me, now) {
                Decision::Acquire if now >= not_before => {
                    if let Some(earlier) = self.undrained() {
                        return self.await_drained(earlier, f).await;
                    }
                    return self.try_acquire().await;
                }
                Decision::Acquire => Some(not_before),
                Decision::WaitUntil(t) => Some(t.max(not_before)),
            },
        };
        // At least once a lease duration, even with nothing to wait for:
        // the heartbeat shows a follower alive (nothing else changes).
        let longest = now + self.cfg.timings.lease_duration;
        let timer = sleep_until(wake.map_or(longest, |t| t.min(longest)));
        tokio::select! {
            alive = self.subscription.changed() => {
                if !alive {
                    return self.subscription_ended();
                }
            }
            changed = self.intent.changed() => {
                if changed.is_err() {
                    return State::Stopped;
                }
            }
            // Taken at the top of the next step.
            _ = timings_changed(&mut self.timings) => {}
            _ = timer => {}
        }
        State::Following(f)
    }

    /// Takes new timings (a reload), which apply from the next term.
    /// Compared, not asked whether changed: waiting for a change (in
    /// [`Elector::follow`]) marks it seen.
    pub(super) fn take_new_timings(&mut self) {
        let Some(t) = self.timings.as_mut() else {
            return;
        };
        let timings = *t.borrow_and_update();
        if timings != self.cfg.timings {
            tracing::info!(lease = %self.cfg.lease, timings = %timings, "new timings apply from the next term");
            self.cfg.timings = timings;
            self.heartbeat.set_longest_step(longest_step(&timings));
            self.subscription.set_cadence(cadence(&timings));
        }
    }

    /// An earlier term of this host whose tasks may still run.
    pub(super) fn undrained(&mut self) -> Option<Arc<Term>> {
        self.draining.retain(|t| !(t.is_over() && t.tasks() == 0));
        self.draining.first().cloned()
    }

    /// Waits until the tasks of an earlier term are gone before contending:
    /// a term of this host starts no task while one of an earlier term runs,
    /// just as no other host may lead before that term's force-stop time.
    /// So no task of an older term ever runs beside one of a newer term,
    /// and records tagged with terms never go back. The wait ends at the
    /// earlier term's force-stop time at the latest, when the supervisor
    /// drops its tasks.
    pub(super) async fn await_drained(&mut self, earlier: Arc<Term>, f: Following) -> State {
        tracing::debug!(lease = %self.cfg.lease, term = earlier.number(), "waiting for the tasks of an earlier term to stop before taking the lease again");
        tokio::select! {
            _ = earlier.drained() => {}
            changed = self.intent.changed() => {
                if changed.is_err() {
                    return State::Stopped;
                }
            }
        }
        State::Following(f)
    }

    /// The subscription's task ended (it panicked): without news of the
    /// lease the elector cannot go on. It stops; the host notices, ends the
    /// term if there is one, and exits without releasing.
    pub(super) fn subscription_ended(&mut self) -> State {
        tracing::error!(lease = %self.cfg.lease, "the lease's subscription ended unexpectedly; the elector stops");
        self.failure.get_or_insert(ElectorError::SubscriptionEnded {
            lease: self.cfg.lease.clone(),
        });
        State::Stopped
    }

    pub(super) fn jittered_retry(&self) -> Duration {
        self.cfg
            .timings
            .retry_period
            .mul_f64(rand::rng().random_range(1.0..1.5))
    }

    pub(super) fn backoff(&self) -> State {
        State::Following(Following {
            not_before: Instant::now() + self.jittered_retry(),
        })
    }

    /// Tries to take the lease in the term after the highest one known:
    /// the term begins if the write is confirmed.
    pub(super) async fn try_acquire(&mut self) -> State {
        let t = self.cfg.timings;
        let previous = self.known.as_ref().and_then(|k| k.record.clone());
        let term = previous
            .as_ref()
            .map_or(0, |p| p.record.term)
            .max(self.known_term)
            + 1;
        let record = self.claim_record(term);
        let started = self.clock.now();
        let started_at = Instant::now();
        let request = async {
            match &previous {
                Some(p) => self.store.update(&self.cfg.lease, &p.version, &record).await,
                None => self.store.create(&self.cfg.lease, &record).await,
            }
        };
        match timeout(t.request_timeout, request).await {
            Ok(Ok(written)) => self.won(written, term, started, started_at),
            Ok(Err(e)) if e.is_conflict() => self.lost_race(&e, previous.as_ref()).await,
            Ok(Err(e)) => {
                self.store_fault("acquire", &e);
                self.backoff()
            }
            Err(_) => {
                self.failed_request(StoreErrorKind::Timeout);
                tracing::warn!(lease = %self.cfg.lease, timeout = %human(t.request_timeout), "acquiring the lease timed out");
                // The write may have landed: read again before the next
                // attempt (which then conflicts if the read fails too).
                let _ = self.read(t.request_timeout).await;
                self.publish_follower();
                self.backoff()
            }
        }
    }

    /// The record that takes the lease for this host in `term`.
    pub(super) fn claim_record(&mut self, term: u64) -> LeaseRecord {
        let wall = SystemTime::now();
        LeaseRecord {
            plugins: self.claimed(),
            yielded: None,
            host: self.host_info(),
            instance: Some(self.me.instance.clone()),
            holder: Some(self.cfg.identity.clone()),
            lease_duration: self.cfg.timings.lease_duration,
            acquire_time: Some(wall),
            renew_time: Some(wall),
            term,
        }
    }

    /// The lease was taken for `term` in `written`, with the request sent
    /// at `started` (term clock) or `started_at` (tokio's): the term
    /// begins, its renew deadline counted from when the request was sent.
    pub(super) fn won(
        &mut self,
        written: Versioned,
        term: u64,
        started: Moment,
        started_at: Instant,
    ) -> State {
        let t = self.cfg.timings;
        self.learn(Some(written.clone()), started_at);
        self.trouble_over();
        let term = Term::begin(
            &self.cfg.lease,
            term,
            t.grace,
            self.clock.clone(),
            started + t.renew_deadline,
        );
        term.confirm_claims(written.record.plugins.as_deref().unwrap_or_default());
        let status = Status {
            role: Role::Leading,
            holder: Some(self.cfg.identity.clone()),
            lease: self.cfg.lease.clone(),
            term: term.number(),
        };
        self.publish(status, Some(term.clone()));
        State::Leading(Lead {
            term,
            began: started_at,
            current: written,
            next_renew: started + t.retry_period,
            held: true,
        })
    }

    /// Another host wrote first (`e`, a conflict on `previous`): read the
    /// lease again and go on following.
    pub(super) async fn lost_race(&mut self, e: &StoreError, previous: Option<&Versioned>) -> State {
        self.failed_request(StoreErrorKind::Conflict);
        tracing::debug!(lease = %self.cfg.lease, "another host wrote first; reading the lease again");
        let read = self.read(self.cfg.timings.request_timeout).await;
        self.publish_follower();
        match read {
            // The store refuses what it still shows: do not spin on it; try
            // again after a retry period. A record read with a higher term
            // than before (a term floor found above the Lease's own, which
            // another contender may just have raised) is news: the next
            // attempt starts above it, at once.
            Some(r)
                if r.as_ref().map(|v| (&v.version, v.record.term))
                    == previous.map(|v| (&v.version, v.record.term)) =>
            {
                tracing::warn!(lease = %self.cfg.lease, error = %e, "the lease reads the same after a conflict; backing off");
                self.backoff()
            }
            Some(_) => State::Following(Following {
                not_before: Instant::now(),
            }),
            None => self.backoff(),
        }
    }
}
