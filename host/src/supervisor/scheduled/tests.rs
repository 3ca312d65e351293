//! Tests of [`scheduled`](super): each skip the progress holds is logged and
//! counted once, also when the store did not answer the write that holds it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::election::{LeaseView, Role, Status, TermClock};
use crate::runtime::PluginRuntime;
use crate::runtime::plugin::tests::{guest_lines, spec_of};
use crate::runtime::{EngineOptions, PluginEngine};
use crate::schedule::When;
use crate::store::buckets::{Applied, BucketInfo, Entry};
use crate::store::memory::buckets::MemoryBuckets;
use crate::supervisor::time::HostTime;

/// How a write carrying a skip fails.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// Made, but answered as if the store could not be reached.
    AnswerLost,
    /// Not made.
    Refused,
}

/// Buckets in memory whose next `left` writes carrying a skip fail so.
struct Faulty {
    inner: MemoryBuckets,
    fault: Fault,
    left: AtomicU32,
    /// Told of each write that fails (once it has failed).
    failed: tokio::sync::Notify,
}

impl Faulty {
    fn fails(&self, write: &Write) -> bool {
        let skips = write.ops.iter().any(|op| match op {
            Op::Set { value, .. } => Progress::from_bytes(value).is_ok_and(|p| p.last_skip.is_some()),
            _ => false,
        });
        skips
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
    }
}

#[async_trait::async_trait]
impl BucketStore for Faulty {
    fn describe(&self) -> String {
        "faulty buckets".into()
    }
    async fn claim(&self, bucket: &BucketName, term: u64) -> Result<u64, BucketError> {
        self.inner.claim(bucket, term).await
    }
    async fn get(&self, bucket: &BucketName, key: &str) -> Result<Option<Entry>, BucketError> {
        self.inner.get(bucket, key).await
    }
    async fn get_many(
        &self,
        bucket: &BucketName,
        keys: &[String],
    ) -> Result<Vec<Option<Entry>>, BucketError> {
        self.inner.get_many(bucket, keys).await
    }
    async fn list_keys(
        &self,
        bucket: &BucketName,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, BucketError> {
        self.inner.list_keys(bucket, after, limit).await
    }
    async fn apply(&self, bucket: &BucketName, write: Write) -> Result<Applied, BucketError> {
        let fails = self.fails(&write);
        let unavailable = || BucketError::Unavailable {
            bucket: bucket.clone(),
            detail: "no answer".into(),
        };
        let applied = match self.fault {
            Fault::Refused if fails => Err(unavailable()),
            Fault::AnswerLost if fails => self.inner.apply(bucket, write).await.and(Err(unavailable())),
            _ => self.inner.apply(bucket, write).await,
        };
        if fails {
            self.failed.notify_one();
        }
        applied
    }
    async fn buckets(&self, lease: Option<&str>) -> Result<Vec<BucketInfo>, BucketError> {
        self.inner.buckets(lease).await
    }
}

/// The skips counted, by reason.
#[derive(Default)]
struct Counted(Mutex<BTreeMap<String, u64>>);

impl TaskObserver for Counted {
    fn schedule_skipped(&self, _: &str, reason: &'static str, count: u64) {
        *self.0.lock().unwrap().entry(reason.into()).or_default() += count;
    }
}

/// When the test's term ends.
enum Ends {
    /// After this long.
    After(Duration),
    /// As the first write carrying a skip fails (whatever the time: a busy
    /// machine may take long to get there).
    AtFirstFault,
    /// Once the stored progress has no run going (the run recorded as
    /// ended, or given up), however long that takes.
    OnceNothingRuns,
}

/// Runs one term of `sched-probe` every second, ending as `ends` says, over
/// a progress last handled ten seconds ago (nine due times to skip as
/// superseded), the first `faults` writes carrying a skip failing with
/// `fault`. Returns the host's log, the skips counted and the progress left.
fn term_over_old_progress(
    fault: Fault,
    faults: u32,
    ends: Ends,
) -> (String, BTreeMap<String, u64>, Progress) {
    let when = When::every(Duration::from_secs(1)).unwrap();
    let old = Progress {
        when: Some(when.to_string()),
        handled: Some(millis(
            when.last_at_or_before(SystemTime::now() - Duration::from_secs(10))
                .unwrap(),
        )),
        ..Progress::default()
    };
    one_term_ending(Schedule::new(when), old, fault, faults, ends)
}

/// [`one_term`], the term ending as `ends` says.
fn one_term_ending(
    schedule: Schedule,
    old: Progress,
    fault: Fault,
    faults: u32,
    ends: Ends,
) -> (String, BTreeMap<String, u64>, Progress) {
    let lasts = match ends {
        Ends::After(lasts) => lasts,
        // A bound only a test that never gets there reaches.
        Ends::AtFirstFault | Ends::OnceNothingRuns => Duration::from_secs(60),
    };
    let records = tempfile::tempdir().unwrap();
    let runtime = PluginRuntime::new(PluginEngine::new(EngineOptions::default()).unwrap()).unwrap();
    let env = [("SCHED_RECORDS", "/records"), ("SCHED_HOST", "h1")];
    let plugin = Arc::new(
        runtime
            .load(&spec_of("sched_probe.wasm", &env, Some(records.path())))
            .unwrap(),
    );
    let store = Arc::new(Faulty {
        inner: MemoryBuckets::new(),
        fault,
        left: AtomicU32::new(faults),
        failed: tokio::sync::Notify::new(),
    });
    let counted = Arc::new(Counted::default());
    let bucket = BucketName::new("sched", SCHEDULES_BUCKET);
    let (_schedules, schedule) = watch::channel(Some(schedule));
    let scheduling = Scheduling {
        schedule,
        store: store.clone(),
        host: "h1".into(),
        run_now: Arc::new(tokio::sync::Mutex::new(mpsc::unbounded_channel().1)),
    };
    let log = guest_lines(|| async {
        let seed = Write::new(
            1,
            vec![Op::Set {
                key: plugin.name().into(),
                value: old.to_bytes(),
            }],
            Limits::default(),
        );
        store.inner.apply(&bucket, seed).await.unwrap();
        let clock = TermClock::system();
        let term = Term::begin(
            "sched",
            5,
            Duration::from_millis(200),
            clock.clone(),
            clock.now() + lasts,
        );
        let view = LeaseView {
            status: Status {
                role: Role::Leading,
                holder: Some("h1".into()),
                lease: "sched".into(),
                term: 5,
            },
            term: Some(term.clone()),
            since: clock.now(),
            yielded: None,
            holder_address: None,
        };
        let (_elector, view) = watch::channel(view);
        let ender = async {
            let nothing_runs = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let stored = store.inner.get(&bucket, plugin.name()).await.unwrap();
                    if stored.is_some_and(|e| Progress::from_bytes(&e.value).unwrap().running.is_none()) {
                        return;
                    }
                }
            };
            match ends {
                Ends::After(_) => {}
                Ends::AtFirstFault => tokio::select! {
                    () = store.failed.notified() => term.end(clock.now()),
                    () = term.over() => {}
                },
                Ends::OnceNothingRuns => tokio::select! {
                    () = nothing_runs => term.end(clock.now()),
                    () = term.over() => {}
                },
            }
        };
        tokio::join!(
            run_scheduled_term(&plugin, &term, &view, &*counted, &scheduling, &HostTime::System),
            ender
        );
    });
    let left = store.inner.get(&bucket, plugin.name());
    let left = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(left)
        .unwrap()
        .unwrap();
    let counted = counted.0.lock().unwrap().clone();
    (log, counted, Progress::from_bytes(&left.value).unwrap())
}

/// The due times the log says were skipped, by reason (confirmed only).
fn logged_skips(log: &str) -> BTreeMap<String, u64> {
    let mut skips = BTreeMap::new();
    for line in log
        .lines()
        .filter(|l| l.contains("scheduled runs skipped plugin"))
    {
        let field = |name: &str| {
            line.split(&format!(" {name}="))
                .nth(1)
                .and_then(|v| v.split(' ').next())
                .unwrap()
        };
        *skips
            .entry(field("reason").trim_matches('"').to_owned())
            .or_default() += field("count").parse::<u64>().unwrap();
    }
    skips
}

#[test]
fn a_skip_whose_answer_was_lost_is_logged_once_the_progress_shows_it() {
    for fault in [Fault::AnswerLost, Fault::Refused] {
        let (log, counted, left) = term_over_old_progress(fault, 1, Ends::After(Duration::from_millis(2500)));
        assert!(
            left.skipped.get("superseded").is_some_and(|n| *n >= 9),
            "{left:?}"
        );
        assert_eq!(
            counted, left.skipped,
            "the skips counted are those written: {log}"
        );
        assert_eq!(
            logged_skips(&log),
            left.skipped,
            "the skips logged are those written: {log}"
        );
        assert!(!log.contains("unconfirmed"), "{log}");
    }
}

#[test]
fn a_skip_unanswered_when_the_term_ends_is_logged_as_unconfirmed() {
    // The term ends as the store fails to answer the skip's write: the
    // skip is then unconfirmed, however long the machine took to write it.
    let (log, counted, left) = term_over_old_progress(Fault::AnswerLost, u32::MAX, Ends::AtFirstFault);
    assert!(counted.is_empty(), "{counted:?}");
    assert!(
        left.skipped.get("superseded").is_some_and(|n| *n >= 9),
        "{left:?}"
    );
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("scheduled runs skipped"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains("unconfirmed") && said[0].contains("reason=\"superseded\""),
        "{log}"
    );
}

/// A progress whose `baton run-now` run, asked `ago`, was cut off by
/// term 4's end, on an hourly schedule handled up to its last due time
/// (so nothing scheduled is due while the test runs).
fn run_now_cut_off(ago: Duration) -> (Schedule, Progress, u64) {
    let when = When::every(Duration::from_secs(3600)).unwrap();
    let asked = millis(SystemTime::now() - ago);
    let mut old = Progress {
        when: Some(when.to_string()),
        handled: Some(millis(when.last_at_or_before(SystemTime::now()).unwrap())),
        ..Progress::default()
    };
    old.started(RunRecord {
        due: asked,
        attempt: 0,
        on_demand: true,
        started: asked,
        ended: None,
        outcome: None,
        host: "h0".into(),
        term: 4,
    });
    let mut schedule = Schedule::new(when);
    // Far past what a busy machine takes to get to the run.
    schedule.starting_deadline = Some(Duration::from_secs(60));
    (schedule, old, asked)
}

#[test]
fn a_cut_off_run_now_run_runs_again_on_demand_for_the_same_time_outside_the_schedule() {
    let (schedule, old, asked) = run_now_cut_off(Duration::from_millis(300));
    let (log, counted, left) =
        one_term_ending(schedule, old.clone(), Fault::Refused, 0, Ends::OnceNothingRuns);
    // The guest was told it runs on demand, for the time it was asked.
    assert!(
        log.contains(&format!("sched run due={asked} attempt=1 on_demand=true term=5")),
        "{log}"
    );
    let ran = left.last().unwrap();
    assert!(ran.on_demand && ran.due == asked && ran.attempt == 1, "{left:?}");
    assert_eq!(ran.outcome.as_deref(), Some("ok"), "{left:?}");
    // Nothing of the schedule changed.
    assert_eq!(left.handled, old.handled, "{left:?}");
    assert!(
        left.skipped.is_empty() && counted.is_empty(),
        "{left:?} {counted:?}"
    );
}

#[test]
fn a_cut_off_run_now_run_past_its_deadline_is_given_up_not_counted_as_a_skip() {
    let (schedule, old, asked) = run_now_cut_off(Duration::from_secs(120));
    let (log, counted, left) =
        one_term_ending(schedule, old.clone(), Fault::Refused, 0, Ends::OnceNothingRuns);
    assert!(!log.contains("sched run due="), "not run again: {log}");
    assert!(left.running.is_none(), "{left:?}");
    let given_up = left.last().unwrap();
    assert!(given_up.on_demand && given_up.due == asked, "{left:?}");
    assert_eq!(given_up.outcome.as_deref(), Some("cut off"), "{left:?}");
    assert_eq!(left.handled, old.handled, "{left:?}");
    assert!(left.skipped.is_empty() && left.last_skip.is_none(), "{left:?}");
    assert!(counted.is_empty(), "{counted:?}");
    assert!(!log.contains("scheduled runs skipped"), "{log}");
}
