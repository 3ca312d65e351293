//! `baton status`'s schedules: for each scheduled plugin of the
//! configuration, its next due time, the run going, the last runs and the
//! skips, read from the lease's bucket of schedules.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use crate::config::Config;
use crate::schedule::{Progress, RunRecord, Schedule, from_millis, millis};
use crate::store::buckets::{BucketName, BucketStore};
use crate::supervisor::SCHEDULES_BUCKET;

/// One scheduled plugin, as its progress says.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleStatus {
    /// The plugin.
    pub plugin: String,
    /// Its lease.
    pub lease: String,
    /// When its runs are due, in words.
    pub schedule: String,
    /// Whether a reload suspended it.
    pub suspended: bool,
    /// The next due time not yet handled (RFC 3339), if any.
    #[serde(serialize_with = "super::rfc3339")]
    pub next_due: Option<SystemTime>,
    /// A run started and not recorded as ended.
    pub running: Option<RunRecord>,
    /// The last ended runs, newest first.
    pub runs: Vec<RunRecord>,
    /// Due times skipped, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Why the progress could not be read, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The scheduled plugins of `config` and their progress in `buckets`.
pub async fn collect(
    config: &Config,
    buckets: &Arc<dyn BucketStore>,
    now: SystemTime,
) -> Vec<ScheduleStatus> {
    let mut all = Vec::new();
    for p in config.plugins.iter() {
        let Some(schedule) = &p.schedule else { continue };
        let bucket = BucketName::new(&p.lease, SCHEDULES_BUCKET);
        let read = buckets.get(&bucket, &p.spec.name).await;
        let (progress, error) = match read {
            Ok(None) => (Progress::default(), None),
            Ok(Some(e)) => match Progress::from_bytes(&e.value) {
                Ok(p) => (p, None),
                Err(e) => (Progress::default(), Some(e)),
            },
            Err(e) => (Progress::default(), Some(e.to_string())),
        };
        all.push(status_of(&p.spec.name, &p.lease, schedule, progress, error, now));
    }
    all
}

fn status_of(
    plugin: &str,
    lease: &str,
    schedule: &Schedule,
    progress: Progress,
    error: Option<String>,
    now: SystemTime,
) -> ScheduleStatus {
    let after = progress.handled.map_or(now, from_millis);
    let next_due = match &progress.running {
        Some(r) => Some(from_millis(r.due)),
        None => schedule.when.next_after(after),
    };
    let mut runs = progress.history.clone();
    runs.reverse();
    ScheduleStatus {
        plugin: plugin.to_owned(),
        lease: lease.to_owned(),
        schedule: schedule.when.to_string(),
        suspended: schedule.suspend,
        next_due,
        running: progress.running,
        runs,
        skipped: progress.skipped,
        error,
    }
}

/// The table of the schedules: one row per plugin, then its last runs.
pub fn table(all: &[ScheduleStatus], runs: usize) -> String {
    let time = |ms: u64| humantime::format_rfc3339_millis(from_millis(ms)).to_string();
    let mut out = String::new();
    for s in all {
        let next = s
            .next_due
            .map_or("-".into(), |t| humantime::format_rfc3339_millis(t).to_string());
        let skipped: Vec<String> = s.skipped.iter().map(|(r, n)| format!("{n} {r}")).collect();
        out.push_str(&format!(
            "plugin {} (lease {}): {}{}; next due {next}; skipped: {}\n",
            s.plugin,
            s.lease,
            s.schedule,
            if s.suspended { " (suspended)" } else { "" },
            if skipped.is_empty() {
                "none".into()
            } else {
                skipped.join(", ")
            },
        ));
        if let Some(e) = &s.error {
            out.push_str(&format!("  progress unreadable: {e}\n"));
        }
        if let Some(r) = &s.running {
            out.push_str(&format!(
                "  running: due {} started {} on {} (term {})\n",
                time(r.due),
                time(r.started),
                r.host,
                r.term
            ));
        }
        for r in s.runs.iter().take(runs) {
            out.push_str(&format!(
                "  due {} started {} ended {} {} on {} (term {}{})\n",
                time(r.due),
                time(r.started),
                r.ended.map_or("-".into(), time),
                r.outcome.as_deref().unwrap_or("-"),
                r.host,
                r.term,
                if r.on_demand { ", run-now" } else { "" },
            ));
        }
    }
    out
}

/// Milliseconds since the epoch of `t` (for tests).
pub fn ms(t: SystemTime) -> u64 {
    millis(t)
}
