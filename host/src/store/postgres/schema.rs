//! The PostgreSQL store's schema and its versioned migrations, applied at
//! start-up in one transaction under an advisory lock (hosts starting
//! together migrate once), recorded in `<schema>.migrations`.
//!
//! - `leases`: one row per lease record (the record as JSON, its version,
//!   its term, its write counter and the timeline it was written on);
//! - `lease_meta`: what stays of a lease when its record is deleted: the
//!   *term floor* (raised by every write, never lowered), the create count,
//!   the write counter, the timeline of the last change;
//! - a trigger on `leases` keeps `lease_meta` and sends a notification
//!   (the row itself when it fits) on every change, whoever makes it;
//! - `lease_replace` and `lease_create`: the compare-and-swap writes, each
//!   one call (one round trip, one transaction);
//! - `buckets` and `entries`: the key-value buckets with their fences.
//!
//! Migrations only ever add: a host of an older baton keeps working on a
//! newer schema it knows no migration of (it checks the versions it
//! needs), and a host refuses a schema migrated past what it knows only if
//! a migration is marked incompatible (none so far).

use tokio_postgres::Client;

use super::connect::map_error;
use crate::store::{ANY_LEASE, StoreError};

/// How many terms one timeline may give out per lease: the terms a write
/// on timeline `t` starts are above `(t - 1) × TERMS_PER_TIMELINE` when
/// the lease's last write was on an older timeline (see `docs/postgres.md`).
pub const TERMS_PER_TIMELINE: u64 = 1_000_000_000;

/// One migration: its version, what it does, its SQL (`{s}`: the quoted
/// schema, `{channel}`: the notification channel).
struct Migration {
    version: i32,
    description: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "leases, lease_meta, the change trigger, the write functions, buckets",
    sql: r#"
CREATE TABLE {s}.lease_meta (
    name text PRIMARY KEY,
    floor bigint NOT NULL DEFAULT 0,
    creates bigint NOT NULL DEFAULT 0,
    seq bigint NOT NULL DEFAULT 0,
    timeline integer NOT NULL DEFAULT 1
);
CREATE TABLE {s}.leases (
    name text PRIMARY KEY,
    record text NOT NULL,
    version text NOT NULL,
    term bigint NOT NULL,
    seq bigint NOT NULL DEFAULT 0,
    timeline integer NOT NULL DEFAULT 1
);
-- The server's current timeline: 1 until the first promotion of a
-- standby, then one more with each.
CREATE FUNCTION {s}.timeline() RETURNS integer LANGUAGE sql VOLATILE AS $f$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$f$;
CREATE FUNCTION {s}.term_base(tl integer) RETURNS bigint LANGUAGE sql IMMUTABLE AS $f$
    SELECT (tl - 1)::bigint * 1000000000
$f$;
CREATE FUNCTION {s}.lease_changed() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE
    n text := CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END;
    tl integer := {s}.timeline();
    s bigint;
    payload text;
BEGIN
    INSERT INTO {s}.lease_meta AS m (name, floor, creates, seq, timeline)
        VALUES (n, CASE WHEN TG_OP = 'DELETE' THEN 0 ELSE NEW.term END,
                CASE WHEN TG_OP = 'INSERT' THEN 1 ELSE 0 END, 1, tl)
    ON CONFLICT (name) DO UPDATE SET
        floor = GREATEST(m.floor, EXCLUDED.floor),
        creates = m.creates + EXCLUDED.creates,
        seq = m.seq + 1,
        timeline = tl
    RETURNING m.seq INTO s;
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('{channel}', json_build_object('n', n, 's', s, 't', tl, 'd', true)::text);
        RETURN OLD;
    END IF;
    NEW.seq := s;
    NEW.timeline := tl;
    payload := json_build_object('n', n, 's', s, 't', tl, 'v', NEW.version, 'r', NEW.record)::text;
    IF octet_length(payload) >= 7900 THEN
        payload := json_build_object('n', n, 's', s, 't', tl)::text;
    END IF;
    PERFORM pg_notify('{channel}', payload);
    RETURN NEW;
END
$f$;
CREATE TRIGGER lease_changed BEFORE INSERT OR UPDATE OR DELETE ON {s}.leases
    FOR EACH ROW EXECUTE FUNCTION {s}.lease_changed();

-- Replaces version p_old of lease p_name: a renewal or release (term not
-- above the stored one) or a new term (the floor below it). p_promoted:
-- the caller read the record as written before a promotion to that
-- timeline. Outcome 'ok', or why not.
CREATE FUNCTION {s}.lease_replace(p_name text, p_old text, p_promoted integer,
        p_record text, p_term bigint, p_version text,
        OUT outcome text, OUT o_seq bigint, OUT o_tl integer, OUT o_floor bigint)
    LANGUAGE plpgsql AS $f$
DECLARE
    cur record;
    fl bigint;
BEGIN
    o_tl := {s}.timeline();
    SELECT l.term, l.timeline INTO cur FROM {s}.leases l
        WHERE l.name = p_name AND l.version = p_old FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'written over';
        RETURN;
    END IF;
    IF (p_promoted IS NULL AND cur.timeline <> o_tl)
        OR (p_promoted IS NOT NULL AND (p_promoted <> o_tl OR cur.timeline >= o_tl)) THEN
        outcome := 'promoted';
        RETURN;
    END IF;
    IF p_promoted IS NOT NULL AND p_term <= {s}.term_base(o_tl) THEN
        outcome := 'below the timeline';
        RETURN;
    END IF;
    SELECT m.floor INTO fl FROM {s}.lease_meta m WHERE m.name = p_name FOR UPDATE;
    o_floor := COALESCE(fl, 0);
    IF p_term > cur.term AND o_floor >= p_term THEN
        outcome := 'floor';
        RETURN;
    END IF;
    UPDATE {s}.leases SET record = p_record, version = p_version, term = p_term
        WHERE name = p_name RETURNING seq INTO o_seq;
    outcome := 'ok';
END
$f$;

-- Creates lease p_name's record if it is absent and its meta is as read:
-- absent (p_floor NULL), or at floor p_floor with p_creates creates; in a
-- term above the floor unless p_own (the holder writing its own deleted
-- record again), and above the timeline's base if the meta is of an older
-- timeline (or absent, after a promotion).
CREATE FUNCTION {s}.lease_create(p_name text, p_record text, p_term bigint, p_version text,
        p_floor bigint, p_creates bigint, p_own boolean,
        OUT outcome text, OUT o_seq bigint, OUT o_tl integer)
    LANGUAGE plpgsql AS $f$
DECLARE
    m record;
BEGIN
    o_tl := {s}.timeline();
    PERFORM 1 FROM {s}.leases WHERE name = p_name;
    IF FOUND THEN
        outcome := 'exists';
        RETURN;
    END IF;
    SELECT * INTO m FROM {s}.lease_meta WHERE name = p_name FOR UPDATE;
    IF FOUND <> (p_floor IS NOT NULL) OR (FOUND AND (m.floor <> p_floor OR m.creates <> p_creates)) THEN
        outcome := 'meta moved';
        RETURN;
    END IF;
    IF FOUND AND NOT p_own AND p_term <= m.floor THEN
        outcome := 'floor';
        RETURN;
    END IF;
    IF o_tl > 1 AND (NOT FOUND OR m.timeline < o_tl) AND p_term <= {s}.term_base(o_tl) THEN
        outcome := 'below the timeline';
        RETURN;
    END IF;
    INSERT INTO {s}.leases (name, record, version, term) VALUES (p_name, p_record, p_version, p_term)
        ON CONFLICT (name) DO NOTHING RETURNING seq INTO o_seq;
    outcome := CASE WHEN o_seq IS NULL THEN 'exists' ELSE 'ok' END;
END
$f$;

CREATE TABLE {s}.buckets (
    lease text NOT NULL,
    bucket text NOT NULL,
    fence bigint NOT NULL DEFAULT 0,
    revision bigint NOT NULL DEFAULT 0,
    size bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (lease, bucket)
);
CREATE TABLE {s}.entries (
    lease text NOT NULL,
    bucket text NOT NULL,
    key text NOT NULL,
    value bytea NOT NULL,
    version bigint NOT NULL,
    PRIMARY KEY (lease, bucket, key),
    FOREIGN KEY (lease, bucket) REFERENCES {s}.buckets (lease, bucket)
);
"#,
}];

/// The newest migration this baton knows.
pub const SCHEMA_VERSION: i32 = 1;

/// The notification channel of `schema`'s lease changes.
pub fn channel(schema: &str) -> String {
    format!("baton.{schema}.leases")
}

/// `schema` quoted as an SQL identifier.
pub fn quoted(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// Creates `schema` and applies the migrations it lacks, in one
/// transaction under an advisory lock of the schema's own.
pub(super) async fn migrate(client: &mut Client, schema: &str) -> Result<Vec<i32>, StoreError> {
    let s = quoted(schema);
    let fail = |what: &str, e: tokio_postgres::Error| privilege_error(schema, what, e);
    // Up to date already: nothing to lock or create, so that a role that
    // may only read and write the tables (and `baton status`) needs no
    // more.
    if let Ok(rows) = client
        .query(&format!("SELECT version FROM {s}.migrations"), &[])
        .await
    {
        let applied: Vec<i32> = rows.iter().map(|row| row.get(0)).collect();
        if MIGRATIONS.iter().all(|m| applied.contains(&m.version)) {
            return Ok(Vec::new());
        }
    }
    let tx = client
        .transaction()
        .await
        .map_err(|e| fail("begin the migration", e))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext($1))",
        &[&format!("baton.migrate.{schema}")],
    )
    .await
    .map_err(|e| fail("take the migration lock", e))?;
    let exists: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .map_err(|e| fail("look for the schema", e))?
        .get(0);
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA {s}"))
            .await
            .map_err(|e| fail(&format!("create the schema {s}"), e))?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {s}.migrations (version integer PRIMARY KEY, \
         description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
    ))
    .await
    .map_err(|e| fail(&format!("create the table {s}.migrations"), e))?;
    let applied: Vec<i32> = tx
        .query(
            &format!("SELECT version FROM {s}.migrations ORDER BY version"),
            &[],
        )
        .await
        .map_err(|e| fail("read the migrations applied", e))?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut done = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        let sql = m.sql.replace("{s}", &s).replace("{channel}", &channel(schema));
        tx.batch_execute(&sql)
            .await
            .map_err(|e| fail(&format!("apply migration {} ({})", m.version, m.description), e))?;
        tx.execute(
            &format!("INSERT INTO {s}.migrations (version, description) VALUES ($1, $2)"),
            &[&m.version, &m.description],
        )
        .await
        .map_err(|e| fail("record the migration", e))?;
        done.push(m.version);
    }
    tx.commit().await.map_err(|e| fail("commit the migration", e))?;
    Ok(done)
}

/// The store's error for a failed step of the migration: a missing
/// privilege named, with what to grant.
fn privilege_error(schema: &str, what: &str, e: tokio_postgres::Error) -> StoreError {
    let denied = e
        .code()
        .is_some_and(|c| *c == tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE);
    if !denied {
        return map_error(ANY_LEASE, what, e);
    }
    let detail = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_owned());
    StoreError::Refused {
        lease: ANY_LEASE.into(),
        detail: format!(
            "cannot {what}: {detail}. The role needs CREATE on the database to create the schema \
             {schema:?} (GRANT CREATE ON DATABASE <db> TO <role>), or an administrator creates it \
             for the role (CREATE SCHEMA {} AUTHORIZATION <role>)",
            quoted(schema)
        ),
    }
}
