//! `baton drain` and `baton resume` on the server side.
//!
//! A drain marks the host draining (its [`HostHandle`]: every record it
//! renews says so, and the other hosts' spreaders leave it out of their
//! assignment), sets every elector to [`Intent::Drain`] (a lease not led
//! here is not taken; the spreader leaves the intent alone), and hands each
//! lease led here over the graceful way: its term ends (the tasks are told
//! at once), the tasks stop (grace, then force), then the lease is
//! released, as by a yield, so another host takes it at once. One lease at
//! a time, each released before the next is told, or all at once. The
//! reply comes once the host leads nothing or the wait is over, naming
//! each lease handed over and any it could not. Readiness is not touched.
//!
//! A resume clears the mark and sets every draining elector back to
//! [`Intent::Contend`]; the spreader *steers* them again at its next
//! listing. A restart also ends a drain (the mark lives in the process).

use std::sync::Arc;

use super::*;

impl ControlledHost {
    /// `baton drain`: see the [module documentation](self).
    pub(super) async fn drain(&self, all_at_once: bool, wait: Duration) -> Reply {
        let id = &self.identity;
        let started = Instant::now();
        let all = self.leases.read().unwrap_or_else(|e| e.into_inner()).clone();
        if all.values().any(|l| *l.intent.borrow() == Intent::Stop) {
            let message = format!("host {id} is shutting down: it hands every lease over anyway");
            return Reply::failed(id, Failure::ShuttingDown, message);
        }
        if self.host.set_draining(true) {
            tracing::info!(
                leases = all.len(),
                all_at_once,
                "draining (baton drain): handing every lease led here over, taking none until baton resume"
            );
        }
        // Leases not led here first: from now on none is taken.
        let mut led = Vec::new();
        for (name, l) in &all {
            match l.view.borrow().leading_term().cloned() {
                Some(term) => led.push((name.clone(), l.clone(), term)),
                None => set_draining(&l.intent),
            }
        }
        let deadline = started + wait;
        let mut done: Vec<HandedOver> = Vec::new();
        if all_at_once {
            for (_, l, _) in &led {
                set_draining(&l.intent);
            }
            let each = led
                .iter()
                .map(|(name, l, term)| hand_over(name, l, term, started, deadline));
            done = futures::future::join_all(each).await;
        } else {
            for (name, l, term) in &led {
                set_draining(&l.intent);
                done.push(hand_over(name, l, term, started, deadline).await);
            }
        }
        // Led here still: a lease taken between the look and the drain's
        // mark, or one whose hand-over did not finish in time.
        let still: Vec<String> = all
            .iter()
            .filter(|(_, l)| l.view.borrow().status.is_leading())
            .map(|(name, _)| name.clone())
            .collect();
        self.drained_reply(done, still, started.elapsed())
    }

    /// The answer to a drain that handed `done` over in `took`, with the
    /// leases `still` led here.
    fn drained_reply(&self, done: Vec<HandedOver>, still: Vec<String>, took: Duration) -> Reply {
        let id = &self.identity;
        let mut lines: Vec<String> = done.iter().map(describe).collect();
        if lines.is_empty() {
            lines.push("it led no lease".into());
        }
        let failed: Vec<&HandedOver> = done.iter().filter(|h| !h.released).collect();
        let ok = still.is_empty() && failed.is_empty();
        let mut message = format!(
            "host {id} drains (it takes no lease until baton resume or a restart); in {}: {}",
            human(took),
            lines.join("; ")
        );
        if !still.is_empty() {
            message.push_str(&format!("; it still leads {}", still.join(", ")));
        }
        tracing::info!(
            handed_over = done.len(),
            still_leading = %still.join(","),
            "drained"
        );
        let failure = if !still.is_empty() {
            Some(Failure::StillLeading)
        } else if !failed.is_empty() {
            Some(Failure::NotReleased)
        } else {
            None
        };
        Reply {
            ok,
            failure,
            message,
            lease: still.first().cloned().or(failed.first().map(|h| h.lease.clone())),
            draining: Some(true),
            handed_over: done,
            ..Reply::new(id)
        }
    }

    /// `baton resume`: see the [module documentation](self).
    pub(super) fn resume(&self) -> Reply {
        let id = &self.identity;
        let was = self.host.set_draining(false);
        let all = self.leases.read().unwrap_or_else(|e| e.into_inner()).clone();
        for l in all.values() {
            l.intent.send_if_modified(|intent| {
                if *intent != Intent::Drain {
                    return false;
                }
                *intent = Intent::Contend;
                true
            });
        }
        let message = if was {
            tracing::info!(
                leases = all.len(),
                "resumed (baton resume): contending for the leases again"
            );
            format!(
                "host {id} resumed: it contends for its {} lease(s) again",
                all.len()
            )
        } else {
            format!("host {id} was not draining")
        };
        Reply {
            ok: true,
            message,
            draining: Some(false),
            ..Reply::new(id)
        }
    }
}

/// Sets an elector to drain, unless it is stopping.
fn set_draining(intent: &watch::Sender<Intent>) {
    intent.send_if_modified(|intent| {
        if matches!(*intent, Intent::Stop | Intent::Drain) {
            return false;
        }
        *intent = Intent::Drain;
        true
    });
}

/// Waits until `term` of lease `name` (told to drain) is handed over: its
/// tasks gone and the lease released, within its hand-over bound and
/// before `deadline`; then for another host to take it, a little.
async fn hand_over(
    name: &str,
    l: &ControlledLease,
    term: &Arc<crate::election::Term>,
    started: Instant,
    deadline: Instant,
) -> HandedOver {
    let number = term.number();
    let bound = (Instant::now() + l.handover_bound).min(deadline);
    let drained = tokio::time::timeout_at(bound, term.drained()).await.is_ok();
    let drained_ms = drained.then(|| ms(started.elapsed()));
    let mut view = l.view.clone();
    let released = drained
        && tokio::time::timeout_at(
            bound,
            view.wait_for(|v| !(v.status.is_leading() && v.status.term == number)),
        )
        .await
        .is_ok_and(|r| r.is_ok());
    let taken = if released {
        let wait = (Instant::now() + HANDOVER_WAIT).min(deadline.max(Instant::now()));
        tokio::time::timeout_at(
            wait,
            view.wait_for(|v| v.status.term > number && v.status.holder.is_some() && !v.status.is_leading()),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|v| (v.status.holder.clone().unwrap_or_default(), v.status.term))
    } else {
        None
    };
    if !released {
        tracing::warn!(
            lease = name,
            term = number,
            "drain: the lease was not handed over in time"
        );
    }
    HandedOver {
        lease: name.to_owned(),
        term: number,
        released,
        drained_ms,
        new_holder: taken.as_ref().map(|t| t.0.clone()),
        new_term: taken.map(|t| t.1),
    }
}

/// One lease handed over, in words.
fn describe(h: &HandedOver) -> String {
    let taken = match (&h.new_holder, h.new_term) {
        (Some(holder), Some(term)) => format!("{holder} took it in term {term}"),
        _ => format!("no other host took it within {}", human(HANDOVER_WAIT)),
    };
    match (h.released, h.drained_ms) {
        (true, Some(d)) => format!(
            "{} term {}: tasks stopped {d} ms into the drain, released; {taken}",
            h.lease, h.term
        ),
        (false, Some(_)) => format!(
            "{} term {}: tasks stopped but the release was not confirmed in time",
            h.lease, h.term
        ),
        _ => format!(
            "{} term {}: tasks not confirmed stopped within the wait; the lease is released once they \
             are, or expires on its own",
            h.lease, h.term
        ),
    }
}
