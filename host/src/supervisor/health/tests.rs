use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::supervisor::time::HostTime;

/// A check that answers from a script, each after `takes`, and notes when
/// it was called.
struct Script {
    answers: VecDeque<bool>,
    takes: Duration,
    called: Vec<Duration>,
    start: Instant,
}

impl Script {
    fn new(answers: &[bool], takes: Duration) -> Script {
        Script {
            answers: answers.iter().copied().collect(),
            takes,
            called: Vec::new(),
            start: Instant::now(),
        }
    }
}

impl Check for Script {
    fn check(&mut self, _timeout: Duration) -> impl Future<Output = CheckOutcome> + Send {
        self.called.push(self.start.elapsed());
        let healthy = self.answers.pop_front().expect("no more checks scripted");
        let takes = self.takes;
        async move {
            tokio::time::sleep(takes).await;
            if healthy {
                CheckOutcome::Healthy
            } else {
                CheckOutcome::Unhealthy("down".into())
            }
        }
    }
}

fn settings(threshold: u32) -> HealthCheck {
    HealthCheck {
        period: Duration::from_secs(5),
        timeout: Duration::from_secs(1),
        threshold,
        back_off: Duration::from_secs(60),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn a_success_resets_the_count_and_the_threshold_is_reached_in_a_row() {
    let mut count = FailureCount::new(3);
    assert_eq!(count.record(false), (1, false));
    assert_eq!(count.record(false), (2, false));
    assert_eq!(count.record(true), (0, false));
    assert_eq!(count.record(false), (1, false));
    assert_eq!(count.record(false), (2, false));
    assert_eq!(count.record(false), (3, true));
    // A threshold of 1: the first failure.
    assert_eq!(FailureCount::new(1).record(false), (1, true));
}

#[tokio::test(start_paused = true)]
async fn checks_come_every_period_and_threshold_failures_in_a_row_end_the_watch() {
    let mut script = Script::new(&[true, false, false, true, false, false, false], secs(1));
    let mut seen = Vec::new();
    let started = Instant::now();
    let last = watch_health(
        &mut script,
        &settings(3),
        &HostTime::System,
        std::future::pending(),
        || false,
        |o, n| seen.push((o.as_str(), n)),
    )
    .await;
    assert!(
        matches!(last, Some(CheckOutcome::Unhealthy(ref m)) if m == "down"),
        "{last:?}"
    );
    // One period after the start, then every period (a check's time does
    // not shift the next one).
    let due: Vec<Duration> = (1..=7).map(|i| secs(5 * i)).collect();
    assert_eq!(script.called, due);
    // The seventh check ended one second after it began.
    assert_eq!(started.elapsed(), secs(36));
    assert_eq!(
        seen,
        [
            ("ok", 0),
            ("failed", 1),
            ("failed", 2),
            ("ok", 0),
            ("failed", 1),
            ("failed", 2),
            ("failed", 3)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_end_of_the_term_ends_the_watch_even_during_a_check() {
    // The term ends 12.5 s in, during the second check (10 s to 13 s).
    let mut script = Script::new(&[false, false, false], secs(3));
    let over = tokio::time::sleep(Duration::from_millis(12_500));
    let started = Instant::now();
    let last = watch_health(
        &mut script,
        &settings(2),
        &HostTime::System,
        over,
        || false,
        |_, _| {},
    )
    .await;
    assert!(last.is_none());
    assert_eq!(started.elapsed(), Duration::from_millis(12_500));
    assert_eq!(script.called, [secs(5), secs(10)]);
}

/// A check stopped by the end of its own term: it returns at the moment
/// the term is over, before the watch has seen `over` resolve.
struct EndsTheTerm(Arc<std::sync::atomic::AtomicBool>);

impl Check for EndsTheTerm {
    fn check(&mut self, _timeout: Duration) -> impl Future<Output = CheckOutcome> + Send {
        let ended = self.0.clone();
        async move {
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
            CheckOutcome::Unhealthy("stopped by the host because term 4 ended".into())
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_check_that_returns_once_its_term_is_over_counts_for_nothing() {
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut check = EndsTheTerm(ended.clone());
    let mut reported = Vec::new();
    // `over` never resolves here: only the term's own answer says it ended.
    let last = watch_health(
        &mut check,
        &settings(1),
        &HostTime::System,
        std::future::pending(),
        || ended.load(std::sync::atomic::Ordering::SeqCst),
        |o, n| reported.push((o.as_str(), n)),
    )
    .await;
    // A threshold of 1: counted, it would have handed the lease over.
    assert!(last.is_none(), "{last:?}");
    assert!(reported.is_empty(), "reported after the term: {reported:?}");
}

#[tokio::test(start_paused = true)]
async fn a_hand_over_stands_by_over_contending_but_never_over_a_stop_or_a_longer_stand_by() {
    let now = Instant::now();
    let (intent, _rx) = watch::channel(Intent::Contend);
    assert!(stand_by(&intent, now + secs(60)));
    assert_eq!(
        *intent.borrow(),
        Intent::StandBy {
            until: now + secs(60)
        }
    );
    // A longer stand-by (a yield) is kept; a shorter one is lengthened.
    assert!(!stand_by(&intent, now + secs(30)));
    assert!(stand_by(&intent, now + secs(90)));
    assert_eq!(
        *intent.borrow(),
        Intent::StandBy {
            until: now + secs(90)
        }
    );
    intent.send_replace(Intent::Defer { head_start: secs(3) });
    assert!(stand_by(&intent, now + secs(10)));
    for kept in [Intent::Stop, Intent::Drain] {
        intent.send_replace(kept);
        assert!(!stand_by(&intent, now + secs(10)));
        assert_eq!(*intent.borrow(), kept);
    }
}
