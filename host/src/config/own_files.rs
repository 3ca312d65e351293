//! The host's own files, which no plugin's `dirs` grant may reach: the
//! embedded store's directory, the configuration file, the compiled-code
//! cache, the core-dump directory, the control socket and its lock file,
//! and every kubeconfig and CA file the configuration names (or, for a
//! Kubernetes client without a named kubeconfig, the ones it reads by
//! default).
//!
//! A grant is refused, at start and at reload, if its host directory
//! contains one of them or lies inside one, both sides resolved
//! ([`resolve`]: symlinks followed, a path that does not exist yet taken
//! from its nearest existing ancestor).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use crate::config::{Config, StoreConfig};

/// One of the host's own files or directories.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnFile {
    /// Where it is, as configured.
    pub path: PathBuf,
    /// What it is, such as "the embedded store's directory".
    pub what: String,
    /// What a guest could do with it.
    pub risk: &'static str,
}

/// The host's own files under `config`, whose compiled-code cache is
/// `cache_dir` and whose control socket (if it has one) is `control_socket`.
pub fn own_files(config: &Config, cache_dir: &Path, control_socket: Option<&Path>) -> Vec<OwnFile> {
    let mut own = Vec::new();
    let mut add = |path: &Path, what: String, risk: &'static str| {
        own.push(OwnFile {
            path: path.to_path_buf(),
            what,
            risk,
        })
    };
    store_files(config, &mut add);
    host_files(config, cache_dir, control_socket, &mut add);
    grant_files(config, &mut add);
    registry_files(config, cache_dir, &mut add);
    own
}

/// What pulling from registries reads and writes: the cache of pulled
/// components, the credentials, the CA, the keys (only when a plugin
/// comes from a registry).
fn registry_files(config: &Config, compiled: &Path, add: &mut impl FnMut(&Path, String, &'static str)) {
    if config.plugins.iter().all(|p| p.source.is_none()) {
        return;
    }
    let r = &config.registry;
    add(
        &r.settings(compiled).cache_dir,
        "the cache of pulled components".into(),
        "a guest could record a forged tag or signature check there, and the host would run another version",
    );
    if let Some(f) = &r.auth_file {
        add(f, "the registry credentials".into(), "they are secrets");
    }
    if let Some(f) = &r.ca {
        add(
            f,
            "the registry CA".into(),
            "the guest could change which registries the host trusts",
        );
    }
    let keys = config
        .plugins
        .iter()
        .filter_map(|p| p.source.as_ref()?.verify_key.as_ref());
    for key in r.verify_key.iter().chain(keys) {
        add(
            &key.file,
            "a signature key".into(),
            "the guest could replace the key components are verified with",
        );
    }
}

/// What the store reads: its directory, or its kubeconfig.
fn store_files(config: &Config, add: &mut impl FnMut(&Path, String, &'static str)) {
    match &config.store {
        StoreConfig::Embedded { dir } => add(
            dir,
            "the embedded store's directory".into(),
            "a file written there, named like a lease version, stops every host from leading that lease",
        ),
        StoreConfig::Kubernetes { kubeconfig, .. } => match kubeconfig {
            Some(k) => add(k, "the store's kubeconfig".into(), KUBE_RISK),
            None => default_kube(add, "the store's Kubernetes client"),
        },
        StoreConfig::Postgres(pg) => {
            let files = [
                (&pg.ca, "the postgres store's CA"),
                (&pg.url_file, "the postgres store's URL file"),
            ];
            for (file, what) in files {
                if let Some(file) = file {
                    add(
                        file,
                        what.into(),
                        "it lets a plugin act as this host on the database",
                    );
                }
            }
        }
        StoreConfig::Etcd(etcd) => {
            let files = [
                (&etcd.ca, "the etcd store's CA"),
                (&etcd.cert, "the etcd store's client certificate"),
                (&etcd.key, "the etcd store's client key"),
                (&etcd.password_file, "the etcd store's password file"),
            ];
            for (file, what) in files {
                if let Some(file) = file {
                    add(
                        file,
                        what.into(),
                        "it lets a plugin act as this host on the etcd cluster",
                    );
                }
            }
        }
    }
}

/// The configuration file, the compiled-code cache, the core-dump
/// directory, and the control socket with its lock file.
fn host_files(
    config: &Config,
    cache_dir: &Path,
    control_socket: Option<&Path>,
    add: &mut impl FnMut(&Path, String, &'static str),
) {
    if let Some(file) = &config.source {
        add(
            file,
            "the configuration file".into(),
            "the guest could read the host's configuration, or rewrite it for the next reload",
        );
    }
    add(
        cache_dir,
        "the compiled-code cache".into(),
        "the host runs the native code cached there: a guest could replace it and run outside its sandbox",
    );
    if let Some(dir) = &config.coredump_dir {
        add(
            dir,
            "the core-dump directory".into(),
            "the dumps hold the linear memory of trapped instances, other plugins' included",
        );
    }
    if let Some(socket) = control_socket {
        let risk = "the guest could remove or replace the host's control channel (`baton yield`)";
        add(socket, "the control socket".into(), risk);
        let mut lock: OsString = socket.as_os_str().to_owned();
        lock.push(".lock");
        add(Path::new(&lock), "the control socket's lock file".into(), risk);
    }
}

/// What the plugins' grants make the host read: CA files, kubeconfigs.
fn grant_files(config: &Config, add: &mut impl FnMut(&Path, String, &'static str)) {
    for p in &config.plugins {
        let name = &p.spec.name;
        for ca in p.spec.grants.http.grants().filter_map(|g| g.ca.as_deref()) {
            add(
                ca,
                format!("the CA file of plugin {name:?}'s `http` grant"),
                "the guest could change which servers the host trusts for that plugin's requests",
            );
        }
        if let Some(k) = p.spec.grants.http.kubernetes() {
            match &k.kubeconfig {
                Some(file) => add(
                    file,
                    format!("the kubeconfig of plugin {name:?}'s `kubernetes` grant"),
                    KUBE_RISK,
                ),
                None => default_kube(add, "the Kubernetes client of a plugin's `kubernetes` grant"),
            }
        }
    }
}

const KUBE_RISK: &str = "it holds the host's Kubernetes credentials";

/// What a Kubernetes client without a named kubeconfig reads: the files of
/// `KUBECONFIG`, else `~/.kube/config`, and the in-cluster service
/// account's folder.
fn default_kube(add: &mut impl FnMut(&Path, String, &'static str), whose: &str) {
    match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(list) => {
            for file in std::env::split_paths(&list).filter(|p| !p.as_os_str().is_empty()) {
                add(
                    &file,
                    format!("the kubeconfig of {whose} (KUBECONFIG)"),
                    KUBE_RISK,
                );
            }
        }
        None => {
            if let Some(home) = std::env::var_os("HOME") {
                let file = PathBuf::from(home).join(".kube").join("config");
                add(
                    &file,
                    format!("the kubeconfig of {whose} (~/.kube/config)"),
                    KUBE_RISK,
                );
            }
        }
    }
    add(
        Path::new("/var/run/secrets/kubernetes.io/serviceaccount"),
        format!("the service account folder of {whose}"),
        "it holds the pod's Kubernetes token",
    );
}

/// `path` made absolute with every symlink followed: the nearest existing
/// ancestor canonicalized and the rest appended (`..` in the rest taken
/// lexically). A dangling symlink is followed to where it points.
pub fn resolve(path: &Path) -> PathBuf {
    resolve_at(path, 0)
}

fn resolve_at(path: &Path, depth: usize) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let parts: Vec<Component> = abs.components().collect();
    for i in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..i].iter().collect();
        let base = match std::fs::canonicalize(&prefix) {
            Ok(c) => c,
            Err(_) => match std::fs::read_link(&prefix) {
                // Dangling: where it points, which may be created later.
                Ok(target) if depth < 40 => {
                    let parent = prefix.parent().unwrap_or(Path::new("/"));
                    resolve_at(&parent.join(target), depth + 1)
                }
                _ => continue,
            },
        };
        return append(base, &parts[i..]);
    }
    append(PathBuf::from("/"), &parts)
}

fn append(mut base: PathBuf, rest: &[Component]) -> PathBuf {
    for c in rest {
        match c {
            Component::ParentDir => {
                base.pop();
            }
            Component::Normal(name) => base.push(name),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    base
}

/// Why each of `config`'s `dirs` grants that reaches one of `own` is
/// refused, one message per grant, naming the plugin, the grant and what
/// it would expose; empty if none is.
pub fn refused_grants(config: &Config, own: &[OwnFile]) -> Vec<String> {
    let own: Vec<(&OwnFile, PathBuf)> = own.iter().map(|o| (o, resolve(&o.path))).collect();
    let mut refused = Vec::new();
    for p in &config.plugins {
        for d in &p.spec.grants.files {
            let host = resolve(&d.host);
            let hits: Vec<String> = own
                .iter()
                .filter_map(|(o, path)| {
                    let how = if &host == path {
                        "is"
                    } else if path.starts_with(&host) {
                        "contains"
                    } else if host.starts_with(path) {
                        "lies inside"
                    } else {
                        return None;
                    };
                    let shown = if *path == o.path {
                        path.display().to_string()
                    } else {
                        format!("{} (resolved: {})", o.path.display(), path.display())
                    };
                    Some(format!("{how} {} {shown}: {}", o.what, o.risk))
                })
                .collect();
            if hits.is_empty() {
                continue;
            }
            let resolved = if host == d.host {
                String::new()
            } else {
                format!(" (resolved: {})", host.display())
            };
            refused.push(format!(
                "plugin {:?}: field `dirs`: the grant {{ host = {:?}, guest = {:?} }}{resolved} {}",
                p.spec.name,
                d.host.display().to_string(),
                d.guest,
                hits.join("; and it ")
            ));
        }
    }
    refused
}

/// `dirs` grants that reach the host's own files: each refusal as
/// [`refused_grants`] says it (naming the plugin, the grant and what it
/// would expose). The message does not name the configuration file.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} (a `dirs` grant may not contain or lie inside the host's own files; grant a folder of its own)",
    .refusals.join("; ")
)]
pub struct OwnFilesGranted {
    /// One message per refused grant.
    pub refusals: Vec<String>,
}

/// [`refused_grants`] of `config` against [`own_files`], as one error: a
/// grant may not reach the host's own files.
pub fn check_grants(
    config: &Config,
    cache_dir: &Path,
    control_socket: Option<&Path>,
) -> Result<(), OwnFilesGranted> {
    let refusals = refused_grants(config, &own_files(config, cache_dir, control_socket));
    if refusals.is_empty() {
        return Ok(());
    }
    Err(OwnFilesGranted { refusals })
}

#[cfg(test)]
mod tests;
