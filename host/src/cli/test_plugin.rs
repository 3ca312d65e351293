//! `baton test`: runs one plugin in this process through scenarios
//! ([`crate::harness`]): the contract's own (lead, run, lose the lead,
//! lead again, pause past the lease, …; for a scheduled plugin, a
//! simulated day handed over twice), or the scenario files given; prints
//! a verdict per step and fails (exit status 1) if one failed. Its buckets
//! are in memory; its schedule and clocks run on virtual time unless
//! `--real-time`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;

use crate::config::Config;
use crate::harness::record::{OutputLog, RecordingBuckets, StubHttp, Subject};
use crate::harness::scenario::default_script;
use crate::harness::script::Script;
use crate::harness::steps::run_script;
use crate::harness::verdict::Verdict;
use crate::harness::{Harness, Setup};
use crate::runtime::{
    ClockGrant, ConfigSource, DEFAULT_MEMORY_LIMIT, Grants, HttpGrant, PluginRuntime, PluginSpec,
};
use crate::schedule::Schedule;
use crate::store::buckets::BucketStore;
use crate::store::memory::buckets::MemoryBuckets;
use crate::supervisor::time::{HostTime, VirtualTime};

/// How the verdicts are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for people.
    Table,
    /// JSON: one object per step.
    Json,
    /// JUnit XML, which CI systems display: one test case per step.
    Junit,
}

/// What `baton test` was asked (its command line).
#[derive(Debug, clap::Args)]
pub struct TestArgs {
    /// The component file.
    pub plugin: PathBuf,
    /// Scenario files (TOML), run in order, each on a fresh store; none:
    /// the contract's own scenario.
    pub scenarios: Vec<PathBuf>,
    /// Take its grants, schedule and lease's timings from this
    /// configuration (its plugin of that file, or named by --plugin).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// The plugin's name in the configuration.
    #[arg(long = "plugin")]
    pub name: Option<String>,
    /// The grace without a configuration.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// How long each term of the contract's scenario runs before it is
    /// lost (real time).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub run: Duration,
    /// Run schedules and the plugin's clocks on real time, not virtual
    /// time (`advance` steps then fail).
    #[arg(long)]
    pub real_time: bool,
    /// How to print the verdicts: a table, JSON, or JUnit XML.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

/// The plugin as the configuration (or the defaults) gives it.
struct Subjected {
    spec: PluginSpec,
    lease: String,
    grace: Duration,
    lease_duration: Duration,
    schedule: Option<Schedule>,
}

/// One scenario's verdicts.
#[derive(serde::Serialize)]
struct Outcome {
    scenario: String,
    verdicts: Vec<Verdict>,
}

/// `baton test`.
pub async fn execute(args: TestArgs) -> anyhow::Result<ExitCode> {
    let subject = subject_of(&args)?;
    let scripts = args
        .scenarios
        .iter()
        .map(|f| Script::load(f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut runtime = PluginRuntime::new(super::check::engine()?)?;
    let mut outcomes = Vec::new();
    if scripts.is_empty() {
        outcomes.push(run_one(&mut runtime, &subject, None, &args).await?);
    }
    for script in &scripts {
        outcomes.push(run_one(&mut runtime, &subject, Some(script), &args).await?);
    }
    crate::ops::logging::written(Duration::from_millis(200));
    print(&subject.spec.name, &outcomes, args.format)?;
    let passed = outcomes.iter().flat_map(|o| &o.verdicts).all(|v| v.passed);
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs `script` (the contract's if `None`) on a fresh store and harness.
async fn run_one(
    runtime: &mut PluginRuntime,
    subject: &Subjected,
    script: Option<&Script>,
    args: &TestArgs,
) -> anyhow::Result<Outcome> {
    let time = if args.real_time {
        HostTime::System
    } else {
        let start = script.and_then(|s| s.start).unwrap_or_else(SystemTime::now);
        HostTime::Virtual(VirtualTime::starting_at(start))
    };
    let store: Arc<dyn BucketStore> = Arc::new(MemoryBuckets::new());
    let buckets = Arc::new(RecordingBuckets::new(store.clone()));
    runtime.set_bucket_store(buckets.clone());
    // One live host, this one: a plugin that reads the live hosts starts
    // at once, as on a host whose membership lists it.
    runtime.hosts().send_replace(crate::election::Hosts {
        live: 1,
        this_host_live: true,
    });
    let output = Arc::new(OutputLog::default());
    let http = script.filter(|s| !s.http.is_empty()).map(|s| {
        Arc::new(StubHttp {
            stubs: s.http.clone(),
            requests: Default::default(),
        })
    });
    let spec = harness_spec(subject, script, &time, &output, http.as_ref())?;
    let plugin = tokio::task::block_in_place(|| runtime.load(&spec)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut harness = Harness::start(Setup {
        plugin: Arc::new(plugin),
        lease: subject.lease.clone(),
        grace: subject.grace,
        lease_duration: subject.lease_duration,
        schedule: subject.schedule.clone(),
        buckets: buckets.clone(),
        time,
    });
    let sub = Subject {
        output,
        stdout_checked: Default::default(),
        http_checked: Default::default(),
        http,
        buckets,
        store,
        bucket_names: spec.grants.keyvalue.buckets.clone(),
    };
    let built;
    let script = match script {
        Some(s) => s,
        None => {
            built = default_script(&harness, args.run, subject.schedule.as_ref());
            &built
        }
    };
    let verdicts = run_script(&mut harness, &sub, script).await;
    harness.finish().await;
    Ok(Outcome {
        scenario: script.name.clone(),
        verdicts,
    })
}

/// The plugin's spec under the harness: its clocks on `time`, its output
/// tapped, its HTTP answered by the stubs, the scenario's configuration
/// values over its own.
fn harness_spec(
    subject: &Subjected,
    script: Option<&Script>,
    time: &HostTime,
    output: &Arc<OutputLog>,
    http: Option<&Arc<StubHttp>>,
) -> anyhow::Result<PluginSpec> {
    let mut spec = subject.spec.clone();
    if let HostTime::Virtual(v) = time {
        spec.grants.clocks = ClockGrant::from_source(v.clone());
    }
    spec.grants.output.tap = Some(output.clone());
    if let Some(stub) = http {
        let origins = stub
            .stubs
            .iter()
            .map(|s| origin(&s.url))
            .collect::<anyhow::Result<Vec<_>>>()?;
        spec.grants.http = spec.grants.http.clone().with_stub(stub.clone(), &origins)?;
    }
    for (key, value) in script.map(|s| &s.config).into_iter().flatten() {
        let values = &mut spec.grants.config.values;
        values.retain(|(k, _)| k != key);
        values.push((key.clone(), ConfigSource::Value(value.clone())));
        values.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ok(spec)
}

/// The origin of a stub's URL, as a grant.
fn origin(url: &str) -> anyhow::Result<HttpGrant> {
    let uri: http::Uri = url.trim_end_matches('*').parse()?;
    let scheme = uri.scheme_str().unwrap_or("https");
    let host = uri.host().context("a stub's URL has a host")?;
    let port = uri.port_u16().unwrap_or(if scheme == "https" { 443 } else { 80 });
    Ok(format!("{scheme}://{host}:{port}").parse()?)
}

/// The plugin's spec, lease, timings and schedule: from the configuration
/// if one is given (its plugin named so, or of the same file), else the
/// defaults.
fn subject_of(args: &TestArgs) -> anyhow::Result<Subjected> {
    let stem = args.plugin.file_stem().map(|s| s.to_string_lossy().into_owned());
    let Some(file) = &args.config else {
        let name = args.name.clone().or(stem).unwrap_or_else(|| "plugin".into());
        let spec = PluginSpec {
            name: name.clone(),
            path: args.plugin.clone(),
            digest: None,
            memory_limit: DEFAULT_MEMORY_LIMIT,
            grants: Grants::default(),
            health_check: None,
        };
        return Ok(Subjected {
            spec,
            lease: format!("{name}-test"),
            grace: args.grace,
            lease_duration: crate::election::Timings::default().lease_duration,
            schedule: None,
        });
    };
    let config = Config::load(file)?;
    let same_file = |p: &Path| p.canonicalize().ok() == args.plugin.canonicalize().ok();
    let found = config.plugins.iter().find(|p| match &args.name {
        Some(n) => &p.spec.name == n,
        None => same_file(&p.spec.path),
    });
    let p = found.with_context(|| {
        format!(
            "{}: no plugin {} (name it with --plugin)",
            file.display(),
            args.name.as_deref().map_or_else(
                || format!("of file {}", args.plugin.display()),
                |n| format!("{n:?}")
            )
        )
    })?;
    let timings = config
        .leases
        .iter()
        .find(|l| l.name == p.lease)
        .map(|l| l.timings);
    let mut spec = p.spec.clone();
    spec.path = args.plugin.clone();
    Ok(Subjected {
        spec,
        lease: p.lease.clone(),
        grace: timings.as_ref().map_or(args.grace, |t| t.grace),
        lease_duration: timings.map_or_else(
            || crate::election::Timings::default().lease_duration,
            |t| t.lease_duration,
        ),
        schedule: p.schedule.clone(),
    })
}

/// Prints the verdicts as `format` says.
fn print(plugin: &str, outcomes: &[Outcome], format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(outcomes)?),
        Format::Junit => print!("{}", junit(plugin, outcomes)),
        Format::Table => {
            for o in outcomes {
                println!("baton test: plugin {plugin:?}, {}", o.scenario);
                for v in &o.verdicts {
                    let mark = if v.passed { "pass" } else { "FAIL" };
                    println!("  {mark}  {}: {}", v.step, v.detail);
                }
            }
            let all: Vec<&Verdict> = outcomes.iter().flat_map(|o| &o.verdicts).collect();
            let failed = all.iter().filter(|v| !v.passed).count();
            println!("{} steps, {failed} failed", all.len());
        }
    }
    Ok(())
}

/// The verdicts as JUnit XML: a suite per scenario, a test case per
/// verdict, a failure's message the verdict's detail.
fn junit(plugin: &str, outcomes: &[Outcome]) -> String {
    let count = |o: &Outcome| (o.verdicts.len(), o.verdicts.iter().filter(|v| !v.passed).count());
    let (tests, failures) = outcomes
        .iter()
        .map(count)
        .fold((0, 0), |(t, f), (a, b)| (t + a, f + b));
    let class = xml_escape(plugin);
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    xml.push_str(&format!(
        "<testsuites tests=\"{tests}\" failures=\"{failures}\">\n"
    ));
    for o in outcomes {
        let (n, failed) = count(o);
        let suite = xml_escape(&format!("baton test: {plugin}: {}", o.scenario));
        xml.push_str(&format!(
            "  <testsuite name=\"{suite}\" tests=\"{n}\" failures=\"{failed}\">\n"
        ));
        for v in &o.verdicts {
            let name = xml_escape(&v.step);
            if v.passed {
                xml.push_str(&format!(
                    "    <testcase classname=\"{class}\" name=\"{name}\"/>\n"
                ));
            } else {
                let detail = xml_escape(&v.detail);
                xml.push_str(&format!(
                    "    <testcase classname=\"{class}\" name=\"{name}\">\n      <failure message=\"{detail}\">{detail}</failure>\n    </testcase>\n"
                ));
            }
        }
        xml.push_str("  </testsuite>\n");
    }
    xml.push_str("</testsuites>\n");
    xml
}

/// `text` with XML's special characters escaped.
fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_has_a_case_per_step_and_a_failure_with_the_detail_escaped() {
        let verdicts = [
            Verdict {
                step: "lead in term 1: a fresh instance starts".into(),
                passed: true,
                detail: "started".into(),
            },
            Verdict {
                step: "lose the lead".into(),
                passed: false,
                detail: "ignored the change: <stopped> by force & \"late\"".into(),
            },
        ];
        let outcomes = [Outcome {
            scenario: "s".into(),
            verdicts: verdicts.to_vec(),
        }];
        let xml = junit("p&q", &outcomes);
        assert!(xml.contains("<testsuites tests=\"2\" failures=\"1\">"), "{xml}");
        assert!(
            xml.contains("<testsuite name=\"baton test: p&amp;q: s\""),
            "{xml}"
        );
        assert!(
            xml.contains(
                "<testcase classname=\"p&amp;q\" name=\"lead in term 1: a fresh instance starts\"/>"
            ),
            "{xml}"
        );
        assert!(
            xml.contains(
                "<failure message=\"ignored the change: &lt;stopped&gt; by force &amp; &quot;late&quot;\">"
            ),
            "{xml}"
        );
        assert_eq!(xml.matches("<testcase ").count(), 2);
    }
}
