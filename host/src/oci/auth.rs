//! Registry credentials from the usual places: a file the configuration
//! names (`[registry] auth-file`: a Docker `config.json`, or a Kubernetes
//! image-pull Secret's `.dockerconfigjson` mounted as a file), else
//! `REGISTRY_AUTH_FILE`, Podman's `$XDG_RUNTIME_DIR/containers/auth.json`,
//! `$DOCKER_CONFIG/config.json`, `~/.docker/config.json`: the first that
//! exists. Read again at each pull, so a rotated Secret is used at once.
//!
//! Invariant: a secret never reaches the log: [`Credentials`] shows only
//! the registries it has credentials for.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

/// The credentials of one file, by registry (`host` or `host:port`).
#[derive(Clone, Default)]
pub struct Credentials {
    by_registry: BTreeMap<String, (String, String)>,
    /// The file they came from.
    pub file: Option<PathBuf>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("registries", &self.by_registry.keys().collect::<Vec<_>>())
            .field("file", &self.file)
            .finish()
    }
}

/// Why a credentials file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// It cannot be read.
    #[error("registry credentials {}: cannot read it: {error}", file.display())]
    Unreadable {
        /// The file.
        file: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// It is not a Docker `config.json`.
    #[error("registry credentials {}: {why}", file.display())]
    Malformed {
        /// The file.
        file: PathBuf,
        /// What is wrong (never a secret).
        why: String,
    },
}

#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    auths: Option<BTreeMap<String, Entry>>,
    #[serde(flatten)]
    legacy: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct Entry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl Credentials {
    /// The credentials of `file` if given (it must exist), else of the
    /// first of the usual files that exists; none if none does.
    pub fn load(file: Option<&Path>) -> Result<Credentials, AuthError> {
        let path = match file {
            Some(f) => f.to_path_buf(),
            None => match usual_files().into_iter().find(|f| f.is_file()) {
                Some(f) => f,
                None => return Ok(Credentials::default()),
            },
        };
        let text = std::fs::read(&path).map_err(|error| AuthError::Unreadable {
            file: path.clone(),
            error,
        })?;
        Credentials::parse(&text, &path)
    }

    /// Reads a `config.json` (or the older `.dockercfg`, whose entries are
    /// at the top level).
    pub fn parse(text: &[u8], path: &Path) -> Result<Credentials, AuthError> {
        let malformed = |why: String| AuthError::Malformed {
            file: path.to_path_buf(),
            why,
        };
        let file: ConfigFile = serde_json::from_slice(text).map_err(|e| {
            malformed(format!(
                "not a Docker config.json (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        let entries: BTreeMap<String, Entry> = match file.auths {
            Some(a) => a,
            None => file
                .legacy
                .into_iter()
                .filter_map(|(k, v)| Some((k, serde_json::from_value(v).ok()?)))
                .collect(),
        };
        let mut by_registry = BTreeMap::new();
        for (key, entry) in entries {
            let registry = registry_of(&key);
            let pair = match (entry.username, entry.password, entry.auth) {
                (Some(u), Some(p), _) => (u, p),
                (_, _, Some(auth)) => decode(&auth).ok_or_else(|| {
                    malformed(format!("the `auth` of {key:?} is not base64 of user:password"))
                })?,
                _ => continue,
            };
            by_registry.insert(registry, pair);
        }
        Ok(Credentials {
            by_registry,
            file: Some(path.to_path_buf()),
        })
    }

    /// What to present to `registry`: basic credentials, or none.
    pub fn for_registry(&self, registry: &str) -> RegistryAuth {
        match self.by_registry.get(registry) {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    /// Whether there are credentials for `registry`.
    pub fn has(&self, registry: &str) -> bool {
        self.by_registry.contains_key(registry)
    }
}

/// A key of `auths` as a registry: `https://reg.example.com/v1/` and
/// `reg.example.com` are one.
fn registry_of(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = rest.split('/').next().unwrap_or(rest);
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_owned(),
        h => h.to_owned(),
    }
}

fn decode(auth: &str) -> Option<(String, String)> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// The usual files, in the order they are looked for.
fn usual_files() -> Vec<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let mut files = Vec::new();
    files.extend(var("REGISTRY_AUTH_FILE"));
    files.extend(var("XDG_RUNTIME_DIR").map(|d| d.join("containers/auth.json")));
    files.extend(var("DOCKER_CONFIG").map(|d| d.join("config.json")));
    files.extend(var("HOME").map(|d| d.join(".docker/config.json")));
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_and_kubernetes_files_give_basic_credentials_and_hide_them() {
        let auth = base64::engine::general_purpose::STANDARD.encode("ci:s3cret");
        let text = format!(
            r#"{{"auths":{{"https://reg.example.com/v1/":{{"auth":"{auth}"}},
                "127.0.0.1:5000":{{"username":"u","password":"p","auth":"x"}}}}}}"#
        );
        let c = Credentials::parse(text.as_bytes(), Path::new("config.json")).unwrap();
        assert!(
            matches!(c.for_registry("reg.example.com"), RegistryAuth::Basic(u, p) if u == "ci" && p == "s3cret")
        );
        assert!(matches!(c.for_registry("127.0.0.1:5000"), RegistryAuth::Basic(u, _) if u == "u"));
        assert!(matches!(
            c.for_registry("other.example.com"),
            RegistryAuth::Anonymous
        ));
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("reg.example.com"),
            "{shown}"
        );
    }

    #[test]
    fn a_broken_file_is_named_without_its_secrets() {
        let e = Credentials::parse(
            br#"{"auths":{"r.io":{"auth":"not base64!"}}}"#,
            Path::new("/run/pull/.dockerconfigjson"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/run/pull/.dockerconfigjson") && e.contains("r.io"),
            "{e}"
        );
        let e = Credentials::parse(b"{", Path::new("x.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.json"), "{e}");
    }
}
