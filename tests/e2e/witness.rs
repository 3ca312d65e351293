//! A witness of the term's promise, shared by the end-to-end and the
//! Kubernetes tests: guests of both worlds that append term-tagged,
//! timestamped records back to back to one shared file, leaders paused past
//! their lease, and the check of the file against every host's log.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::support::*;

/// Keeps `n` threads spinning until dropped: a machine whose CPUs are busy.
pub struct CpuLoad(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl CpuLoad {
    pub fn start(n: usize) -> CpuLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 1u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                })
            })
            .collect();
        CpuLoad(stop, threads)
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for t in self.1.drain(..) {
            let _ = t.join();
        }
    }
}

/// The force-stop time an event carries.
pub fn force_stop_at(e: &Event) -> SystemTime {
    humantime::parse_rfc3339(e.str("force_stop_at").expect("force_stop_at")).unwrap()
}

/// The term a host leads in now, according to its last status event of a
/// lease (not of its membership record).
pub fn leading_term(h: &Host) -> Option<u64> {
    let last = h
        .all(|e| {
            e.message() == "lease status changed"
                && !e.str("lease").unwrap_or("").starts_with("baton-member.")
        })
        .into_iter()
        .last()?;
    (last.str("role") == Some("leading"))
        .then(|| last.u64("term"))
        .flatten()
}

/// `[[plugin]]` tables for `lease` whose guests append records to
/// `dir/records`: one pollable guest that honours the change, one future
/// guest that ignores it. Each host names itself in `PROBE_HOST`.
pub fn appender_plugins(lease: &str, dir: &Path) -> String {
    let mut text = String::new();
    for (name, world, ignore) in [("coop", "pollable", false), ("stubborn", "future", true)] {
        text.push_str(&format!(
            "\n[[plugin]]\nname = {name:?}\npath = {:?}\nlease = {lease:?}\ninherit-env = [\"PROBE_HOST\"]\n\
             env = {{ PROBE_MODE = \"append\", PROBE_TAG = {name:?}{} }}\ndirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
            guest(&format!("probe_{world}.wasm")).display().to_string(),
            if ignore { ", PROBE_IGNORE = \"1\"" } else { "" },
            dir.display().to_string(),
        ));
    }
    text
}

/// Starts one host per name on `config`, each naming itself in
/// `PROBE_HOST`, and waits until each has loaded its plugins.
pub fn start_hosts(config: &Path, names: &[&str], extra_args: &[&std::ffi::OsStr]) -> Vec<Host> {
    let hosts: Vec<Host> = names
        .iter()
        .map(|n| {
            Host::start_opts(
                n,
                config,
                Opts {
                    env: &[("PROBE_HOST", n)],
                    args: extra_args,
                    ..Opts::default()
                },
            )
        })
        .collect();
    for h in &hosts {
        h.wait_for(Duration::from_secs(60), "plugins loaded", |e| {
            e.message() == "compiled-code cache"
        });
    }
    hosts
}

/// `rounds` times: finds the leader (in a term newer than the last one
/// paused), waits until its guests run in that term (their first line of
/// it: the probes print it, then append) and `written(term)` holds (the
/// term's first record is in the file, see [`recorded`]), lets them work
/// for a moment, and stops it with SIGSTOP for `pause` (past its lease),
/// then resumes it. A leader that loses its term before its guests run (a
/// busy machine) is not paused: the next one is, so that each paused term
/// had its guests working.
pub fn pause_leaders_when(hosts: &[Host], rounds: usize, pause: Duration, written: impl Fn(u64) -> bool) {
    let mut last_term = 0;
    let mut round = 0;
    while round < rounds {
        let until = Instant::now() + Duration::from_secs(60);
        let (leader, term) = loop {
            if let Some((i, t)) = hosts
                .iter()
                .enumerate()
                .filter_map(|(i, h)| leading_term(h).map(|t| (i, t)))
                .filter(|(_, t)| *t > last_term)
                .max_by_key(|(_, t)| *t)
            {
                break (i, t);
            }
            assert!(
                Instant::now() < until,
                "round {round}: no new leader after term {last_term} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        last_term = term;
        let h = &hosts[leader];
        let working = loop {
            if !h
                .all(|e| e.str("target") == Some("guest") && e.guest_term() == Some(term))
                .is_empty()
                && written(term)
            {
                break true;
            }
            if leading_term(h) != Some(term) {
                break false;
            }
            assert!(
                Instant::now() < until,
                "round {round}: {} leads term {term} but no guest of it ran (and wrote) within 60 s",
                h.name
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        if !working {
            continue;
        }
        std::thread::sleep(Duration::from_millis(300));
        h.signal(libc::SIGSTOP);
        std::thread::sleep(pause);
        h.signal(libc::SIGCONT);
        round += 1;
    }
}

/// Whether the records file `file` holds a record of `term`.
#[allow(dead_code)] // used by tests/kube
pub fn recorded(file: &Path, term: u64) -> bool {
    let prefix = format!("term={term} ");
    std::fs::read_to_string(file).is_ok_and(|text| text.lines().any(|l| l.starts_with(&prefix)))
}

/// What the records showed.
pub struct Witnessed {
    pub records: usize,
    pub terms: BTreeSet<u64>,
}

/// One line of the records file: `term=N host=H guest=G seq=K at=T`.
pub struct Record {
    pub term: u64,
    pub host: String,
    pub guest: String,
    /// The guest's wall-clock reading when it wrote the record.
    pub at: SystemTime,
}

impl Record {
    /// Parses line `n` (from 0) of the file; panics naming it if it is not
    /// a record.
    pub fn parse(n: usize, line: &str) -> Record {
        let field = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")).map(str::to_owned))
                .unwrap_or_else(|| panic!("line {}: no {k}: {line:?}", n + 1))
        };
        Record {
            term: field("term").parse().unwrap(),
            host: field("host"),
            guest: field("guest"),
            at: SystemTime::UNIX_EPOCH + Duration::from_micros(field("at").parse().unwrap()),
        }
    }
}

/// Checks the records file against the hosts' logs (they have exited):
/// every record was stamped (the guest read the wall clock, a host call)
/// before its term's force-stop time, as its host logged it, so no host
/// call passed the fence after it; and no record of an older term follows
/// one of a newer term, so no write landed after its term ended (a write
/// held up between the last check of its term and its system call goes
/// nowhere: `runtime/fence/window.rs`).
pub fn check_records(file: &Path, hosts: &[Host]) -> Witnessed {
    let mut force_stop: HashMap<(String, u64), SystemTime> = HashMap::new();
    for h in hosts {
        for e in h.all(|e| e.is("leader task stopped", None)) {
            force_stop.insert((h.name.clone(), e.u64("term").unwrap()), force_stop_at(&e));
        }
    }
    let text = std::fs::read_to_string(file).unwrap();
    let context = |n: usize| {
        let from = n.saturating_sub(3);
        text.lines().skip(from).take(6).collect::<Vec<_>>().join("\n")
    };
    let mut newest = 0u64;
    let mut terms = BTreeSet::new();
    let mut records = 0;
    for (n, line) in text.lines().enumerate() {
        let Record {
            term,
            host,
            guest,
            at,
        } = Record::parse(n, line);
        let Some(stop) = force_stop.get(&(host.clone(), term)) else {
            panic!(
                "line {}: host {host} logged no force-stop time for term {term}",
                n + 1
            );
        };
        let late = ms_between(*stop, at);
        assert!(
            late <= 5.0,
            "line {}: stamped {late:.1} ms after its term's force-stop time:\n{}",
            n + 1,
            context(n)
        );
        assert!(
            term >= newest,
            "line {}: a record of term {term} (host {host}, {}) after one of term {newest}:\n{}",
            n + 1,
            guest,
            context(n)
        );
        newest = term;
        terms.insert(term);
        records += 1;
    }
    Witnessed { records, terms }
}

/// The records file in a scratch folder.
pub fn records_dir(s: &Scratch) -> PathBuf {
    let data = s.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    data
}
