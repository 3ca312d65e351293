//! The `BucketStore` contract, written once: one public function per rule
//! that the trait and its module documentation (`baton::store::buckets`)
//! promise, run against every backend. `tests/core` runs it on the memory
//! and embedded stores, `tests/kube` on the Kubernetes store (each rule in a
//! namespace of its own); both include this file with `#[path]` and name
//! each rule through [`for_each_bucket_rule!`], so a rule added here runs
//! everywhere.
//!
//! Each rule takes `open`, which returns another handle on one and the same
//! empty store at each call: another process's view (a second SQLite
//! connection, a second Kubernetes client). A rule asserts only what every
//! backend promises; how one stores a bucket stays in its own tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use baton::store::buckets::{BucketError, BucketInfo, BucketName, BucketStore, Entry, Limits, Op, Write};

/// Calls `$runner!(rule)` for every rule of the contract.
macro_rules! for_each_bucket_rule {
    ($runner:ident) => {
        $runner!(claim_raises_the_fence_and_returns_the_old_one);
        $runner!(an_older_term_is_fenced_whatever_happened_in_between);
        $runner!(a_write_raises_the_fence);
        $runner!(claims_in_the_same_term_are_idempotent);
        $runner!(a_batch_is_all_or_nothing);
        $runner!(swap_compares_versions_and_a_rewrite_changes_the_version);
        $runner!(increments_are_decimal_and_overflow_is_an_error);
        $runner!(limits_refuse_with_an_error_naming_the_bucket);
        $runner!(a_writer_that_may_not_commit_is_stopped_and_writes_nothing);
        $runner!(list_keys_pages_in_byte_order);
        $runner!(buckets_lists_fence_entries_and_bytes);
        $runner!(buckets_of_one_name_under_two_leases_are_apart);
        $runner!(concurrent_increments_of_one_term_are_all_counted_once);
    };
}
pub(crate) use for_each_bucket_rule;

/// A handle on the store under test.
pub type Handle = Arc<dyn BucketStore>;

fn demo() -> BucketName {
    BucketName::new("demo", "counter")
}

fn set(key: &str, value: &str) -> Op {
    Op::Set {
        key: key.into(),
        value: value.as_bytes().to_vec(),
    }
}

fn incr(key: &str, delta: i64) -> Op {
    Op::Increment {
        key: key.into(),
        delta,
    }
}

fn swap(key: &str, version: u64, value: &str) -> Op {
    Op::Swap {
        key: key.into(),
        version,
        value: value.as_bytes().to_vec(),
    }
}

async fn apply(store: &Handle, b: &BucketName, term: u64, ops: Vec<Op>) -> Result<Vec<i64>, BucketError> {
    store.apply(b, Write::new(term, ops, Limits::default())).await
}

async fn value(store: &Handle, b: &BucketName, key: &str) -> Option<String> {
    let entry = store.get(b, key).await.unwrap();
    entry.map(|e| String::from_utf8(e.value).unwrap())
}

async fn entry(store: &Handle, b: &BucketName, key: &str) -> Entry {
    store
        .get(b, key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no key {key:?} in {b}"))
}

/// The bucket as `buckets(Some(lease))` lists it.
async fn info(store: &Handle, b: &BucketName) -> BucketInfo {
    let all = store.buckets(Some(&b.lease)).await.unwrap();
    all.into_iter()
        .find(|i| &i.name == b)
        .unwrap_or_else(|| panic!("{b} is not listed"))
}

/// Asserts that `e` is a refusal by the fence `fence` of a write or claim
/// of `term` to `b`.
fn assert_fenced(e: &BucketError, b: &BucketName, term: u64, fence: u64) {
    assert!(e.is_stale(), "{e}");
    let expected = BucketError::Fenced {
        bucket: b.clone(),
        term,
        fence,
    };
    assert_eq!(e, &expected, "{e}");
}

/// A claim raises the fence to its term and returns the fence before; every
/// handle then sees the new fence.
pub async fn claim_raises_the_fence_and_returns_the_old_one(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    assert_eq!(a.claim(&demo(), 3).await.unwrap(), 0, "a new bucket's fence is 0");
    assert_eq!(info(&b, &demo()).await.fence, 3);
    assert_eq!(b.claim(&demo(), 5).await.unwrap(), 3);
    assert_eq!(a.claim(&demo(), 9).await.unwrap(), 5, "a skipped term is no gap");
    assert_eq!(info(&open(), &demo()).await.fence, 9);
}

/// A claim or a write of a term older than the fence is `Fenced`, from any
/// handle, whatever was written, deleted or claimed since: nothing of it
/// lands.
pub async fn an_older_term_is_fenced_whatever_happened_in_between(open: impl Fn() -> Handle) {
    let (old, new) = (open(), open());
    let b = demo();
    old.claim(&b, 4).await.unwrap();
    apply(&old, &b, 4, vec![set("k", "four")]).await.unwrap();
    new.claim(&b, 5).await.unwrap();
    for store in [&old, &new, &open()] {
        assert_fenced(&store.claim(&b, 4).await.unwrap_err(), &b, 4, 5);
        let e = apply(store, &b, 4, vec![set("k", "stale")]).await.unwrap_err();
        assert_fenced(&e, &b, 4, 5);
    }
    // The newer term writes, deletes everything, writes again: the bucket
    // may be empty, its fence stays.
    apply(&new, &b, 5, vec![set("k", "five")]).await.unwrap();
    apply(&new, &b, 5, vec![Op::Delete { key: "k".into() }])
        .await
        .unwrap();
    assert_eq!(info(&new, &b).await.entries, 0);
    for term in [1, 3, 4] {
        let e = apply(&open(), &b, term, vec![set("k", "stale")])
            .await
            .unwrap_err();
        assert_fenced(&e, &b, term, 5);
    }
    // A third term claims; the second is now as stale as the first.
    open().claim(&b, 6).await.unwrap();
    let e = apply(&new, &b, 5, vec![set("late", "five")]).await.unwrap_err();
    assert_fenced(&e, &b, 5, 6);
    assert_fenced(&new.claim(&b, 5).await.unwrap_err(), &b, 5, 6);
    assert_eq!(value(&old, &b, "k").await, None, "no stale write landed");
    assert_eq!(value(&old, &b, "late").await, None, "no stale write landed");
    assert_eq!(info(&old, &b).await.fence, 6);
}

/// A write of a newer term than the fence (no claim before it) lands and
/// raises the fence: older terms are refused from then on, the same term is
/// not.
pub async fn a_write_raises_the_fence(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let n = demo();
    apply(&a, &n, 3, vec![set("k", "3")]).await.unwrap();
    assert_eq!(info(&b, &n).await.fence, 3);
    assert_fenced(&b.claim(&n, 2).await.unwrap_err(), &n, 2, 3);
    assert_fenced(
        &apply(&b, &n, 2, vec![set("k", "2")]).await.unwrap_err(),
        &n,
        2,
        3,
    );
    apply(&b, &n, 3, vec![set("k", "3 again")]).await.unwrap();
    apply(&b, &n, 7, vec![set("k", "7")]).await.unwrap();
    assert_eq!(info(&a, &n).await.fence, 7);
    assert_fenced(
        &apply(&a, &n, 3, vec![set("k", "3")]).await.unwrap_err(),
        &n,
        3,
        7,
    );
    assert_eq!(
        a.claim(&n, 8).await.unwrap(),
        7,
        "the claim sees the write's fence"
    );
    assert_eq!(value(&a, &n, "k").await.as_deref(), Some("7"));
}

/// Claiming again in the term that holds the fence changes nothing: it
/// returns that term, and entries and their versions stay as they were.
pub async fn claims_in_the_same_term_are_idempotent(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let n = demo();
    assert_eq!(a.claim(&n, 3).await.unwrap(), 0);
    assert_eq!(a.claim(&n, 3).await.unwrap(), 3);
    apply(&a, &n, 3, vec![set("k", "v")]).await.unwrap();
    let before = entry(&a, &n, "k").await;
    for store in [&a, &b] {
        assert_eq!(store.claim(&n, 3).await.unwrap(), 3);
    }
    assert_eq!(entry(&b, &n, "k").await, before);
    assert_eq!(info(&b, &n).await.fence, 3);
    // A compare-and-swap that read before the claims still succeeds.
    apply(&b, &n, 3, vec![swap("k", before.version, "w")])
        .await
        .unwrap();
    assert_eq!(value(&a, &n, "k").await.as_deref(), Some("w"));
}

/// A batch lands whole or not at all: a failing op anywhere in it (a stale
/// swap, a value over the limit, an increment of a non-integer) leaves no
/// trace of the others, not even a raised fence.
pub async fn a_batch_is_all_or_nothing(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let n = demo();
    apply(&a, &n, 5, vec![set("a", "0"), set("text", "x")])
        .await
        .unwrap();
    let a0 = entry(&a, &n, "a").await;
    apply(&a, &n, 5, vec![set("a", "1")]).await.unwrap();
    let a1 = entry(&a, &n, "a").await;
    let limits = Limits {
        key: 16,
        value: 8,
        bucket: 1 << 20,
    };
    let failing: Vec<(&str, Vec<Op>, Limits)> = vec![
        (
            "a stale swap last",
            vec![
                set("b", "2"),
                incr("a", 1),
                Op::Delete { key: "text".into() },
                swap("a", a0.version, "9"),
            ],
            Limits::default(),
        ),
        (
            "a stale swap first",
            vec![swap("a", a1.version + 100, "9"), set("b", "2")],
            Limits::default(),
        ),
        (
            "a value too long",
            vec![set("b", "2"), incr("a", 1), set("c", "123456789")],
            limits,
        ),
        (
            "a key too long",
            vec![set("b", "2"), set("a-key-of-17-bytes", "v")],
            limits,
        ),
        (
            "a non-integer increment",
            vec![set("b", "2"), incr("a", 1), incr("text", 1)],
            Limits::default(),
        ),
    ];
    for (what, ops, limits) in failing {
        let e = b.apply(&n, Write::new(9, ops, limits)).await.unwrap_err();
        assert!(!e.is_stale(), "{what}: {e}");
        for store in [&a, &b] {
            assert_eq!(entry(store, &n, "a").await, a1, "{what}: a changed");
            assert_eq!(value(store, &n, "b").await, None, "{what}: b was written");
            assert_eq!(value(store, &n, "c").await, None, "{what}: c was written");
            assert_eq!(
                value(store, &n, "text").await.as_deref(),
                Some("x"),
                "{what}: text changed"
            );
        }
        let listed = info(&a, &n).await;
        assert_eq!((listed.fence, listed.entries), (5, 2), "{what}: {listed:?}");
    }
    // The batch that does not fail lands whole, in one version.
    let done = apply(
        &b,
        &n,
        9,
        vec![
            set("b", "2"),
            incr("a", 1),
            swap("text", entry(&a, &n, "text").await.version, "y"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(done, vec![2]);
    for (key, want) in [("a", "2"), ("b", "2"), ("text", "y")] {
        assert_eq!(value(&a, &n, key).await.as_deref(), Some(want), "{key}");
    }
    assert!(entry(&a, &n, "a").await.version > a1.version);
    assert_eq!(info(&a, &n).await.fence, 9);
}

/// Compare-and-swap: version 0 means absent; a swap against the version
/// read lands and gives a new version; a stale version is `Changed`, also
/// once the key was deleted and written again with the same value.
pub async fn swap_compares_versions_and_a_rewrite_changes_the_version(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let n = demo();
    a.claim(&n, 1).await.unwrap();
    apply(&a, &n, 1, vec![swap("k", 0, "first")]).await.unwrap();
    let changed = |e: BucketError| {
        assert!(
            matches!(&e, BucketError::Changed { key, .. } if key == "k"),
            "{e}"
        )
    };
    changed(apply(&b, &n, 1, vec![swap("k", 0, "again")]).await.unwrap_err());
    let v1 = entry(&b, &n, "k").await;
    assert!(v1.version > 0, "{v1:?}");
    apply(&b, &n, 1, vec![swap("k", v1.version, "second")])
        .await
        .unwrap();
    let v2 = entry(&a, &n, "k").await;
    assert!(v2.version > v1.version, "{v1:?} then {v2:?}");
    changed(
        apply(&a, &n, 1, vec![swap("k", v1.version, "late")])
            .await
            .unwrap_err(),
    );
    // Deleted and written again with the very same value: a new version.
    apply(&a, &n, 1, vec![Op::Delete { key: "k".into() }])
        .await
        .unwrap();
    assert_eq!(b.get(&n, "k").await.unwrap(), None);
    changed(
        apply(&b, &n, 1, vec![swap("k", v2.version, "late")])
            .await
            .unwrap_err(),
    );
    apply(&a, &n, 1, vec![set("k", "second")]).await.unwrap();
    let v3 = entry(&b, &n, "k").await;
    assert_eq!(v3.value, v2.value);
    assert!(v3.version > v2.version, "{v2:?} then {v3:?}");
    changed(
        apply(&b, &n, 1, vec![swap("k", v2.version, "late")])
            .await
            .unwrap_err(),
    );
    changed(apply(&b, &n, 1, vec![swap("k", 0, "late")]).await.unwrap_err());
    // A write to another key moves no version of this one.
    apply(&a, &n, 1, vec![set("other", "x")]).await.unwrap();
    apply(&b, &n, 1, vec![swap("k", v3.version, "third")])
        .await
        .unwrap();
    assert_eq!(value(&a, &n, "k").await.as_deref(), Some("third"));
}

/// Increments store decimal ASCII, start from 0, return each new value in
/// order; a value that is not a decimal integer, or an overflow, is an
/// error that changes nothing.
pub async fn increments_are_decimal_and_overflow_is_an_error(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let n = demo();
    assert_eq!(apply(&a, &n, 1, vec![incr("n", 5)]).await.unwrap(), vec![5]);
    assert_eq!(value(&b, &n, "n").await.as_deref(), Some("5"));
    assert_eq!(
        apply(&b, &n, 1, vec![incr("n", -7), incr("m", 2), incr("n", 1)])
            .await
            .unwrap(),
        vec![-2, 2, -1]
    );
    assert_eq!(value(&a, &n, "n").await.as_deref(), Some("-1"));
    apply(&a, &n, 1, vec![set("n", "41")]).await.unwrap();
    assert_eq!(apply(&b, &n, 1, vec![incr("n", 1)]).await.unwrap(), vec![42]);
    assert_eq!(value(&a, &n, "n").await.as_deref(), Some("42"));
    let not_integer = |e: BucketError, key: &str| {
        assert!(
            matches!(&e, BucketError::NotAnInteger { key: k, .. } if k == key),
            "{e}"
        );
        assert!(e.to_string().contains(&n.to_string()), "{e}");
    };
    apply(
        &a,
        &n,
        1,
        vec![set("text", "forty"), set("max", &i64::MAX.to_string())],
    )
    .await
    .unwrap();
    not_integer(apply(&b, &n, 1, vec![incr("text", 1)]).await.unwrap_err(), "text");
    not_integer(apply(&b, &n, 1, vec![incr("max", 1)]).await.unwrap_err(), "max");
    apply(&a, &n, 1, vec![set("min", &i64::MIN.to_string())])
        .await
        .unwrap();
    not_integer(apply(&b, &n, 1, vec![incr("min", -1)]).await.unwrap_err(), "min");
    assert_eq!(value(&a, &n, "text").await.as_deref(), Some("forty"));
    assert_eq!(value(&a, &n, "max").await, Some(i64::MAX.to_string()));
    assert_eq!(value(&a, &n, "min").await, Some(i64::MIN.to_string()));
    assert_eq!(
        apply(&a, &n, 1, vec![incr("max", -1)]).await.unwrap(),
        vec![i64::MAX - 1]
    );
}

/// Limits on a key, a value and the bucket's size: at the limit a write
/// lands; past it, `Limit` naming the bucket, and nothing is written.
pub async fn limits_refuse_with_an_error_naming_the_bucket(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let n = demo();
    let limits = Limits {
        key: 8,
        value: 16,
        bucket: 60,
    };
    let write = |ops: Vec<Op>| Write::new(1, ops, limits);
    let refused = |e: BucketError, what: &str| {
        assert!(
            matches!(&e, BucketError::Limit { bucket, .. } if bucket == &n),
            "{what}: {e}"
        );
        assert!(e.to_string().contains("demo/counter"), "{what}: {e}");
    };
    a.apply(&n, write(vec![set("8-bytes!", "a value, 16 byte")]))
        .await
        .unwrap();
    refused(
        b.apply(&n, write(vec![set("9-bytes!!", "v")])).await.unwrap_err(),
        "key",
    );
    refused(
        b.apply(&n, write(vec![set("k", "a value of 17 byt")]))
            .await
            .unwrap_err(),
        "value",
    );
    refused(
        b.apply(&n, write(vec![swap("k", 0, "a value of 17 byt")]))
            .await
            .unwrap_err(),
        "swapped value",
    );
    // 24 bytes so far; 36 more is the limit, and 2 more are over it.
    a.apply(
        &n,
        write(vec![set("k1", "0123456789abcdef"), set("k2", "0123456789abcdef")]),
    )
    .await
    .unwrap();
    assert_eq!(info(&b, &n).await.bytes, 60);
    refused(
        b.apply(&n, write(vec![set("k3", "")])).await.unwrap_err(),
        "bucket",
    );
    // A value replaced by one as long counts the difference only: none.
    b.apply(&n, write(vec![set("k1", "fedcba9876543210")]))
        .await
        .unwrap();
    b.apply(&n, write(vec![Op::Delete { key: "k2".into() }, set("k3", "x")]))
        .await
        .unwrap();
    assert_eq!(info(&a, &n).await.bytes, 24 + 18 + 3);
    assert_eq!(value(&a, &n, "9-bytes!!").await, None);
    assert_eq!(value(&a, &n, "k").await, None);
    assert_eq!(value(&a, &n, "k1").await.as_deref(), Some("fedcba9876543210"));
    assert_eq!(info(&a, &n).await.entries, 3);
}

/// A writer whose last check says it may not commit (its term past its
/// force-stop time) is refused with `Stopped`, and nothing of the write
/// lands, not even the fence; a write that the fence refuses first is
/// `Fenced`.
pub async fn a_writer_that_may_not_commit_is_stopped_and_writes_nothing(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let n = demo();
    a.claim(&n, 2).await.unwrap();
    apply(&a, &n, 2, vec![set("k", "2")]).await.unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let stopped = |term: u64, ops: Vec<Op>| {
        let asked = asked.clone();
        Write {
            may_commit: Arc::new(move || {
                asked.fetch_add(1, Ordering::SeqCst);
                false
            }),
            ..Write::new(term, ops, Limits::default())
        }
    };
    for (term, ops) in [
        (2, vec![set("k", "late")]),
        (3, vec![set("k", "late"), incr("n", 1)]),
    ] {
        let e = b.apply(&n, stopped(term, ops)).await.unwrap_err();
        assert!(e.is_stale(), "{e}");
        assert_eq!(
            e,
            BucketError::Stopped {
                bucket: n.clone(),
                term
            },
            "{e}"
        );
    }
    assert!(asked.load(Ordering::SeqCst) >= 2, "the last check was made");
    assert_eq!(value(&a, &n, "k").await.as_deref(), Some("2"));
    assert_eq!(value(&a, &n, "n").await, None);
    assert_eq!(info(&a, &n).await.fence, 2, "a stopped write raises no fence");
    let e = b
        .apply(&n, stopped(1, vec![set("k", "older")]))
        .await
        .unwrap_err();
    assert_fenced(&e, &n, 1, 2);
    assert_eq!(a.claim(&n, 3).await.unwrap(), 2);
}

/// `list_keys` returns keys in byte order, at most `limit`, from after
/// `after` (which need not exist); paging through it yields every key once.
pub async fn list_keys_pages_in_byte_order(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let n = demo();
    assert!(
        b.list_keys(&n, None, 10).await.unwrap().is_empty(),
        "a missing bucket has no keys"
    );
    let keys = ["b", "a", "B", "10", "9", "a/1", "ä", "a0", "-", "zz", "Z", "a b"];
    apply(&a, &n, 1, keys.iter().map(|k| set(k, "v")).collect())
        .await
        .unwrap();
    let mut sorted: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    sorted.sort_by(|x, y| x.as_bytes().cmp(y.as_bytes()));
    assert_eq!(b.list_keys(&n, None, 100).await.unwrap(), sorted);
    for limit in [1, 3, 5] {
        let mut paged: Vec<String> = Vec::new();
        loop {
            let page = b
                .list_keys(&n, paged.last().map(String::as_str), limit)
                .await
                .unwrap();
            assert!(page.len() <= limit, "{page:?}");
            let done = page.len() < limit;
            paged.extend(page);
            if done {
                break;
            }
        }
        assert_eq!(paged, sorted, "pages of {limit}");
    }
    let after_a: Vec<String> = sorted
        .iter()
        .filter(|k| k.as_bytes() > b"a0".as_slice())
        .cloned()
        .collect();
    assert_eq!(b.list_keys(&n, Some("a0"), 100).await.unwrap(), after_a);
    let after_missing: Vec<String> = sorted
        .iter()
        .filter(|k| k.as_bytes() > b"a00".as_slice())
        .cloned()
        .collect();
    assert_eq!(b.list_keys(&n, Some("a00"), 100).await.unwrap(), after_missing);
    assert!(b.list_keys(&n, Some("ä"), 100).await.unwrap().is_empty());
    assert!(b.list_keys(&n, None, 0).await.unwrap().is_empty());
}

/// `buckets` lists every bucket (claimed or written) with its fence, its
/// entries and its bytes (keys plus values), or a lease's only.
pub async fn buckets_lists_fence_entries_and_bytes(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let (p, q, other) = (
        BucketName::new("jobs", "p"),
        BucketName::new("jobs", "q"),
        BucketName::new("sync", "p"),
    );
    a.claim(&q, 4).await.unwrap();
    apply(&a, &p, 2, vec![set("key", "value"), set("n", "")])
        .await
        .unwrap();
    apply(&b, &other, 7, vec![set("cursor", "0123456789")])
        .await
        .unwrap();
    let listed = |bucket: &BucketName, fence, entries, bytes| BucketInfo {
        name: bucket.clone(),
        fence,
        entries,
        bytes,
    };
    let mut all = open().buckets(None).await.unwrap();
    all.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(
        all,
        vec![
            listed(&p, 2, 2, 8 + 1),
            listed(&q, 4, 0, 0),
            listed(&other, 7, 1, 16)
        ]
    );
    let mut jobs = b.buckets(Some("jobs")).await.unwrap();
    jobs.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(jobs, vec![listed(&p, 2, 2, 9), listed(&q, 4, 0, 0)]);
    assert!(b.buckets(Some("none")).await.unwrap().is_empty());
    apply(&b, &p, 3, vec![Op::Delete { key: "key".into() }, set("n", "12")])
        .await
        .unwrap();
    assert_eq!(info(&a, &p).await, listed(&p, 3, 1, 3));
}

/// A bucket is its lease's: one of the same name under another lease has
/// its own fence, keys and versions.
pub async fn buckets_of_one_name_under_two_leases_are_apart(open: impl Fn() -> Handle) {
    let (a, b) = (open(), open());
    let (x, y) = (BucketName::new("lease-x", "p"), BucketName::new("lease-y", "p"));
    a.claim(&x, 9).await.unwrap();
    apply(&a, &x, 9, vec![set("k", "x"), set("only-x", "1")])
        .await
        .unwrap();
    assert_eq!(
        b.claim(&y, 1).await.unwrap(),
        0,
        "another lease's fence is not this one's"
    );
    apply(&b, &y, 1, vec![swap("k", 0, "y")]).await.unwrap();
    assert_eq!(value(&a, &x, "k").await.as_deref(), Some("x"));
    assert_eq!(value(&a, &y, "k").await.as_deref(), Some("y"));
    assert_eq!(value(&a, &y, "only-x").await, None);
    assert_eq!(b.list_keys(&y, None, 10).await.unwrap(), vec!["k".to_owned()]);
    assert_eq!((info(&a, &x).await.fence, info(&a, &y).await.fence), (9, 1));
    apply(&a, &x, 9, vec![Op::Delete { key: "k".into() }])
        .await
        .unwrap();
    assert_eq!(value(&b, &y, "k").await.as_deref(), Some("y"));
}

/// Writers of one term on two handles increment one key at once: every
/// increment that succeeded is counted exactly once, none that failed is.
pub async fn concurrent_increments_of_one_term_are_all_counted_once(open: impl Fn() -> Handle) {
    const WRITERS: usize = 4;
    const EACH: usize = 12;
    let handles = [open(), open()];
    let n = demo();
    handles[0].claim(&n, 3).await.unwrap();
    let writers = (0..WRITERS).map(|w| {
        let store = handles[w % 2].clone();
        let n = n.clone();
        async move {
            let mut seen = Vec::new();
            let mut failed = Vec::new();
            for _ in 0..EACH {
                match apply(&store, &n, 3, vec![incr("n", 1)]).await {
                    Ok(values) => seen.extend(values),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (seen, failed)
        }
    });
    let results = futures::future::join_all(writers).await;
    let mut seen: Vec<i64> = results.iter().flat_map(|(s, _)| s.clone()).collect();
    let failed: Vec<&String> = results.iter().flat_map(|(_, f)| f).collect();
    seen.sort_unstable();
    let ok = seen.len() as i64;
    println!(
        "{} increments on two handles: {ok} succeeded, failures: {failed:?}",
        WRITERS * EACH
    );
    assert!(ok >= EACH as i64, "most increments succeed: {failed:?}");
    assert_eq!(
        seen,
        (1..=ok).collect::<Vec<_>>(),
        "each value once, none skipped"
    );
    assert_eq!(value(&open(), &n, "n").await, Some(ok.to_string()));
}
