//! `wasi:config/store@0.2.0-draft` for plugins (`wasmtime-wasi-config`):
//! the values of the plugin's `config` table, read again at the start of
//! each run, so a file that changed (a Kubernetes Secret mounted as a file)
//! or a reload's new values apply from the plugin's next run.

use std::path::PathBuf;

use wasmtime::component::Linker;
use wasmtime_wasi::WasiView;
use wasmtime_wasi_config::{WasiConfig, WasiConfigVariables};

use std::collections::BTreeMap;

use super::unit::{Capability, GrantError, GrantSite, LoadContext, RunStart, Setup, SetupError, Shared};
use crate::runtime::world::World;

/// The capability: the plugin's `config` table.
pub struct Config;

/// A `config` value, as written: the value itself, or where to read it.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub enum RawConfigValue {
    /// The value.
    Value(String),
    /// `{ from-file = "…" }` or `{ env = "…" }`.
    Source(RawConfigSource),
}

/// Where a `config` value is read.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RawConfigSource {
    from_file: Option<PathBuf>,
    env: Option<String>,
}

crate::raw_keys! {
    /// `config`.
    pub struct RawConfig {
        values: BTreeMap<String, RawConfigValue> = "config",
    }
}

impl Capability for Config {
    type Raw = RawConfig;
    type Grant = ConfigGrant;
    type Plugin = ConfigGrant;
    type Ctx = WasiConfigVariables;
    type View<'a> = WasiConfig<'a>;

    /// Each key's source: its value, a file (relative to the
    /// configuration's folder) or a variable of the host.
    fn grant(raw: RawConfig, site: &GrantSite<'_>) -> Result<ConfigGrant, GrantError> {
        let mut values = Vec::new();
        for (key, raw) in raw.values.unwrap_or_default() {
            let source = match raw {
                RawConfigValue::Value(v) => ConfigSource::Value(v),
                RawConfigValue::Source(RawConfigSource {
                    from_file: Some(f),
                    env: None,
                }) => ConfigSource::File(site.resolve(&f)),
                RawConfigValue::Source(RawConfigSource {
                    from_file: None,
                    env: Some(v),
                }) => ConfigSource::Env(v),
                RawConfigValue::Source(_) => {
                    let why =
                        format!("key {key:?}: give a string, {{ from-file = \"…\" }} or {{ env = \"…\" }}");
                    return Err(site.error("config", why));
                }
            };
            values.push((key, source));
        }
        Ok(ConfigGrant { values })
    }

    fn load(grant: &ConfigGrant, _: &LoadContext<'_>) -> Result<ConfigGrant, String> {
        Ok(grant.clone())
    }

    /// No values yet: they are read as the run starts.
    fn prepare(_: &ConfigGrant, _: &mut Setup<'_>) -> Result<WasiConfigVariables, SetupError> {
        Ok(WasiConfigVariables::new())
    }

    fn start(ctx: &mut WasiConfigVariables, grant: &ConfigGrant, _: &RunStart<'_>) -> Result<(), SetupError> {
        *ctx = grant.resolve().map_err(SetupError::new)?;
        Ok(())
    }

    fn view<'a>(ctx: &'a mut WasiConfigVariables, _: Shared<'a>) -> WasiConfig<'a> {
        WasiConfig::from(&*ctx)
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        _: World,
        get: for<'a> fn(&'a mut T) -> WasiConfig<'a>,
    ) -> wasmtime::Result<()> {
        wasmtime_wasi_config::add_to_linker(linker, get)
    }

    fn describe(grant: &ConfigGrant) -> Vec<String> {
        let keys: Vec<&str> = grant.keys().collect();
        if keys.is_empty() {
            Vec::new()
        } else {
            vec![format!("config {}", keys.join(","))]
        }
    }
}

/// Where one configuration value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// The value itself.
    Value(String),
    /// The contents of a file (a trailing newline removed).
    File(PathBuf),
    /// A variable of the host's environment.
    Env(String),
}

/// A plugin's configuration values, by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigGrant {
    /// Each key and where its value comes from, in key order.
    pub values: Vec<(String, ConfigSource)>,
}

/// Why a configuration value could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigValueError {
    /// Its file could not be read.
    #[error("config key {key:?}: cannot read {}: {error}", file.display())]
    File {
        /// The key.
        key: String,
        /// The file.
        file: PathBuf,
        /// What reading said.
        error: std::io::Error,
    },
    /// Its environment variable is not set (or not Unicode).
    #[error("config key {key:?}: the host's environment variable {var} is not set")]
    Env {
        /// The key.
        key: String,
        /// The variable.
        var: String,
    },
}

impl ConfigGrant {
    /// The values as they are now.
    pub fn resolve(&self) -> Result<WasiConfigVariables, ConfigValueError> {
        let mut vars = WasiConfigVariables::new();
        for (key, source) in &self.values {
            let value = match source {
                ConfigSource::Value(v) => v.clone(),
                ConfigSource::File(file) => std::fs::read_to_string(file)
                    .map(|s| s.strip_suffix('\n').map(str::to_owned).unwrap_or(s))
                    .map_err(|error| ConfigValueError::File {
                        key: key.clone(),
                        file: file.clone(),
                        error,
                    })?,
                ConfigSource::Env(var) => std::env::var(var).map_err(|_| ConfigValueError::Env {
                    key: key.clone(),
                    var: var.clone(),
                })?,
            };
            vars.insert(key.clone(), value);
        }
        Ok(vars)
    }

    /// The keys, for the log (never the values: they may be secrets).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.iter().map(|(k, _)| k.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_from_the_table_a_file_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        let grant = ConfigGrant {
            values: vec![
                ("region".into(), ConfigSource::Value("eu".into())),
                ("token".into(), ConfigSource::File(file.clone())),
                ("path".into(), ConfigSource::Env("PATH".into())),
            ],
        };
        grant.resolve().unwrap();
        std::fs::remove_file(&file).unwrap();
        let Err(e) = grant.resolve() else {
            panic!("a missing file must fail")
        };
        assert!(
            e.to_string().contains("\"token\"") && e.to_string().contains("token"),
            "{e}"
        );
        let missing = ConfigGrant {
            values: vec![("k".into(), ConfigSource::Env("BATON_SURELY_UNSET_VAR".into()))],
        };
        let Err(e) = missing.resolve() else {
            panic!("an unset variable must fail")
        };
        assert!(e.to_string().contains("BATON_SURELY_UNSET_VAR"), "{e}");
    }
}
