//! `baton test`: runs one plugin in this process through the contract's
//! scenario ([`crate::harness`]): lead, run, lose the lead, lead again in a
//! newer term, lose again; prints a verdict per step and fails (exit
//! status 1) if one failed. Its buckets are in memory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::config::Config;
use crate::harness::Harness;
use crate::harness::scenario::{Verdict, default_scenario};
use crate::runtime::{DEFAULT_MEMORY_LIMIT, Grants, PluginRuntime, PluginSpec};
use crate::store::memory::buckets::MemoryBuckets;

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
    /// Take its grants and its lease's grace from this configuration (its
    /// plugin of that file, or named by --plugin).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// The plugin's name in the configuration.
    #[arg(long = "plugin")]
    pub name: Option<String>,
    /// The grace without a configuration.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub grace: Duration,
    /// How long each term runs before it is lost.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub run: Duration,
    /// How to print the verdicts: a table, JSON, or JUnit XML.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

/// `baton test`.
pub async fn execute(args: TestArgs) -> anyhow::Result<ExitCode> {
    let (spec, lease, grace) = spec_of(&args)?;
    let mut runtime = PluginRuntime::new(super::check::engine()?)?;
    runtime.set_bucket_store(Arc::new(MemoryBuckets::new()));
    let plugin = tokio::task::block_in_place(|| runtime.load(&spec)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut harness = Harness::start(Arc::new(plugin), &lease, grace);
    let verdicts = default_scenario(&mut harness, args.run).await;
    harness.finish().await;
    crate::ops::logging::written(Duration::from_millis(200));
    print(&spec.name, &verdicts, args.format)?;
    Ok(if verdicts.iter().all(|v| v.passed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The plugin's spec, its lease and its grace: from the configuration if
/// one is given (its plugin named so, or of the same file), else the
/// defaults.
fn spec_of(args: &TestArgs) -> anyhow::Result<(PluginSpec, String, Duration)> {
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
        return Ok((spec, format!("{name}-test"), args.grace));
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
    let grace = config
        .leases
        .iter()
        .find(|l| l.name == p.lease)
        .map_or(args.grace, |l| l.timings.grace);
    let mut spec = p.spec.clone();
    spec.path = args.plugin.clone();
    Ok((spec, p.lease.clone(), grace))
}

/// Prints the verdicts as `format` says.
fn print(plugin: &str, verdicts: &[Verdict], format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(verdicts)?),
        Format::Junit => print!("{}", junit(plugin, verdicts)),
        Format::Table => {
            println!("baton test: plugin {plugin:?}, the contract's scenario");
            for v in verdicts {
                let mark = if v.passed { "pass" } else { "FAIL" };
                println!("  {mark}  {}: {}", v.step, v.detail);
            }
            let failed = verdicts.iter().filter(|v| !v.passed).count();
            println!("{} steps, {failed} failed", verdicts.len());
        }
    }
    Ok(())
}

/// The verdicts as JUnit XML: a suite for the plugin, a test case per
/// step, a failure's message the verdict's detail.
fn junit(plugin: &str, verdicts: &[Verdict]) -> String {
    let failures = verdicts.iter().filter(|v| !v.passed).count();
    let suite = xml_escape(&format!("baton test: {plugin}"));
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    xml.push_str(&format!(
        "<testsuites tests=\"{n}\" failures=\"{failures}\">\n  <testsuite name=\"{suite}\" tests=\"{n}\" failures=\"{failures}\">\n",
        n = verdicts.len()
    ));
    for v in verdicts {
        let name = xml_escape(&v.step);
        let class = xml_escape(plugin);
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
    xml.push_str("  </testsuite>\n</testsuites>\n");
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
        let xml = junit("p&q", &verdicts);
        assert!(xml.contains("<testsuites tests=\"2\" failures=\"1\">"), "{xml}");
        assert!(xml.contains("<testsuite name=\"baton test: p&amp;q\""), "{xml}");
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
