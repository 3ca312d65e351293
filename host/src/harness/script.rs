//! A scenario file: what the harness does, step by step, what it expects
//! after each step, and the stubs the plugin talks to. The format is in
//! `docs/testing-plugins.md`; each error names the file, the step and the
//! key at fault.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde::Deserialize;

use super::record::Stub;
use crate::runtime::StubResponse;

/// A scenario, read and checked.
#[derive(Clone, Debug)]
pub struct Script {
    /// Its name: `name`, else the file's.
    pub name: String,
    /// The file.
    pub file: PathBuf,
    /// Virtual time's start (`start`); the real time if not given.
    pub start: Option<SystemTime>,
    /// Configuration values the plugin reads, over its table's.
    pub config: BTreeMap<String, String>,
    /// HTTP answers (`[[http]]`); with none, requests go to the network.
    pub http: Vec<Stub>,
    /// The steps.
    pub steps: Vec<Step>,
    /// Whether a scheduled run must have ended by the end (the contract's
    /// scenario of a scheduled plugin).
    pub require_runs: bool,
}

/// One step: an action and what is expected after it.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// What the harness does.
    pub action: Action,
    /// What must be true once it is done.
    pub expect: Expect,
}

/// What a step does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// This host leads, in a new term.
    Lead,
    /// This host loses the lead: the change fires, the grace runs.
    Lose,
    /// The host stops for this long: past the lease, its term ended
    /// meanwhile and its task is stopped at once when it resumes.
    Pause(Duration),
    /// The host dies: its task is gone at once; the lease expires after
    /// its duration.
    Crash,
    /// Virtual time moves on this much, each due time on the way run.
    Advance(Duration),
    /// Virtual time moves on to this time.
    AdvanceTo(SystemTime),
    /// Real time passes, the plugin running.
    Wait(Duration),
    /// `baton run-now`: one scheduled run at once.
    RunNow,
    /// An operator's write to the plugin's bucket.
    KvPut {
        /// The bucket (the plugin's only one if not given).
        bucket: Option<String>,
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// The plugin's health check is called; `true`: expected healthy.
    Health(bool),
}

impl Action {
    /// The step's key, as written.
    pub fn key(&self) -> &'static str {
        match self {
            Action::Lead => "lead",
            Action::Lose => "lose",
            Action::Pause(_) => "pause",
            Action::Crash => "crash",
            Action::Advance(_) | Action::AdvanceTo(_) => "advance",
            Action::Wait(_) => "wait",
            Action::RunNow => "run-now",
            Action::KvPut { .. } => "kv-put",
            Action::Health(_) => "health",
        }
    }
}

/// What must be true after a step; each is optional.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Expect {
    /// After `lose`: the task returned by itself within this after the
    /// change (default: the grace).
    pub returns_within: Option<Duration>,
    /// Lines the plugin printed since the last such check (or the start)
    /// contain each of these.
    pub stdout_contains: Vec<String>,
    /// Bucket entries after the step: `KEY` (the plugin's only bucket) or
    /// `BUCKET/KEY`, to a value (`None`: absent).
    pub kv: BTreeMap<String, Option<String>>,
    /// How many HTTP requests the plugin sent since the last such check
    /// (or the start).
    pub http_requests: Option<usize>,
    /// No bucket write and no HTTP request of a term after its change
    /// fired (over the scenario so far).
    pub no_effect_after_stop: bool,
    /// The due times whose runs completed during the step, in order.
    pub runs: Option<Vec<SystemTime>>,
    /// The newest term's first write of each key it set does not start
    /// that key over (repeat an earlier term's first value of it after
    /// the key had moved on): the state goes on from the last write.
    pub state_goes_on: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawScript {
    name: Option<String>,
    start: Option<String>,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    http: Vec<RawStub>,
    #[serde(default)]
    step: Vec<RawStep>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawStub {
    url: String,
    method: Option<String>,
    #[serde(default = "ok")]
    status: u16,
    #[serde(default)]
    body: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

fn ok() -> u16 {
    200
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawStep {
    lead: Option<bool>,
    lose: Option<bool>,
    pause: Option<String>,
    crash: Option<bool>,
    advance: Option<String>,
    wait: Option<String>,
    run_now: Option<bool>,
    kv_put: Option<RawKvPut>,
    health: Option<String>,
    #[serde(default)]
    expect: RawExpect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKvPut {
    bucket: Option<String>,
    key: String,
    value: String,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawExpect {
    returns_within: Option<String>,
    stdout_contains: Option<OneOrMany>,
    #[serde(default)]
    kv: BTreeMap<String, toml::Value>,
    http_requests: Option<usize>,
    #[serde(default)]
    no_effect_after_stop: bool,
    runs: Option<Vec<String>>,
    #[serde(default)]
    state_goes_on: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A scenario file that cannot be used: the file, and where and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", file.display())]
pub struct ScriptError {
    /// The file.
    pub file: PathBuf,
    /// Where in it, and why.
    pub reason: String,
}

impl Script {
    /// Reads and checks `file`.
    pub fn load(file: &Path) -> Result<Script, ScriptError> {
        let fail = |reason: String| ScriptError {
            file: file.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(file).map_err(|e| fail(format!("cannot read it: {e}")))?;
        Script::parse(&text, file).map_err(fail)
    }

    /// Reads `text`, the contents of `file`.
    pub fn parse(text: &str, file: &Path) -> Result<Script, String> {
        let raw: RawScript = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?;
        let start = raw
            .start
            .as_deref()
            .map(|s| timestamp(s).map_err(|e| format!("`start`: {e}")))
            .transpose()?;
        let http = raw
            .http
            .into_iter()
            .enumerate()
            .map(|(i, s)| stub(s).map_err(|e| format!("[[http]] {}: {e}", i + 1)))
            .collect::<Result<Vec<_>, _>>()?;
        let steps = raw
            .step
            .into_iter()
            .enumerate()
            .map(|(i, s)| step(s).map_err(|e| format!("step {}: {e}", i + 1)))
            .collect::<Result<Vec<_>, _>>()?;
        if steps.is_empty() {
            return Err("no [[step]]: a scenario needs at least one".into());
        }
        if http.is_empty() && steps.iter().any(|s| s.expect.http_requests.is_some()) {
            return Err("`http-requests` counts the requests answered by [[http]] stubs: add one".into());
        }
        let name = raw.name.unwrap_or_else(|| {
            file.file_name()
                .map_or_else(|| "scenario".into(), |n| n.to_string_lossy().into_owned())
        });
        Ok(Script {
            name,
            file: file.to_owned(),
            start,
            config: raw.config,
            http,
            steps,
            require_runs: false,
        })
    }
}

/// A time written as RFC 3339 with an offset (`2026-03-29T03:00:00+02:00`).
fn timestamp(text: &str) -> Result<SystemTime, String> {
    let at: jiff::Timestamp = text
        .parse()
        .map_err(|e| format!("{text:?} is not a time with an offset, as 2026-03-29T03:00:00+02:00 ({e})"))?;
    Ok(SystemTime::from(at))
}

fn duration(key: &str, text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{key}`: {text:?} is not a duration, as \"1s\" or \"26h\" ({e})"))
}

fn stub(raw: RawStub) -> Result<Stub, String> {
    let uri: http::Uri = raw
        .url
        .trim_end_matches('*')
        .parse()
        .map_err(|e| format!("`url`: {:?}: {e}", raw.url))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!("`url`: {:?} is not an http or https URL", raw.url));
    }
    let status = http::StatusCode::from_u16(raw.status)
        .map_err(|_| format!("`status`: {} is not a status code", raw.status))?;
    Ok(Stub {
        url: raw.url,
        method: raw.method.map(|m| m.to_ascii_uppercase()),
        response: StubResponse {
            status: status.as_u16(),
            headers: raw.headers.into_iter().collect(),
            body: Bytes::from(raw.body),
        },
    })
}

fn step(raw: RawStep) -> Result<Step, String> {
    let flag = |key: &str, v: Option<bool>| match v {
        Some(false) => Err(format!("`{key} = false` does nothing: leave the key out")),
        other => Ok(other.unwrap_or(false)),
    };
    let mut actions = Vec::new();
    if flag("lead", raw.lead)? {
        actions.push(Action::Lead);
    }
    if flag("lose", raw.lose)? {
        actions.push(Action::Lose);
    }
    if flag("crash", raw.crash)? {
        actions.push(Action::Crash);
    }
    if flag("run-now", raw.run_now)? {
        actions.push(Action::RunNow);
    }
    if let Some(p) = raw.pause {
        actions.push(Action::Pause(duration("pause", &p)?));
    }
    if let Some(a) = raw.advance {
        actions.push(match duration("advance", &a) {
            Ok(d) => Action::Advance(d),
            Err(_) => Action::AdvanceTo(
                timestamp(&a).map_err(|e| format!("`advance`: a duration (\"26h\") or {e}"))?,
            ),
        });
    }
    if let Some(w) = raw.wait {
        actions.push(Action::Wait(duration("wait", &w)?));
    }
    if let Some(kv) = raw.kv_put {
        actions.push(Action::KvPut {
            bucket: kv.bucket,
            key: kv.key,
            value: kv.value,
        });
    }
    if let Some(h) = raw.health {
        actions.push(Action::Health(match h.as_str() {
            "ok" => true,
            "fail" => false,
            other => {
                return Err(format!(
                    "`health`: {other:?}: write \"ok\" or \"fail\" (what the check must say)"
                ));
            }
        }));
    }
    let action =
        match actions.len() {
            1 => actions.remove(0),
            0 => return Err(
                "no action: write one of lead, lose, pause, crash, advance, wait, run-now, kv-put, health"
                    .into(),
            ),
            _ => {
                let keys: Vec<&str> = actions.iter().map(Action::key).collect();
                return Err(format!("one action per step, not {}", keys.join(" and ")));
            }
        };
    let expect = expect(raw.expect)?;
    if expect.returns_within.is_some() && action != Action::Lose {
        return Err(
            "`expect.returns-within` follows `lose` (after a pause or a crash the task is stopped at once)"
                .into(),
        );
    }
    Ok(Step { action, expect })
}

fn expect(raw: RawExpect) -> Result<Expect, String> {
    let kv = raw
        .kv
        .into_iter()
        .map(|(k, v)| match v {
            toml::Value::String(s) => Ok((k, Some(s))),
            toml::Value::Boolean(false) => Ok((k, None)),
            other => Err(format!(
                "`expect.kv.{k}`: {other} is neither a string (the value) nor false (absent)"
            )),
        })
        .collect::<Result<_, _>>()?;
    let runs = raw
        .runs
        .map(|r| {
            r.iter()
                .map(|t| timestamp(t).map_err(|e| format!("`expect.runs`: {e}")))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(Expect {
        returns_within: raw
            .returns_within
            .map(|d| duration("expect.returns-within", &d))
            .transpose()?,
        stdout_contains: match raw.stdout_contains {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s],
            Some(OneOrMany::Many(v)) => v,
        },
        kv,
        http_requests: raw.http_requests,
        no_effect_after_stop: raw.no_effect_after_stop,
        runs,
        state_goes_on: raw.state_goes_on,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Script, String> {
        Script::parse(text, Path::new("s.toml"))
    }

    #[test]
    fn a_scenario_reads_its_steps_expectations_and_stubs() {
        let s = parse(
            r#"
            name = "nightly"
            start = "2026-03-28T12:00:00+01:00"
            config = { greeting = "hi" }
            [[http]]
            url = "https://api.example.com/items*"
            body = "[]"
            [[step]]
            lead = true
            [[step]]
            advance = "26h"
            expect = { runs = ["2026-03-29T03:00:00+02:00"], http-requests = 1 }
            [[step]]
            lose = true
            expect = { returns-within = "500ms", no-effect-after-stop = true }
            [[step]]
            kv-put = { key = "count", value = "41" }
            expect.kv = { count = "41", gone = false }
            "#,
        )
        .unwrap();
        assert_eq!(s.name, "nightly");
        assert_eq!(s.config["greeting"], "hi");
        assert_eq!(s.http[0].response.status, 200);
        assert_eq!(s.steps.len(), 4);
        assert_eq!(s.steps[1].action, Action::Advance(Duration::from_secs(26 * 3600)));
        let due = s.steps[1].expect.runs.as_ref().unwrap()[0];
        assert_eq!(
            due.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
            1_774_746_000
        );
        assert_eq!(s.steps[2].expect.returns_within, Some(Duration::from_millis(500)));
        assert_eq!(s.steps[3].expect.kv["gone"], None);
    }

    #[test]
    fn errors_name_the_step_and_the_key() {
        let cases = [
            (
                "[[step]]\nlead = true\nlose = true\n",
                "step 1: one action per step, not lead and lose",
            ),
            (
                "[[step]]\nlead = true\n[[step]]\nadvance = \"soon\"\n",
                "step 2: `advance`: a duration",
            ),
            (
                "[[step]]\nlead = true\nexpect = { returns-within = \"1s\" }\n",
                "step 1: `expect.returns-within` follows",
            ),
            ("[[step]]\nhealth = \"maybe\"\n", "step 1: `health`: \"maybe\""),
            (
                "[[step]]\nlead = true\nexpect = { http-requests = 1 }\n",
                "counts the requests answered by [[http]] stubs",
            ),
            ("[[step]]\nleed = true\n", "unknown field `leed`"),
            ("name = \"x\"\n", "no [[step]]"),
            (
                "start = \"tomorrow\"\n[[step]]\nlead = true\n",
                "`start`: \"tomorrow\" is not a time",
            ),
        ];
        for (text, wanted) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.contains(wanted), "{text:?}: {err}");
        }
    }
}
