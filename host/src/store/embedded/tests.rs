//! Tests of [`embedded`](super).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::*;
use crate::store::deleted::floor_record;

fn record(holder: Option<&str>, term: u64) -> LeaseRecord {
    LeaseRecord {
        renew_time: Some(std::time::SystemTime::now()),
        ..LeaseRecord::new(holder, term, Duration::from_secs(15))
    }
}

fn store() -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path().join("leases")).unwrap();
    (dir, store)
}

/// The watch's next observation that differs from `previous` (a watch
/// may yield the same record again).
async fn next_change(watch: &mut LeaseWatch, previous: &Option<Versioned>) -> Option<Versioned> {
    loop {
        let next = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .expect("watch yielded in time")
            .expect("watch still open")
            .expect("watch yielded a record");
        if &next != previous {
            return next;
        }
    }
}

/// Deletes a lease behind the store's back, as an operator would.
fn remove_lease(dir: &Path, lease: &str) {
    fs::remove_dir_all(dir.join(format!("{lease}.lease"))).unwrap();
}

/// The file of a lease's newest version.
fn newest_version(dir: &Path, lease: &str) -> PathBuf {
    let versions = dir.join(format!("{lease}.lease"));
    let mut names: Vec<_> = fs::read_dir(&versions)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    versions.join(names.last().expect("a version"))
}

/// The term floor of a lease, as the store reads it.
fn floor_of(store: &EmbeddedStore, lease: &str) -> u64 {
    read_lock_state(&store.files(lease).unwrap()).unwrap().floor
}

/// The term floor in a floor file, as text.
fn floor_in(lock: &Path) -> String {
    let text = fs::read_to_string(lock).unwrap();
    text.split_whitespace().next().unwrap_or_default().to_owned()
}

/// Writes `record` to a lease that has none: a create, or an update of
/// what the store reads for a deleted lease (a tombstone or the term
/// floor).
async fn recreate(store: &EmbeddedStore, lease: &str, record: &LeaseRecord) -> Versioned {
    match store.get(lease).await.unwrap() {
        Some(gone) => store.update(lease, &gone.version, record).await.unwrap(),
        None => store.create(lease, record).await.unwrap(),
    }
}

/// The next item of a watch, failing the test after `secs` seconds: a
/// bound that only a watch that never yields breaks (10 s: a busy machine
/// delays inotify's wake-ups and fsyncs by whole seconds).
async fn next_within(watch: &mut LeaseWatch, secs: u64) -> Option<Versioned> {
    tokio::time::timeout(Duration::from_secs(secs), watch.next())
        .await
        .expect("watch yielded in time")
        .expect("watch still open")
        .expect("watch yielded a record")
}

#[test]
fn version_names() {
    assert_eq!(version_counter(version_name(42).as_bytes()), Some(42));
    assert_eq!(version_counter(version_name(u64::MAX).as_bytes()), Some(u64::MAX));
    for bad in [
        "99999999999999999999.json",
        "0000000000000000042.json",
        "000000000000000000042.json",
        "0000000000000000004a.json",
        "00000000000000000042.jso",
        "00000000000000000042",
        ".tmp-00000000000000000042",
        "",
    ] {
        assert_eq!(version_counter(bad.as_bytes()), None, "{bad:?}");
    }
}

#[test]
fn lease_names() {
    for ok in ["a", "demo", "jobs.billing-1", "0", "a-b.c-d.e", &"a".repeat(253)] {
        assert_eq!(validate_lease_name(ok), Ok(()), "{ok:?}");
    }
    for bad in [
        "",
        "Demo",
        "-a",
        "a-",
        ".a",
        "a.",
        "a..b",
        "a.-b",
        "a_b",
        "a/b",
        "..",
        "a b",
        "é",
        &"a".repeat(254),
    ] {
        let err = validate_lease_name(bad).unwrap_err().to_string();
        assert!(err.contains("invalid lease name"), "{bad:?}: {err}");
    }
}

#[tokio::test]
async fn invalid_names_are_refused() {
    let (_dir, store) = store();
    let r = record(Some("a"), 1);
    for bad in ["../escape", "UPPER", ""] {
        let errors = [
            store.get(bad).await.unwrap_err(),
            store.create(bad, &r).await.unwrap_err(),
            store.update(bad, "x-1", &r).await.unwrap_err(),
            store.watch(bad).await.err().unwrap(),
            store.delete(bad).await.unwrap_err(),
        ];
        for err in errors {
            match err {
                StoreError::Refused { lease, .. } => assert_eq!(lease, bad),
                other => panic!("{bad:?}: expected Refused, got {other:?}"),
            }
        }
    }
    assert!(fs::read_dir(store.dir()).unwrap().next().is_none());
}

#[tokio::test]
async fn create_get_update_conflict() {
    let (_dir, store) = store();
    assert!(store.describe().starts_with("embedded store at /"));
    assert_eq!(store.get("demo").await.unwrap(), None);

    let r1 = record(Some("host-a"), 1);
    let v1 = store.create("demo", &r1).await.unwrap();
    assert_eq!(v1.record, r1);
    assert_eq!(store.get("demo").await.unwrap(), Some(v1.clone()));

    let err = store
        .create("demo", &record(Some("host-b"), 1))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(store.get("demo").await.unwrap(), Some(v1.clone()));

    let r2 = record(Some("host-a"), 2);
    let v2 = store.update("demo", &v1.version, &r2).await.unwrap();
    assert_ne!(v2.version, v1.version);
    assert_eq!(v2.record, r2);
    assert_eq!(store.get("demo").await.unwrap(), Some(v2.clone()));

    // A stale version loses.
    let err = store
        .update("demo", &v1.version, &record(None, 9))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(store.get("demo").await.unwrap(), Some(v2.clone()));

    // Updating a lease that does not exist is a conflict too.
    let err = store.update("other", &v2.version, &r2).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(store.get("other").await.unwrap(), None);

    // Another store on the same directory sees the same thing.
    let again = EmbeddedStore::open(store.dir()).unwrap();
    assert_eq!(again.get("demo").await.unwrap(), Some(v2.clone()));

    // Deleted while held: read as its tombstone by the stores that saw
    // it, as free by one that did not.
    assert!(store.delete("demo").await.unwrap());
    assert!(!store.delete("demo").await.unwrap());
    let tombstone = Versioned {
        version: format!("{TOMBSTONE}{}", v2.version),
        record: r2,
    };
    assert_eq!(store.get("demo").await.unwrap(), Some(tombstone));
    let stranger = EmbeddedStore::open(store.dir()).unwrap();
    assert_eq!(stranger.get("demo").await.unwrap(), Some(floor_record(2)));
}

#[tokio::test]
async fn list_returns_every_lease_and_ignores_other_files() {
    let (_dir, store) = store();
    assert!(store.list().await.unwrap().is_empty());
    let b = store.create("b.jobs", &record(Some("x"), 1)).await.unwrap();
    let a = store.create("a", &record(None, 0)).await.unwrap();
    fs::write(store.dir().join("README"), "hello").unwrap();
    fs::create_dir(store.dir().join("Bad_Name.lease")).unwrap();
    fs::write(store.dir().join("Bad_Name.lease/00000000000000000001.json"), "{}").unwrap();
    fs::write(store.dir().join(".c.tmp"), "{").unwrap();
    fs::create_dir(store.dir().join("sub")).unwrap();
    let listed = store.list().await.unwrap();
    assert_eq!(listed, vec![("a".to_string(), a), ("b.jobs".to_string(), b)]);
}

/// One compare-and-swap increment of `term`, retried on conflict.
/// Returns the version written.
async fn increment(store: &EmbeddedStore, lease: &str) -> String {
    loop {
        let current = store.get(lease).await.unwrap().unwrap();
        let mut next = current.record.clone();
        next.term += 1;
        match store.update(lease, &current.version, &next).await {
            Ok(written) => return written.version,
            Err(e) if e.is_conflict() => tokio::task::yield_now().await,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updaters_lose_no_update() {
    const TASKS: usize = 3;
    const THREADS: usize = 3;
    const EACH: usize = 30;
    let (_dir, store) = store();
    store.create("counter", &record(None, 0)).await.unwrap();

    // Tasks sharing one store instance...
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut versions = Vec::new();
            for _ in 0..EACH {
                versions.push(increment(&store, "counter").await);
            }
            versions
        }));
    }
    // ...and threads, each with its own runtime and store instance (its
    // own lock file descriptions, as a separate process would have).
    let mut threads = Vec::new();
    for t in 0..THREADS {
        let dir = store.dir().to_path_buf();
        threads.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let store = EmbeddedStore::open(dir).unwrap();
                // Both ways of writing a version, side by side.
                store.unnamed_temps.store(t % 2 == 0, Ordering::Relaxed);
                let mut versions = Vec::new();
                for _ in 0..EACH {
                    versions.push(increment(&store, "counter").await);
                }
                versions
            })
        }));
    }

    let mut versions = HashSet::new();
    for task in tasks {
        for v in task.await.unwrap() {
            assert!(versions.insert(v), "version repeated");
        }
    }
    for thread in threads {
        for v in tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap()
        {
            assert!(versions.insert(v), "version repeated");
        }
    }
    let last = store.get("counter").await.unwrap().unwrap();
    assert_eq!(last.record.term as usize, (TASKS + THREADS) * EACH);
    assert_eq!(versions.len(), (TASKS + THREADS) * EACH);
}

#[tokio::test]
async fn a_record_deleted_while_held_reads_as_a_tombstone_until_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let holder = EmbeddedStore::open(dir.path()).unwrap();
    let follower = EmbeddedStore::open(dir.path()).unwrap();
    let held = holder.create("demo", &record(Some("a"), 7)).await.unwrap();
    let mut watch = follower.watch("demo").await.unwrap();
    assert_eq!(next_within(&mut watch, 10).await, Some(held.clone()));
    remove_lease(dir.path(), "demo");

    // Every reader that saw the record reads the same tombstone, again
    // and again.
    let tomb_version = format!("{TOMBSTONE}{}", held.version);
    let tombstone = Some(Versioned {
        version: tomb_version.clone(),
        record: held.record.clone(),
    });
    assert_eq!(next_change(&mut watch, &Some(held.clone())).await, tombstone);
    assert_eq!(follower.get("demo").await.unwrap(), tombstone);
    assert_eq!(holder.get("demo").await.unwrap(), tombstone);
    assert_eq!(holder.get("demo").await.unwrap(), tombstone);
    // One that never saw it finds the lease free, at the highest term
    // it ever had.
    let stranger = EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(stranger.get("demo").await.unwrap(), Some(floor_record(7)));

    // Updating the tombstone writes the record again; updating it once
    // more, or updating a tombstone this store never reported, conflicts.
    let again = holder
        .update("demo", &tomb_version, &record(Some("a"), 7))
        .await
        .unwrap();
    assert_ne!(again.version, held.version);
    // (The watch may yield the tombstone again first.)
    let mut seen = next_within(&mut watch, 10).await;
    while seen != Some(again.clone()) {
        assert!(
            seen.as_ref()
                .is_some_and(|v| v.version.starts_with(&tomb_version)),
            "{seen:?}"
        );
        seen = next_within(&mut watch, 10).await;
    }
    let err = follower
        .update("demo", &tomb_version, &record(Some("b"), 8))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let err = stranger
        .update("demo", &tomb_version, &record(Some("b"), 8))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(holder.get("demo").await.unwrap(), Some(again));

    // A record deleted without a holder reads as released at its term.
    let released = holder
        .update(
            "demo",
            &holder.get("demo").await.unwrap().unwrap().version,
            &record(None, 7),
        )
        .await
        .unwrap();
    assert_eq!(follower.get("demo").await.unwrap(), Some(released));
    remove_lease(dir.path(), "demo");
    assert_eq!(follower.get("demo").await.unwrap(), Some(floor_record(7)));
    assert_eq!(holder.get("demo").await.unwrap(), Some(floor_record(7)));

    // Taking it over is a create, at a higher term; the floor follows.
    let taken = stranger
        .update("demo", &floor_record(7).version, &record(Some("c"), 8))
        .await
        .unwrap();
    assert_eq!(taken.record.term, 8);
    assert!(
        stranger
            .update("demo", &floor_record(7).version, &record(Some("d"), 8))
            .await
            .unwrap_err()
            .is_conflict()
    );
    remove_lease(dir.path(), "demo");
    assert_eq!(
        EmbeddedStore::open(dir.path())
            .unwrap()
            .get("demo")
            .await
            .unwrap(),
        Some(floor_record(8))
    );
    // A lease that never existed is just missing.
    assert_eq!(stranger.get("never").await.unwrap(), None);
}

#[tokio::test]
async fn terms_never_go_back_or_repeat_across_deletions() {
    let dir = tempfile::tempdir().unwrap();
    let a = EmbeddedStore::open(dir.path()).unwrap();
    let b = EmbeddedStore::open(dir.path()).unwrap();
    a.create("demo", &record(None, 5)).await.unwrap();
    remove_lease(dir.path(), "demo");
    // b sees the lease released at term 5; a plain create is refused.
    let seen_by_b = b.get("demo").await.unwrap().unwrap();
    assert_eq!(seen_by_b, floor_record(5));
    assert!(
        b.create("demo", &record(Some("b"), 1))
            .await
            .unwrap_err()
            .is_conflict()
    );
    // a takes term 6 and its record is deleted before b reads again:
    // b's take-over at term 6 conflicts, and its next read shows 6.
    let seen_by_a = a.get("demo").await.unwrap().unwrap();
    a.update("demo", &seen_by_a.version, &record(Some("a"), 6))
        .await
        .unwrap();
    remove_lease(dir.path(), "demo");
    let err = b
        .update("demo", &seen_by_b.version, &record(Some("b"), 6))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let again = b.get("demo").await.unwrap().unwrap();
    assert_eq!(again, floor_record(6));
    // A term below the floor is refused outright.
    let err = b
        .update("demo", &again.version, &record(Some("b"), 2))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("terms never go back"), "{err}");
    let taken = b
        .update("demo", &again.version, &record(Some("b"), 7))
        .await
        .unwrap();

    // A floor that is not a number (garbled by hand): renewals go on
    // (they do not touch the floor), a new term is refused naming the
    // file and the fix, and the floor is left as it is.
    fs::write(dir.path().join(".demo.floor"), "not a number\n").unwrap();
    let renewed = b
        .update("demo", &taken.version, &record(Some("b"), 7))
        .await
        .unwrap();
    let err = b
        .update("demo", &renewed.version, &record(Some("c"), 8))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, StoreError::Refused { .. })
            && text.contains(".demo.floor")
            && text.contains("expected the term floor")
            && text.contains("write the two numbers there"),
        "{text}"
    );
    assert_eq!(
        fs::read_to_string(dir.path().join(".demo.floor")).unwrap(),
        "not a number\n"
    );
}

#[tokio::test]
async fn the_floor_in_an_older_lock_file_is_read_and_moved_to_the_floor_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    // An older baton kept the numbers in the lock file, padded.
    fs::write(dir.path().join(".demo.lock"), format!("{:>20} {:>20}\n", 12, 3)).unwrap();
    assert_eq!(store.get("demo").await.unwrap(), Some(floor_record(12)));
    let err = store.create("demo", &record(Some("a"), 1)).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    store
        .update("demo", &floor_record(12).version, &record(Some("a"), 13))
        .await
        .unwrap();
    assert_eq!(
        fs::read_to_string(dir.path().join(".demo.floor")).unwrap(),
        "13 4\n"
    );
}

#[tokio::test]
async fn a_poller_that_misses_a_rewrite_and_second_deletion_dates_the_holder_again() {
    let dir = tempfile::tempdir().unwrap();
    let holder = EmbeddedStore::open(dir.path()).unwrap();
    let poller = EmbeddedStore::open(dir.path()).unwrap();
    let held = holder.create("demo", &record(Some("h"), 4)).await.unwrap();
    assert_eq!(poller.get("demo").await.unwrap(), Some(held));
    remove_lease(dir.path(), "demo");
    let first = poller.get("demo").await.unwrap().unwrap();
    assert!(first.version.starts_with(TOMBSTONE));
    assert_eq!(
        poller.get("demo").await.unwrap(),
        Some(first.clone()),
        "no change, same version"
    );
    // The holder writes its record again; it is deleted again before
    // the poller reads: the poller's next read is a new version, so it
    // dates the holder's lease from then, not from the first deletion.
    let tomb = holder.get("demo").await.unwrap().unwrap();
    holder
        .update("demo", &tomb.version, &record(Some("h"), 4))
        .await
        .unwrap();
    remove_lease(dir.path(), "demo");
    let second = poller.get("demo").await.unwrap().unwrap();
    assert_ne!(second.version, first.version);
    assert_eq!(second.record, first.record);
    assert_eq!(poller.get("demo").await.unwrap(), Some(second));
}

/// The child's half of the test below: raises the floor of lease
/// `demo` in `dir` without end, under the lock, as every writer does.
fn raise_the_floor_forever(dir: &Path) -> ! {
    let store = EmbeddedStore::open(dir).unwrap();
    let files = store.files("demo").unwrap();
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(files.lock())
        .unwrap();
    loop {
        take_lock(&files, &lock, false, &|| None).unwrap();
        let state = read_lock_state(&files).unwrap();
        write_lock_state(
            &files,
            LockState {
                floor: state.floor + 1,
                creates: state.creates + 1,
            },
        )
        .unwrap();
        lock.unlock().unwrap();
    }
}

#[test]
fn a_writer_killed_at_any_point_leaves_a_readable_floor() {
    const CHILD: &str = "BATON_TEST_FLOOR_WRITER";
    const NAME: &str = "store::embedded::tests::a_writer_killed_at_any_point_leaves_a_readable_floor";
    if let Some(dir) = std::env::var_os(CHILD) {
        raise_the_floor_forever(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let files = store.files("demo").unwrap();
    let mut last = 0;
    for round in 0..40 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Once it writes (however long a busy machine takes to start it),
        // killed at a random moment: in a write, a rename, an fsync or
        // between them.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !read_lock_state(&files).is_ok_and(|s| s.floor > last) {
            assert!(
                Instant::now() < deadline,
                "round {round}: the writer never raised the floor"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_micros(rand::random_range(0..5_000)));
        child.kill().unwrap();
        child.wait().unwrap();
        let state = read_lock_state(&files)
            .unwrap_or_else(|e| panic!("after the writer was killed in round {round}: {e}"));
        assert!(
            state.floor >= last,
            "the floor went back from {last} to {}",
            state.floor
        );
        assert_eq!(state.floor, state.creates, "the two numbers were written apart");
        last = state.floor;
    }
    // (Each child did write before it was killed: the test is not
    // vacuous.)
    assert!(last >= 40, "the writers raised the floor only to {last}");
    println!("a writer killed 40 times: the floor reads {last}, never torn");
}

/// Set in a child process of the tests below: it stops itself
/// (`SIGSTOP`) in the middle of each write, its version written and not
/// yet linked.
const STOP_BEFORE_LINK: &str = "BATON_TEST_STOP_BEFORE_LINK";

/// Set for a child that writes through named temporary files.
const NAMED_TEMPS: &str = "BATON_TEST_NAMED_TEMPS";

/// Called by [`commit`] between writing a version and linking it.
pub(super) fn before_link() {
    if std::env::var_os(STOP_BEFORE_LINK).is_some() {
        // SAFETY: raise has no memory-safety preconditions.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
}

/// The child's half of the tests below: `attempts` increments of lease
/// `demo` in `dir` (or as many as fit in `for_ms` milliseconds), one
/// line per outcome on stdout, then a summary line.
fn increment_as_a_child(dir: &Path) -> ! {
    use std::io::Write as _;
    let attempts: usize = std::env::var("BATON_TEST_ATTEMPTS").map_or(usize::MAX, |a| a.parse().unwrap());
    let until = std::env::var("BATON_TEST_FOR_MS")
        .map(|ms| Instant::now() + Duration::from_millis(ms.parse().unwrap()))
        .ok();
    // Or until its standard input ends (the test closes it when it is done
    // with the child, however long that took).
    let ended = Arc::new(AtomicBool::new(false));
    if std::env::var_os("BATON_TEST_UNTIL_EOF").is_some() {
        let ended = ended.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            ended.store(true, Ordering::Relaxed);
        });
    }
    // Past `until`, it goes on until it has written this many times (a
    // loaded machine's fsyncs can take many milliseconds).
    let at_least: usize = std::env::var("BATON_TEST_AT_LEAST").map_or(0, |n| n.parse().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = EmbeddedStore::open(dir).unwrap();
    if std::env::var_os(NAMED_TEMPS).is_some() {
        store.unnamed_temps.store(false, Ordering::Relaxed);
    }
    let (mut ok, mut conflict, mut unknown) = (0, 0, 0);
    let mut out = std::io::stdout().lock();
    // The test harness has written "test <name> ... " without a newline.
    writeln!(out).unwrap();
    for _ in 0..attempts {
        let over = until.is_some_and(|until| Instant::now() >= until) || ended.load(Ordering::Relaxed);
        if over && ok >= at_least {
            break;
        }
        let current = rt.block_on(store.get("demo")).unwrap().unwrap();
        let mut next = current.record.clone();
        next.term += 1;
        let outcome = match rt.block_on(store.update("demo", &current.version, &next)) {
            Ok(_) => {
                ok += 1;
                "ok".to_string()
            }
            Err(e) if e.is_conflict() => {
                conflict += 1;
                format!("conflict {e}")
            }
            Err(StoreError::Unavailable { detail, .. }) => {
                unknown += 1;
                format!("unknown {detail}")
            }
            Err(e) => panic!("{e}"),
        };
        if until.is_none() && std::env::var_os("BATON_TEST_UNTIL_EOF").is_none() {
            writeln!(out, "attempt {outcome}").unwrap();
            out.flush().unwrap();
        }
    }
    writeln!(out, "done {ok} {conflict} {unknown}").unwrap();
    out.flush().unwrap();
    std::process::exit(0)
}

/// Starts this test binary as a child running [`increment_as_a_child`].
fn spawn_child(test: &str, dir: &Path, env: &[(&str, String)]) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("BATON_TEST_INCREMENTER", dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until process `pid` is stopped.
fn wait_stopped(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // "pid (comm) S ...": the state follows the last parenthesis.
        let state = stat.rsplit(')').next().unwrap().trim_start().chars().next();
        if state == Some('T') {
            return;
        }
        assert!(Instant::now() < deadline, "the child never stopped: {stat}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn signal(child: &std::process::Child, signal: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
}

/// `n` increments by this process, each retried on conflict, each
/// bounded by `within` (the lock of an older baton would hold them
/// until the stopped writer resumed).
fn increments(rt: &tokio::runtime::Runtime, store: &EmbeddedStore, n: usize, within: Duration) -> Duration {
    let started = Instant::now();
    for _ in 0..n {
        rt.block_on(async {
            tokio::time::timeout(within, increment(store, "demo"))
                .await
                .expect("an increment finished while the other writer was stopped")
        });
    }
    started.elapsed()
}

#[test]
fn a_writer_stopped_in_the_middle_of_its_write_blocks_no_one_and_its_write_fails() {
    const NAME: &str = "store::embedded::tests::a_writer_stopped_in_the_middle_of_its_write_blocks_no_one_and_its_write_fails";
    if let Some(dir) = std::env::var_os("BATON_TEST_INCREMENTER") {
        increment_as_a_child(Path::new(&dir));
    }
    // The child writes through unnamed temporary files, then named ones.
    for named in [false, true] {
        a_writer_stopped_in_the_middle_of_its_write(NAME, named);
    }
}

fn a_writer_stopped_in_the_middle_of_its_write(name: &str, named: bool) {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    rt.block_on(store.create("demo", &record(None, 0))).unwrap();
    // How many writes this process makes while the child is stopped in
    // each of its writes: none (its write lands), one (its link finds
    // the name taken), and more than the versions kept (its link
    // re-creates the name of a version removed long ago).
    let rounds = [
        0,
        1,
        0,
        3,
        KEPT_VERSIONS as usize,
        0,
        2 * KEPT_VERSIONS as usize + 5,
        1,
    ];
    let mut env = vec![
        (STOP_BEFORE_LINK, "1".to_string()),
        ("BATON_TEST_ATTEMPTS", rounds.len().to_string()),
    ];
    if named {
        env.push((NAMED_TEMPS, "1".into()));
    }
    let mut child = spawn_child(name, dir.path(), &env);
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
        .filter(|l| l.starts_with("attempt ") || l.starts_with("done "));
    let mut mine = 0;
    let mut slowest = Duration::ZERO;
    for (round, &writes) in rounds.iter().enumerate() {
        wait_stopped(child.id());
        slowest = slowest.max(increments(&rt, &store, writes, Duration::from_secs(30)));
        mine += writes;
        signal(&child, libc::SIGCONT);
        let outcome = lines.next().expect("the child reports each attempt");
        if writes == 0 {
            assert_eq!(outcome, "attempt ok", "round {round}: nobody wrote meanwhile");
        } else {
            assert!(
                outcome.starts_with("attempt conflict"),
                "round {round}: {writes} writes came while the child was stopped, yet: {outcome}"
            );
        }
        println!(
            "round {round}: {writes} writes while stopped -> child's write (named temporary files: {named}): {outcome}"
        );
    }
    let done = lines.next().unwrap();
    assert!(child.wait().unwrap().success());
    let landed = rounds.iter().filter(|&&w| w == 0).count();
    assert_eq!(done, format!("done {landed} {} 0", rounds.len() - landed));
    let last = rt.block_on(store.get("demo")).unwrap().unwrap();
    assert_eq!(
        last.record.term as usize,
        mine + landed,
        "no write lost, none stale landed"
    );
    println!("slowest batch of writes while the other writer was stopped: {slowest:?}");
}

#[test]
fn writers_stopped_at_random_moments_block_no_one_and_lose_no_update() {
    const NAME: &str =
        "store::embedded::tests::writers_stopped_at_random_moments_block_no_one_and_lose_no_update";
    if let Some(dir) = std::env::var_os("BATON_TEST_INCREMENTER") {
        increment_as_a_child(Path::new(&dir));
    }
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    // Both ways of writing a version, one in each process.
    store.unnamed_temps.store(false, Ordering::Relaxed);
    rt.block_on(store.create("demo", &record(None, 0))).unwrap();
    let mut child = spawn_child(
        NAME,
        dir.path(),
        &[
            ("BATON_TEST_UNTIL_EOF", "1".into()),
            ("BATON_TEST_AT_LEAST", "100".into()),
        ],
    );
    let mut mine = 0;
    let mut times = Vec::new();
    // Stopped at random moments while it writes as fast as it can, 60
    // times (a count, not a span of time: a busy machine makes fewer stops
    // per second); each time, this process writes twice before letting it
    // go on. Then the child is told to end.
    for _ in 0..60 {
        std::thread::sleep(Duration::from_micros(rand::random_range(0..20_000)));
        signal(&child, libc::SIGSTOP);
        wait_stopped(child.id());
        times.push(increments(&rt, &store, 2, Duration::from_secs(30)));
        mine += 2;
        signal(&child, libc::SIGCONT);
    }
    drop(child.stdin.take());
    let all: Vec<String> = std::io::BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
        .collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "the child failed ({status}): {all:?}");
    let out = all
        .iter()
        .find(|l| l.starts_with("done "))
        .cloned()
        .unwrap_or_default();
    let counts: Vec<usize> = out
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().unwrap())
        .collect();
    let [ok, conflict, unknown] = counts[..] else {
        panic!("no summary from the child: {all:?}")
    };
    // The child was stopped between its read and its write at least
    // once: the two writers really interleaved.
    assert!(
        ok >= 100 && conflict > 0,
        "the child: {ok} written, {conflict} conflicts"
    );
    let last = rt.block_on(store.get("demo")).unwrap().unwrap().record.term as usize;
    assert!(
        (mine + ok..=mine + ok + unknown).contains(&last),
        "the counter is {last}: {mine} by this process, {ok} by the child and {unknown} that may have landed"
    );
    times.sort();
    println!(
        "{} stops; two writes while stopped took {:?} at the median, {:?} at most; \
             the child: {ok} written, {conflict} conflicts, {unknown} unknown",
        times.len(),
        times[times.len() / 2],
        times[times.len() - 1]
    );
}

#[tokio::test]
async fn a_lost_floor_is_restored_and_never_blocks_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let lock = dir.path().join(".demo.floor");
    let held = store.create("demo", &record(Some("a"), 9)).await.unwrap();
    // The floor emptied by hand:
    // a renewal writes it again.
    fs::write(&lock, "").unwrap();
    assert_eq!(floor_of(&store, "demo"), 0);
    let renewed = store
        .update("demo", &held.version, &record(Some("a"), 9))
        .await
        .unwrap();
    assert_eq!(floor_of(&store, "demo"), 9);
    // Emptied again, then the record deleted while held: the holder
    // still writes it again in its term, and the floor is back.
    fs::write(&lock, "").unwrap();
    fs::remove_dir_all(dir.path().join(".demo.terms")).unwrap();
    remove_lease(dir.path(), "demo");
    let tombstone = store.get("demo").await.unwrap().unwrap();
    assert_eq!(tombstone.version, format!("{TOMBSTONE}{}", renewed.version));
    store
        .update("demo", &tombstone.version, &record(Some("a"), 9))
        .await
        .unwrap();
    assert_eq!(floor_in(&lock), "9");
    assert_eq!(floor_of(&store, "demo"), 9);
}

#[tokio::test]
async fn versions_never_repeat_after_delete_and_recreate() {
    let (_dir, store) = store();
    let mut seen = HashSet::new();
    let mut stale = Vec::new();
    for round in 0..3 {
        let mut v = recreate(&store, "demo", &record(None, 3 * round)).await;
        assert!(seen.insert(v.version.clone()));
        for i in 0..3 {
            stale.push(v.version.clone());
            v = store
                .update("demo", &v.version, &record(None, 3 * round + i))
                .await
                .unwrap();
            assert!(seen.insert(v.version.clone()));
        }
        stale.push(v.version.clone());
        // Delete through the store, then behind its back.
        if round % 2 == 0 {
            assert!(store.delete("demo").await.unwrap());
        } else {
            remove_lease(store.dir(), "demo");
        }
    }
    let current = recreate(&store, "demo", &record(None, 9)).await;
    assert!(!seen.contains(&current.version));
    for old in stale {
        let err = store.update("demo", &old, &record(None, 7)).await.unwrap_err();
        assert!(err.is_conflict(), "{err}");
    }
}

#[tokio::test]
async fn malformed_record_is_reported_with_lease_and_path() {
    let (_dir, store) = store();
    let v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    let path = newest_version(store.dir(), "demo");
    let full = fs::read(&path).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", full[..full.len() / 2].to_vec()),
        ("garbage", b"\x00\xffnot json".to_vec()),
        ("wrong shape", br#"{"holder": "a"}"#.to_vec()),
        (
            "bad incarnation",
            String::from_utf8(full.clone())
                .unwrap()
                .replace(&v.version[..16], "../x")
                .into_bytes(),
        ),
    ];
    for (what, bytes) in cases {
        fs::write(&path, &bytes).unwrap();
        let errors = [
            store.get("demo").await.unwrap_err(),
            store.create("demo", &v.record).await.unwrap_err(),
            store.update("demo", &v.version, &v.record).await.unwrap_err(),
            store.list().await.unwrap_err(),
            store
                .watch("demo")
                .await
                .unwrap()
                .next()
                .await
                .unwrap()
                .unwrap_err(),
        ];
        for err in errors {
            match &err {
                StoreError::Malformed { lease, detail } => {
                    assert_eq!(lease, "demo", "{what}");
                    assert!(detail.contains(&path.display().to_string()), "{what}: {detail}");
                }
                other => panic!("{what}: expected Malformed, got {other:?}"),
            }
        }
        // Nothing was overwritten.
        assert_eq!(fs::read(&path).unwrap(), bytes, "{what}");
    }
    // An operator can clear it.
    assert!(store.delete("demo").await.unwrap());
    recreate(&store, "demo", &v.record).await;
}

/// What a crash can leave of an unsynced renewal's version file (`full`
/// its bytes as written, `older` an older version's, as a recycled
/// file's old block holds them).
fn torn_cases(full: &[u8], older: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", Vec::new()),
        ("truncated", full[..full.len() / 2].to_vec()),
        ("garbled", b"\x00\xffnot json".to_vec()),
        ("zeros", vec![0; full.len()]),
        ("an older version's bytes", older.to_vec()),
    ]
}

/// Creates `demo` held by `a` in term 1 and renews it `renewals` times
/// (through `store`); returns every version, oldest first.
async fn held_with_renewals(store: &EmbeddedStore, renewals: usize) -> Vec<Versioned> {
    let mut versions = vec![store.create("demo", &record(Some("a"), 1)).await.unwrap()];
    for _ in 0..renewals {
        let last = versions.last().unwrap().version.clone();
        versions.push(store.update("demo", &last, &record(Some("a"), 1)).await.unwrap());
    }
    versions
}

#[tokio::test]
async fn a_torn_renewal_reads_as_a_renewal_of_the_version_below_and_is_written_over() {
    for torn in 1..=2 {
        let (dir, writer) = store();
        let versions = held_with_renewals(&writer, 3).await;
        let newest = versions.last().unwrap();
        let path = newest_version(writer.dir(), "demo");
        let full = fs::read(&path).unwrap();
        let older = fs::read(path.with_file_name(version_name(1))).unwrap();
        for (what, bytes) in torn_cases(&full, &older) {
            // The newest `torn` versions lost their bytes, as a crash
            // of the machine leaves unsynced renewals.
            for counter in 5 - torn..=4 {
                fs::write(path.with_file_name(version_name(counter)), &bytes).unwrap();
            }
            // A reader started after the crash (no memory of the lease).
            let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
            let readable = &versions[3 - torn as usize];
            let got = reader.get("demo").await.unwrap().expect("a record");
            assert_eq!(got.record, readable.record, "{what}, {torn} torn");
            assert_eq!(got.version, newest.version, "{what}: the torn version's own");
            let watched = reader.watch("demo").await.unwrap().next().await.unwrap().unwrap();
            assert_eq!(watched, Some(got.clone()), "{what}");
            assert_eq!(reader.list().await.unwrap(), vec![("demo".into(), got.clone())]);
            // Read again, the same version: dated once, at first sight.
            assert_eq!(reader.get("demo").await.unwrap(), Some(got.clone()), "{what}");
        }
        // Taken over after it ran out: the version after the torn one,
        // in a term above it (and the floor).
        let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
        let got = reader.get("demo").await.unwrap().unwrap();
        let taken = reader
            .update("demo", &got.version, &record(Some("b"), 2))
            .await
            .unwrap();
        assert!(taken.version.ends_with("-5"), "{}", taken.version);
        assert_eq!(reader.get("demo").await.unwrap(), Some(taken.clone()));
        assert_eq!(floor_of(&reader, "demo"), 2);
        // A second contender that read the torn version lost the race.
        let lost = writer.update("demo", &got.version, &record(Some("c"), 2)).await;
        assert!(lost.unwrap_err().is_conflict());
    }
}

#[tokio::test]
async fn the_newest_fsynced_version_is_kept_to_read_when_every_renewal_is_torn() {
    let (dir, writer) = store();
    let files = writer.files("demo").unwrap();
    let versions = |store: &EmbeddedStore| {
        let dir = open_lease_dir(&files).unwrap().unwrap();
        list_versions(&store.files("demo").unwrap(), &dir, false)
            .unwrap()
            .counters
    };
    // A term far longer than the versions kept: its first version (the
    // create, fsynced) is neither taken for a renewal nor removed.
    let all = held_with_renewals(&writer, 3 * KEPT_VERSIONS as usize).await;
    assert_eq!(versions(&writer)[0], 1, "{:?}", versions(&writer));
    // A crash tore every renewal kept (unread and read-first alike).
    for counter in versions(&writer).into_iter().skip(1) {
        fs::write(files.version_path(counter), b"").unwrap();
    }
    let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
    let got = reader.get("demo").await.unwrap().expect("a record");
    assert_eq!(got.record, all[0].record);
    assert_eq!(got.version, all.last().unwrap().version);
    // Taken over: that write is the newest fsynced one from then on,
    // and the old one goes once it is old.
    let mut v = reader
        .update("demo", &got.version, &record(Some("b"), 2))
        .await
        .unwrap();
    let taken = v.version.rsplit('-').next().unwrap().parse::<u64>().unwrap();
    for _ in 0..=KEPT_VERSIONS {
        v = reader
            .update("demo", &v.version, &record(Some("b"), 2))
            .await
            .unwrap();
    }
    let kept = versions(&reader);
    assert_eq!(kept[0], taken, "{kept:?}");
    assert!(!kept.contains(&1), "{kept:?}");
}

#[tokio::test]
async fn a_live_holder_renews_over_its_torn_version_and_readers_follow() {
    for read_first in [false, true] {
        let (dir, holder) = store();
        let versions = held_with_renewals(&holder, 2).await;
        let newest = versions.last().unwrap();
        let path = newest_version(holder.dir(), "demo");
        fs::write(&path, b"").unwrap();
        let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
        let mut watch = reader.watch("demo").await.unwrap();
        let seen = next_within(&mut watch, 10).await.expect("a record");
        assert_eq!(seen.record.holder(), Some("a"));
        assert_eq!(seen.version, newest.version);
        let over = if read_first {
            // A holder that lost its answer reads first: its own record.
            let again = EmbeddedStore::open(dir.path().join("leases")).unwrap();
            let current = again.get("demo").await.unwrap().unwrap();
            assert_eq!(current.version, newest.version);
            again
                .update("demo", &current.version, &record(Some("a"), 1))
                .await
                .unwrap()
        } else {
            holder
                .update("demo", &newest.version, &record(Some("a"), 1))
                .await
                .unwrap()
        };
        assert!(over.version.ends_with("-4"), "{}", over.version);
        let next = next_change(&mut watch, &Some(seen)).await.expect("a record");
        assert_eq!(next, over, "read first: {read_first}");
        assert_eq!(reader.get("demo").await.unwrap(), Some(over));
    }
}

#[tokio::test]
async fn an_unreadable_version_that_no_unsynced_renewal_wrote_stays_an_error() {
    // Below it: a release (the next write starts a term), and a version
    // under a floor raised for a new term (the next write may have been
    // that term's, fsynced).
    for case in ["released below", "floor above"] {
        let (_dir, store) = store();
        let versions = held_with_renewals(&store, 1).await;
        let files = store.files("demo").unwrap();
        match case {
            "released below" => {
                let last = versions.last().unwrap().version.clone();
                store.update("demo", &last, &record(None, 1)).await.unwrap();
                // Nothing but a new term (fsynced) follows a release.
                fs::write(files.version_path(4), b"").unwrap();
            }
            _ => {
                raise_floor(&files, 2).unwrap();
                fs::write(newest_version(store.dir(), "demo"), b"").unwrap();
            }
        }
        let fresh = EmbeddedStore::open(store.dir()).unwrap();
        let path = newest_version(store.dir(), "demo");
        for err in [
            fresh.get("demo").await.unwrap_err(),
            fresh.list().await.unwrap_err(),
            fresh
                .update("demo", "x-9", &record(Some("c"), 3))
                .await
                .unwrap_err(),
        ] {
            match &err {
                StoreError::Malformed { lease, detail } => {
                    assert_eq!(lease, "demo", "{case}");
                    assert!(detail.contains(&path.display().to_string()), "{case}: {detail}");
                }
                other => panic!("{case}: expected Malformed, got {other:?}"),
            }
        }
        assert_eq!(fs::read(&path).unwrap(), b"", "{case}: nothing written over it");
    }
}

#[tokio::test]
async fn a_missing_newest_version_leaves_the_one_below_as_the_record() {
    // A crash after a write took the oldest file (renamed it aside) but
    // before its link was on disk: the newest name is simply not there.
    let (dir, writer) = store();
    let versions = held_with_renewals(&writer, 20).await;
    let files = writer.files("demo").unwrap();
    let newest = versions.last().unwrap();
    fs::rename(
        files.version_path(21),
        files.versions.join(".tmp-0123456789abcdef"),
    )
    .unwrap();
    let reader = EmbeddedStore::open(dir.path().join("leases")).unwrap();
    let got = reader.get("demo").await.unwrap().unwrap();
    assert_eq!(got, versions[19]);
    let taken = reader
        .update("demo", &got.version, &record(Some("b"), 2))
        .await
        .unwrap();
    assert_eq!(taken.version, newest.version, "the version after the one below");
    assert_eq!(reader.get("demo").await.unwrap(), Some(taken));
}

#[tokio::test]
async fn leftover_temp_files_are_ignored_and_removed_once_old() {
    let (_dir, store) = store();
    let v1 = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    // As if writers died after writing half of their temporary files:
    // one a while ago, one just now (perhaps only stopped).
    let versions = store.dir().join("demo.lease");
    let old = versions.join(".tmp-dead");
    let young = versions.join(".tmp-young");
    for temp in [&old, &young] {
        fs::write(temp, "{\"incarnation\": \"dead").unwrap();
    }
    File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - 2 * STALE_TEMP_AGE)
        .unwrap();
    assert_eq!(store.get("demo").await.unwrap(), Some(v1.clone()));
    assert_eq!(
        store.list().await.unwrap(),
        vec![("demo".to_string(), v1.clone())]
    );
    let v2 = store
        .update("demo", &v1.version, &record(Some("b"), 2))
        .await
        .unwrap();
    assert_eq!(store.get("demo").await.unwrap(), Some(v2));
    assert!(!old.exists(), "the next write removed the old one");
    assert!(young.exists(), "a young one may be a stopped writer's: kept");
}

#[tokio::test]
async fn old_versions_are_removed_lowest_first_and_never_read() {
    let (_dir, store) = store();
    let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    for _ in 0..40 {
        v = store
            .update("demo", &v.version, &record(Some("a"), 1))
            .await
            .unwrap();
    }
    let files = store.files("demo").unwrap();
    let dir = open_lease_dir(&files).unwrap().unwrap();
    let counters = list_versions(&files, &dir, false).unwrap().counters;
    assert_eq!(
        counters,
        std::iter::once(1).chain(25..=41).collect::<Vec<_>>(),
        "the newest fsynced (the create), the newest and 16 before it"
    );
    assert_eq!(store.get("demo").await.unwrap(), Some(v));
}

#[tokio::test]
async fn an_abandoned_create_does_not_write() {
    let (_dir, store) = store();
    // Hold the lease's lock as another process creating it would.
    let lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(store.dir().join(".demo.lock"))
        .unwrap();
    lock.lock().unwrap();
    let attempt = tokio::time::timeout(
        Duration::from_millis(100),
        store.create("demo", &record(Some("b"), 2)),
    )
    .await;
    assert!(attempt.is_err(), "the create waits for the lock");
    lock.unlock().unwrap();
    // Give the blocked thread time to get the lock and give up.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.get("demo").await.unwrap(), None);
}

#[tokio::test]
async fn updates_do_not_wait_for_the_lock() {
    let (_dir, store) = store();
    let v1 = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    let lock = File::options()
        .read(true)
        .write(true)
        .open(store.dir().join(".demo.lock"))
        .unwrap();
    lock.lock().unwrap();
    // The lock stays held: the bound only has to end a wait for it (an
    // fsync'd write on a busy machine can take a second).
    let v2 = tokio::time::timeout(
        Duration::from_secs(30),
        store.update("demo", &v1.version, &record(Some("b"), 2)),
    )
    .await
    .expect("an update takes no lock")
    .unwrap();
    assert_eq!(store.get("demo").await.unwrap(), Some(v2));
    lock.unlock().unwrap();
}

#[tokio::test]
async fn a_record_of_an_older_baton_is_moved_keeping_its_version() {
    let dir = tempfile::tempdir().unwrap();
    let r = record(Some("a"), 3);
    let legacy = serde_json::json!({
        "incarnation": "00aa11bb22cc33dd",
        "counter": 41,
        "record": r,
    });
    fs::write(dir.path().join("demo.lease.json"), legacy.to_string()).unwrap();
    fs::write(dir.path().join(".demo.lock"), format!("{:>20} {:>20}\n", 3, 1)).unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    assert!(!dir.path().join("demo.lease.json").exists());
    let current = store.get("demo").await.unwrap().unwrap();
    assert_eq!(current.version, "00aa11bb22cc33dd-41");
    assert_eq!(current.record, r);
    let next = store
        .update("demo", &current.version, &record(Some("b"), 4))
        .await
        .unwrap();
    assert_eq!(next.version, "00aa11bb22cc33dd-42");
    assert_eq!(floor_of(&store, "demo"), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_changes_from_another_store() {
    let (_dir, watcher_store) = store();
    let writer = EmbeddedStore::open(watcher_store.dir()).unwrap();
    let mut watch = watcher_store.watch("demo").await.unwrap();

    // First the current state: nothing yet.
    assert_eq!(next_within(&mut watch, 10).await, None);

    let created = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
    // The create may surface as more than one event; wait for its record.
    let mut seen = next_within(&mut watch, 10).await;
    while seen.as_ref() != Some(&created) {
        seen = next_within(&mut watch, 10).await;
    }

    // Reading the record (opening it) is not a change.
    writer.get("demo").await.unwrap();
    watcher_store.get("demo").await.unwrap();
    let quiet = tokio::time::timeout(Duration::from_millis(200), async {
        loop {
            let seen = watch.next().await.unwrap().unwrap();
            // Leftover wake-ups from the create may re-yield it.
            assert_eq!(seen.as_ref(), Some(&created));
        }
    })
    .await;
    assert!(quiet.is_err(), "the watch stays quiet without writes");

    let mut latencies = Vec::new();
    let mut current = created;
    for i in 0..20 {
        let started = Instant::now();
        let updated = writer
            .update("demo", &current.version, &record(Some("a"), 2 + i))
            .await
            .unwrap();
        let written = started.elapsed();
        let mut seen = next_within(&mut watch, 10).await;
        while seen.as_ref() != Some(&updated) {
            seen = next_within(&mut watch, 10).await;
        }
        // How soon is a figure (printed below), not a verdict.
        let latency = started.elapsed();
        latencies.push((latency, written));
        current = updated;
    }
    latencies.sort();
    println!(
        "watch latency from start of update (update call itself): min {:?} ({:?}), \
             median {:?} ({:?}), max {:?} ({:?})",
        latencies[0].0, latencies[0].1, latencies[10].0, latencies[10].1, latencies[19].0, latencies[19].1,
    );

    // Deletion through a store, and behind its back: a record deleted
    // while held is seen as its tombstone, one without a holder as gone.
    let started = Instant::now();
    assert!(writer.delete("demo").await.unwrap());
    while next_within(&mut watch, 10)
        .await
        .is_none_or(|v| !v.version.starts_with(TOMBSTONE))
    {}
    println!("watch saw deletion after {:?}", started.elapsed());

    let again = recreate(&writer, "demo", &record(None, 21)).await;
    while next_within(&mut watch, 10).await != Some(again.clone()) {}
    remove_lease(writer.dir(), "demo");
    while next_within(&mut watch, 10).await != Some(floor_record(21)) {}
}

#[tokio::test]
async fn watch_breaks_when_directory_is_removed() {
    let (_dir, store) = store();
    let mut watch = store.watch("demo").await.unwrap();
    assert_eq!(next_within(&mut watch, 10).await, None);
    fs::remove_dir(store.dir()).unwrap();
    let item = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watch.next().await {
                Some(Ok(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .unwrap();
    match item {
        Some(Err(StoreError::Unavailable { lease, .. })) => assert_eq!(lease, "demo"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(watch.next().await.is_none(), "the stream ends after the error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_watch_sees_a_store_directory_made_anew_while_an_old_watch_lives() {
    // All watches of a store share one inotify watcher: a watch made
    // after the directory was removed and made again must watch the
    // new directory, though an older watch (broken) still holds the
    // watcher.
    let (_dir, store) = store();
    let mut old = store.watch("old").await.unwrap();
    assert_eq!(next_within(&mut old, 10).await, None);
    fs::remove_dir(store.dir()).unwrap();
    fs::create_dir(store.dir()).unwrap();
    let mut watch = store.watch("demo").await.unwrap();
    assert_eq!(next_within(&mut watch, 10).await, None);
    let writer = EmbeddedStore::open(store.dir()).unwrap();
    let created = writer.create("demo", &record(Some("a"), 1)).await.unwrap();
    let mut seen = next_within(&mut watch, 10).await;
    while seen.as_ref() != Some(&created) {
        seen = next_within(&mut watch, 10).await;
    }
    drop(old);
}

/// The names in a lease's directory.
fn names_in(dir: &Path, lease: &str) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir.join(format!("{lease}.lease")))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn versions_are_written_through_unnamed_files_or_named_ones_alike() {
    let (_dir, store) = store();
    assert!(
        store.unnamed_temps.load(Ordering::Relaxed),
        "this file system and process can (O_TMPFILE, /proc/self/fd)"
    );
    let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    for (i, named) in [false, true, false, true].into_iter().enumerate() {
        store.unnamed_temps.store(!named, Ordering::Relaxed);
        v = store
            .update("demo", &v.version, &record(Some("a"), 1))
            .await
            .unwrap();
        assert_eq!(
            store.get("demo").await.unwrap(),
            Some(v.clone()),
            "named: {named}"
        );
        // Nothing but versions left behind, either way.
        let expected: Vec<String> = (1..=i as u64 + 2).map(version_name).collect();
        assert_eq!(names_in(store.dir(), "demo"), expected, "named: {named}");
        // A stale write fails either way.
        let err = store
            .update(
                "demo",
                &format!("{}-1", v.version.split('-').next().unwrap()),
                &record(None, 1),
            )
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
    }
    // A write into a lease deleted since it was read fails, whichever
    // file it writes: unnamed, named, or an old version's taken.
    for (named, recycle) in [(false, false), (true, false), (false, true)] {
        store.unnamed_temps.store(!named, Ordering::Relaxed);
        let files = store.files("demo").unwrap();
        let (dir, current, listing) = read_current(&files).unwrap().unwrap();
        let recycle = recycle.then(|| listing.counters[0]);
        fs::rename(&files.versions, store.dir().join(".demo.aside")).unwrap();
        let stored = StoredRecord {
            counter: current.counter + 1,
            write: random_id(),
            replaced: current.write.clone(),
            ..current
        };
        let writer = Writer {
            watcher: store.watcher.clone(),
            unnamed_temps: store.unnamed_temps.clone(),
            last_writes: store.last_writes.clone(),
        };
        let err = commit(&files, &dir, recycle, &stored, Durability::Visible, &writer, None).unwrap_err();
        assert!(err.to_string().contains("deleted while being written"), "{err}");
        fs::rename(store.dir().join(".demo.aside"), &files.versions).unwrap();
    }
}

/// The inode of each version file of `lease`, by counter.
fn inodes_in(dir: &Path, lease: &str) -> std::collections::BTreeMap<u64, u64> {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(dir.join(format!("{lease}{LEASE_SUFFIX}")))
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.unwrap();
            let counter = version_counter(entry.file_name().as_encoded_bytes())?;
            Some((counter, entry.metadata().unwrap().ino()))
        })
        .collect()
}

#[tokio::test]
async fn a_write_takes_the_file_of_the_version_it_removes() {
    let (_dir, store) = store();
    let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    let mut files_ever = std::collections::BTreeSet::new();
    for _ in 0..3 * KEPT_VERSIONS {
        v = store
            .update("demo", &v.version, &record(Some("a"), 1))
            .await
            .unwrap();
        let inodes = inodes_in(store.dir(), "demo");
        assert!(inodes.len() as u64 <= KEPT_VERSIONS + 2, "{inodes:?}");
        files_ever.extend(inodes.values().copied());
    }
    // The first KEPT_VERSIONS + 2 versions got files of their own (the
    // first, fsynced, is kept); every later write took the file of the
    // version it removed.
    assert_eq!(files_ever.len() as u64, KEPT_VERSIONS + 2, "{files_ever:?}");
    assert_eq!(store.get("demo").await.unwrap(), Some(v));
    assert_eq!(
        names_in(store.dir(), "demo").len() as u64,
        KEPT_VERSIONS + 2,
        "no temporary file left behind"
    );
}

#[test]
fn a_reader_never_reads_a_version_whose_file_is_taken_meanwhile() {
    // One thread writes as fast as it can (each write taking the file of
    // the oldest version); another reads the oldest version, the one
    // about to be taken, over and over. Every version it reads must be
    // that version whole: its lease duration is its counter in ms,
    // written in texts of varying length ("999ms", "1s", "1s 1ms"), so
    // that a longer old file is cut too.
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(dir.path()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let marked = |counter: u64| LeaseRecord {
        plugins: None,
        yielded: None,
        lease_duration: Duration::from_millis(counter),
        ..record(Some("a"), 1)
    };
    let mut v = runtime.block_on(store.create("demo", &marked(1))).unwrap();
    let files = store.files("demo").unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (files, done) = (files.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut read, mut gone) = (0u64, 0u64);
            while !done.load(Ordering::Relaxed) {
                let dir = open_lease_dir(&files).unwrap().unwrap();
                let listing = list_versions(&files, &dir, false).unwrap();
                let (Some(&counter), Some(&inode)) = (listing.counters.first(), listing.inodes.first())
                else {
                    continue;
                };
                match read_version(&files, &dir, counter, Some(inode)) {
                    Ok(Some(stored)) => {
                        assert_eq!(stored.record.lease_duration, Duration::from_millis(counter));
                        read += 1;
                    }
                    Ok(None) => gone += 1,
                    Err(e) => panic!("reading version {counter}: {e}"),
                }
            }
            (read, gone)
        })
    };
    for counter in 2..2_000 {
        v = runtime
            .block_on(store.update("demo", &v.version, &marked(counter)))
            .unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let (read, gone) = reader.join().unwrap();
    assert!(read > 0, "read {read}, gone {gone}");
    eprintln!("read {read} versions whole, {gone} taken or removed before read");
}

/// How many renewals of `store` did not read first.
fn renewed_unread(store: &EmbeddedStore) -> u64 {
    store.last_writes.renewed_unread.load(Ordering::Relaxed)
}

#[tokio::test]
async fn renewals_over_the_stores_own_version_do_not_read_first() {
    let (_dir, store) = store();
    let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    // The first update reads (the store did not write version 1 through
    // an update); the renewals after it do not.
    for _ in 0..3 * KEPT_VERSIONS {
        v = store
            .update("demo", &v.version, &record(Some("a"), 1))
            .await
            .unwrap();
    }
    assert_eq!(renewed_unread(&store), 3 * KEPT_VERSIONS - 1);
    assert_eq!(store.get("demo").await.unwrap(), Some(v.clone()));
    assert_eq!(
        EmbeddedStore::open(store.dir())
            .unwrap()
            .get("demo")
            .await
            .unwrap(),
        Some(v.clone()),
        "another store reads the same"
    );
    let names = names_in(store.dir(), "demo");
    // The newest fsynced version (the create) is kept too.
    assert_eq!(names.len() as u64, KEPT_VERSIONS + 2, "{names:?}");
    // A new term or holder is read first, as every write of another store.
    let before = renewed_unread(&store);
    v = store
        .update("demo", &v.version, &record(Some("b"), 2))
        .await
        .unwrap();
    store
        .update("demo", &v.version, &record(Some("b"), 2))
        .await
        .unwrap();
    assert_eq!(
        renewed_unread(&store),
        before + 1,
        "the holder's change was read first"
    );
}

#[tokio::test]
async fn a_renewal_not_read_first_never_lands_over_another_stores_write() {
    let (_dir, a) = store();
    let b = EmbeddedStore::open(a.dir()).unwrap();
    let v1 = a.create("demo", &record(Some("a"), 1)).await.unwrap();
    let va = a
        .update("demo", &v1.version, &record(Some("a"), 1))
        .await
        .unwrap();
    // b writes the next version: a's renewal over its own finds it there.
    let mut vb = b
        .update("demo", &va.version, &record(Some("b"), 2))
        .await
        .unwrap();
    let err = a
        .update("demo", &va.version, &record(Some("a"), 1))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(a.get("demo").await.unwrap(), Some(vb.clone()));
    // a renews again, and is told that b wrote since.
    let va = a
        .update("demo", &vb.version, &record(Some("a"), 2))
        .await
        .unwrap();
    let va = a
        .update("demo", &va.version, &record(Some("a"), 2))
        .await
        .unwrap();
    // b writes so many versions over a's that a's own is gone: a's
    // renewal finds its last version missing, reads first and is refused.
    // (One whose version goes between that check and its link re-creates
    // a removed name and finds out after linking that it is stale: the
    // writers stopped before linking, below.)
    // (A release first: the version that starts b's term is kept as
    // the newest fsynced one, the release is not.)
    vb = b.update("demo", &va.version, &record(None, 2)).await.unwrap();
    vb = b
        .update("demo", &vb.version, &record(Some("b"), 3))
        .await
        .unwrap();
    for _ in 0..KEPT_VERSIONS + 4 {
        vb = b
            .update("demo", &vb.version, &record(Some("b"), 3))
            .await
            .unwrap();
    }
    let unread = renewed_unread(&a);
    let err = a
        .update("demo", &va.version, &record(Some("a"), 2))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(renewed_unread(&a), unread, "it did not count as renewed");
    assert_eq!(a.get("demo").await.unwrap(), Some(vb.clone()));
    assert_eq!(b.get("demo").await.unwrap(), Some(vb.clone()));
    // Deleted and created again up to the same counter by b: a's
    // renewal over its own old version writes nothing.
    let va = a
        .update("demo", &vb.version, &record(Some("a"), 4))
        .await
        .unwrap();
    let va = a
        .update("demo", &va.version, &record(Some("a"), 4))
        .await
        .unwrap();
    let counter = |v: &Versioned| v.version.rsplit('-').next().unwrap().parse::<u64>().unwrap();
    assert_eq!(b.get("demo").await.unwrap(), Some(va.clone()));
    assert!(b.delete("demo").await.unwrap());
    let mut vb = recreate(&b, "demo", &record(Some("b"), 5)).await;
    while counter(&vb) < counter(&va) {
        vb = b
            .update("demo", &vb.version, &record(Some("b"), 5))
            .await
            .unwrap();
    }
    let err = a
        .update("demo", &va.version, &record(Some("a"), 4))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(b.get("demo").await.unwrap(), Some(vb));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_does_not_read_back_its_own_stores_writes() {
    let (_dir, store) = store();
    let other = EmbeddedStore::open(store.dir()).unwrap();
    let mut v = store.create("demo", &record(Some("a"), 1)).await.unwrap();
    let mut watch = store.watch("demo").await.unwrap();
    assert_eq!(next_within(&mut watch, 10).await, Some(v.clone()));
    for _ in 0..KEPT_VERSIONS + 3 {
        v = store
            .update("demo", &v.version, &record(Some("a"), 1))
            .await
            .unwrap();
        // (Renewals come seconds apart; a burst of more writes than
        // are remembered, ahead of the inotify thread, would be read.)
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Its own writes, and the old versions they removed: nothing.
    let quiet = tokio::time::timeout(Duration::from_millis(300), watch.next()).await;
    assert!(quiet.is_err(), "the store's own writes wake no read: {quiet:?}");
    // Another store's write is read.
    let theirs = other
        .update("demo", &v.version, &record(Some("b"), 2))
        .await
        .unwrap();
    assert_eq!(
        next_change(&mut watch, &Some(v.clone())).await,
        Some(theirs.clone())
    );
    // A write of this store that loses to another's (the same name)
    // does not hide the other's.
    let ours = store.update("demo", &v.version, &record(Some("a"), 1)).await;
    assert!(ours.unwrap_err().is_conflict());
    let newer = other
        .update("demo", &theirs.version, &record(Some("b"), 2))
        .await
        .unwrap();
    assert_eq!(next_change(&mut watch, &Some(theirs)).await, Some(newer));
}

#[tokio::test]
async fn the_holders_host_is_kept_in_the_file_and_older_records_read_without() {
    use crate::store::HostInfo;
    let (_dir, store) = store();
    let host = HostInfo {
        address: Some("http://10.1.2.3:8080".into()),
        draining: true,
        weight: 2,
        versions: [
            ("a".to_owned(), format!("sha256:{}", "1".repeat(64))),
            ("b".to_owned(), format!("sha256:{}", "2".repeat(64))),
        ]
        .into(),
    };
    let held = LeaseRecord {
        host: Some(host.clone()),
        ..record(Some("a"), 1)
    };
    let v = store.create("demo", &held).await.unwrap();
    let text = fs::read_to_string(newest_version(store.dir(), "demo")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        json["record"]["host"],
        serde_json::json!({"address": "http://10.1.2.3:8080", "draining": true, "weight": 2, "versions": {
            "a": format!("sha256:{}", "1".repeat(64)),
            "b": format!("sha256:{}", "2".repeat(64)),
        }}),
        "{text}"
    );
    assert_eq!(store.get("demo").await.unwrap().unwrap().record.host, Some(host));
    // A release carries none, and writes none.
    store.update("demo", &v.version, &record(None, 1)).await.unwrap();
    let text = fs::read_to_string(newest_version(store.dir(), "demo")).unwrap();
    assert!(!text.contains("\"host\""), "{text}");
    // Older records have no `host`; a sparse one reads with the defaults.
    let old: LeaseRecord =
        serde_json::from_str(r#"{"holder": "a", "leaseDuration": "15s", "transitions": 1}"#).unwrap();
    assert_eq!(old.host, None);
    let sparse: LeaseRecord =
        serde_json::from_str(r#"{"holder": "a", "leaseDuration": "15s", "transitions": 1, "host": {}}"#)
            .unwrap();
    assert_eq!(sparse.host, Some(HostInfo::default()));
    assert_eq!((sparse.holder_address(), HostInfo::default().weight), (None, 1));
}

#[tokio::test]
async fn a_renewal_reads_first_over_a_version_changed_in_place() {
    let (_dir, a) = store();
    let files = a.files("demo").unwrap();
    let v1 = a.create("demo", &record(Some("a"), 1)).await.unwrap();
    let v2 = a
        .update("demo", &v1.version, &record(Some("a"), 1))
        .await
        .unwrap();
    // Every version garbled in place (same files, same inodes): none can
    // be read, so none may be written over, by a renewal not read first
    // either.
    for counter in [1, 2] {
        fs::write(files.version_path(counter), b"garbage\n").unwrap();
    }
    let unread = renewed_unread(&a);
    let err = a
        .update("demo", &v2.version, &record(Some("a"), 1))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Malformed { .. }), "{err}");
    assert_eq!(renewed_unread(&a), unread, "it did not count as renewed");
    assert!(!files.version_path(3).exists(), "nothing was written");
    assert_eq!(fs::read(files.version_path(2)).unwrap(), b"garbage\n");
}

#[tokio::test]
async fn a_taken_file_a_little_longer_is_padded_a_much_longer_one_cut() {
    let (_dir, store) = store();
    let sized = |n: usize| LeaseRecord {
        instance: Some("i".repeat(n)),
        ..record(Some("a"), 1)
    };
    let mut v = store.create("demo", &sized(600)).await.unwrap();
    // Sizes in a cycle of three, so the file of the version 17 below (the
    // one taken) held the record of the next size: 10 over 590 (cut), 590
    // over 600 (padded), 600 over 10.
    let (mut padded, mut cut) = (0, 0);
    for i in 0..KEPT_VERSIONS as usize * 3 {
        let n = [10, 590, 600][i % 3];
        v = store.update("demo", &v.version, &sized(n)).await.unwrap();
        let text = fs::read_to_string(newest_version(store.dir(), "demo")).unwrap();
        let json = text.trim_end();
        assert!(text.ends_with('\n'), "{text:?}");
        let slack = text.len() - json.len() - 1;
        assert!(slack <= 256, "{slack} bytes of padding");
        match (n, slack) {
            (590, s) if s > 0 => padded += 1,
            (10, 0) => cut += 1,
            _ => {}
        }
        assert_eq!(store.get("demo").await.unwrap(), Some(v.clone()));
        let other = EmbeddedStore::open(store.dir()).unwrap();
        assert_eq!(other.get("demo").await.unwrap(), Some(v.clone()));
    }
    assert!(padded > 5 && cut > 5, "padded {padded}, cut {cut}");
}

#[test]
fn is_version_says_what_version_would() {
    let stored = StoredRecord {
        incarnation: "ab12".into(),
        counter: 42,
        write: String::new(),
        replaced: String::new(),
        durable: 0,
        record: record(Some("a"), 1),
    };
    assert_eq!(stored.version(), "ab12-42");
    for v in [
        "ab12-42", "ab12-042", "ab12-+42", "ab12-4", "ab12-420", "ab1-42", "ab12--42", "ab1242", "",
    ] {
        assert_eq!(stored.is_version(v), stored.version() == v, "{v}");
    }
}
