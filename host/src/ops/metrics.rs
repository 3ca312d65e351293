//! Prometheus metrics, served at `/metrics` on the admin address (see
//! [`admin`](crate::ops::admin)); every name and its meaning is listed in
//! `docs/operations.md`.
//!
//! One [`Metrics`] per `baton run`, made only when an admin address is
//! configured. It holds its own registry (no global one) and is the
//! observer the inner layers report to: the electors'
//! ([`ElectionObserver`]: status changes, renewals, store errors) and the
//! supervisors' ([`TaskObserver`]: task states, starts, ends, stops).
//! What the inner layers only count (the compiled-code cache, each
//! plugin's dropped output and memory, the log's dropped lines) is read
//! when scraped.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::config::LeaseConfig;
use crate::election::{ElectionObserver, Role, Status, StoreErrorKind, Timings};
use crate::runtime::capability::keyvalue::Outcome;
use crate::runtime::{Plugin, PluginEngine};
use crate::supervisor::{TaskEnd, TaskObserver, TaskState};

/// The `Content-Type` of what [`Metrics::encode`] writes: the Prometheus
/// text format, 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    lease: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    lease: String,
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChangeLabels {
    lease: String,
    change: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    lease: String,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabels {
    plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    plugin: String,
    reference: String,
    digest: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    plugin: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    plugin: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyValueLabels {
    plugin: String,
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    plugin: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StopLabels {
    plugin: String,
    how: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    plugin: String,
    lease: String,
    world: &'static str,
}

const ROLES: [Role; 3] = [Role::Pending, Role::Leading, Role::Following];

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Pending => "pending",
        Role::Leading => "leading",
        Role::Following => "following",
    }
}

/// Renewal latencies: 1 ms to about 16 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// A scheduled run's lateness: 100 µs to about 100 s, doubling.
fn lateness_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 20))
}

/// Stop latencies after the end of a term: 1 ms to about 32 s, doubling
/// (a forced stop comes after the grace).
fn stop_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The metrics of one `baton run`; see the [module documentation](self).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    role: Family<RoleLabels, Gauge>,
    term: Family<LeaseLabels, Gauge>,
    changes: Family<ChangeLabels, Counter>,
    renewals: Family<LeaseLabels, Histogram, fn() -> Histogram>,
    store_errors: Family<ErrorLabels, Counter>,
    route_label_errors: Family<LeaseLabels, Counter>,
    task_state: Family<StateLabels, Gauge>,
    starts: Family<PluginLabels, Counter>,
    failures: Family<PluginLabels, Counter>,
    traps: Family<PluginLabels, Counter>,
    forced: Family<PluginLabels, Counter>,
    stops: Family<StopLabels, Histogram, fn() -> Histogram>,
    reloads: Family<ReloadLabels, Counter>,
    schedule_runs: Family<OutcomeLabels, Counter>,
    schedule_skips: Family<ReasonLabels, Counter>,
    schedule_lateness: Family<PluginLabels, Histogram, fn() -> Histogram>,
    health_checks: Family<OutcomeLabels, Counter>,
    health_handovers: Family<LeaseLabels, Counter>,
    sources: Family<SourceLabels, Gauge>,
    read: Arc<Read>,
}

/// What is read when scraped.
#[derive(Debug, Default)]
struct Read {
    inner: Mutex<ReadInner>,
}

#[derive(Default)]
struct ReadInner {
    /// Leases this host leads now, and when the store last confirmed it
    /// (the acquisition or a renewal).
    confirmed: BTreeMap<String, Instant>,
    /// The loaded plugins and their leases.
    plugins: Vec<(Arc<Plugin>, String)>,
    /// Plugins configured but not loaded.
    refused: usize,
    /// Each configured lease's timings.
    timings: Vec<(String, Timings)>,
    engine: Option<PluginEngine>,
}

impl std::fmt::Debug for ReadInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadInner")
            .field("confirmed", &self.confirmed)
            .field("plugins", &self.plugins.len())
            .finish()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric registered, none with a value yet.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("baton");
        let m = Metrics {
            role: Family::default(),
            term: Family::default(),
            changes: Family::default(),
            renewals: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            store_errors: Family::default(),
            route_label_errors: Family::default(),
            task_state: Family::default(),
            starts: Family::default(),
            failures: Family::default(),
            traps: Family::default(),
            forced: Family::default(),
            stops: Family::new_with_constructor(stop_histogram as fn() -> Histogram),
            reloads: Family::default(),
            schedule_runs: Family::default(),
            schedule_skips: Family::default(),
            schedule_lateness: Family::new_with_constructor(lateness_histogram as fn() -> Histogram),
            health_checks: Family::default(),
            health_handovers: Family::default(),
            sources: Family::default(),
            read: Arc::default(),
            registry: Registry::default(),
        };
        m.register_lease_metrics(&mut registry);
        m.register_task_metrics(&mut registry);
        m.register_reloads(&mut registry);
        m.register_schedules(&mut registry);
        m.register_health(&mut registry);
        registry.register_collector(Box::new(m.read.clone()));
        Metrics { registry, ..m }
    }

    /// The electors' metrics, reported through [`ElectionObserver`].
    fn register_lease_metrics(&self, registry: &mut Registry) {
        registry.register(
            "lease_role",
            "This host's role for the lease: 1 for the current role (pending, leading or following), 0 for the others",
            self.role.clone(),
        );
        registry.register(
            "lease_term",
            "The newest term of the lease this host knows of (the fencing token); 0 if none",
            self.term.clone(),
        );
        registry.register(
            "lease_leadership_changes",
            "Times this host started leading the lease (change=\"gained\") or stopped (change=\"lost\")",
            self.changes.clone(),
        );
        registry.register(
            "lease_renewal_seconds",
            "How long the store took to confirm each renewal of the lease by this host",
            self.renewals.clone(),
        );
        registry.register(
            "lease_store_errors",
            "Failed requests of the lease's elector to the store (reads, acquisitions, renewals, releases), by kind: conflict, unavailable, malformed, refused, timeout",
            self.store_errors.clone(),
        );
        registry.register(
            "route_label_errors",
            "Failed requests on the lease's route label (route-label = true): listing pods, labelling this pod, removing the label from a pod",
            self.route_label_errors.clone(),
        );
    }

    /// The supervisors' metrics, reported through [`TaskObserver`].
    fn register_task_metrics(&self, registry: &mut Registry) {
        registry.register(
            "plugin_task_state",
            "Where the plugin's leader task is: 1 for the current state (waiting, running, stopping, backoff, finished), 0 for the others",
            self.task_state.clone(),
        );
        registry.register(
            "plugin_task_starts",
            "Instances of the plugin started in a term (first runs and retries)",
            self.starts.clone(),
        );
        registry.register(
            "plugin_task_failures",
            "Runs of the plugin's task that returned an error",
            self.failures.clone(),
        );
        registry.register(
            "plugin_task_traps",
            "Runs of the plugin's task that trapped (not counting stops by the host)",
            self.traps.clone(),
        );
        registry.register(
            "plugin_forced_stops",
            "Runs of the plugin's task stopped by the host at their term's force-stop time (they did not return within the grace)",
            self.forced.clone(),
        );
        registry.register(
            "plugin_stop_seconds",
            "How long after the end of its term each run of the plugin's task was gone, by how: cooperative (it returned) or forced",
            self.stops.clone(),
        );
    }

    /// Scheduled runs, skips and lateness, reported through [`TaskObserver`].
    fn register_schedules(&self, registry: &mut Registry) {
        registry.register(
            "schedule_runs",
            "Scheduled runs of the plugin that ended, by outcome: ok, failed, trapped (runs cut off by their term's end are run again and not counted here)",
            self.schedule_runs.clone(),
        );
        registry.register(
            "schedule_skipped",
            "Due times of the plugin's schedule skipped, by reason: missed (no host ran it within its starting deadline), superseded (catch-up = latest), overlap (a run still went), cut-off (cut off by its term's end and past its deadline)",
            self.schedule_skips.clone(),
        );
        registry.register(
            "schedule_lateness_seconds",
            "How long after its due time each scheduled run of the plugin started (jitter included)",
            self.schedule_lateness.clone(),
        );
    }

    /// Health checks and the hand-overs they caused, reported through
    /// [`TaskObserver`].
    fn register_health(&self, registry: &mut Registry) {
        registry.register(
            "plugin_health_checks",
            "Calls of the plugin's health check while this host led its lease, by outcome: ok, failed (it returned an error), trapped, timed-out",
            self.health_checks.clone(),
        );
        registry.register(
            "lease_health_handovers",
            "Hand-overs of the lease because a plugin's health check failed its threshold of times in a row",
            self.health_handovers.clone(),
        );
        registry.register(
            "plugin_source_info",
            "1 for each plugin loaded from a registry: its reference and the manifest digest it runs from its lease's next term",
            self.sources.clone(),
        );
    }

    /// The plugins loaded from registries: `(plugin, reference, digest)`
    /// (at start and after each reload).
    pub fn sources(&self, sources: Vec<(String, String, String)>) {
        self.sources.clear();
        for (plugin, reference, digest) in sources {
            let labels = SourceLabels {
                plugin,
                reference,
                digest,
            };
            self.sources.get_or_create(&labels).set(1);
        }
    }

    /// Reloads by result, both results present from the start.
    fn register_reloads(&self, registry: &mut Registry) {
        registry.register(
            "reloads",
            "Reloads (SIGHUP, or a watched file that changed), by result: ok (applied, or nothing changed) or refused (a broken file, a plugin that cannot run, or a change that needs a restart; nothing was changed)",
            self.reloads.clone(),
        );
        for result in ["ok", "refused"] {
            let _ = self.reloads.get_or_create(&ReloadLabels { result });
        }
    }

    /// The plugins `baton run` loaded (with their leases), how many it
    /// refused, and its engine (for the compiled-code cache).
    pub fn loaded(&self, plugins: &[(String, Arc<Plugin>)], refused: usize, engine: &PluginEngine) {
        let mut read = self.read.inner.lock().unwrap_or_else(|e| e.into_inner());
        read.plugins = plugins.iter().map(|(l, p)| (p.clone(), l.clone())).collect();
        read.refused = refused;
        read.engine = Some(engine.clone());
        // Counters at 0 from the start: `increase()` misses the first
        // event of a series that appears with it.
        for (_, p) in plugins {
            let labels = PluginLabels {
                plugin: p.name().to_owned(),
            };
            for family in [&self.starts, &self.failures, &self.traps, &self.forced] {
                let _ = family.get_or_create(&labels);
            }
        }
    }

    /// The configured leases, whose timings are exported (at start and
    /// after each reload that applied).
    pub fn leases(&self, leases: &[LeaseConfig]) {
        let mut read = self.read.inner.lock().unwrap_or_else(|e| e.into_inner());
        read.timings = leases.iter().map(|l| (l.name.clone(), l.timings)).collect();
        // Counters at 0 from the start, as in `loaded`.
        for l in leases {
            for change in ["gained", "lost"] {
                let labels = ChangeLabels {
                    lease: l.name.clone(),
                    change,
                };
                let _ = self.changes.get_or_create(&labels);
            }
            for kind in StoreErrorKind::ALL {
                let labels = ErrorLabels {
                    lease: l.name.clone(),
                    kind: kind.as_str(),
                };
                let _ = self.store_errors.get_or_create(&labels);
            }
        }
    }

    /// A request on the route label of `lease` failed.
    pub fn route_label_error(&self, lease: &str) {
        self.route_label_errors
            .get_or_create(&LeaseLabels {
                lease: lease.to_owned(),
            })
            .inc();
    }

    /// A reload ended so: applied (`true`) or refused.
    pub fn reloaded(&self, ok: bool) {
        let result = if ok { "ok" } else { "refused" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// Every metric in the Prometheus text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String does not fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    fn set_task_state(&self, plugin: &str, state: TaskState) {
        for s in TaskState::ALL {
            self.task_state
                .get_or_create(&StateLabels {
                    plugin: plugin.to_owned(),
                    state: s.as_str(),
                })
                .set(i64::from(s == state));
        }
    }
}

impl ElectionObserver for Metrics {
    fn status_changed(&self, before: &Status, after: &Status) {
        let lease = &after.lease;
        for r in ROLES {
            self.role
                .get_or_create(&RoleLabels {
                    lease: lease.clone(),
                    role: role_name(r),
                })
                .set(i64::from(r == after.role));
        }
        self.term
            .get_or_create(&LeaseLabels { lease: lease.clone() })
            .set(i64::try_from(after.term).unwrap_or(i64::MAX));
        let change = match (before.is_leading(), after.is_leading()) {
            (false, true) => Some("gained"),
            (true, false) => Some("lost"),
            // A new term straight after the last (not published so today).
            (true, true) if before.term != after.term => Some("gained"),
            _ => None,
        };
        if let Some(change) = change {
            self.changes
                .get_or_create(&ChangeLabels {
                    lease: lease.clone(),
                    change,
                })
                .inc();
        }
        let mut read = self.read.inner.lock().unwrap_or_else(|e| e.into_inner());
        if after.is_leading() {
            read.confirmed.insert(lease.clone(), Instant::now());
        } else {
            read.confirmed.remove(lease);
        }
    }

    fn renewed(&self, lease: &str, latency: Duration) {
        self.renewals
            .get_or_create(&LeaseLabels {
                lease: lease.to_owned(),
            })
            .observe(latency.as_secs_f64());
        let mut read = self.read.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = read.confirmed.get_mut(lease) {
            *at = Instant::now();
        }
    }

    fn store_error(&self, lease: &str, kind: StoreErrorKind) {
        self.store_errors
            .get_or_create(&ErrorLabels {
                lease: lease.to_owned(),
                kind: kind.as_str(),
            })
            .inc();
    }
}

impl TaskObserver for Metrics {
    fn state(&self, plugin: &str, state: TaskState) {
        self.set_task_state(plugin, state);
    }

    fn started(&self, plugin: &str) {
        self.starts
            .get_or_create(&PluginLabels {
                plugin: plugin.to_owned(),
            })
            .inc();
    }

    fn ended(&self, plugin: &str, end: TaskEnd) {
        let family = match end {
            TaskEnd::Failed => &self.failures,
            TaskEnd::Trapped => &self.traps,
            TaskEnd::Forced => &self.forced,
            TaskEnd::Finished | TaskEnd::NotStarted => return,
        };
        family
            .get_or_create(&PluginLabels {
                plugin: plugin.to_owned(),
            })
            .inc();
    }

    fn stopped(&self, plugin: &str, forced: bool, after: Duration) {
        self.stops
            .get_or_create(&StopLabels {
                plugin: plugin.to_owned(),
                how: if forced { "forced" } else { "cooperative" },
            })
            .observe(after.as_secs_f64());
    }

    fn scheduled_run(
        &self,
        plugin: &str,
        _: &crate::schedule::ScheduledRun,
        outcome: &'static str,
        lateness: Duration,
    ) {
        let labels = OutcomeLabels {
            plugin: plugin.to_owned(),
            outcome,
        };
        self.schedule_runs.get_or_create(&labels).inc();
        let plugin = PluginLabels {
            plugin: plugin.to_owned(),
        };
        self.schedule_lateness
            .get_or_create(&plugin)
            .observe(lateness.as_secs_f64());
    }

    fn schedule_skipped(&self, plugin: &str, reason: &'static str, count: u64) {
        let labels = ReasonLabels {
            plugin: plugin.to_owned(),
            reason,
        };
        self.schedule_skips.get_or_create(&labels).inc_by(count);
    }

    fn health_check(&self, plugin: &str, outcome: &'static str) {
        let labels = OutcomeLabels {
            plugin: plugin.to_owned(),
            outcome,
        };
        self.health_checks.get_or_create(&labels).inc();
    }

    fn health_handover(&self, lease: &str) {
        let labels = LeaseLabels {
            lease: lease.to_owned(),
        };
        self.health_handovers.get_or_create(&labels).inc();
    }
}

/// Encodes `family` under `name` (the registry adds the prefix).
fn emit<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: &M,
) -> std::fmt::Result {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for Read {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let read = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        encode_renewal_ages(&read, &mut encoder)?;
        encode_timings(&read, &mut encoder)?;
        encode_plugins(&read, &mut encoder)?;
        encode_counts(&read, &mut encoder)
    }
}

/// `lease_seconds_since_renewal`, for each lease this host leads.
fn encode_renewal_ages(read: &ReadInner, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
    let since = Family::<LeaseLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for (lease, at) in &read.confirmed {
        since
            .get_or_create(&LeaseLabels { lease: lease.clone() })
            .set(at.elapsed().as_secs_f64());
    }
    emit(
        encoder,
        "lease_seconds_since_renewal",
        "Seconds since the store last confirmed this host's hold on the lease (its acquisition or a renewal); only while this host leads it",
        &since,
    )
}

/// `lease_duration_seconds`, `lease_renew_deadline_seconds` and
/// `lease_retry_period_seconds`: each configured lease's timings, for
/// alerts that scale with them (deploy/prometheus).
fn encode_timings(read: &ReadInner, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
    type Seconds = Gauge<f64, std::sync::atomic::AtomicU64>;
    type Pick = (&'static str, &'static str, fn(&Timings) -> Duration);
    let pick: [Pick; 3] = [
        (
            "lease_duration_seconds",
            "The lease's configured lease duration (LD)",
            |t| t.lease_duration,
        ),
        (
            "lease_renew_deadline_seconds",
            "The lease's configured renew deadline (RD)",
            |t| t.renew_deadline,
        ),
        (
            "lease_retry_period_seconds",
            "The lease's configured retry period (RP)",
            |t| t.retry_period,
        ),
    ];
    for (name, help, field) in pick {
        let family = Family::<LeaseLabels, Seconds>::default();
        for (lease, t) in &read.timings {
            family
                .get_or_create(&LeaseLabels { lease: lease.clone() })
                .set(field(t).as_secs_f64());
        }
        emit(encoder, name, help, &family)?;
    }
    Ok(())
}

/// Each loaded plugin's info, dropped output and memory.
fn encode_plugins(read: &ReadInner, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
    let info = Family::<InfoLabels, Gauge>::default();
    let dropped = Family::<PluginLabels, Counter>::default();
    let memory = Family::<PluginLabels, Gauge>::default();
    let keyvalue = Family::<KeyValueLabels, Counter>::default();
    for (p, lease) in &read.plugins {
        // Every outcome of a plugin with state, 0 until it happens.
        for (write, kind) in [(false, "read"), (true, "write")] {
            for outcome in Outcome::ALL {
                if let Some(counts) = p.bucket_counts() {
                    let labels = KeyValueLabels {
                        plugin: p.name().to_owned(),
                        kind,
                        outcome: outcome.label(),
                    };
                    keyvalue.get_or_create(&labels).inc_by(counts.get(write, outcome));
                }
            }
        }
        let plugin = PluginLabels {
            plugin: p.name().to_owned(),
        };
        info.get_or_create(&InfoLabels {
            plugin: p.name().to_owned(),
            lease: lease.clone(),
            world: p.wit_world(),
        })
        .set(1);
        dropped
            .get_or_create(&plugin)
            .inc_by(p.output().dropped_lines_total());
        memory
            .get_or_create(&plugin)
            .set(i64::try_from(p.memory_bytes()).unwrap_or(i64::MAX));
    }
    emit(
        encoder,
        "plugin_info",
        "1 for each loaded plugin, with its lease and the world it targets",
        &info,
    )?;
    emit(
        encoder,
        "plugin_output_dropped_lines",
        "Lines of the plugin's output dropped by its output-rate limit",
        &dropped,
    )?;
    emit(
        encoder,
        "plugin_keyvalue_operations",
        "The plugin's wasi:keyvalue operations, by kind (read, write) and outcome: ok, conflict (a compare-and-swap found the entry changed), stale (a write refused because a newer term claimed the bucket or the term was past its force-stop time), limit, error",
        &keyvalue,
    )?;
    emit(
        encoder,
        "plugin_memory_bytes",
        "Linear memory of the plugin's running instances, in bytes (0 while none runs)",
        &memory,
    )
}

/// The host's counts: plugins loaded and refused, the compiled-code
/// cache's hits and misses, the log's dropped lines.
fn encode_counts(read: &ReadInner, encoder: &mut DescriptorEncoder) -> std::fmt::Result {
    emit(
        encoder,
        "plugins_loaded",
        "Plugins loaded and ready to run",
        &Gauge::<i64>::default().tap(read.plugins.len() as i64),
    )?;
    emit(
        encoder,
        "plugins_refused",
        "Configured plugins that could not be loaded (each is named in the log and on /readyz)",
        &Gauge::<i64>::default().tap(read.refused as i64),
    )?;
    if let Some((hits, misses)) = read.engine.as_ref().and_then(PluginEngine::cache_stats) {
        emit(
            encoder,
            "compiled_cache_hits",
            "Components whose compiled code was found in the compiled-code cache",
            &ConstCounter::new(hits as u64),
        )?;
        emit(
            encoder,
            "compiled_cache_misses",
            "Components compiled because the compiled-code cache did not hold them",
            &ConstCounter::new(misses as u64),
        )?;
    }
    emit(
        encoder,
        "log_dropped_lines",
        "Log lines dropped because standard error did not keep up",
        &ConstCounter::new(crate::ops::logging::dropped_lines()),
    )
}

/// Sets a gauge and hands it back.
trait Tap {
    fn tap(self, v: i64) -> Self;
}

impl Tap for Gauge<i64> {
    fn tap(self, v: i64) -> Self {
        self.set(v);
        self
    }
}

#[cfg(test)]
mod tests;
