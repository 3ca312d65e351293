//! `[registry]` and the plugins whose `path` is an `oci://` reference:
//! how the host talks to registries, where it caches what it pulls, and
//! which key must have signed a component (`verify-key`, for every such
//! plugin or per plugin).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::parse::Source;
use super::{ConfigError, ConfigErrorKind};
use crate::oci::{self, Reference, VerifyKey};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(super) struct RawRegistry {
    auth_file: Option<PathBuf>,
    ca: Option<PathBuf>,
    #[serde(default)]
    plain_http: Vec<String>,
    verify_key: Option<PathBuf>,
    #[serde(default, with = "humantime_serde")]
    poll: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
    cache_dir: Option<PathBuf>,
}

/// `[registry]`, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryConfig {
    /// `auth-file`: the credentials; `None`: the usual places.
    pub auth_file: Option<PathBuf>,
    /// `ca`: a CA certificate trusted besides the web's roots.
    pub ca: Option<PathBuf>,
    /// `plain-http`: registries spoken to without TLS.
    pub plain_http: Vec<String>,
    /// `verify-key`: every `oci://` plugin must be signed by this key.
    pub verify_key: Option<VerifyKey>,
    /// `poll`: how often `--watch` re-resolves tags.
    pub poll: Option<Duration>,
    /// `timeout`: how long one registry operation may take.
    pub timeout: Option<Duration>,
    /// `cache-dir`: where pulled components are kept; `None`: `oci` beside
    /// the compiled-code cache.
    pub cache_dir: Option<PathBuf>,
}

impl RegistryConfig {
    /// The client's settings; `compiled` is the compiled-code cache, whose
    /// sibling `oci` holds pulled components unless `cache-dir` says.
    pub fn settings(&self, compiled: &Path) -> oci::Settings {
        let cache_dir = self.cache_dir.clone().unwrap_or_else(|| match compiled.parent() {
            Some(parent) => parent.join("oci"),
            None => compiled.join("oci"),
        });
        let mut s = oci::Settings::with_cache(cache_dir);
        s.auth_file.clone_from(&self.auth_file);
        s.ca.clone_from(&self.ca);
        s.plain_http.clone_from(&self.plain_http);
        s.timeout = self.timeout.unwrap_or(oci::DEFAULT_TIMEOUT);
        s.poll = self.poll.unwrap_or(oci::DEFAULT_POLL);
        s
    }
}

/// A plugin's component in a registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciSource {
    /// Its reference (`path`).
    pub reference: Reference,
    /// The key that must have signed it: the plugin's `verify-key`, else
    /// `[registry] verify-key`; `None`: no signature required.
    pub verify_key: Option<VerifyKey>,
    /// The manifest digest pulled for it, once the host has (`None` in a
    /// configuration as read).
    pub digest: Option<String>,
}

impl Source<'_> {
    /// `[registry]`.
    pub(super) fn registry(&self, raw: Option<&RawRegistry>) -> Result<RegistryConfig, ConfigError> {
        let Some(raw) = raw else {
            return Ok(RegistryConfig::default());
        };
        let err = |field, reason| ConfigError {
            file: self.file.clone(),
            line: None,
            kind: ConfigErrorKind::Registry { field, reason },
        };
        if let Some(p) = raw.poll
            && p < oci::MIN_POLL
        {
            let least = humantime::format_duration(oci::MIN_POLL);
            return Err(err(
                "poll",
                format!("below {least}: registries are asked at most that often"),
            ));
        }
        if raw.timeout.is_some_and(|t| t.is_zero()) {
            return Err(err("timeout", "must be above zero".into()));
        }
        if let Some(bad) = raw.plain_http.iter().find(|r| r.is_empty() || r.contains('/')) {
            return Err(err(
                "plain-http",
                format!("{bad:?} is not a registry: write host or host:port"),
            ));
        }
        let verify_key = match &raw.verify_key {
            Some(k) => Some(VerifyKey::read(&self.resolve(k)).map_err(|e| err("verify-key", e.to_string()))?),
            None => None,
        };
        Ok(RegistryConfig {
            auth_file: raw.auth_file.as_ref().map(|f| self.resolve(f)),
            ca: raw.ca.as_ref().map(|f| self.resolve(f)),
            plain_http: raw.plain_http.clone(),
            verify_key,
            poll: raw.poll,
            timeout: raw.timeout,
            cache_dir: raw.cache_dir.as_ref().map(|d| self.resolve(d)),
        })
    }

    /// A plugin's `path` if it is a reference, with the key that must have
    /// signed it (`verify-key`, else the registry's).
    pub(super) fn oci_source(
        &self,
        at: usize,
        name: &str,
        path: &Path,
        verify_key: Option<&Path>,
        registry: &RegistryConfig,
    ) -> Result<Option<OciSource>, ConfigError> {
        let field_err = self.plugin_field_err(at, name);
        let text = path.to_string_lossy();
        if !text.starts_with(oci::SCHEME) {
            if verify_key.is_some() {
                return Err(field_err(
                    "verify-key",
                    "applies only to a component from a registry (a `path` of oci://…)".into(),
                ));
            }
            return Ok(None);
        }
        let reference = Reference::parse(&text).map_err(|e| field_err("path", e.to_string()))?;
        let verify_key = match verify_key {
            Some(k) => {
                Some(VerifyKey::read(&self.resolve(k)).map_err(|e| field_err("verify-key", e.to_string()))?)
            }
            None => registry.verify_key.clone(),
        };
        Ok(Some(OciSource {
            reference,
            verify_key,
            digest: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const HEAD: &str = "[[lease]]\nname = \"l\"\n";

    #[test]
    fn a_reference_path_gives_a_source_and_the_registry_settings() {
        let text = format!(
            "{HEAD}[registry]\nplain-http = [\"127.0.0.1:5000\"]\npoll = \"5s\"\n\
             [[plugin]]\nname = \"p\"\npath = \"oci://127.0.0.1:5000/team/p:1\"\nlease = \"l\"\n\
             [[plugin]]\nname = \"f\"\npath = \"f.wasm\"\nlease = \"l\"\n"
        );
        let c = Config::parse(&text, None).unwrap();
        let s = c.plugins[0].source.as_ref().unwrap();
        assert_eq!(s.reference.to_string(), "oci://127.0.0.1:5000/team/p:1");
        assert!(s.verify_key.is_none() && s.digest.is_none());
        assert!(c.plugins[1].source.is_none());
        let settings = c.registry.settings(std::path::Path::new("/c/baton/compiled"));
        assert_eq!(settings.cache_dir, std::path::Path::new("/c/baton/oci"));
        assert_eq!(settings.plain_http, ["127.0.0.1:5000"]);
        assert_eq!(settings.poll, std::time::Duration::from_secs(5));
    }

    #[test]
    fn bad_references_keys_and_polls_are_named() {
        let plugin = |path: &str, extra: &str| {
            format!("{HEAD}[[plugin]]\nname = \"p\"\npath = {path:?}\nlease = \"l\"\n{extra}")
        };
        let cases = [
            (plugin("oci://team/p:1", ""), "plugin \"p\": field `path`"),
            (plugin("oci://r.io/p", ""), "neither a tag nor a digest"),
            (
                plugin("f.wasm", "verify-key = \"k.pub\"\n"),
                "field `verify-key`: applies only",
            ),
            (
                plugin("oci://r.io/p:1", "verify-key = \"/nonexistent.pub\"\n"),
                "/nonexistent.pub",
            ),
            (
                format!("{HEAD}[registry]\npoll = \"10ms\"\n"),
                "[registry]: field `poll`",
            ),
            (
                format!("{HEAD}[registry]\nplain-http = [\"http://x\"]\n"),
                "field `plain-http`",
            ),
        ];
        for (text, want) in cases {
            let e = Config::parse(&text, None).unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in: {e}");
        }
    }
}
