//! Leading and resigning: renewing the lease on time, stepping down, and
//! releasing it once the term's tasks are gone.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::{Instant, timeout};

use super::decide::{Verdict, judge_sighting, keeps_leading};
use super::{DRAIN_ALLOWANCE, Elector, Following, Intent, Lead, Loss, State, claims_changed};
use crate::election::clock::Moment;
use crate::election::report::{StoreErrorKind, before_release_bound};
use crate::election::status::{Role, Status};
use crate::election::term::Term;
use crate::store::{LeaseRecord, RELEASED_LEASE_DURATION, StoreError, Yielded};
use crate::support::recurring::Note;
use crate::support::rounding::human;

impl Elector {
    /// Leading: renew on time; step down when the term's deadline passes
    /// or the lease is seen in other hands.
    pub(super) async fn lead(&mut self, mut l: Lead) -> State {
        if !self.keeps(&l) {
            return self.start_resigning(l);
        }
        tokio::select! {
            biased;
            changed = self.intent.changed() => {
                if changed.is_err() || !self.keeps(&l) {
                    return self.start_resigning(l);
                }
                State::Leading(l)
            }
            _ = l.term.over() => self.step_down(l, Loss::Deadline("no renewal was confirmed within the renew deadline")),
            _ = self.clock.sleep_until(l.next_renew) => match self.renew_heeding_intent(&mut l).await {
                Ok(()) => State::Leading(l),
                Err(loss) => self.step_down(l, loss),
            },
            _ = claims_changed(&mut self.claims) => {
                // Written at once: a plugin added waits for it to start.
                l.next_renew = self.clock.now();
                State::Leading(l)
            }
            alive = self.subscription.changed() => {
                if !alive {
                    return self.subscription_ended();
                }
                match self.judge_latest(&mut l) {
                    Ok(()) => State::Leading(l),
                    Err(loss) => self.step_down(l, loss),
                }
            }
        }
    }

    /// [`Elector::renew`], but told to resign while the renewal is in
    /// flight (a slow store may hold it up to `request-timeout`), the term
    /// ends at once: the tasks are told now, not when the store answers.
    /// The resignation itself follows the answer (the release needs it).
    async fn renew_heeding_intent(&mut self, l: &mut Lead) -> Result<(), Loss> {
        let mut intent = self.intent.clone();
        let (term, began, clock) = (l.term.clone(), l.began, self.clock.clone());
        let renewal = self.renew(l);
        tokio::pin!(renewal);
        tokio::select! {
            biased;
            result = &mut renewal => return result,
            () = resign_asked(&mut intent, &term, began) => {}
        }
        term.end(clock.now());
        tracing::debug!(
            lease = term.lease(),
            term = term.number(),
            "told to resign while renewing: the term ends now, the release follows the renewal"
        );
        renewal.await
    }

    /// Ends the term (its tasks are told now) but keeps the lease until
    /// they are gone.
    pub(super) fn start_resigning(&mut self, l: Lead) -> State {
        l.term.end(self.clock.now());
        let status = Status {
            role: Role::Pending,
            holder: None,
            ..self.tx.borrow().status.clone()
        };
        self.publish(status, None);
        tracing::info!(lease = %self.cfg.lease, term = l.term.number(), force_stop_at = %l.term.stop_at_wall(), "resigning: leader tasks are told to stop; the lease is kept until they have");
        State::Resigning(l)
    }

    /// Resigning: keep the lease until the term's tasks, and those of any
    /// earlier term of this host, are gone, then release it.
    pub(super) async fn resign(&mut self, mut l: Lead) -> State {
        self.draining.retain(|t| !(t.is_over() && t.tasks() == 0));
        let terms: Vec<Arc<Term>> = self.draining.iter().cloned().chain([l.term.clone()]).collect();
        let last_stop = terms.iter().map(|t| t.stop_at()).max().unwrap_or_default();
        let give_up_at = last_stop + DRAIN_ALLOWANCE;
        let held = l.held && self.clock.now() < l.term.lead_until();
        let drained = async {
            for t in &terms {
                t.drained().await;
            }
        };
        tokio::select! {
            biased;
            _ = drained => {
                if held {
                    self.before_release(&l).await;
                    self.release(&l).await;
                } else {
                    tracing::info!(lease = %self.cfg.lease, term = l.term.number(), "the lease was lost while the tasks stopped; nothing to release");
                }
                self.after_resigning()
            }
            _ = self.clock.sleep_until(give_up_at) => {
                let tasks: usize = terms.iter().map(|t| t.tasks()).sum();
                tracing::error!(
                    lease = %self.cfg.lease,
                    term = l.term.number(),
                    tasks,
                    "leader tasks are not confirmed stopped; not releasing the lease, which expires on its own"
                );
                self.draining.push(l.term);
                self.after_resigning()
            }
            _ = self.clock.sleep_until(l.next_renew), if held => {
                if let Err(loss) = self.renew(&mut l).await {
                    self.lost_while_resigning(&mut l, loss);
                }
                State::Resigning(l)
            }
            alive = self.subscription.changed(), if held => {
                if !alive {
                    return self.subscription_ended();
                }
                if let Err(loss) = self.judge_latest(&mut l) {
                    self.lost_while_resigning(&mut l, loss);
                }
                State::Resigning(l)
            }
        }
    }

    /// Resigned: follow, or stop if told to.
    pub(super) fn after_resigning(&mut self) -> State {
        match self.intent() {
            Intent::Stop => State::Stopped,
            _ => {
                self.publish_follower();
                State::Following(Following {
                    not_before: Instant::now(),
                })
            }
        }
    }

    /// While holding the lease: what the subscription saw.
    pub(super) fn judge_latest(&mut self, l: &mut Lead) -> Result<(), Loss> {
        let Some(s) = self.subscription.take_new() else {
            return Ok(());
        };
        match judge_sighting(s.record.as_ref(), &l.current, &self.me, l.term.number()) {
            Verdict::Same => Ok(()),
            Verdict::Ours(adopted) => {
                l.current = (*adopted).clone();
                self.learn(Some(*adopted), s.at);
                Ok(())
            }
            Verdict::Lost => {
                self.learn(s.record, s.at);
                Err(Loss::Taken("the lease was taken over, overwritten or deleted"))
            }
        }
    }

    /// Renews the lease, bounded by `request-timeout` and by the time left
    /// in the term. `Err` with the reason if the lease is lost.
    pub(super) async fn renew(&mut self, l: &mut Lead) -> Result<(), Loss> {
        let t = self.cfg.timings;
        let started = self.clock.now();
        let until = l.term.lead_until();
        if started >= until {
            return Err(Loss::Deadline(
                "no renewal was confirmed within the renew deadline",
            ));
        }
        let limit = t.request_timeout.min(until - started);
        let version = l.current.version.clone();
        let record = LeaseRecord {
            plugins: self.claimed(),
            yielded: None,
            host: self.host_info(),
            renew_time: Some(SystemTime::now()),
            ..l.current.record.clone()
        };
        let result = timeout(limit, self.store.update(&self.cfg.lease, &version, &record)).await;
        match result {
            Ok(Ok(written)) => {
                self.trouble_over();
                self.observer
                    .renewed(&self.cfg.lease, self.clock.now().since(started));
                if !l.term.extend(started + t.renew_deadline) {
                    return Err(Loss::Deadline(
                        "the renewal was confirmed only after the renew deadline",
                    ));
                }
                l.next_renew = on_grid(started + t.retry_period, t.retry_period);
                l.term
                    .confirm_claims(written.record.plugins.as_deref().unwrap_or_default());
                l.current = written.clone();
                self.learn(Some(written), Instant::now());
                Ok(())
            }
            Ok(Err(e)) if e.is_conflict() => self.renewal_conflicted(l, &version).await,
            Ok(Err(e)) => {
                self.renewal_failed(&e, until);
                l.next_renew = self.retry_soon();
                Ok(())
            }
            Err(_) => {
                self.failed_request(StoreErrorKind::Timeout);
                tracing::warn!(lease = %self.cfg.lease, remaining = %human(until - self.clock.now()), "renewal timed out; still leading until the renew deadline");
                l.next_renew = self.retry_soon();
                Ok(())
            }
        }
    }

    /// When to try a failed renewal again: half a retry period from now.
    pub(super) fn retry_soon(&self) -> Moment {
        self.clock.now() + self.cfg.timings.retry_period / 2
    }

    /// Someone wrote after this host's last write (a renewal of `version`
    /// conflicted). If it is still ours (a write whose answer was missed),
    /// adopt it; otherwise the lease was taken: stop at once. The read is
    /// bounded by the term too.
    pub(super) async fn renewal_conflicted(&mut self, l: &mut Lead, version: &str) -> Result<(), Loss> {
        self.failed_request(StoreErrorKind::Conflict);
        let left = l.term.lead_until() - self.clock.now();
        let Some(current) = self.read(self.cfg.timings.request_timeout.min(left)).await else {
            l.next_renew = self.retry_soon();
            tracing::warn!(lease = %self.cfg.lease, "renewal conflicted and the lease cannot be read; retrying");
            return Ok(());
        };
        match judge_sighting(current.as_ref(), &l.current, &self.me, l.term.number()) {
            Verdict::Ours(current) => {
                // Renew it at once, unless it is the very version that
                // conflicted (then not in a loop).
                l.next_renew = if current.version == version {
                    self.retry_soon()
                } else {
                    self.clock.now()
                };
                l.term
                    .confirm_claims(current.record.plugins.as_deref().unwrap_or_default());
                l.current = *current;
                Ok(())
            }
            Verdict::Same => {
                l.next_renew = self.retry_soon();
                Ok(())
            }
            Verdict::Lost => {
                // Who holds it now: another host, nobody, or (after a
                // database's promotion) nobody known.
                let holder = current.as_ref().and_then(|v| v.record.holder()).unwrap_or("none");
                let term = current.as_ref().map_or(0, |v| v.record.term);
                tracing::info!(lease = %self.cfg.lease, holder, term, "the lease's record after the conflicting renewal");
                Err(Loss::Taken("the lease was written by another host"))
            }
        }
    }

    /// A renewal failed with `e`: counted, and said (once, then now and
    /// then) with the time left until the renew deadline `until`.
    pub(super) fn renewal_failed(&mut self, e: &StoreError, until: Moment) {
        self.failed_request(StoreErrorKind::of(e));
        let remaining = until - self.clock.now();
        match self.trouble.note(&e.to_string(), Instant::now().into_std()) {
            Note::Quiet => {
                tracing::debug!(lease = %self.cfg.lease, error = %e, remaining = %human(remaining), "renewal failed; still leading until the renew deadline")
            }
            _ => {
                tracing::warn!(lease = %self.cfg.lease, error = %e, remaining = %human(remaining), "renewal failed; still leading until the renew deadline")
            }
        }
    }

    /// The lease was lost while the term's tasks stop (resigning): nothing
    /// to release any more, and if it was taken, no grace either.
    pub(super) fn lost_while_resigning(&mut self, l: &mut Lead, loss: Loss) {
        if let Loss::Taken(_) = loss {
            l.term.end_without_grace(self.clock.now());
        }
        tracing::warn!(lease = %self.cfg.lease, term = l.term.number(), reason = loss.reason(), force_stop_at = %l.term.stop_at_wall(), "lost the lease while its tasks stop");
        l.held = false;
    }

    /// Stops leading at once: the term ends now. Its tasks may run until its
    /// force-stop time (now, if the lease was taken: see [`Loss`]); it is
    /// kept among the draining terms until they are gone, so that a later
    /// release waits for them too.
    pub(super) fn step_down(&mut self, l: Lead, loss: Loss) -> State {
        match loss {
            Loss::Deadline(_) => l.term.end(self.clock.now()),
            Loss::Taken(_) => l.term.end_without_grace(self.clock.now()),
        }
        let reason = loss.reason();
        tracing::warn!(lease = %self.cfg.lease, term = l.term.number(), reason, force_stop_at = %l.term.stop_at_wall(), "stepping down");
        self.draining.retain(|t| !(t.is_over() && t.tasks() == 0));
        self.draining.push(l.term);
        self.publish_follower();
        State::Following(Following {
            not_before: Instant::now(),
        })
    }

    /// Gives the lease up after its tasks have drained: an empty holder and
    /// a short duration, so a standby takes over at once. Retried on
    /// conflict (an in-flight renewal) while the lease is still ours, and
    /// never past the term's renew deadline.
    pub(super) async fn release(&mut self, l: &Lead) {
        let t = self.cfg.timings;
        let term = l.term.number();
        let mut current = l.current.clone();
        loop {
            let now = self.clock.now();
            let until = l.term.lead_until();
            if now >= until {
                tracing::warn!(lease = %self.cfg.lease, term, "could not release the lease before the renew deadline; it will expire");
                return;
            }
            // A release standing by is a yield: the others take the lease
            // at once, and know this host stays out until then.
            let yielded = match self.intent() {
                Intent::StandBy { until } if until > Instant::now() => Some(Yielded {
                    by: self.cfg.identity.clone(),
                    duration: until - Instant::now(),
                }),
                // A drain: as a yield for one lease duration (this host
                // drains for as long as it is told to, but the others do
                // not wait for it anyway: its membership record says it
                // drains).
                Intent::Drain => Some(Yielded {
                    by: self.cfg.identity.clone(),
                    duration: t.lease_duration,
                }),
                _ => None,
            };
            let record = LeaseRecord {
                yielded,
                plugins: None,
                host: None,
                instance: None,
                holder: None,
                lease_duration: RELEASED_LEASE_DURATION,
                acquire_time: None,
                renew_time: Some(SystemTime::now()),
                term,
            };
            let limit = t.request_timeout.min(until - now);
            match timeout(
                limit,
                self.store.update(&self.cfg.lease, &current.version, &record),
            )
            .await
            {
                Ok(Ok(written)) => {
                    self.learn(Some(written), Instant::now());
                    tracing::info!(lease = %self.cfg.lease, term, "released the lease");
                    return;
                }
                Ok(Err(e)) if e.is_conflict() => {
                    self.failed_request(StoreErrorKind::Conflict);
                    let left = l.term.lead_until() - self.clock.now();
                    match self.read(t.request_timeout.min(left)).await {
                        Some(read) => match judge_sighting(read.as_ref(), &current, &self.me, term) {
                            Verdict::Ours(v) => current = *v,
                            Verdict::Same => self.pause(t.retry_period / 4).await,
                            Verdict::Lost => {
                                tracing::info!(lease = %self.cfg.lease, term, "the lease is no longer ours; nothing to release");
                                return;
                            }
                        },
                        None => self.pause(t.retry_period / 4).await,
                    }
                }
                Ok(Err(e)) => {
                    self.failed_request(StoreErrorKind::of(&e));
                    tracing::warn!(lease = %self.cfg.lease, error = %e, "releasing the lease failed; retrying");
                    self.pause(t.retry_period / 4).await;
                }
                Err(_) => {
                    self.failed_request(StoreErrorKind::Timeout);
                    tracing::warn!(lease = %self.cfg.lease, "releasing the lease timed out; retrying");
                }
            }
        }
    }

    /// Awaits the host's [`BeforeRelease`](crate::election::BeforeRelease)
    /// hook, if any, at most [`before_release_bound`]: the release comes
    /// next whatever it did.
    async fn before_release(&self, l: &Lead) {
        let Some(hook) = &self.before_release else {
            return;
        };
        let left = l.term.lead_until() - self.clock.now();
        let bound = before_release_bound(self.cfg.timings.request_timeout, left);
        let term = l.term.number();
        if timeout(bound, hook.before_release(&self.cfg.lease, term))
            .await
            .is_err()
        {
            tracing::warn!(lease = %self.cfg.lease, term, bound = %human(bound), "the work before the release did not finish in time; releasing anyway");
        }
    }

    /// Sleeps `d` on tokio's clock.
    pub(super) async fn pause(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
}

/// Resolves once `intent` asks the leader of `term`, begun at `began`, to
/// give it up ([`keeps_leading`]), or its sender is gone.
async fn resign_asked(intent: &mut watch::Receiver<Intent>, term: &Term, began: Instant) {
    while intent.changed().await.is_ok() {
        let now = *intent.borrow_and_update();
        if !keeps_leading(now, term.number(), began, Instant::now()) {
            return;
        }
    }
}

/// `at`, moved back to the grid of sixteenths of `retry_period`: a host's
/// renewals of leases of one retry period fall on at most sixteen moments
/// of each period, so its thread wakes for them together (one wake-up per
/// moment, not one per lease). At most a sixteenth early, so a renewal
/// comes no later than it would have; after the first, every renewal is on
/// the grid and a period apart.
fn on_grid(at: Moment, retry_period: std::time::Duration) -> Moment {
    let step = u64::try_from((retry_period / 16).as_nanos()).unwrap_or(u64::MAX);
    if step == 0 {
        return at;
    }
    let n = at.as_nanos();
    Moment::from_nanos(n - n % step)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn renewals_fall_on_sixteenths_of_the_retry_period_never_later() {
        let rp = Duration::from_secs(2);
        let step = rp / 16;
        let mut at = Moment::from_nanos(1_234_567_891);
        for _ in 0..5 {
            let next = on_grid(at + rp, rp);
            assert!(next <= at + rp, "never later");
            assert!((at + rp) - next < step, "at most a sixteenth early");
            assert_eq!(next.as_nanos() % step.as_nanos() as u64, 0, "on the grid");
            at = next;
        }
        // Once on the grid, a period apart.
        assert_eq!(on_grid(at + rp, rp) - at, rp);
        // A retry period too short to divide: unchanged.
        let tiny = Duration::from_nanos(10);
        assert_eq!(on_grid(at + tiny, tiny), at + tiny);
    }
}
