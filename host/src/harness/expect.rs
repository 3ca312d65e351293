//! A step's expectations, checked once its action is done: output, bucket
//! contents, HTTP requests, effects after a term's change, due times run;
//! and, at the end, each due time completed once.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use super::record::Subject;
use super::script::Expect;
use super::verdict::{Verdict, stamp};
use super::{Event, Harness};

/// Where the records stood when a step began.
pub struct Marks {
    events: usize,
}

impl Marks {
    /// The records' lengths now.
    pub fn now(h: &Harness) -> Marks {
        Marks {
            events: h.recorder.events().len(),
        }
    }
}

/// The verdicts of `expect` after a step.
pub async fn expectations(
    h: &Harness,
    s: &Subject,
    expect: &Expect,
    marks: &Marks,
    label: &str,
) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    if !expect.stdout_contains.is_empty() {
        verdicts.push(stdout(s, &expect.stdout_contains, label));
    }
    for (key, wanted) in &expect.kv {
        verdicts.push(kv(h, s, key, wanted.as_deref(), label).await);
    }
    if let Some(n) = expect.http_requests {
        verdicts.push(http_requests(s, n, label));
    }
    if expect.no_effect_after_stop {
        verdicts.push(no_effect_after_stop(h, s, label));
    }
    if let Some(runs) = &expect.runs {
        verdicts.push(runs_completed(h, runs, marks, label));
    }
    if expect.state_goes_on {
        verdicts.push(state_goes_on(h, s, label));
    }
    verdicts
}

/// The newest term did not start a key over: its first value of each key
/// it set is not an earlier term's first value of it, unless the key still
/// held that value (nothing moved on since).
fn state_goes_on(h: &Harness, s: &Subject, label: &str) -> Verdict {
    let step = format!("{label}: the state goes on from the last write");
    let newest = h.newest();
    // Per bucket and key: the first value each term set, and the last
    // value that landed before the newest term.
    let mut firsts: BTreeMap<(String, String), BTreeMap<u64, Vec<u8>>> = BTreeMap::new();
    let mut last_before: BTreeMap<(String, String), Vec<u8>> = BTreeMap::new();
    for (_, w) in s.buckets.writes.all() {
        for (key, value) in &w.sets {
            let at = (w.bucket.clone(), key.clone());
            firsts
                .entry(at.clone())
                .or_default()
                .entry(w.term)
                .or_insert_with(|| value.clone());
            if w.term < newest && w.result.is_ok() {
                last_before.insert(at, value.clone());
            }
        }
    }
    let mut faults = Vec::new();
    let mut checked = 0;
    for ((bucket, key), by_term) in &firsts {
        let Some(now) = by_term.get(&newest) else { continue };
        checked += 1;
        let before = last_before.get(&(bucket.clone(), key.clone()));
        let restarted = by_term
            .iter()
            .any(|(term, first)| *term < newest && first == now && before.is_some_and(|b| b != first));
        if restarted {
            let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
            faults.push(format!(
                "term {newest} set {bucket} {key} to {:?}, as an earlier term first did: it started over instead of going on from {:?}, the last write",
                text(now),
                before.map_or_else(String::new, |b| text(b))
            ));
        }
    }
    if faults.is_empty() {
        let detail = match checked {
            0 => format!("term {newest} set no key"),
            n => format!("term {newest} set {n} keys, none started over"),
        };
        Verdict::new(step, true, detail)
    } else {
        Verdict::new(step, false, faults.join("; "))
    }
}

/// The lines printed since the last `stdout-contains` (or the start).
fn stdout(s: &Subject, wanted: &[String], label: &str) -> Verdict {
    let since = since_last(&s.stdout_checked, s.output.0.len());
    let lines: Vec<String> = s
        .output
        .0
        .since(since)
        .into_iter()
        .filter(|(stream, _)| *stream == "stdout")
        .map(|(_, l)| l)
        .collect();
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|w| !lines.iter().any(|l| l.contains(w.as_str())))
        .collect();
    let step = format!("{label}: stdout contains {}", quoted(wanted));
    if missing.is_empty() {
        return Verdict::new(step, true, format!("in {} lines", lines.len()));
    }
    let last: Vec<&str> = lines.iter().rev().take(5).rev().map(String::as_str).collect();
    let printed = if last.is_empty() {
        "it printed nothing".to_owned()
    } else {
        format!("its last lines: {}", last.join(" | "))
    };
    Verdict::new(
        step,
        false,
        format!("no line contained {}; {printed}", quoted(&missing)),
    )
}

/// How many records the last check saw; this check sees `now`.
fn since_last(checked: &std::sync::Mutex<usize>, now: usize) -> usize {
    std::mem::replace(&mut *checked.lock().unwrap_or_else(|e| e.into_inner()), now)
}

fn quoted<S: AsRef<str>>(texts: &[S]) -> String {
    let q: Vec<String> = texts.iter().map(|t| format!("{:?}", t.as_ref())).collect();
    q.join(", ")
}

async fn kv(h: &Harness, s: &Subject, key: &str, wanted: Option<&str>, label: &str) -> Verdict {
    let (bucket, entry) = match key.split_once('/') {
        Some((b, k)) => (Some(b), k),
        None => (None, key),
    };
    let step = match wanted {
        Some(v) => format!("{label}: kv {key} = {v:?}"),
        None => format!("{label}: kv {key} absent"),
    };
    let name = match s.bucket(h, bucket) {
        Ok(n) => n,
        Err(e) => return Verdict::new(step, false, e),
    };
    let found = match s.store.get(&name, entry).await {
        Ok(e) => e.map(|e| String::from_utf8_lossy(&e.value).into_owned()),
        Err(e) => return Verdict::new(step, false, format!("cannot read it: {e}")),
    };
    let detail = match &found {
        Some(v) => format!("it is {v:?}"),
        None => "it is absent".to_owned(),
    };
    Verdict::new(step, found.as_deref() == wanted, detail)
}

/// The requests sent since the last `http-requests` (or the start).
fn http_requests(s: &Subject, wanted: usize, label: &str) -> Verdict {
    let step = format!("{label}: {wanted} HTTP requests");
    let Some(http) = &s.http else {
        return Verdict::new(step, false, "no stubs: requests are not recorded");
    };
    let since = since_last(&s.http_checked, http.requests.len());
    let sent = http.requests.since(since);
    let list: Vec<String> = sent
        .iter()
        .map(|(r, answered)| {
            let term = r
                .term
                .map_or_else(|| "no Baton-Term".to_owned(), |t| format!("Baton-Term {t}"));
            let stub = if *answered { "" } else { ", no stub" };
            format!("{} {} ({term}{stub})", r.method, r.url)
        })
        .collect();
    let detail = if list.is_empty() {
        "it sent none".to_owned()
    } else {
        format!("it sent {}: {}", list.len(), list.join("; "))
    };
    Verdict::new(step, sent.len() == wanted, detail)
}

/// No bucket write and no HTTP request of a term after its change fired.
fn no_effect_after_stop(h: &Harness, s: &Subject, label: &str) -> Verdict {
    let step = format!("{label}: no effect after a term's change");
    let ended: BTreeMap<u64, Instant> = h.ended.iter().copied().collect();
    let late = |term: u64, at: Instant| ended.get(&term).is_some_and(|end| at > *end);
    let mut faults = Vec::new();
    let mut by_term: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for (at, w) in s.buckets.writes.all() {
        if late(w.term, at) {
            let counts = by_term.entry(w.term).or_default();
            if w.result.is_ok() {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
    }
    for (term, (landed, refused)) in by_term {
        faults.push(format!(
            "term {term} wrote to its bucket {} times after its change fired ({landed} landed within the grace, {refused} refused)",
            landed + refused
        ));
    }
    if let Some(http) = &s.http {
        let mut sent: BTreeMap<u64, usize> = BTreeMap::new();
        for (at, (r, _)) in http.requests.all() {
            if let Some(t) = r.term.filter(|t| late(*t, at)) {
                *sent.entry(t).or_default() += 1;
            }
        }
        for (term, n) in sent {
            faults.push(format!(
                "term {term} sent {n} HTTP requests after its change fired"
            ));
        }
    }
    if faults.is_empty() {
        Verdict::new(step, true, "none")
    } else {
        Verdict::new(step, false, faults.join("; "))
    }
}

/// The due times whose runs completed (`ok`) since `marks`.
fn runs_completed(h: &Harness, wanted: &[SystemTime], marks: &Marks, label: &str) -> Verdict {
    let got: Vec<SystemTime> = h.recorder.events()[marks.events..]
        .iter()
        .filter_map(|e| match e {
            Event::Ran {
                due,
                on_demand: false,
                outcome: "ok",
            } => Some(*due),
            _ => None,
        })
        .collect();
    let list = |ts: &[SystemTime]| {
        let s: Vec<String> = ts.iter().map(|t| stamp(*t)).collect();
        format!("[{}]", s.join(", "))
    };
    Verdict::new(
        format!("{label}: runs completed {}", list(wanted)),
        got == wanted,
        format!("completed {}", list(&got)),
    )
}

/// Each due time completed once over the scenario (none twice, none only
/// failed); `None` if no due time ran.
pub fn each_due_once(h: &Harness) -> Option<Verdict> {
    let mut counts: BTreeMap<SystemTime, Vec<&'static str>> = BTreeMap::new();
    for e in h.recorder.events() {
        if let Event::Ran {
            due,
            on_demand: false,
            outcome,
        } = e
        {
            counts.entry(due).or_default().push(outcome);
        }
    }
    let step = "each due time completed once";
    let twice: Vec<String> = counts
        .iter()
        .filter(|(_, o)| o.iter().filter(|o| **o == "ok").count() > 1)
        .map(|(due, o)| format!("its run for {} completed {} times", stamp(*due), o.len()))
        .collect();
    let failed: Vec<String> = counts
        .iter()
        .filter(|(_, o)| !o.contains(&"ok"))
        .map(|(due, o)| format!("its run for {} ended {}", stamp(*due), o.join(", then ")))
        .collect();
    if counts.is_empty() {
        return None;
    }
    let faults: Vec<String> = twice.into_iter().chain(failed).collect();
    Some(if faults.is_empty() {
        Verdict::new(step, true, format!("{} due times, each once", counts.len()))
    } else {
        Verdict::new(step, false, faults.join("; "))
    })
}
