//! Tests of [`schedule`](super): due times across daylight-saving changes,
//! and the leader's decisions under a fake clock (every `now` is given).

use std::time::{Duration, SystemTime};

use super::*;

/// A time from RFC 3339.
fn at(s: &str) -> SystemTime {
    let ts: jiff::Timestamp = s.parse().unwrap();
    from_millis(u64::try_from(ts.as_millisecond()).unwrap())
}

fn show(t: SystemTime) -> String {
    jiff::Timestamp::from_millisecond(i64::try_from(millis(t)).unwrap())
        .unwrap()
        .to_string()
}

/// The due times of `when` after `from`, `n` of them, in UTC.
fn dues(when: &When, from: &str, n: usize) -> Vec<String> {
    let mut t = at(from);
    (0..n)
        .map(|_| {
            t = when.next_after(t).unwrap();
            show(t)
        })
        .collect()
}

#[test]
fn every_is_counted_from_the_epoch_so_every_host_agrees() {
    let when = When::every(Duration::from_secs(30)).unwrap();
    assert_eq!(
        dues(&when, "2026-12-04T10:00:10.5Z", 2),
        ["2026-12-04T10:00:30Z", "2026-12-04T10:01:00Z"]
    );
    assert_eq!(
        show(when.last_at_or_before(at("2026-12-04T10:00:59Z")).unwrap()),
        "2026-12-04T10:00:30Z"
    );
    assert!(When::every(Duration::from_millis(50)).is_err());
}

#[test]
fn cron_seconds_are_optional_and_time_zones_apply() {
    let five = When::cron("*/5 * * * *", None).unwrap();
    assert_eq!(
        dues(&five, "2026-12-04T10:03:00Z", 2),
        ["2026-12-04T10:05:00Z", "2026-12-04T10:10:00Z"]
    );
    let secs = When::cron("*/20 * * * * *", None).unwrap();
    assert_eq!(
        dues(&secs, "2026-12-04T10:00:00.300Z", 2),
        ["2026-12-04T10:00:20Z", "2026-12-04T10:00:40Z"]
    );
    let berlin = When::cron("0 9 * * *", Some("Europe/Berlin")).unwrap();
    assert_eq!(dues(&berlin, "2026-12-04T00:00:00Z", 1), ["2026-12-04T08:00:00Z"]);
    assert!(
        When::cron("0 9 * * *", Some("Mars/Olympus"))
            .unwrap_err()
            .to_string()
            .contains("Mars/Olympus")
    );
}

#[test]
fn a_daily_run_in_the_hour_that_daylight_saving_skips_or_repeats_runs_once_a_day() {
    let when = When::cron("30 2 * * *", Some("Europe/Berlin")).unwrap();
    // Spring forward, 2026-03-29: 02:00 CET becomes 03:00 CEST, so 02:30
    // does not exist that day.
    let spring = dues(&when, "2026-03-27T12:00:00Z", 3);
    assert_eq!(spring[0], "2026-03-28T01:30:00Z");
    assert_eq!(spring[2], "2026-03-30T00:30:00Z");
    assert!(
        spring[1].starts_with("2026-03-29"),
        "one run on the short day: {spring:?}"
    );
    // Fall back, 2026-10-25: 03:00 CEST becomes 02:00 CET, so 02:30 comes
    // twice; it runs once.
    let fall = dues(&when, "2026-10-24T12:00:00Z", 2);
    assert!(fall[0].starts_with("2026-10-25T0"), "{fall:?}");
    assert_eq!(
        fall[1], "2026-10-26T01:30:00Z",
        "no second run at the repeated 02:30: {fall:?}"
    );
}

fn every_second() -> Schedule {
    Schedule::new(When::every(Duration::from_secs(1)).unwrap())
}

fn handled(s: &str) -> Progress {
    Progress {
        handled: Some(millis(at(s))),
        ..Progress::default()
    }
}

#[test]
fn a_new_schedule_starts_from_now_and_waits_for_its_next_due_time() {
    let s = every_second();
    let first = next(&s, &Progress::default(), at("2026-12-04T10:00:00.400Z"));
    assert_eq!(
        first,
        Next::Skip {
            upto: at("2026-12-04T10:00:00Z"),
            count: 0,
            reason: SkipReason::Missed
        }
    );
    let p = handled("2026-12-04T10:00:00Z");
    assert_eq!(
        next(&s, &p, at("2026-12-04T10:00:00.400Z")),
        Next::Wait(at("2026-12-04T10:00:01Z"))
    );
    assert_eq!(
        next(&s, &p, at("2026-12-04T10:00:01.002Z")),
        Next::Run {
            due: at("2026-12-04T10:00:01Z"),
            attempt: 0,
            on_demand: false
        }
    );
}

#[test]
fn missed_due_times_run_once_within_the_deadline_and_are_skipped_past_it() {
    let s = every_second();
    let p = handled("2026-12-04T10:00:00Z");
    // 10:00:01 to :04 were missed; :05 is 300 ms late, within one period.
    let now = at("2026-12-04T10:00:05.300Z");
    assert_eq!(
        next(&s, &p, now),
        Next::Skip {
            upto: at("2026-12-04T10:00:04Z"),
            count: 4,
            reason: SkipReason::Superseded
        }
    );
    let p = handled("2026-12-04T10:00:04Z");
    assert_eq!(
        next(&s, &p, now),
        Next::Run {
            due: at("2026-12-04T10:00:05Z"),
            attempt: 0,
            on_demand: false
        }
    );
    // Past its deadline (one period) and no later one due yet: skipped.
    let mut late = every_second();
    late.starting_deadline = Some(Duration::from_millis(200));
    assert_eq!(
        next(&late, &p, now),
        Next::Skip {
            upto: at("2026-12-04T10:00:05Z"),
            count: 1,
            reason: SkipReason::Missed
        }
    );
}

#[test]
fn catch_up_all_runs_each_missed_time_within_the_deadline_in_order() {
    let mut s = every_second();
    s.catch_up = CatchUp::All;
    s.starting_deadline = Some(Duration::from_millis(2500));
    let p = handled("2026-12-04T10:00:00Z");
    let now = at("2026-12-04T10:00:05.300Z");
    // :01 and :02 are past 2.5 s; :03 is not.
    assert_eq!(
        next(&s, &p, now),
        Next::Skip {
            upto: at("2026-12-04T10:00:02Z"),
            count: 2,
            reason: SkipReason::Missed
        }
    );
    let p = handled("2026-12-04T10:00:02Z");
    assert_eq!(
        next(&s, &p, now),
        Next::Run {
            due: at("2026-12-04T10:00:03Z"),
            attempt: 0,
            on_demand: false
        }
    );
}

#[test]
fn a_run_cut_off_by_its_terms_end_runs_again_within_its_deadline_then_is_skipped() {
    let s = every_second();
    let mut p = handled("2026-12-04T10:00:00Z");
    p.started(RunRecord {
        due: millis(at("2026-12-04T10:00:01Z")),
        attempt: 0,
        on_demand: false,
        started: millis(at("2026-12-04T10:00:01Z")),
        ended: None,
        outcome: None,
        host: "a".into(),
        term: 3,
    });
    let soon = at("2026-12-04T10:00:01.800Z");
    assert_eq!(
        next(&s, &p, soon),
        Next::Run {
            due: at("2026-12-04T10:00:01Z"),
            attempt: 1,
            on_demand: false
        }
    );
    let later = at("2026-12-04T10:00:02.500Z");
    assert_eq!(
        next(&s, &p, later),
        Next::Skip {
            upto: at("2026-12-04T10:00:01Z"),
            count: 1,
            reason: SkipReason::CutOff
        }
    );
    p.cut_off();
    assert_eq!(p.last().unwrap().outcome.as_deref(), Some("cut off"));
    assert_eq!(
        p.handled,
        Some(millis(at("2026-12-04T10:00:00Z"))),
        "a cut-off run is not handled"
    );
}

#[test]
fn an_ended_run_is_handled_and_never_due_again_and_suspend_idles() {
    let mut s = every_second();
    let mut p = handled("2026-12-04T10:00:00Z");
    let due = at("2026-12-04T10:00:01Z");
    p.started(RunRecord {
        due: millis(due),
        attempt: 0,
        on_demand: false,
        started: millis(due),
        ended: None,
        outcome: None,
        host: "a".into(),
        term: 3,
    });
    p.ended(at("2026-12-04T10:00:01.200Z"), "ok");
    assert_eq!(p.handled, Some(millis(due)));
    assert_eq!(
        next(&s, &p, at("2026-12-04T10:00:01.900Z")),
        Next::Wait(at("2026-12-04T10:00:02Z"))
    );
    let stored = Progress::from_bytes(&p.to_bytes()).unwrap();
    assert_eq!(stored, p);
    s.suspend = true;
    assert_eq!(next(&s, &p, at("2026-12-04T10:00:05Z")), Next::Idle);
}

#[test]
fn a_cut_off_run_now_run_runs_again_on_demand_then_is_given_up_outside_the_skips() {
    let s = every_second();
    let mut p = handled("2026-12-04T10:00:00Z");
    let asked = at("2026-12-04T10:00:00.250Z");
    p.started(RunRecord {
        due: millis(asked),
        attempt: 0,
        on_demand: true,
        started: millis(asked),
        ended: None,
        outcome: None,
        host: "a".into(),
        term: 3,
    });
    assert_eq!(
        next(&s, &p, at("2026-12-04T10:00:00.900Z")),
        Next::Run {
            due: asked,
            attempt: 1,
            on_demand: true
        }
    );
    // Past its deadline (one period): given up, not skipped.
    assert_eq!(
        next(&s, &p, at("2026-12-04T10:00:01.500Z")),
        Next::GiveUp { due: asked }
    );
}
