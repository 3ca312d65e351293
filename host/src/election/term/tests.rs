//! Tests of [`term`](super).

use super::*;

const GRACE: Duration = Duration::from_secs(2);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn term(clock: &TermClock, valid_for: Duration) -> Arc<Term> {
    Term::begin("demo", 3, GRACE, clock.clone(), clock.now() + valid_for)
}

#[tokio::test(start_paused = true)]
async fn a_term_is_over_at_its_deadline_and_must_stop_a_grace_later() {
    let clock = TermClock::paused();
    let t = term(&clock, secs(5));
    assert!(!t.is_over() && !t.must_stop());
    tokio::time::sleep(secs(5)).await;
    assert!(t.is_over());
    assert!(!t.must_stop(), "the grace has not passed");
    tokio::time::sleep(GRACE).await;
    assert!(t.must_stop());
}

#[tokio::test(start_paused = true)]
async fn ending_moves_both_times_earlier_and_never_later() {
    let clock = TermClock::paused();
    let t = term(&clock, secs(5));
    let now = clock.now();
    t.end(now + secs(1));
    assert_eq!(t.over_at(), now + secs(1));
    assert_eq!(t.stop_at(), now + secs(1) + GRACE);
    t.end(now + secs(4));
    assert_eq!(t.over_at(), now + secs(1), "an end never moves later");
    // Renewals go on while a resigning host drains: the deadline moves,
    // the end does not.
    assert!(t.extend(now + secs(9)));
    assert_eq!(t.lead_until(), now + secs(9));
    assert_eq!(t.stop_at(), now + secs(1) + GRACE);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_confirmed_after_the_deadline_cannot_revive_the_term() {
    let clock = TermClock::paused();
    let t = term(&clock, secs(5));
    let started = clock.now();
    tokio::time::sleep(secs(6)).await;
    assert!(t.is_over());
    assert!(!t.extend(started + secs(10)));
    assert!(t.is_over(), "over for good");
    assert_eq!(t.over_at(), started + secs(5));
    assert_eq!(t.stop_at(), started + secs(5) + GRACE);
}

#[tokio::test(start_paused = true)]
async fn a_suspended_machine_finds_its_term_over_on_waking() {
    let clock = TermClock::paused();
    let t = term(&clock, secs(5));
    clock.suspend(secs(60));
    // tokio's clock did not move, the term clock did.
    assert!(t.is_over() && t.must_stop());
    assert!(!t.extend(clock.now() + secs(5)));
}

#[tokio::test(start_paused = true)]
async fn waiters_wake_at_the_deadline_and_on_ending_but_not_on_renewals() {
    let clock = TermClock::paused();
    let t = term(&clock, secs(5));
    let start = tokio::time::Instant::now();
    // Renewed twice while a waiter waits: it wakes at the last deadline.
    let waiter = {
        let t = t.clone();
        tokio::spawn(async move { t.over().await })
    };
    tokio::time::sleep(secs(3)).await;
    assert!(t.extend(clock.now() + secs(5)));
    tokio::time::sleep(secs(3)).await;
    assert!(t.extend(clock.now() + secs(5)));
    waiter.await.unwrap();
    assert_eq!(tokio::time::Instant::now() - start, secs(11));
    // Ending wakes at once.
    let t = term(&clock, secs(100));
    let waiter = {
        let t = t.clone();
        tokio::spawn(async move { t.stop_due().await })
    };
    tokio::task::yield_now().await;
    let ended = tokio::time::Instant::now();
    t.end(clock.now());
    waiter.await.unwrap();
    assert_eq!(tokio::time::Instant::now() - ended, GRACE);
}

#[tokio::test(start_paused = true)]
async fn drained_waits_for_every_task_and_no_task_enters_an_over_term() {
    let clock = TermClock::paused();
    let t = term(&clock, secs(5));
    let a = t.enter().unwrap();
    let b = t.enter().unwrap();
    assert_eq!(t.tasks(), 2);
    t.end(clock.now());
    assert!(t.enter().is_none(), "an over term takes no new task");
    let drained = {
        let t = t.clone();
        tokio::spawn(async move { t.drained().await })
    };
    drop(a);
    tokio::task::yield_now().await;
    assert!(!drained.is_finished());
    drop(b);
    drained.await.unwrap();
    assert_eq!(t.tasks(), 0);
}
