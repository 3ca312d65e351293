//! Hot reload, at the edge: what asks for one (SIGHUP, or a watched file
//! that changed), what a new configuration may change without a restart,
//! and the watcher of the configuration file and the plugin files.
//!
//! [`serve`](crate::daemon::serve) applies a reload: it re-reads the configuration,
//! refuses it whole if it is broken or changes what needs a restart
//! ([`needs_restart`]), compiles every new or changed plugin in the
//! background, and only once all of them can run applies the changes: new
//! versions run from their lease's next term (or at once, by a hand-over,
//! for `reload = "now"`), new leases and plugins start, removed ones are
//! handed over, new timings apply from each lease's next term, and a
//! change of spreading (turned on or off, new `[spread]` settings or
//! membership timings, a plugin counting the live hosts added or removed)
//! replaces the spreader (`Launcher::respread` in `serve.rs`). A refused
//! reload changes nothing.
//!
//! The watcher polls the files by path, following symlinks, so it sees a
//! file replaced by a rename as well as a Kubernetes ConfigMap volume's
//! update (an atomic swap of the `..data` symlink of the directory): it
//! compares each file's identity (device, inode, size, modification time),
//! then its content, and reports a change only once the files have stayed
//! the same for [`SETTLE`] (a copy in progress, or several files updated
//! one after the other, make one reload).

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, LoadError};

/// How often the watcher looks at the files.
pub const POLL: Duration = Duration::from_millis(250);

/// How long changed files must stay the same before a reload.
pub const SETTLE: Duration = Duration::from_millis(500);

/// What asked for a reload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// SIGHUP.
    Signal,
    /// Watched files changed.
    Changed(Vec<PathBuf>),
    /// Tags of registry plugins point to new digests (`--watch`).
    Moved(Vec<String>),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Signal => f.write_str("SIGHUP"),
            Cause::Changed(paths) => {
                let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                write!(f, "changed: {}", names.join(", "))
            }
            Cause::Moved(tags) => write!(f, "tags moved: {}", tags.join(", ")),
        }
    }
}

/// Reads the configuration again, with the command line's overrides.
pub type Loader = Arc<dyn Fn() -> Result<Config, LoadError> + Send + Sync>;

/// What [`serve`](crate::daemon::serve) needs to reload.
pub struct Reload {
    /// Reads the configuration again.
    pub load: Loader,
    /// Requests (SIGHUP; the watcher's, when it runs).
    pub requests: mpsc::UnboundedReceiver<Cause>,
    /// Where the watcher sends its requests, if the host watches its files
    /// (`watch = true` or `--watch`).
    pub watch: Option<mpsc::UnboundedSender<Cause>>,
}

/// The files a configuration depends on: its own file and each plugin's
/// (a registry plugin's file never changes: its tag is watched instead).
pub fn watched_files(config: &Config) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = config.source.iter().cloned().collect();
    let from_files = config.plugins.iter().filter(|p| p.source.is_none());
    files.extend(from_files.map(|p| p.spec.path.clone()));
    files.sort();
    files.dedup();
    files
}

/// A hash of a file's content (change detection, not security); `None`
/// if it cannot be read. The same as [`Plugin::content_hash`] of a plugin
/// compiled from the same bytes.
///
/// [`Plugin::content_hash`]: crate::runtime::Plugin::content_hash
pub fn content_hash(path: &Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    Some(h.finish())
}

/// A file's identity as the path resolves now (symlinks followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

fn identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Identity {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        modified: m.modified().ok(),
    })
}

/// What the watcher knows of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    identity: Option<Identity>,
    content: Option<u64>,
}

fn look(path: &Path, before: Option<&Seen>) -> Seen {
    let identity = identity(path);
    match before {
        Some(b) if b.identity == identity && identity.is_some() => *b,
        _ => Seen {
            identity,
            content: content_hash(path),
        },
    }
}

/// Watches `files` (updated by the host after each reload) until `stop`,
/// sending a [`Cause::Changed`] to `requests` when the content of some of
/// them changed and then stayed the same for [`SETTLE`]. A file that
/// changes back before that is no change.
pub async fn watch_files(
    mut files: watch::Receiver<Vec<PathBuf>>,
    requests: mpsc::UnboundedSender<Cause>,
    stop: CancellationToken,
) {
    let mut known: BTreeMap<PathBuf, Seen> = BTreeMap::new();
    // Changed files, and their state when last seen changing.
    let mut pending: Option<(tokio::time::Instant, BTreeMap<PathBuf, Seen>)> = None;
    loop {
        let paths = files.borrow_and_update().clone();
        // A file the host depends on from now on is known as it is now.
        known.retain(|p, _| paths.contains(p));
        for p in &paths {
            if !known.contains_key(p) {
                known.insert(p.clone(), look(p, None));
            }
        }
        let now = tokio::time::Instant::now();
        let mut changing = BTreeMap::new();
        for p in &paths {
            let before = pending
                .as_ref()
                .and_then(|(_, c)| c.get(p))
                .or_else(|| known.get(p));
            let seen = look(p, before);
            if Some(&seen) != known.get(p) {
                changing.insert(p.clone(), seen);
            }
        }
        pending = match pending.take() {
            _ if changing.is_empty() => None,
            Some((since, before)) if before == changing => {
                if now - since >= SETTLE {
                    let changed: Vec<PathBuf> = changing
                        .iter()
                        .filter(|(p, s)| known.get(*p).map(|k| k.content) != Some(s.content))
                        .map(|(p, _)| p.clone())
                        .collect();
                    known.extend(changing);
                    if !changed.is_empty() && requests.send(Cause::Changed(changed)).is_err() {
                        return;
                    }
                    None
                } else {
                    Some((since, before))
                }
            }
            _ => Some((now, changing)),
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// What the host was started with that a reload cannot change.
#[derive(Clone, Debug)]
pub struct Fixed {
    /// The reservation of each instance's memory (the pool's slot size).
    pub memory_reservation: Option<u64>,
    /// The instance pool's slots, if instances come from a pool.
    pub pool_slots: Option<u32>,
    /// The compiled-code cache (`cache-dir`, or the default).
    pub cache_dir: PathBuf,
    /// The control socket, if the host has one.
    pub control_socket: Option<PathBuf>,
}

/// Why `new` cannot replace `old` without a restart; empty if it can.
pub fn needs_restart(old: &Config, new: &Config, fixed: &Fixed) -> Vec<String> {
    let mut why = Vec::new();
    let mut differs = |what: &str, changed: bool| {
        if changed {
            why.push(format!("{what} changed (it needs a restart)"));
        }
    };
    differs("the identity", old.identity != new.identity);
    differs("the lease store ([store])", old.store != new.store);
    differs(
        "the leases with route-label = true",
        super::route::routed(old) != super::route::routed(new),
    );
    differs("admin-address", old.admin_address != new.admin_address);
    differs(
        "advertise-address",
        old.advertise_address != new.advertise_address,
    );
    differs("control-socket", old.control_socket != new.control_socket);
    differs("cache-dir", old.cache_dir != new.cache_dir);
    differs("coredump-dir", old.coredump_dir != new.coredump_dir);
    differs("instance-pool", old.instance_pool != new.instance_pool);
    if let Some(reservation) = fixed.memory_reservation {
        for p in &new.plugins {
            if p.spec.memory_limit > reservation {
                why.push(format!(
                    "plugin {:?}: memory-limit {} is above the {} each instance was given at start \
                     (the largest limit then, rounded up to a power of two: the instance pool's slot \
                     size); it needs a restart",
                    p.spec.name,
                    bytesize::ByteSize(p.spec.memory_limit),
                    bytesize::ByteSize(reservation)
                ));
            }
        }
    }
    if let Some(slots) = fixed.pool_slots {
        let n = new.plugins.len();
        if n + n / 4 > slots as usize {
            why.push(format!(
                "{n} plugins need more than the instance pool's {slots} slots, sized at start; it needs \
                 a restart"
            ));
        }
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::parse(text, Some(Path::new("/etc/baton/b.toml"))).unwrap()
    }

    #[test]
    fn restart_only_settings_are_named() {
        let base = "identity = \"a\"\n[spread]\nenabled = false\n[[lease]]\nname = \"x\"\n";
        let old = cfg(base);
        let fixed = Fixed {
            memory_reservation: Some(64 << 20),
            pool_slots: Some(20),
            cache_dir: "/var/cache/baton".into(),
            control_socket: None,
        };
        assert!(needs_restart(&old, &cfg(base), &fixed).is_empty());
        let more = format!("{base}[[lease]]\nname = \"y\"\n");
        assert!(
            needs_restart(&old, &cfg(&more), &fixed).is_empty(),
            "a lease added"
        );
        let why = needs_restart(&old, &cfg(&base.replace("\"a\"", "\"b\"")), &fixed);
        assert_eq!(why, vec!["the identity changed (it needs a restart)".to_owned()]);
        let kube = format!("{base}[store]\nkind = \"kubernetes\"\n");
        assert!(needs_restart(&old, &cfg(&kube), &fixed)[0].contains("[store]"));
        let big = format!(
            "{base}[[plugin]]\nname = \"p\"\npath = \"p.wasm\"\nlease = \"x\"\nmemory-limit = \"100 MiB\"\n"
        );
        let why = needs_restart(&old, &cfg(&big), &fixed);
        assert!(why[0].contains("plugin \"p\": memory-limit"), "{why:?}");
        // Spreading applies by reload (serve replaces the spreader): on by
        // default from one lease to two, off from two to one or from none,
        // `[spread]` settings and the membership record's timings changed.
        let none = "identity = \"a\"\n";
        let one = format!("{none}[[lease]]\nname = \"x\"\n");
        let two = format!("{one}[[lease]]\nname = \"y\"\n");
        let settled = format!("{two}[spread]\nsettle = \"9s\"\nhead-start = \"2s\"\n");
        let off = format!("{two}[spread]\nenabled = false\n");
        let slower = format!("{two}[defaults]\nlease-duration = \"30s\"\n");
        for (a, b) in [
            (&one, &two),
            (&two, &one),
            (&none.to_owned(), &two),
            (&two, &settled),
            (&two, &off),
            (&off, &two),
            (&two, &slower),
        ] {
            let (a, b) = (cfg(a), cfg(b));
            assert_ne!((a.spread, a.membership), (b.spread, b.membership));
            assert!(needs_restart(&a, &b, &fixed).is_empty(), "{a:?} -> {b:?}");
            assert!(needs_restart(&b, &a, &fixed).is_empty(), "{b:?} -> {a:?}");
        }
    }

    #[tokio::test(start_paused = false)]
    async fn a_symlink_swap_is_one_change_once_settled() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // As a ConfigMap volume: ..data -> ..v1, b.toml -> ..data/b.toml.
        std::fs::create_dir(d.join("..v1")).unwrap();
        std::fs::write(d.join("..v1/b.toml"), "a").unwrap();
        std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/b.toml", d.join("b.toml")).unwrap();
        let file = d.join("b.toml");
        let (_files_tx, files) = watch::channel(vec![file.clone()]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let task = tokio::spawn(watch_files(files, tx, stop.clone()));
        tokio::time::sleep(POLL * 2).await;
        std::fs::create_dir(d.join("..v2")).unwrap();
        std::fs::write(d.join("..v2/b.toml"), "b").unwrap();
        std::os::unix::fs::symlink("..v2", d.join("..tmp")).unwrap();
        std::fs::rename(d.join("..tmp"), d.join("..data")).unwrap();
        let cause = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("seen")
            .unwrap();
        assert_eq!(cause, Cause::Changed(vec![file.clone()]));
        // The same content again under a new inode is no change.
        std::fs::create_dir(d.join("..v3")).unwrap();
        std::fs::write(d.join("..v3/b.toml"), "b").unwrap();
        std::os::unix::fs::symlink("..v3", d.join("..tmp")).unwrap();
        std::fs::rename(d.join("..tmp"), d.join("..data")).unwrap();
        assert!(
            tokio::time::timeout(SETTLE * 3, rx.recv()).await.is_err(),
            "no change"
        );
        stop.cancel();
        task.await.unwrap();
    }
}
