//! The conversion of the TOML's raw tables into a [`Config`]: one method
//! per section, each checking its fields and naming the file, line and
//! field at fault. Relative paths are taken from the file's folder.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use bytesize::ByteSize;

use super::*;
use crate::election::spread::MAX_WEIGHT;
use crate::runtime::capability::unit::GrantSite;
use crate::runtime::{Grants, RawGrants};
use crate::schedule::{CatchUp, Overlap, Schedule, When};

/// The file being parsed: its name for messages, its text for line
/// numbers, its folder for relative paths.
pub(super) struct Source<'a> {
    pub(super) file: String,
    pub(super) text: &'a str,
    pub(super) base: PathBuf,
}

impl Source<'_> {
    /// An error at byte `offset` of the text.
    pub(super) fn err_at(&self, offset: usize, kind: ConfigErrorKind) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            line: Some(line_of(self.text, offset)),
            kind,
        }
    }

    /// Errors in a field of plugin `name`'s table at `at`: `(field, reason)`.
    pub(super) fn plugin_field_err<'a>(
        &'a self,
        at: usize,
        name: &'a str,
    ) -> impl Fn(&'static str, String) -> ConfigError + 'a {
        move |field, reason| {
            self.err_at(
                at,
                ConfigErrorKind::PluginField {
                    plugin: name.to_owned(),
                    field,
                    reason,
                },
            )
        }
    }

    /// An error of the file as a whole.
    pub(super) fn err(&self, kind: ConfigErrorKind) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            line: None,
            kind,
        }
    }

    /// A plugin's grant in `field` that its parser refused, saying why in
    /// its own words.
    fn grant_err(
        &self,
        at: usize,
        plugin: &str,
        field: impl Into<String>,
        why: impl std::fmt::Display,
    ) -> ConfigError {
        let reason = why.to_string();
        self.err_at(
            at,
            ConfigErrorKind::Grant {
                plugin: plugin.to_owned(),
                field: field.into(),
                reason,
            },
        )
    }

    /// `p`, relative to the file's folder unless absolute.
    pub(super) fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    /// The `[[lease]]` tables, each with its timings over `[defaults]`.
    pub(super) fn leases(&self, raw: &RawConfig) -> Result<Vec<LeaseConfig>, ConfigError> {
        let mut leases: Vec<LeaseConfig> = Vec::new();
        let kubernetes = matches!(raw.store, Some(RawStore::Kubernetes { .. }));
        for lease in &raw.leases {
            let name = lease.name.get_ref();
            let at = lease.name.span().start;
            validate_lease_name(name).map_err(|e| {
                let reason = e.to_string();
                self.err_at(
                    at,
                    ConfigErrorKind::LeaseName {
                        lease: name.clone(),
                        reason,
                    },
                )
            })?;
            if name.starts_with(MEMBER_PREFIX) {
                return Err(self.err_at(at, ConfigErrorKind::ReservedLeaseName(name.clone())));
            }
            if leases.iter().any(|l| &l.name == name) {
                return Err(self.err_at(at, ConfigErrorKind::LeaseDeclaredTwice(name.clone())));
            }
            let timings = lease.timings.over(&raw.defaults);
            timings.validate().map_err(|error| {
                self.err_at(
                    at,
                    ConfigErrorKind::UnsafeTimings {
                        lease: name.clone(),
                        error: Box::new(error),
                    },
                )
            })?;
            if kubernetes {
                self.whole_seconds(at, name, timings.lease_duration)?;
            } else if lease.route_label {
                return Err(self.err_at(at, ConfigErrorKind::RouteLabelWithoutPods(name.clone())));
            }
            leases.push(LeaseConfig {
                name: name.clone(),
                timings,
                placement: self.placement(at, name, lease)?,
                route_label: lease.route_label,
            });
        }
        Ok(leases)
    }

    /// A lease's `prefer` and `avoid`: host identities (free-form, not
    /// empty), none in both.
    fn placement(&self, at: usize, name: &str, lease: &RawLease) -> Result<Placement, ConfigError> {
        for (field, hosts) in [("prefer", &lease.prefer), ("avoid", &lease.avoid)] {
            if hosts.iter().any(|h| h.trim().is_empty()) {
                let lease = name.to_owned();
                return Err(self.err_at(at, ConfigErrorKind::EmptyPlacementHost { lease, field }));
            }
        }
        if let Some(host) = lease.prefer.iter().find(|h| lease.avoid.contains(h)) {
            let (lease, host) = (name.to_owned(), host.clone());
            return Err(self.err_at(at, ConfigErrorKind::PreferAndAvoid { lease, host }));
        }
        Ok(Placement {
            prefer: lease.prefer.clone(),
            avoid: lease.avoid.clone(),
        })
    }

    /// `weight`: 1 by default, at most [`MAX_WEIGHT`].
    pub(super) fn weight(&self, raw: Option<i64>) -> Result<u32, ConfigError> {
        match raw {
            None => Ok(1),
            Some(w) if (1..=i64::from(MAX_WEIGHT)).contains(&w) => Ok(w as u32),
            Some(w) => Err(self.err(ConfigErrorKind::Weight(w))),
        }
    }

    /// A Kubernetes Lease holds `leaseDurationSeconds`: `d` must be whole
    /// seconds.
    fn whole_seconds(&self, at: usize, name: &str, d: Duration) -> Result<(), ConfigError> {
        if d.subsec_nanos() == 0 && d.as_secs() <= i32::MAX as u64 {
            return Ok(());
        }
        Err(self.err_at(
            at,
            ConfigErrorKind::FractionalLeaseDuration {
                lease: name.to_owned(),
                duration: d,
            },
        ))
    }

    /// The `[[plugin]]` tables, each under a declared lease.
    pub(super) fn plugins(
        &self,
        raw: &mut RawConfig,
        leases: &[LeaseConfig],
        registry: &RegistryConfig,
    ) -> Result<Vec<PluginConfig>, ConfigError> {
        let mut plugins: Vec<PluginConfig> = Vec::new();
        for p in &mut raw.plugins {
            let grants = std::mem::take(&mut p.grants);
            let p = &*p;
            let name = p.name.get_ref();
            let at = p.name.span().start;
            self.plugin_name(at, name)?;
            if plugins.iter().any(|q| &q.spec.name == name) {
                return Err(self.err_at(at, ConfigErrorKind::PluginDeclaredTwice(name.clone())));
            }
            self.declared_lease(name, &p.lease, leases)?;
            let source = self.oci_source(at, name, p.path.get_ref(), p.verify_key.as_deref(), registry)?;
            plugins.push(PluginConfig {
                spec: PluginSpec {
                    name: name.clone(),
                    // A reference's file is known once it is pulled.
                    path: match &source {
                        Some(s) => PathBuf::from(s.reference.to_string()),
                        None => self.resolve(p.path.get_ref()),
                    },
                    digest: None,
                    memory_limit: self.memory_limit(at, name, p)?,
                    grants: self.grants(at, name, grants)?,
                    health_check: self.health_check(at, name, p.health_check.as_ref())?,
                },
                lease: p.lease.get_ref().clone(),
                reload: p.reload,
                schedule: self.schedule(at, name, p)?,
                source,
            });
        }
        self.own_buckets_apart(&raw.plugins, &plugins)?;
        Ok(plugins)
    }

    /// Each capability's grant, from its keys of the plugin's table.
    fn grants(&self, at: usize, name: &str, raw: RawGrants) -> Result<Grants, ConfigError> {
        let site = GrantSite {
            plugin: name,
            at,
            base: &self.base,
        };
        raw.grants(&site)
            .map_err(|e| self.grant_err(e.at, name, e.field, e.reason))
    }

    /// A bucket granted by name is shared under the lease; it must not be
    /// another plugin's own bucket (stored under that plugin's name).
    fn own_buckets_apart(&self, raw: &[RawPlugin], plugins: &[PluginConfig]) -> Result<(), ConfigError> {
        for (r, p) in raw.iter().zip(plugins) {
            let clash = p.spec.grants.keyvalue.buckets.iter().find(|b| {
                plugins
                    .iter()
                    .any(|q| q.lease == p.lease && q.spec.name != p.spec.name && &&q.spec.name == b)
            });
            if let Some(b) = clash {
                return Err(self.err_at(
                    r.name.span().start,
                    ConfigErrorKind::PluginField {
                        plugin: p.spec.name.clone(),
                        field: "keyvalue",
                        reason: format!(
                            "bucket {b:?} is the own bucket of plugin {b:?} of the same lease; name another"
                        ),
                    },
                ));
            }
        }
        Ok(())
    }

    /// `schedule` or `every`, and the policies of a schedule.
    fn schedule(&self, at: usize, name: &str, p: &RawPlugin) -> Result<Option<Schedule>, ConfigError> {
        let err = self.plugin_field_err(at, name);
        let when = match (&p.schedule, p.every) {
            (Some(_), Some(_)) => return Err(err("every", "give `schedule` or `every`, not both".into())),
            (Some(pattern), None) => {
                When::cron(pattern, p.time_zone.as_deref()).map_err(|e| err("schedule", e.to_string()))?
            }
            (None, Some(period)) => When::every(period).map_err(|e| err("every", e.to_string()))?,
            (None, None) => {
                let policy = p.time_zone.is_some()
                    || p.starting_deadline.is_some()
                    || p.catch_up.is_some()
                    || p.overlap.is_some()
                    || p.jitter.is_some()
                    || p.suspend;
                if policy {
                    return Err(err(
                        "schedule",
                        "a schedule's settings without `schedule` or `every`".into(),
                    ));
                }
                return Ok(None);
            }
        };
        if p.time_zone.is_some() && matches!(when, When::Every(_)) {
            return Err(err(
                "time-zone",
                "only for a cron `schedule`; `every` counts from the Unix epoch".into(),
            ));
        }
        let mut schedule = Schedule::new(when);
        schedule.starting_deadline = p.starting_deadline;
        schedule.jitter = p.jitter.unwrap_or_default();
        schedule.suspend = p.suspend;
        schedule.catch_up = match p.catch_up {
            Some(RawCatchUp::All) => CatchUp::All,
            _ => CatchUp::Latest,
        };
        schedule.overlap = match p.overlap {
            Some(RawOverlap::QueueOne) => Overlap::QueueOne,
            Some(RawOverlap::Replace) => Overlap::Replace,
            _ => Overlap::Skip,
        };
        let now = std::time::SystemTime::now();
        let deadline = schedule.when.next_after(now).map(|d| schedule.deadline_of(d));
        if let Some(deadline) = deadline
            && schedule.jitter >= deadline
        {
            return Err(err(
                "jitter",
                format!(
                    "{} is not shorter than the starting deadline, {}: a run could never start in time",
                    humantime::format_duration(schedule.jitter),
                    humantime::format_duration(deadline)
                ),
            ));
        }
        Ok(Some(schedule))
    }

    /// A plugin's name: lease records list plugins by name.
    fn plugin_name(&self, at: usize, name: &str) -> Result<(), ConfigError> {
        if name.is_empty() {
            return Err(self.err_at(at, ConfigErrorKind::EmptyPluginName));
        }
        if name.contains(',') || name.chars().any(char::is_control) {
            return Err(self.err_at(at, ConfigErrorKind::PluginName(name.to_owned())));
        }
        Ok(())
    }

    /// The plugin's `lease` names a declared `[[lease]]`.
    fn declared_lease(
        &self,
        name: &str,
        lease: &toml::Spanned<String>,
        leases: &[LeaseConfig],
    ) -> Result<(), ConfigError> {
        let wanted = lease.get_ref();
        if leases.iter().any(|l| &l.name == wanted) {
            return Ok(());
        }
        Err(self.err_at(
            lease.span().start,
            ConfigErrorKind::UndeclaredLease {
                plugin: name.to_owned(),
                lease: wanted.clone(),
                declared: leases.iter().map(|l| l.name.clone()).collect(),
            },
        ))
    }

    /// `memory-limit`: 1 MiB at least.
    fn memory_limit(&self, at: usize, name: &str, p: &RawPlugin) -> Result<u64, ConfigError> {
        let limit = p.memory_limit.map_or(DEFAULT_MEMORY_LIMIT, |m| m.as_u64());
        if limit < ByteSize::mib(1).as_u64() {
            return Err(self.err_at(at, ConfigErrorKind::MemoryLimitTooSmall(name.to_owned())));
        }
        Ok(limit)
    }

    /// `[store]`: the embedded store by default, in `.baton/leases` beside
    /// the file.
    pub(super) fn store(&self, raw: Option<RawStore>) -> Result<StoreConfig, ConfigError> {
        match raw.unwrap_or_default() {
            RawStore::Embedded { dir } => Ok(StoreConfig::Embedded {
                dir: dir
                    .map(|d| self.resolve(&d))
                    .unwrap_or_else(|| self.base.join(".baton").join("leases")),
            }),
            RawStore::Kubernetes {
                namespace,
                kubeconfig,
                labels,
                pod,
                pod_namespace,
            } => {
                for ns in namespace.iter().chain(&pod_namespace) {
                    validate_namespace(ns).map_err(|e| self.err(ConfigErrorKind::Namespace(e)))?;
                }
                self.labels(&labels)?;
                Ok(StoreConfig::Kubernetes {
                    namespace,
                    kubeconfig: kubeconfig.map(|p| self.resolve(&p)),
                    labels,
                    pod,
                    pod_namespace,
                })
            }
            raw @ RawStore::Postgres { .. } => self.postgres_store(raw),
            RawStore::Etcd {
                endpoints,
                prefix,
                ca,
                cert,
                key,
                user,
                password_file,
                dial_timeout,
                request_timeout,
            } => {
                let endpoints = endpoints.unwrap_or_default();
                for e in &endpoints {
                    crate::config::etcd_endpoint(e).map_err(|why| self.err(ConfigErrorKind::Etcd(why)))?;
                }
                let prefix = prefix.unwrap_or_else(|| crate::store::etcd::DEFAULT_PREFIX.into());
                if prefix.is_empty() || prefix.contains('\0') {
                    return Err(self.err(ConfigErrorKind::Etcd(format!(
                        "field `prefix`: {prefix:?} is not a key prefix (non-empty, no NUL)"
                    ))));
                }
                if cert.is_some() != key.is_some() {
                    return Err(self.err(ConfigErrorKind::Etcd(
                        "fields `cert` and `key`: a client certificate needs its key, and a key its certificate"
                            .into(),
                    )));
                }
                for (field, d) in [
                    ("dial-timeout", dial_timeout),
                    ("request-timeout", request_timeout),
                ] {
                    if d.is_some_and(|d| d.is_zero()) {
                        return Err(self.err(ConfigErrorKind::Etcd(format!(
                            "field `{field}`: must be above zero"
                        ))));
                    }
                }
                Ok(StoreConfig::Etcd(crate::config::EtcdConfig {
                    endpoints,
                    prefix,
                    ca: ca.map(|p| self.resolve(&p)),
                    cert: cert.map(|p| self.resolve(&p)),
                    key: key.map(|p| self.resolve(&p)),
                    user,
                    password_file: password_file.map(|p| self.resolve(&p)),
                    dial_timeout,
                    request_timeout,
                }))
            }
        }
    }

    /// `[store] labels`: valid, and not baton's own.
    fn labels(&self, labels: &BTreeMap<String, String>) -> Result<(), ConfigError> {
        for (k, v) in labels {
            if k.is_empty() || k.len() > 316 || v.len() > 63 {
                return Err(self.err(ConfigErrorKind::Label {
                    key: k.clone(),
                    value: v.clone(),
                }));
            }
            if k == crate::store::kube::ROLE_LABEL {
                return Err(self.err(ConfigErrorKind::OwnLabel(k.clone())));
            }
        }
        Ok(())
    }

    /// `[spread]`: the membership records' settings (`None` if the
    /// defaults' timings are unsafe and nothing spreads), and whether the
    /// leads are spread (by default with more than one lease).
    pub(super) fn spread(
        &self,
        raw: &RawConfig,
        leases: usize,
    ) -> Result<(Option<SpreadConfig>, bool), ConfigError> {
        let spreading = raw.spread.enabled.unwrap_or(leases > 1);
        let base = RawTimings::default().over(&raw.defaults);
        if let Err(e) = base.validate() {
            if spreading {
                return Err(self.err(ConfigErrorKind::UnsafeDefaults(Box::new(e))));
            }
            return Ok((None, false));
        }
        let head_start = raw.spread.head_start.unwrap_or(DEFAULT_HEAD_START);
        if head_start.is_zero() || head_start >= base.lease_duration {
            return Err(self.err(ConfigErrorKind::HeadStart {
                head_start,
                lease_duration: base.lease_duration,
            }));
        }
        let forget_after = raw.spread.forget_after.unwrap_or(DEFAULT_FORGET_AFTER);
        if forget_after.is_zero() {
            return Err(self.err(ConfigErrorKind::ZeroForgetAfter));
        }
        let membership = SpreadConfig {
            forget_after,
            member_timings: member_timings(base),
            head_start,
            settle: raw.spread.settle.unwrap_or(base.retry_period * 2),
        };
        Ok((Some(membership), spreading))
    }

    /// `admin-address`, if set: a string like `"127.0.0.1:9090"`.
    pub(super) fn admin_address(&self, raw: &RawConfig) -> Result<Option<SocketAddr>, ConfigError> {
        let Some(a) = &raw.admin_address else {
            return Ok(None);
        };
        let parsed = match a.get_ref() {
            toml::Value::String(text) => parse_admin_address(text),
            other => Err(AdminAddressError::NotAString(other.type_str())),
        };
        parsed
            .map(Some)
            .map_err(|e| self.err_at(a.span().start, ConfigErrorKind::AdminAddress(e)))
    }

    /// `advertise-address`, if set: not empty, no whitespace.
    pub(super) fn advertise_address(
        &self,
        raw: Option<Spanned<String>>,
    ) -> Result<Option<String>, ConfigError> {
        let Some(address) = raw else {
            return Ok(None);
        };
        let at = address.span().start;
        validate_advertise_address(address.get_ref())
            .map_err(|e| self.err_at(at, ConfigErrorKind::AdvertiseAddress(e)))?;
        Ok(Some(address.into_inner()))
    }

    /// `identity`: not empty; a unique default when left out.
    pub(super) fn identity(&self, raw: Option<String>) -> Result<String, ConfigError> {
        match raw {
            Some(i) if i.trim().is_empty() => Err(self.err(ConfigErrorKind::EmptyIdentity)),
            Some(i) => Ok(i),
            None => Ok(default_identity()),
        }
    }
}
