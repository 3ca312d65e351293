//! File operations other than writes, across a leader paused past its
//! lease: a guest that creates, links, unlinks, renames and makes
//! directories back to back under term-tagged names, on two hosts whose
//! every fenced file operation sleeps between its last term check and its
//! system call (the test hook `BATON_TEST_FS_DELAY_MS`), so a pause almost
//! always catches one held up in that window. Each step sets the entry's
//! inode change time, so the directory itself dates when each operation
//! landed: none of an older term may land after a newer term's first.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use crate::support::*;
use crate::witness;

/// Ops of an older term dated after a newer term's first op, out of all.
struct Landed {
    entries: usize,
    terms: usize,
    late: Vec<String>,
}

/// Reads `dir`: each inode (a file and its hard link are one) named
/// `tN.sK...`, with its change time (ns): when the last operation on it
/// landed.
fn landed(dir: &Path) -> Landed {
    let mut inodes = std::collections::BTreeSet::new();
    let mut entries: Vec<(u64, i128, String)> = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let term: u64 = name[1..name.find('.').unwrap()].parse().unwrap();
        let meta = entry.path().symlink_metadata().unwrap();
        if !inodes.insert(meta.ino()) {
            continue;
        }
        let ctime = meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128;
        entries.push((term, ctime, name));
    }
    let mut first: BTreeMap<u64, i128> = BTreeMap::new();
    for (term, ctime, _) in &entries {
        let f = first.entry(*term).or_insert(*ctime);
        *f = (*f).min(*ctime);
    }
    let late = entries
        .iter()
        .filter(|(term, ctime, _)| first.range(term + 1..).any(|(_, f)| ctime > f))
        .map(|(term, ctime, name)| {
            let (newer, f) = first.range(term + 1..).find(|(_, f)| ctime > *f).unwrap();
            format!(
                "{name}: {:.1} ms after term {newer}'s first",
                (ctime - f) as f64 / 1e6
            )
        })
        .collect();
    Landed {
        entries: entries.len(),
        terms: first.len(),
        late,
    }
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs the test hook BATON_TEST_FS_DELAY_MS: a build with --features test-hooks"
)]
fn no_file_operation_of_a_paused_term_lands_after_the_next_terms_first() {
    let s = Scratch::new();
    let data = witness::records_dir(&s);
    let ops = data.join("ops");
    std::fs::create_dir(&ops).unwrap();
    let mut text = config(&s.store(), &[]);
    text.push_str(&format!(
        "\n[[plugin]]\nname = \"ops\"\npath = {:?}\nlease = \"demo\"\nenv = {{ PROBE_MODE = \"fsops\" }}\n\
         dirs = [{{ host = {:?}, guest = \"/data\" }}]\n",
        guest("probe_future.wasm").display().to_string(),
        data.display().to_string(),
    ));
    let cfg = s.write("baton.toml", &text);
    let delay = std::env::var("BATON_TEST_FS_DELAY_MS").unwrap_or_else(|_| "200".into());
    let mut hosts: Vec<Host> = ["host-a", "host-b"]
        .iter()
        .map(|n| {
            let env = [("BATON_TEST_FS_DELAY_MS", delay.as_str())];
            Host::start_opts(
                n,
                &cfg,
                Opts {
                    env: &env,
                    ..Opts::default()
                },
            )
        })
        .collect();
    let rounds = std::env::var("BATON_TEST_ROUNDS").map_or(4, |r| r.parse().unwrap());
    // Each leader paused once an operation of its term landed.
    let of_term = |term: u64| {
        let prefix = format!("t{term:06}.");
        std::fs::read_dir(&ops).is_ok_and(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        })
    };
    witness::pause_leaders_when(&hosts, rounds, Duration::from_secs(5), of_term);
    // And the term after the last pause landed some too (however long
    // that takes here).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let terms = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir(&ops)
            .unwrap()
            .filter_map(Result::ok)
            .filter_map(|e| {
                e.file_name()
                    .to_string_lossy()
                    .split('.')
                    .next()
                    .map(str::to_owned)
            })
            .collect()
    };
    while terms().len() <= rounds {
        assert!(
            std::time::Instant::now() < deadline,
            "no operation of a term after the last pause within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for h in &hosts {
        h.sigterm();
    }
    for h in &mut hosts {
        h.wait_exit(Duration::from_secs(15));
    }
    let seen = landed(&ops);
    println!(
        "file ops, {delay} ms between check and call, {rounds} pauses: {} inodes in {} terms; \
         {} of an older term landed after a newer term's first",
        seen.entries,
        seen.terms,
        seen.late.len()
    );
    for late in &seen.late {
        println!("  late: {late}");
    }
    assert!(
        seen.terms > rounds,
        "each pause started a new term: {} terms",
        seen.terms
    );
    assert!(seen.late.is_empty(), "{} operations landed late", seen.late.len());
}
