//! The elector under paused time, against the in-memory store with faults.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use super::*;
use crate::store::memory::MemoryStore;
use crate::store::subscription::Sighting;
use crate::store::{LeaseRecord, LeaseStore, Versioned};

const LEASE: &str = "demo";

/// The timings of the election's tests (also the spreader's).
pub(super) fn timings() -> Timings {
    let t = Timings {
        lease_duration: Duration::from_secs(10),
        renew_deadline: Duration::from_secs(6),
        retry_period: Duration::from_secs(1),
        grace: Duration::from_secs(2),
        request_timeout: Duration::from_secs(1),
    };
    t.validate().unwrap();
    t
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// One store and one clock, shared by the candidates of a test.
struct Cluster {
    store: MemoryStore,
    clock: TermClock,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster {
            store: MemoryStore::new(),
            clock: TermClock::paused(),
        }
    }

    /// A candidate with its own client of the store (as a process would).
    fn start(&self, identity: &str) -> Candidate {
        self.start_as(identity, &HostHandle::default())
    }

    /// [`start`](Self::start), saying `host` of itself in its records.
    fn start_as(&self, identity: &str, host: &HostHandle) -> Candidate {
        let cfg = ElectorConfig {
            lease: LEASE.into(),
            identity: identity.into(),
            timings: timings(),
            host: host.subscribe(),
        };
        let (elector, rx, intent) = Elector::new(cfg, Arc::new(self.store.client()), self.clock.clone());
        let task = tokio::spawn(elector.run());
        Candidate { rx, intent, task }
    }
}

struct Candidate {
    rx: watch::Receiver<LeaseView>,
    intent: watch::Sender<Intent>,
    task: JoinHandle<Result<(), ElectorError>>,
}

impl Candidate {
    async fn until_leading(&mut self) -> Status {
        self.rx
            .wait_for(|v| v.status.is_leading())
            .await
            .unwrap()
            .status
            .clone()
    }

    async fn until_not_leading(&mut self) -> Status {
        self.rx
            .wait_for(|v| !v.status.is_leading())
            .await
            .unwrap()
            .status
            .clone()
    }

    async fn until_following(&mut self) -> Status {
        self.rx
            .wait_for(|v| v.status.role == Role::Following)
            .await
            .unwrap()
            .status
            .clone()
    }

    fn term(&self) -> Arc<Term> {
        self.rx.borrow().term.clone().expect("leading")
    }
}

fn record(holder: Option<&str>, term: u64, lease_secs: u64) -> LeaseRecord {
    LeaseRecord::new(holder, term, secs(lease_secs))
}

#[tokio::test(start_paused = true)]
async fn a_lone_candidate_leads_with_term_one() {
    let c = Cluster::new();
    let mut a = c.start("a");
    let s = a.until_leading().await;
    assert_eq!(s.term, 1);
    assert_eq!(s.holder.as_deref(), Some("a"));
    let rec = c.store.peek(LEASE).unwrap().record;
    assert_eq!(rec.holder(), Some("a"));
    assert_eq!(rec.term, 1);
    assert_eq!(rec.lease_duration, timings().lease_duration);
    let term = a.term();
    assert_eq!(
        (term.lease(), term.number(), term.grace()),
        (LEASE, 1, timings().grace)
    );
}

#[tokio::test(start_paused = true)]
async fn the_holders_host_is_in_its_records_and_views_and_leaves_with_it() {
    use crate::store::HostInfo;
    let c = Cluster::new();
    let host = |address: &str| {
        HostHandle::new(HostInfo {
            address: Some(address.into()),
            ..HostInfo::default()
        })
    };
    let (host_a, host_b) = (host("10.0.0.1:80"), host("10.0.0.2:80"));
    let mut a = c.start_as("a", &host_a);
    a.until_leading().await;
    let mut b = c.start_as("b", &host_b);
    b.until_following().await;
    let address = |x: &Candidate| x.rx.borrow().holder_address.clone();
    assert_eq!(c.store.peek(LEASE).unwrap().record.host, Some(host_a.get()));
    assert_eq!(address(&a).as_deref(), Some("10.0.0.1:80"));
    assert_eq!(address(&b).as_deref(), Some("10.0.0.1:80"));
    // A change of the handle is in the next renewal.
    assert!(host_a.set_draining(true));
    sleep(timings().retry_period * 2).await;
    assert!(c.store.peek(LEASE).unwrap().record.host.unwrap().draining);
    // The release carries none; the next holder's write its own.
    a.intent.send_replace(Intent::Stop);
    b.until_leading().await;
    assert_eq!(c.store.peek(LEASE).unwrap().record.host, Some(host_b.get()));
    assert_eq!(address(&b).as_deref(), Some("10.0.0.2:80"));
}

#[tokio::test(start_paused = true)]
async fn one_leader_and_a_follower_that_is_not_woken_by_renewals() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let mut b = c.start("b");
    let s = b.until_following().await;
    assert_eq!(s.holder.as_deref(), Some("a"));
    assert_eq!(s.term, 1);
    b.rx.borrow_and_update();
    a.rx.borrow_and_update();
    // Ten renewals later neither status has changed.
    sleep(secs(10)).await;
    assert!(!b.rx.has_changed().unwrap(), "a renewal woke the follower");
    assert!(
        !a.rx.has_changed().unwrap(),
        "a renewal woke the leader's observers"
    );
    assert!(a.rx.borrow().status.is_leading());
    assert!(c.store.op_counts().update >= 9, "{:?}", c.store.op_counts());
}

#[tokio::test(start_paused = true)]
async fn a_leader_renews_once_per_retry_period_however_slow_its_writes() {
    // Writes taking from nothing to most of a retry period, changing
    // between renewals (a busy machine): the renewals keep their period,
    // counted from when each was started, and never come closer than the
    // grid allows (a sixteenth early), so a lease costs at most one write
    // per retry period however the latency varies.
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    c.store.reset_op_counts();
    let rp = timings().retry_period;
    let periods = 40;
    for i in 0..periods {
        c.store.set_latency(rp * [0, 9, 2, 7, 0, 5][i % 6] / 10);
        sleep(rp).await;
    }
    c.store.set_latency(Duration::ZERO);
    let writes = c.store.op_counts().update;
    assert!(a.rx.borrow().status.is_leading(), "the lead was lost");
    // Over `periods` retry periods: at most one write per 15/16 of one,
    // plus the one under way at the start.
    let most = (periods as u64 * 16).div_ceil(15) + 1;
    assert!(
        (periods as u64 - 2..=most).contains(&writes),
        "{writes} writes in {periods} retry periods (at most {most})"
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashed_leader_is_replaced_after_the_lease_duration() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let mut b = c.start("b");
    b.until_following().await;
    sleep(Duration::from_millis(3500)).await;
    let last_renewal = Instant::now() - Duration::from_millis(500);
    a.task.abort(); // a crash: no release
    let s = b.until_leading().await;
    let took = Instant::now() - last_renewal;
    assert_eq!(s.term, 2);
    assert!(took >= timings().lease_duration, "took over after {took:?}");
    assert!(
        took <= timings().lease_duration + timings().retry_period,
        "took over after {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_makes_the_leader_step_down_at_the_renew_deadline() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    sleep(Duration::from_millis(2500)).await;
    let term = a.term();
    let confirmed_until = term.lead_until();
    c.store.set_unavailable(true);
    let lost = a.until_not_leading().await;
    assert_eq!(lost.role, Role::Pending);
    let now = c.clock.now();
    assert!(
        now <= confirmed_until,
        "stepped down late: {:?}",
        now - confirmed_until
    );
    assert!(term.is_over());
    // Nobody else may lead before the lease expires: the tasks get their
    // grace.
    assert_eq!(term.stop_at(), term.over_at() + term.grace());
    // The lease itself could only expire for others a full lease after the
    // last renewal: the task's force-stop time comes first.
    let last_renewal_start = confirmed_until - timings().renew_deadline;
    assert!(term.stop_at() < last_renewal_start + timings().lease_duration);
    // The store comes back: the same host regains the lease, in a new term.
    c.store.set_unavailable(false);
    let s = a.until_leading().await;
    assert_eq!(s.term, 2);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_store_cannot_stretch_the_term() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let term = a.term();
    c.store.hang(true);
    let until = term.lead_until();
    a.until_not_leading().await;
    assert!(c.clock.now() <= until + Duration::from_millis(1));
    // The force-stop time never moved past the last confirmed renewal.
    assert_eq!(term.stop_at(), until + timings().grace);
}

#[tokio::test(start_paused = true)]
async fn the_force_stop_comes_on_time_even_if_the_elector_is_stuck_or_gone() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    sleep(secs(2)).await;
    let term = a.term();
    let stop_at = term.stop_at();
    assert_eq!(stop_at, term.lead_until() + timings().grace);
    // The elector dies: nobody will say the term is over.
    a.task.abort();
    let start = Instant::now();
    term.over().await;
    assert!(term.is_over());
    term.stop_due().await;
    assert_eq!(c.clock.now(), stop_at, "at the force-stop time, not later");
    assert!(Instant::now() - start <= timings().renew_deadline + timings().grace);
}

#[tokio::test(start_paused = true)]
async fn a_suspended_leader_finds_its_term_over_on_waking_and_starts_a_new_one() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let term = a.term();
    // The machine sleeps for a minute: tokio's timers did not see it.
    c.clock.suspend(secs(60));
    assert!(
        term.is_over() && term.must_stop(),
        "the term clock counted the suspend"
    );
    // At its next wake the elector steps down instead of renewing, and
    // (the record still naming it) leads again in a new term.
    let s =
        a.rx.wait_for(|v| v.status.is_leading() && v.status.term == 2)
            .await
            .unwrap()
            .status
            .clone();
    assert_eq!(s.holder.as_deref(), Some("a"));
    assert!(term.is_over(), "the old term never comes back");
    assert!(
        !a.term().is_over(),
        "the new term is measured from its own renewal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_foreign_write_makes_the_leader_step_down_at_once() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let term = a.term();
    let before = Instant::now();
    c.store.write_raw(LEASE, record(Some("intruder"), 7, 30));
    let s = a.until_not_leading().await;
    assert_eq!(s.role, Role::Following);
    assert_eq!(s.holder.as_deref(), Some("intruder"));
    assert_eq!(s.term, 7);
    assert!(Instant::now() - before < Duration::from_millis(10));
    assert!(term.is_over());
    // The intruder may act already: no grace, the tasks stop at once.
    assert_eq!(term.stop_at(), term.over_at());
    assert!(term.must_stop());
    // When the intruder's lease runs out, `a` takes over with a newer term.
    let s = a.until_leading().await;
    assert_eq!(s.term, 8);
}

#[tokio::test(start_paused = true)]
async fn resigning_keeps_the_lease_until_the_terms_tasks_are_gone_then_releases_for_a_prompt_takeover() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let term = a.term();
    let task = term.enter().unwrap();
    let mut b = c.start("b");
    b.until_following().await;

    a.intent.send_replace(Intent::Stop);
    let s = a.until_not_leading().await;
    assert_eq!(s.role, Role::Pending);
    assert!(term.is_over(), "the tasks were told");
    // Draining takes longer than a renewal period: still ours.
    sleep(secs(3)).await;
    assert_eq!(c.store.peek(LEASE).unwrap().record.holder(), Some("a"));
    assert!(!b.rx.borrow().status.is_leading());

    let released_at = Instant::now();
    drop(task);
    a.task.await.unwrap().unwrap();
    assert_ne!(c.store.peek(LEASE).unwrap().record.holder(), Some("a"));
    let s = b.until_leading().await;
    assert_eq!(s.term, 2);
    assert!(Instant::now() - released_at < Duration::from_millis(50));
}

#[tokio::test(start_paused = true)]
async fn a_task_that_is_never_confirmed_gone_keeps_the_lease_unreleased() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let term = a.term();
    let _stuck = term.enter().unwrap();
    a.intent.send_replace(Intent::Stop);
    a.task.await.unwrap().unwrap();
    // It gave up at the force-stop time plus the drain allowance, without
    // releasing: the lease expires by itself.
    assert!(c.clock.now() >= term.stop_at() + DRAIN_ALLOWANCE);
    assert_eq!(c.store.peek(LEASE).unwrap().record.holder(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn standing_by_hands_the_lease_over_and_follows_without_stopping() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let mut b = c.start("b");
    b.until_following().await;
    let until = Instant::now() + secs(30);
    a.intent.send_replace(Intent::StandBy { until });
    // No task runs: the lease is released at once, b takes it.
    let s = b.until_leading().await;
    assert_eq!(s.term, 2);
    let s = a.until_following().await;
    assert_eq!(s.holder.as_deref(), Some("b"));
    // a stands by, then contends again: it follows b, and takes over when
    // b stops.
    sleep(secs(40)).await;
    assert_eq!(a.rx.borrow().status.role, Role::Following);
    assert!(!a.task.is_finished());
    a.intent.send_replace(Intent::Contend);
    b.intent.send_replace(Intent::Stop);
    let s = a.until_leading().await;
    assert_eq!(s.term, 3);
}

#[tokio::test(start_paused = true)]
async fn a_standby_whose_time_passes_during_a_slow_renewal_still_hands_the_lease_over() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    // Renewals every second, each taking 900 ms from now on: at 1.1 s one
    // is in flight until 1.9 s.
    c.store.set_latency(Duration::from_millis(900));
    sleep(Duration::from_millis(1100)).await;
    let until = Instant::now() + Duration::from_millis(300);
    a.intent.send_replace(Intent::StandBy { until });
    let handed = tokio::time::timeout(secs(3), a.until_not_leading()).await;
    assert!(handed.is_ok(), "the stand-by was passed unseen: still leading");
}

#[tokio::test(start_paused = true)]
async fn told_to_stop_during_a_slow_renewal_the_term_ends_at_once_and_the_release_follows() {
    for intent in [Intent::Stop, Intent::Drain] {
        let c = Cluster::new();
        let mut a = c.start("a");
        a.until_leading().await;
        let term = a.term();
        // Each renewal takes 900 ms from now on: at 1.1 s one is in flight
        // until 1.9 s.
        c.store.set_latency(Duration::from_millis(900));
        sleep(Duration::from_millis(1100)).await;
        a.intent.send_replace(intent);
        sleep(Duration::from_millis(1)).await;
        assert!(
            term.is_over(),
            "{intent:?}: the tasks were not told while the renewal was in flight"
        );
        assert!(term.stop_at() <= c.clock.now() + timings().grace);
        // The renewal's answer comes, then the release.
        let released = tokio::time::timeout(secs(5), async {
            while c.store.peek(LEASE).unwrap().record.holder().is_some() {
                sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(released.is_ok(), "{intent:?}: never released");
    }
}

#[tokio::test(start_paused = true)]
async fn a_standby_does_not_take_a_free_lease_before_its_time() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let until = Instant::now() + secs(20);
    a.intent.send_replace(Intent::StandBy { until });
    a.until_not_leading().await;
    sleep(secs(15)).await;
    assert!(
        !a.rx.borrow().status.is_leading(),
        "took the lease while standing by"
    );
    a.until_leading().await;
    assert!(Instant::now() >= until);
}

#[tokio::test(start_paused = true)]
async fn release_is_retried_on_conflict() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    c.store.inject_conflict_next(2);
    a.intent.send_replace(Intent::Stop);
    a.task.await.unwrap().unwrap();
    let rec = c.store.peek(LEASE).unwrap().record;
    assert_eq!(rec.holder(), None);
    assert_eq!(rec.lease_duration, RELEASED_LEASE_DURATION);
    assert_eq!(rec.term, 1, "a release keeps the term");
}

#[tokio::test(start_paused = true)]
async fn a_record_deleted_while_held_is_written_again_by_its_holder_in_the_same_term() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let mut b = c.start("b");
    b.until_following().await;
    let term = a.term();
    a.rx.borrow_and_update();
    let deleted_at = Instant::now();
    assert!(c.store.delete(LEASE));
    // The holder sees its tombstone, leads on, and writes the record again
    // at its next renewal.
    sleep(timings().retry_period * 2).await;
    let back = c.store.peek(LEASE).expect("written again");
    assert_eq!((back.record.holder(), back.record.term), (Some("a"), 1));
    assert!(!a.rx.has_changed().unwrap(), "the holder's status did not change");
    assert!(!term.is_over());
    // The holder dies right after: the follower dated the holder's lease
    // from when it saw the deletion or the rewrite, never earlier.
    a.task.abort();
    let s = b.until_leading().await;
    assert_eq!(s.term, 2);
    assert!(Instant::now() - deleted_at >= timings().lease_duration);
}

#[tokio::test(start_paused = true)]
async fn terms_are_never_reused_after_a_deletion() {
    let c = Cluster::new();
    let mut a = c.start("a");
    assert_eq!(a.until_leading().await.term, 1);
    let mut b = c.start("b");
    b.until_following().await;
    a.task.abort();
    assert_eq!(b.until_leading().await.term, 2);
    b.intent.send_replace(Intent::Stop);
    b.task.await.unwrap().unwrap();
    // Every host gone and the record deleted: a newcomer, which never saw
    // the record, still leads in a term never used before.
    assert!(c.store.delete(LEASE));
    let mut d = c.start("d");
    assert_eq!(d.until_leading().await.term, 3);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_within_the_renew_deadline_keep_the_lead() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    a.rx.borrow_and_update();
    c.store.fail_next(3);
    sleep(secs(5)).await;
    assert!(!a.rx.has_changed().unwrap(), "a transient failure cost the lead");
}

#[test]
fn expiry_is_judged_from_local_observation_and_the_records_duration() {
    let now = Instant::now();
    let me = Me {
        identity: "me".into(),
        instance: "i1".into(),
    };
    let versioned = |holder: Option<&str>, secs| Versioned {
        record: LeaseRecord {
            plugins: None,
            yielded: None,
            host: None,
            // "me" with this process's instance; "namesake": another
            // process under the same identity.
            instance: (holder == Some("me")).then(|| "i1".to_owned()),
            holder: holder.map(str::to_owned),
            lease_duration: Duration::from_secs(secs),
            acquire_time: None,
            // Timestamps inside the record are ignored, even absurd ones.
            renew_time: Some(std::time::UNIX_EPOCH),
            term: 3,
        },
        version: "1".into(),
    };
    let seen = now - Duration::from_secs(5);
    let known = |r| Sighting {
        record: Some(r),
        at: seen,
    };
    assert_eq!(
        follower_decision(&known(versioned(Some("x"), 30)), &me, now),
        Decision::WaitUntil(seen + Duration::from_secs(30))
    );
    assert_eq!(
        follower_decision(&known(versioned(Some("x"), 4)), &me, now),
        Decision::Acquire
    );
    assert_eq!(
        follower_decision(&known(versioned(None, 30)), &me, now),
        Decision::Acquire
    );
    assert_eq!(
        follower_decision(&known(versioned(Some(""), 30)), &me, now),
        Decision::Acquire
    );
    assert_eq!(
        follower_decision(&known(versioned(Some("me"), 30)), &me, now),
        Decision::Acquire
    );
    let mut namesake = versioned(Some("me"), 30);
    namesake.record.instance = Some("i2".into());
    assert_eq!(
        follower_decision(&known(namesake.clone()), &me, now),
        Decision::WaitUntil(seen + Duration::from_secs(30)),
        "another process under this identity is another holder"
    );
    namesake.record.instance = None;
    assert_eq!(
        follower_decision(&known(namesake.clone()), &me, now),
        Decision::WaitUntil(seen + Duration::from_secs(30)),
        "a record without an instance (another writer, an older baton) is nobody's own"
    );
    let s = follower_status(Some(&known(namesake)), "demo", &me, 1);
    assert_eq!((s.role, s.holder.as_deref()), (Role::Following, Some("me")));
    let none = Sighting {
        record: None,
        at: now,
    };
    assert_eq!(follower_decision(&none, &me, now), Decision::Acquire);
    let s = follower_status(Some(&known(versioned(Some("x"), 30))), "demo", &me, 1);
    assert_eq!(
        (s.role, s.holder.as_deref(), s.term),
        (Role::Following, Some("x"), 3)
    );
}

#[test]
fn a_leader_judges_what_it_sees_by_holder_and_term() {
    let me = Me {
        identity: "me".into(),
        instance: "i1".into(),
    };
    let v = |version: &str, holder: &str, term| {
        let mut record = record(Some(holder), term, 10);
        record.instance = (holder == "me").then(|| "i1".to_owned());
        Versioned {
            version: version.into(),
            record,
        }
    };
    let current = v("5", "me", 2);
    assert_eq!(judge_sighting(Some(&current), &current, &me, 2), Verdict::Same);
    let missed = v("6", "me", 2);
    assert_eq!(
        judge_sighting(Some(&missed), &current, &me, 2),
        Verdict::Ours(Box::new(missed.clone()))
    );
    assert_eq!(
        judge_sighting(Some(&v("7", "other", 3)), &current, &me, 2),
        Verdict::Lost
    );
    assert_eq!(
        judge_sighting(Some(&v("7", "me", 3)), &current, &me, 2),
        Verdict::Lost,
        "a later term of mine is not this term"
    );
    let mut namesake = v("8", "me", 2);
    namesake.record.instance = Some("i2".into());
    assert_eq!(
        judge_sighting(Some(&namesake), &current, &me, 2),
        Verdict::Lost,
        "another process under this identity, even in this term"
    );
    assert_eq!(judge_sighting(None, &current, &me, 2), Verdict::Lost);
}

#[tokio::test(start_paused = true)]
async fn new_timings_set_the_subscriptions_polling_period_once_adopted() {
    // A follower of a foreign holder's long lease: every read it makes
    // while the store is down is its subscription's poll.
    let c = Cluster::new();
    c.store.write_raw(LEASE, record(Some("x"), 1, 1000));
    let cfg = ElectorConfig {
        lease: LEASE.into(),
        identity: "a".into(),
        timings: timings(),
        host: HostHandle::default().subscribe(),
    };
    let (mut elector, mut rx, _intent) = Elector::new(cfg, Arc::new(c.store.client()), c.clock.clone());
    let (new_timings, source) = watch::channel(timings());
    elector.set_timings_source(source);
    let heartbeat = elector.heartbeat();
    let _task = tokio::spawn(elector.run());
    rx.wait_for(|v| v.status.role == Role::Following).await.unwrap();

    let reads_in_20s = || async {
        c.store.set_unavailable(true);
        c.store.reset_op_counts();
        sleep(secs(20)).await;
        c.store.set_unavailable(false);
        let gets = c.store.op_counts().get;
        // Watching again.
        sleep(secs(10)).await;
        gets
    };
    // Retry period 1 s: a read every 1 to 1.5 s.
    let before = reads_in_20s().await;
    assert!((13..=21).contains(&before), "{before} reads in 20 s");

    let slower = Timings {
        retry_period: secs(4),
        ..timings()
    };
    slower.validate().unwrap();
    new_timings.send_replace(slower);
    // A follower takes them at once (it is woken for them).
    timeout(Duration::from_millis(10), async {
        while heartbeat.longest_step() != longest_step(&slower) {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("adopted at once");
    // Retry period 4 s: a read every 4 to 6 s.
    let after = reads_in_20s().await;
    assert!(
        (3..=6).contains(&after),
        "{after} reads in 20 s at the new retry period"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_at_start_is_retried_with_back_off_not_hammered() {
    let c = Cluster::new();
    c.store.set_unavailable(true);
    let mut a = c.start("a");
    sleep(secs(10)).await;
    let counts = c.store.op_counts();
    // One read per retry period (jittered x [1, 1.5]) at most, plus watch attempts.
    assert!(counts.get <= 11, "{counts:?}");
    assert!(!a.rx.borrow().status.is_leading());
    c.store.set_unavailable(false);
    let s = a.until_leading().await;
    assert_eq!(s.term, 1);
}

#[tokio::test(start_paused = true)]
async fn a_store_that_keeps_refusing_what_it_shows_is_retried_with_back_off() {
    // A free lease whose writes conflict while reads show it unchanged
    // (for example a store whose own bookkeeping refuses the write): the
    // candidate must not spin, writing once per retry period at most.
    let c = Cluster::new();
    c.store.write_raw(LEASE, record(None, 4, 1));
    c.store.inject_conflict_next(1_000);
    let mut a = c.start("a");
    sleep(secs(10)).await;
    let counts = c.store.op_counts();
    assert!(counts.create + counts.update <= 11, "{counts:?}");
    assert!(counts.update >= 5, "it keeps trying: {counts:?}");
    assert!(!a.rx.borrow().status.is_leading());
    c.store.inject_conflict_next(0);
    let s = a.until_leading().await;
    assert_eq!(s.term, 5);
}

#[tokio::test(start_paused = true)]
async fn a_store_call_is_bounded_by_the_time_left_in_the_term() {
    // Requests may take up to request-timeout; a renewal started 0.5 s
    // before the deadline must give up at the deadline, not 0.5 s later.
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let term = a.term();
    c.store.set_latency(Duration::from_millis(900));
    // Renewals now confirm 0.9 s after they start: the lead holds.
    sleep(secs(8)).await;
    assert!(a.rx.borrow().status.is_leading());
    c.store.hang(true);
    let until = term.lead_until();
    a.until_not_leading().await;
    assert!(
        c.clock.now() <= until,
        "{:?} after the deadline",
        c.clock.now() - until
    );
    let reads_before = c.store.op_counts().get;
    assert!(reads_before < 50);
}

#[tokio::test(start_paused = true)]
async fn a_conflicting_renewal_whose_reread_hangs_steps_down_by_the_deadline() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let term = a.term();
    // Every renewal conflicts and every read hangs: the leader can neither
    // renew nor learn why, and must not linger past its deadline.
    c.store.inject_conflict_next(1_000);
    let reads = c.store.clone();
    tokio::spawn(async move {
        // Let the conflicting renewal through, then hang its re-read.
        loop {
            sleep(Duration::from_millis(50)).await;
            if reads.op_counts().update > 0 {
                reads.hang(true);
                break;
            }
        }
    });
    let until = term.lead_until();
    a.until_not_leading().await;
    assert!(c.clock.now() <= until);
    assert!(term.is_over());
}

#[tokio::test(start_paused = true)]
async fn the_store_sees_what_the_elector_wrote_through_another_client() {
    // Sanity: each candidate has its own client, sharing one store.
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let other = c.store.client();
    let seen = other.get(LEASE).await.unwrap().unwrap();
    assert_eq!(seen.record.holder(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn a_new_term_waits_for_the_tasks_of_an_earlier_term_and_so_does_a_release() {
    // Term 1 ends at its deadline (the store hung) while its task is still
    // within its grace; the store recovers. This host takes the lease again
    // only once term 1's task is gone, as another host could only after
    // term 1's force-stop time: no task of term 1 runs beside one of term 2.
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let first = a.term();
    let task = first.enter().unwrap();
    c.store.hang(true);
    a.until_not_leading().await;
    c.store.hang(false);
    sleep(secs(5)).await;
    assert!(
        !a.rx.borrow().status.is_leading(),
        "term 2 began beside term 1's task"
    );
    drop(task);
    let s =
        a.rx.wait_for(|v| v.status.is_leading())
            .await
            .unwrap()
            .status
            .clone();
    assert_eq!(s.term, 2);
    // And a release waits for every task of the lease's terms.
    let second = a.term().enter().unwrap();
    a.intent.send_replace(Intent::Stop);
    sleep(Duration::from_millis(500)).await;
    assert!(!a.task.is_finished());
    assert_eq!(
        c.store.peek(LEASE).unwrap().record.holder(),
        Some("a"),
        "not released while term 2's task runs"
    );
    drop(second);
    a.task.await.unwrap().unwrap();
    assert_eq!(
        c.store.peek(LEASE).unwrap().record.holder(),
        None,
        "released once it is gone"
    );
}

#[tokio::test(start_paused = true)]
async fn an_elector_whose_host_is_gone_hands_the_lease_over_and_stops() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    drop(a.intent);
    a.task.await.unwrap().unwrap();
    assert_eq!(c.store.peek(LEASE).unwrap().record.holder(), None);
}

#[tokio::test(start_paused = true)]
async fn an_elector_whose_subscription_died_stops_without_releasing() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    c.store.panic_next_watch();
    c.store.break_watches();
    let err = a.task.await.unwrap().unwrap_err();
    assert!(matches!(err, ElectorError::SubscriptionEnded { .. }), "{err}");
    assert_eq!(
        c.store.peek(LEASE).unwrap().record.holder(),
        Some("a"),
        "left to expire"
    );
}

#[tokio::test(start_paused = true)]
async fn two_processes_under_one_identity_never_both_lead_and_do_not_storm() {
    let c = Cluster::new();
    let mut a = c.start("same");
    let first = a.until_leading().await;
    let writes = c.store.op_counts().update + c.store.op_counts().create;
    // A second process under the same identity: it does not take a's
    // record for its own, waits, sees a renew, and stops, naming it.
    let mut b = c.start("same");
    let err = tokio::time::timeout(secs(30), &mut b.task)
        .await
        .expect("b stops")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&err, ElectorError::DuplicateIdentity { identity, .. } if identity == "same"),
        "{err}"
    );
    assert!(
        err.to_string().contains("identities must be unique per process"),
        "{err}"
    );
    assert!(!b.rx.borrow().status.is_leading(), "b never led");
    // a led on in its term throughout: no storm of terms.
    let now = a.rx.borrow().status.clone();
    assert!(now.is_leading() && now.term == first.term, "a: {now:?}");
    assert_eq!(c.store.peek(LEASE).unwrap().record.term, first.term);
    let counts = c.store.op_counts();
    // a's renewals only (one per retry period), b wrote nothing.
    assert!(counts.update + counts.create - writes <= 6, "{counts:?}");
    sleep(secs(30)).await;
    assert_eq!(c.store.peek(LEASE).unwrap().record.term, first.term);
}

#[tokio::test(start_paused = true)]
async fn a_process_restarted_under_its_identity_waits_out_the_lease_of_the_one_before() {
    let c = Cluster::new();
    let mut a = c.start("same");
    let first = a.until_leading().await;
    a.task.abort(); // killed: its record stays, held
    let killed = Instant::now();
    let mut again = c.start("same");
    let second = again.until_leading().await;
    let waited = Instant::now() - killed;
    assert!(
        waited >= secs(10) - secs(1),
        "the new process took its namesake's record at once ({waited:?}); it must wait out the lease"
    );
    assert_eq!(second.term, first.term + 1);
}

#[tokio::test(start_paused = true)]
async fn a_restarted_process_whose_predecessors_lease_is_deleted_does_not_take_the_deletion_for_a_renewal() {
    // The deleted record reads as a tombstone held by the namesake, under a
    // version of its own: a store's reading, not a write by the namesake.
    let c = Cluster::new();
    let mut a = c.start("same");
    let first = a.until_leading().await;
    a.task.abort(); // killed: its record stays, held
    let mut again = c.start("same");
    sleep(secs(2)).await;
    assert!(c.store.delete(LEASE));
    let second = timeout(secs(40), again.until_leading())
        .await
        .expect("the restarted process leads once the deleted record's lease ran out");
    assert!(second.term > first.term);
}

#[tokio::test(start_paused = true)]
async fn a_deferring_host_takes_a_released_lease_only_after_the_head_start() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let mut b = c.start("b");
    b.until_following().await;
    b.intent.send_replace(Intent::Defer { head_start: secs(3) });
    a.intent.send_replace(Intent::Stop);
    a.task.await.unwrap().unwrap();
    let released = Instant::now();
    let s = b.until_leading().await;
    assert_eq!(s.term, 2);
    assert!(
        Instant::now() >= released + secs(3),
        "took it {:?} after the release",
        released.elapsed()
    );
    assert!(
        Instant::now() < released + secs(4),
        "took it {:?} after the release",
        released.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_deferring_host_takes_an_expired_lease_within_half_a_retry_period() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let mut b = c.start("b");
    b.until_following().await;
    b.intent.send_replace(Intent::Defer { head_start: secs(60) });
    // a dies: nothing is released; the lease expires after LD (10 s).
    a.task.abort();
    let died = Instant::now();
    b.until_leading().await;
    assert!(
        died.elapsed() <= timings().lease_duration + timings().retry_period * 2,
        "{:?}",
        died.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_hand_over_ends_its_term_once_and_a_later_term_is_kept() {
    let c = Cluster::new();
    let mut a = c.start("a");
    let s = a.until_leading().await;
    a.intent.send_replace(Intent::HandOver {
        term: s.term,
        head_start: secs(1),
    });
    a.until_not_leading().await;
    let released = Instant::now();
    // Nobody else takes it: a takes it back after the head start, in a
    // new term, and keeps it.
    let s = a.until_leading().await;
    assert_eq!(s.term, 2);
    assert!(released.elapsed() >= secs(1));
    sleep(secs(30)).await;
    let now = a.rx.borrow().status.clone();
    assert!(now.is_leading() && now.term == 2, "{now:?}");
}

#[tokio::test(start_paused = true)]
async fn a_deferring_leader_leads_on() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    a.intent.send_replace(Intent::Defer { head_start: secs(1) });
    sleep(secs(30)).await;
    let now = a.rx.borrow().status.clone();
    assert!(now.is_leading() && now.term == 1, "{now:?}");
}

#[tokio::test(start_paused = true)]
async fn a_yield_says_so_in_its_release_and_a_deferring_host_takes_it_at_once() {
    let c = Cluster::new();
    let mut a = c.start("a");
    a.until_leading().await;
    let mut b = c.start("b");
    b.until_following().await;
    // b defers to a (a long head start): after a plain release it would
    // wait; after a yield nobody waits for a.
    b.intent.send_replace(Intent::Defer { head_start: secs(5) });
    let yielded_at = Instant::now();
    a.intent.send_replace(Intent::StandBy {
        until: yielded_at + secs(20),
    });
    let s = b.until_leading().await;
    assert_eq!(s.term, 2);
    assert!(
        yielded_at.elapsed() < Duration::from_millis(100),
        "took {:?}",
        yielded_at.elapsed()
    );
    // Both saw the yield, with a's time to stand by from when they saw it.
    for v in [&a.rx, &b.rx] {
        let seen = v.borrow().yielded.clone().expect("the yield was seen");
        assert_eq!(seen.by, "a");
        assert!(seen.until >= yielded_at + secs(20) - Duration::from_millis(100));
        assert!(seen.until <= yielded_at + secs(20) + Duration::from_millis(100));
    }
    // b's own record no longer carries it.
    assert_eq!(c.store.peek(LEASE).unwrap().record.yielded, None);
    // A plain release says nothing of a yield.
    b.intent.send_replace(Intent::Stop);
    b.task.await.unwrap().unwrap();
    let released = c.store.peek(LEASE).unwrap().record;
    assert_eq!(released.holder(), None);
    assert_eq!(released.yielded, None);
}
