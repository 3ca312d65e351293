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
    match &config.store {
        StoreConfig::Embedded { dir } => add(
            dir,
            "the embedded store's directory".into(),
            "a file written there, named like a lease version, stops every host from leading that lease",
        ),
        StoreConfig::Kubernetes { kubeconfig, .. } => match kubeconfig {
            Some(k) => add(k, "the store's kubeconfig".into(), KUBE_RISK),
            None => default_kube(&mut add, "the store's Kubernetes client"),
        },
    }
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
    for p in &config.plugins {
        let name = &p.spec.name;
        for ca in p.spec.http.grants().filter_map(|g| g.ca.as_deref()) {
            add(
                ca,
                format!("the CA file of plugin {name:?}'s `http` grant"),
                "the guest could change which servers the host trusts for that plugin's requests",
            );
        }
        if let Some(k) = p.spec.http.kubernetes() {
            match &k.kubeconfig {
                Some(file) => add(
                    file,
                    format!("the kubeconfig of plugin {name:?}'s `kubernetes` grant"),
                    KUBE_RISK,
                ),
                None => default_kube(&mut add, "the Kubernetes client of a plugin's `kubernetes` grant"),
            }
        }
    }
    own
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
        for d in &p.spec.dirs {
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

/// [`refused_grants`] of `config` against [`own_files`], as one error
/// (without the file's name): a grant may not reach the host's own files.
pub fn check_grants(config: &Config, cache_dir: &Path, control_socket: Option<&Path>) -> Result<(), String> {
    let refused = refused_grants(config, &own_files(config, cache_dir, control_socket));
    if refused.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{} (a `dirs` grant may not contain or lie inside the host's own files; grant a folder of its own)",
        refused.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, grant: &str) -> Config {
        let text = format!(
            "[store]\nkind = \"embedded\"\ndir = \"leases\"\n[[lease]]\nname = \"demo\"\n[[plugin]]\n\
             name = \"p\"\npath = \"p.wasm\"\nlease = \"demo\"\ndirs = [{{ host = {grant:?}, guest = \"/data\" }}]\n"
        );
        Config::parse(&text, Some(&dir.join("baton.toml"))).unwrap()
    }

    fn check(dir: &Path, grant: &str) -> Result<(), String> {
        let c = config(dir, grant);
        check_grants(&c, &dir.join("cache"), Some(&dir.join("run/h.sock")))
    }

    #[test]
    fn resolve_follows_symlinks_and_missing_tails() {
        let t = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir(real.join("a")).unwrap();
        std::os::unix::fs::symlink(real.join("a"), real.join("link")).unwrap();
        assert_eq!(resolve(&real.join("link/x/../y")), real.join("a/y"));
        assert_eq!(resolve(&real.join("link/./z")), real.join("a/z"));
        // A dangling symlink: where it points.
        std::os::unix::fs::symlink(real.join("later"), real.join("dangling")).unwrap();
        assert_eq!(resolve(&real.join("dangling/q")), real.join("later/q"));
    }

    #[test]
    fn grants_over_or_inside_the_hosts_own_files_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("data")).unwrap();
        std::fs::create_dir_all(d.join("leases/demo.lease")).unwrap();
        // A folder of its own: granted.
        check(d, "data").unwrap();
        // Containing the store (and the file, the cache, the socket).
        let e = check(d, ".").unwrap_err();
        assert!(
            e.contains("plugin \"p\": field `dirs`: the grant { host = "),
            "{e}"
        );
        assert!(e.contains("guest = \"/data\""), "{e}");
        assert!(e.contains("contains the embedded store's directory"), "{e}");
        assert!(e.contains("stops every host from leading"), "{e}");
        assert!(e.contains("contains the configuration file"), "{e}");
        assert!(e.contains("contains the compiled-code cache"), "{e}");
        assert!(e.contains("contains the control socket "), "{e}");
        assert!(e.contains("contains the control socket's lock file"), "{e}");
        // Inside the store, and the store itself.
        let e = check(d, "leases/demo.lease").unwrap_err();
        assert!(e.contains("lies inside the embedded store's directory"), "{e}");
        assert!(!e.contains("configuration file"), "{e}");
        let e = check(d, "leases").unwrap_err();
        assert!(e.contains("is the embedded store's directory"), "{e}");
        // Inside a cache that does not exist yet.
        let e = check(d, "cache/sub").unwrap_err();
        assert!(e.contains("lies inside the compiled-code cache"), "{e}");
        // A symlink to the store, and one to a folder above it.
        std::os::unix::fs::symlink(d.join("leases"), d.join("data/store")).unwrap();
        let e = check(d, "data/store").unwrap_err();
        assert!(e.contains("is the embedded store's directory"), "{e}");
        assert!(e.contains("(resolved: "), "{e}");
        let up = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(d, up.path().join("up")).unwrap();
        let e = check(d, &up.path().join("up").display().to_string()).unwrap_err();
        assert!(e.contains("contains the embedded store's directory"), "{e}");
    }

    /// A self-signed certificate (P-256), for a CA file that parses.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBhzCCAS2gAwIBAgIUAQitSUYBSDVnENl6H+CmtKHJiNowCgYIKoZIzj0EAwIw
GDEWMBQGA1UEAwwNYmF0b24gdGVzdCBDQTAgFw0yNjEyMDIwNTExMTlaGA8yMTI2
MTEwODA1MTExOVowGDEWMBQGA1UEAwwNYmF0b24gdGVzdCBDQTBZMBMGByqGSM49
AgEGCCqGSM49AwEHA0IABAxS08NhO2SJtBBHPDzuiKLd963qxb633DhfP5FwnUVI
Mc08bqB0G5hftierm2zeSGBjNLoIzRTgF3Fn3YMuRTqjUzBRMB0GA1UdDgQWBBSz
GEQVIdqnYsBSsy/+oXTviYFOMTAfBgNVHSMEGDAWgBSzGEQVIdqnYsBSsy/+oXTv
iYFOMTAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIQC6d8k/MTuC
jmH5mF+aKAMYSdUYGL0tdkBkN98t9IkwdAIgA/I5JdSBqyXdlejKoyxS9E8bzHIy
cToc32njV4kUTis=
-----END CERTIFICATE-----
";

    #[test]
    fn kubeconfigs_ca_files_and_core_dumps_are_the_hosts_own() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("certs")).unwrap();
        std::fs::write(d.join("certs/ca.pem"), TEST_CA).unwrap();
        let text = "coredump-dir = \"dumps\"\n[store]\nkind = \"kubernetes\"\nkubeconfig = \"kube/config\"\n\
                    [[lease]]\nname = \"demo\"\n[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\nlease = \"demo\"\n\
                    http = [{ url = \"https://x.example\", ca = \"certs/ca.pem\" }]\n\
                    dirs = [{ host = \"kube\", guest = \"/k\" }, { host = \"certs\", guest = \"/c\" }, \
                    { host = \"dumps/x\", guest = \"/d\" }, { host = \"ok\", guest = \"/ok\" }]\n";
        let c = Config::parse(text, Some(&d.join("baton.toml"))).unwrap();
        let refused = refused_grants(&c, &own_files(&c, &d.join("cache"), None));
        assert_eq!(refused.len(), 3, "{refused:#?}");
        assert!(
            refused[0].contains("contains the store's kubeconfig"),
            "{}",
            refused[0]
        );
        assert!(refused[0].contains("credentials"), "{}", refused[0]);
        assert!(
            refused[1].contains("contains the CA file of plugin \"p\"'s `http` grant"),
            "{}",
            refused[1]
        );
        assert!(
            refused[2].contains("lies inside the core-dump directory"),
            "{}",
            refused[2]
        );
    }
}
