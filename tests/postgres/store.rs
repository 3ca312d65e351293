//! The postgres store against the server: its schema and migrations, a
//! role's missing privilege, TLS, a pooler in transaction mode.

use std::time::Duration;

use baton::store::LeaseRecord;
use futures::StreamExt;

use super::*;

#[test]
fn hosts_starting_together_migrate_once_and_record_the_version() {
    let t = PgTest::new("migrate");
    let stores: Vec<PostgresStore> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| t.store())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(stores.len(), 4);
    let versions = t.env.psql(&format!(
        "SELECT string_agg(version::text, ',') FROM {}.migrations",
        t.schema
    ));
    assert_eq!(versions, "1");
}

#[test]
fn a_role_that_cannot_create_the_schema_is_told_which_privilege_it_lacks() {
    let t = PgTest::new("limited");
    let e =
        t.rt.block_on(PostgresStore::connect(t.options_at(&t.env.limited_url), &|_| {
            None
        }))
        .expect_err("the limited role creates nothing");
    let text = e.to_string();
    assert!(
        text.contains("permission denied") && text.contains("GRANT CREATE ON DATABASE"),
        "{text}"
    );
    // Created by an administrator for the role, the schema serves it.
    t.env
        .psql(&format!("CREATE SCHEMA {} AUTHORIZATION baton_limited", t.schema));
    let store = t.store_at(&t.env.limited_url);
    let written =
        t.rt.block_on(store.create("demo", &LeaseRecord::new(Some("a"), 1, Duration::from_secs(4))))
            .expect("a create in its own schema");
    assert_eq!(written.record.term, 1);
}

#[test]
fn tls_checks_the_servers_certificate_against_the_ca() {
    let t = PgTest::new("tls");
    let url = format!("{}?sslmode=verify-full", t.env.url);
    let refused =
        t.rt.block_on(PostgresStore::connect(t.options_at(&url), &|_| None))
            .expect_err("not signed by a Web PKI root");
    assert!(refused.to_string().contains("connect"), "{refused}");
    let options = PostgresOptions {
        ca: Some(t.env.ca.clone()),
        ..t.options_at(&url)
    };
    t.rt.block_on(PostgresStore::connect(options, &|_| None))
        .expect("the test CA signed it");
}

#[test]
fn through_a_pooler_in_transaction_mode_changes_are_polled() {
    let t = PgTest::new("pooler");
    // Both through the pooler: its server connections change between
    // transactions, so no request may rely on a prepared statement.
    let writer = t.store_at(&t.env.pooler_url);
    let pooled = t.store_at(&t.env.pooler_url);
    t.rt.block_on(async {
        let mut watch = pooled.watch("demo").await.expect("watch");
        assert_eq!(watch.next().await.unwrap().unwrap(), None);
        let record = LeaseRecord::new(Some("a"), 1, Duration::from_secs(4));
        let written = writer.create("demo", &record).await.unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the change heard through the pooler")
            .unwrap()
            .unwrap();
        assert_eq!(seen, Some(written.clone()));
        // Renewals from many tasks at once, each a CAS through the pooler.
        let mut last = written;
        for round in 0..20 {
            let reads = futures::future::join_all((0..4).map(|_| writer.get("demo"))).await;
            for r in reads {
                assert_eq!(
                    r.unwrap().map(|v| v.version),
                    Some(last.version.clone()),
                    "round {round}"
                );
            }
            last = writer.update("demo", &last.version, &record).await.unwrap();
        }
    });
}

#[test]
fn a_bucket_writer_frozen_mid_transaction_does_not_keep_the_next_term_out() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use baton::store::buckets::{BucketName, BucketStore, Limits, Op, Write};

    let t = PgTest::new("frozen_writer");
    let bucket = BucketName::new("demo", "state");
    let writer = {
        let options = PostgresOptions {
            request_timeout: Duration::from_secs(1),
            ..t.options_at(&t.env.url)
        };
        t.rt.block_on(PostgresStore::connect(options, &|_| None)).unwrap()
    };
    let claimer = t.store();
    t.rt.block_on(writer.buckets().claim(&bucket, 1)).unwrap();
    // The writer's last check, inside its transaction with the bucket's
    // row locked, blocks its thread for 8 s: a frozen process.
    let woke = Arc::new(AtomicBool::new(false));
    let frozen = {
        let (buckets, bucket, woke) = (writer.buckets(), bucket.clone(), woke.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut write = Write::new(
                1,
                vec![Op::Set {
                    key: "k".into(),
                    value: b"v".to_vec(),
                }],
                Limits::default(),
            );
            write.may_commit = Arc::new(move || {
                std::thread::sleep(Duration::from_secs(8));
                woke.store(true, Ordering::SeqCst);
                true
            });
            rt.block_on(buckets.apply(&bucket, write))
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // The next term's claim gets the row once the server ended the
    // frozen writer's session, while it is still frozen.
    let before =
        t.rt.block_on(claimer.buckets().claim(&bucket, 2))
            .expect("claimed");
    assert_eq!(before, 1);
    assert!(
        !woke.load(Ordering::SeqCst),
        "the claim waited for the frozen writer to wake"
    );
    let written = frozen.join().unwrap();
    assert!(
        written.is_err(),
        "the frozen writer's transaction was ended: {written:?}"
    );
    let entry = t.rt.block_on(claimer.buckets().get(&bucket, "k")).unwrap();
    assert_eq!(entry, None);
}
