//! The counter of the chaos runs: the `kv-counter` guest increments one
//! key of its bucket by compare-and-swap on every host that leads, under
//! every fault, and this checker reads its lines and the final value.
//!
//! What must hold, from the guests' own lines (`kv try`, `kv ok`) and the
//! value left in the store (`"<n> <term>"`, read with `baton kv get`). The
//! lines are read from the file the guests append them to as they happen
//! (`KV_RECORDS`), not from the hosts' logs: a SIGKILLed host loses the
//! log lines still queued in it, and a write whose `kv try` line was lost
//! would look like an increment from nowhere.
//!
//! - no count is acknowledged twice (`kv ok n=N` once per `N`): no
//!   increment applied twice;
//! - every count up to the final one was acknowledged, or was tried by an
//!   instance that never saw the answer (a process killed, an instance
//!   stopped at its force-stop, a request that timed out): no increment
//!   lost, and none appeared from nowhere;
//! - acknowledged counts, in order, never go back in term: no write of an
//!   older term landed after the first write of a newer term.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::support::*;

/// The `[[plugin]]` table of the counter under "demo", writing every
/// `interval_ms` and recording its lines in `dir` (see [`records`]).
pub fn plugin(interval_ms: u64, dir: &Path) -> String {
    format!(
        "\n[[plugin]]\nname = \"counter\"\npath = {:?}\nlease = \"demo\"\n\
         env = {{ KV_INTERVAL_MS = \"{interval_ms}\", KV_RECORDS = \"/kv/records\" }}\n\
         dirs = [{{ host = {:?}, guest = \"/kv\" }}]\n",
        guest("kv_counter.wasm").display().to_string(),
        dir.display().to_string()
    )
}

/// The folder of the counter's records in a scratch folder.
pub fn records(s: &Scratch) -> std::path::PathBuf {
    let dir = s.dir.path().join("kv");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A guest line `kv WHAT n=N term=T`: (what, n, term).
fn parse(line: &str) -> Option<(&str, u64, u64)> {
    let mut words = line.split_whitespace();
    if words.next()? != "kv" {
        return None;
    }
    let what = words.next()?;
    let n = words.next()?.strip_prefix("n=")?.parse().ok()?;
    let term = words.next()?.strip_prefix("term=")?.parse().ok()?;
    Some((what, n, term))
}

/// Reads the counter's final value with `baton kv get` on `config` (with
/// `env`), and checks it against the guests' records in `dir`; panics with
/// the reason on a broken rule.
pub fn check(config: &Path, env: &[(String, String)], dir: &Path, seed: u64) {
    let out = baton()
        .args(["kv", "get", "--config"])
        .arg(config)
        .args(["--plugin", "counter", "count"])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let value: u64 = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let mut ok: BTreeMap<u64, u64> = BTreeMap::new();
    let mut in_doubt = 0;
    let lines = std::fs::read_to_string(dir.join("records")).unwrap_or_default();
    {
        // Per term (each one host's): the last try not yet answered.
        let mut open: BTreeMap<u64, u64> = BTreeMap::new();
        for line in lines.lines() {
            let Some((what, n, term)) = parse(line) else {
                continue;
            };
            match what {
                "try" => {
                    in_doubt += usize::from(open.insert(term, n).is_some());
                }
                "ok" => {
                    open.remove(&term);
                    let before = ok.insert(n, term);
                    assert!(
                        before.is_none(),
                        "seed {seed}: count {n} acknowledged twice (terms {before:?} and {term})"
                    );
                }
                "conflict" => {
                    open.remove(&term);
                }
                _ => {}
            }
        }
        in_doubt += open.len();
    }
    assert!(
        ok.keys().all(|n| *n <= value),
        "seed {seed}: counts acknowledged above the final value {value}: {:?}",
        ok.keys().rev().take(3).collect::<Vec<_>>()
    );
    let missing = (1..=value).filter(|n| !ok.contains_key(n)).count();
    assert!(
        missing <= in_doubt,
        "seed {seed}: {missing} counts up to {value} were never acknowledged, but only {in_doubt} tries went unanswered"
    );
    let terms: Vec<u64> = ok.values().copied().collect();
    let back = terms.windows(2).find(|w| w[1] < w[0]);
    assert!(
        back.is_none(),
        "seed {seed}: a write of term {:?} landed after one of a newer term",
        back
    );
    let distinct: BTreeSet<u64> = terms.iter().copied().collect();
    println!(
        "  counter: final {value}, {} acknowledged over {} terms, {in_doubt} tries unanswered",
        ok.len(),
        distinct.len()
    );
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn lines_are_read() {
        assert_eq!(parse("kv ok n=12 term=3"), Some(("ok", 12, 3)));
        assert_eq!(parse("kv error n=2 term=3 error=x"), Some(("error", 2, 3)));
        assert_eq!(parse("tick 1"), None);
    }
}
