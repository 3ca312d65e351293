//! Connecting to PostgreSQL: the connection settings (a URL, else the
//! libpq environment, and a password file), TLS through rustls, the pool,
//! and telling the store's errors from what the server says.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::PostgresOptions;
use crate::store::{ANY_LEASE, StoreError};

/// Whether TLS is used and how the server's certificate is checked
/// (libpq's `sslmode`): `prefer` and `require` encrypt without checking
/// the certificate, as libpq does; `verify-ca` checks it as `verify-full`
/// does (the chain and the name), which is stricter than libpq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tls {
    /// No TLS.
    Disable,
    /// TLS if the server offers it, the certificate unchecked.
    Prefer,
    /// TLS or nothing, the certificate unchecked.
    Require,
    /// TLS or nothing, the certificate checked against the CA.
    Verify,
}

/// Where to connect and how: the client's settings, TLS, the schema.
pub(super) struct Connector {
    pub(super) config: tokio_postgres::Config,
    pub(super) tls: MakeRustlsConnect,
    /// A description without the password, for logs.
    pub(super) describe: String,
}

/// The connection settings from `options` (through `env` for libpq's
/// variables), or why they cannot work.
pub(super) fn connector(
    options: &PostgresOptions,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Connector, StoreError> {
    let refused = |detail: String| StoreError::Refused {
        lease: ANY_LEASE.into(),
        detail,
    };
    let var = |name: &str| env(name).filter(|v| !v.is_empty());
    let (url, url_ssl, url_root) = split_tls_params(options.url.as_deref().unwrap_or(""));
    let mut config: tokio_postgres::Config = if url.is_empty() {
        tokio_postgres::Config::new()
    } else {
        url.parse()
            .map_err(|e| refused(format!("field `url`: not a PostgreSQL connection string: {e}")))?
    };
    fill_from_env(&mut config, url.is_empty(), &var)?;
    let sslmode = url_ssl
        .or_else(|| var("PGSSLMODE"))
        .unwrap_or_else(|| "prefer".into());
    let tls = match sslmode.as_str() {
        "disable" | "allow" => Tls::Disable,
        "prefer" => Tls::Prefer,
        "require" => Tls::Require,
        "verify-ca" | "verify-full" => Tls::Verify,
        other => {
            return Err(refused(format!(
                "sslmode {other:?}: use disable, prefer, require, verify-ca or verify-full"
            )));
        }
    };
    config.ssl_mode(match tls {
        Tls::Disable => SslMode::Disable,
        Tls::Prefer => SslMode::Prefer,
        Tls::Require | Tls::Verify => SslMode::Require,
    });
    let root = options
        .ca
        .clone()
        .or(url_root.map(PathBuf::from))
        .or_else(|| var("PGSSLROOTCERT").map(PathBuf::from));
    config.connect_timeout(options.connect_timeout);
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(5));
    config.keepalives_interval(Duration::from_secs(2));
    config.keepalives_retries(3);
    // A connection whose packets go unanswered (black-holed) breaks
    // rather than hanging the requests queued on it.
    config.tcp_user_timeout(options.request_timeout.max(Duration::from_secs(2)) * 2);
    let describe = describe(&config);
    Ok(Connector {
        tls: rustls_connector(root.as_deref(), tls == Tls::Verify)?,
        config,
        describe,
    })
}

/// Fills in what the URL left out from libpq's variables (read through
/// `var`); `whole`: there was no URL at all.
fn fill_from_env(
    config: &mut tokio_postgres::Config,
    whole: bool,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<(), StoreError> {
    let refused = |detail: String| StoreError::Refused {
        lease: ANY_LEASE.into(),
        detail,
    };
    if config.get_hosts().is_empty() {
        let hosts = var("PGHOST").unwrap_or_else(|| "localhost".into());
        for h in hosts.split(',') {
            if h.starts_with('/') {
                config.host_path(h);
            } else {
                config.host(h);
            }
        }
    }
    if config.get_ports().is_empty()
        && let Some(p) = var("PGPORT")
    {
        for port in p.split(',') {
            config.port(
                port.trim()
                    .parse()
                    .map_err(|_| refused(format!("PGPORT={p:?}: not a port")))?,
            );
        }
    }
    let user = config
        .get_user()
        .map(str::to_owned)
        .or_else(|| var("PGUSER"))
        .or_else(|| var("USER"))
        .ok_or_else(|| refused("no user: give it in `url` or PGUSER".into()))?;
    config.user(&user);
    if config.get_dbname().is_none() {
        config.dbname(var("PGDATABASE").unwrap_or_else(|| user.clone()));
    }
    if config.get_application_name().is_none() {
        config.application_name(var("PGAPPNAME").unwrap_or_else(|| "baton".into()));
    }
    if whole && let Some(t) = var("PGTARGETSESSIONATTRS") {
        config.target_session_attrs(match t.as_str() {
            "read-write" => tokio_postgres::config::TargetSessionAttrs::ReadWrite,
            "any" => tokio_postgres::config::TargetSessionAttrs::Any,
            other => {
                return Err(refused(format!(
                    "PGTARGETSESSIONATTRS={other:?}: use read-write or any"
                )));
            }
        });
    }
    if config.get_password().is_none() {
        if let Some(p) = var("PGPASSWORD") {
            config.password(p);
        } else if let Some(p) = password_from_file(config, &user, var("PGPASSFILE"), var("HOME"))? {
            config.password(p);
        }
    }
    Ok(())
}

/// The URL without `sslmode` and `sslrootcert` (tokio-postgres knows only
/// some of libpq's modes), and those two.
fn split_tls_params(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut ssl, mut root) = (None, None);
    if let Some((base, query)) = url.split_once('?') {
        let mut kept = Vec::new();
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some(("sslmode", v)) => ssl = Some(v.to_owned()),
                Some(("sslrootcert", v)) => root = Some(v.to_owned()),
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (url, ssl, root);
    }
    if !url.contains("://") {
        let mut kept = Vec::new();
        for word in url.split_whitespace() {
            match word.split_once('=') {
                Some(("sslmode", v)) => ssl = Some(v.to_owned()),
                Some(("sslrootcert", v)) => root = Some(v.to_owned()),
                _ => kept.push(word),
            }
        }
        return (kept.join(" "), ssl, root);
    }
    (url.to_owned(), ssl, root)
}

/// The hosts, ports, user and database, for logs (never the password).
fn describe(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            };
            let port = config
                .get_ports()
                .get(i)
                .or(config.get_ports().first())
                .copied()
                .unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    format!(
        "{}@{}/{}",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    )
}

/// The password for `user` in the password file (`PGPASSFILE`, else
/// `~/.pgpass`), libpq's format: `host:port:database:user:password`, `*`
/// matching anything, the first matching line winning.
fn password_from_file(
    config: &tokio_postgres::Config,
    user: &str,
    file: Option<String>,
    home: Option<String>,
) -> Result<Option<String>, StoreError> {
    let path = match (file, home) {
        (Some(f), _) => PathBuf::from(f),
        (None, Some(h)) => Path::new(&h).join(".pgpass"),
        (None, None) => return Ok(None),
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(_)) | None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let db = config.get_dbname().unwrap_or(user).to_owned();
    Ok(pgpass_lookup(&text, [&host, &port, &db, user]))
}

/// The password of the first line of `text` (a `.pgpass`) matching
/// `wanted` (host, port, database, user).
fn pgpass_lookup(text: &str, wanted: [&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_pgpass(line);
        if fields.len() != 5 {
            continue;
        }
        if fields[..4].iter().zip(wanted).all(|(f, w)| f == "*" || f == w) {
            return Some(fields[4].clone());
        }
    }
    None
}

/// A `.pgpass` line's fields: `:` separates, `\` escapes.
fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut().expect("one field").push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
}

/// A rustls connector trusting `root` (a PEM file of CA certificates), or
/// the Web PKI roots; without `verify`, one that takes any certificate.
fn rustls_connector(root: Option<&Path>, verify: bool) -> Result<MakeRustlsConnect, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    match root {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| StoreError::Refused {
                lease: ANY_LEASE.into(),
                detail: format!("cannot read the CA file {}: {e}", path.display()),
            })?;
            use rustls_pki_types::pem::PemObject;
            for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| StoreError::Refused {
                    lease: ANY_LEASE.into(),
                    detail: format!("the CA file {}: {e}", path.display()),
                })?;
                roots.add(cert).map_err(|e| StoreError::Refused {
                    lease: ANY_LEASE.into(),
                    detail: format!("the CA file {}: {e}", path.display()),
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Refused {
            lease: ANY_LEASE.into(),
            detail: format!("TLS: {e}"),
        })?;
    let config = if verify {
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
            .with_no_client_auth()
    };
    Ok(MakeRustlsConnect::new(config))
}

/// libpq's `sslmode=prefer` and `require`: the connection encrypted, the
/// server's certificate not checked (its handshake signatures are).
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A pool of at most `size` connections over `connector`, each warmed up
/// for the write functions of the schema `s` (quoted) when it opens.
pub(super) fn pool(connector: &Connector, size: usize, s: &str) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        connector.config.clone(),
        connector.tls.clone(),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    // A server session compiles a PL/pgSQL function and plans its
    // statements (and its trigger's) on their first run: 4 to 5 ms, which
    // a follower's first acquisition would pay in the middle of a
    // hand-over. Each new connection runs them once, on a lease name no
    // lease can have, and rolls back (no row, no notification). Best
    // effort: before the schema's first migration it fails, harmlessly.
    let n = "'~warm-up ' || pg_backend_pid()";
    let warm = format!(
        "BEGIN; SELECT {s}.lease_create({n}, '{{}}', 1, 'w1', NULL, 0, false); \
         SELECT {s}.lease_replace({n}, 'w1', NULL, '{{}}', 1, 'w2'); \
         SELECT {s}.lease_replace({n}, 'w2', NULL, '{{}}', 2, 'w3'); ROLLBACK"
    );
    let warm_up = deadpool_postgres::Hook::async_fn(move |client, _| {
        let warm = warm.clone();
        Box::pin(async move {
            if client.batch_execute(&warm).await.is_err() {
                let _ = client.batch_execute("ROLLBACK").await;
            }
            Ok(())
        })
    });
    Pool::builder(manager)
        .max_size(size.max(1))
        .post_create(warm_up)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::Refused {
            lease: ANY_LEASE.into(),
            detail: format!("the connection pool: {e}"),
        })
}

/// The store's error for the client's error `e` of `what` on `lease`:
/// denied privileges and failed authentication are refusals (retrying
/// will not fix them), anything else the connection or the server says
/// is unavailability.
pub fn map_error(lease: &str, what: &str, e: tokio_postgres::Error) -> StoreError {
    let lease = lease.to_owned();
    let detail = match e.as_db_error() {
        Some(db) => format!("{what}: {} ({})", db.message(), db.code().code()),
        None => format!("{what}: {e}"),
    };
    let refused = e.code().is_some_and(|c| {
        [
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_CATALOG_NAME,
            SqlState::UNDEFINED_FUNCTION,
            SqlState::UNDEFINED_TABLE,
        ]
        .contains(c)
    });
    if refused {
        StoreError::Refused { lease, detail }
    } else {
        StoreError::Unavailable { lease, detail }
    }
}

/// The store's error for a pool's failure to hand out a connection.
pub(super) fn pool_error(lease: &str, what: &str, e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => map_error(lease, what, e),
        other => StoreError::Unavailable {
            lease: lease.to_owned(),
            detail: format!("{what}: {other}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines_match_by_field_with_wildcards_and_escapes() {
        let text = "# comment\nother:5432:*:baton:no\n*:5432:*:baton:pa\\:ss\n";
        assert_eq!(
            pgpass_lookup(text, ["db", "5432", "baton", "baton"]).as_deref(),
            Some("pa:ss")
        );
        assert_eq!(pgpass_lookup(text, ["db", "5433", "baton", "baton"]), None);
    }

    #[test]
    fn tls_parameters_leave_the_url_for_the_client() {
        let (url, ssl, root) = split_tls_params(
            "postgres://u@h:1/db?sslmode=verify-full&application_name=x&sslrootcert=/ca.pem",
        );
        assert_eq!(url, "postgres://u@h:1/db?application_name=x");
        assert_eq!(
            (ssl.as_deref(), root.as_deref()),
            (Some("verify-full"), Some("/ca.pem"))
        );
    }

    #[test]
    fn settings_come_from_the_environment_when_the_url_leaves_them_out() {
        let options = PostgresOptions::for_tests(None);
        let env = |name: &str| match name {
            "PGHOST" => Some("db.example,db2.example".to_owned()),
            "PGPORT" => Some("6432".to_owned()),
            "PGUSER" => Some("svc".to_owned()),
            "PGPASSWORD" => Some("secret".to_owned()),
            "PGSSLMODE" => Some("disable".to_owned()),
            _ => None,
        };
        let c = connector(&options, &env).expect("settings");
        assert_eq!(c.describe, "svc@db.example:6432,db2.example:6432/svc");
        assert_eq!(c.config.get_password(), Some(&b"secret"[..]));
        assert!(!c.describe.contains("secret"));
        let bad = |name: &str| match name {
            "PGSSLMODE" => Some("sometimes".to_owned()),
            "PGUSER" => Some("svc".to_owned()),
            _ => None,
        };
        let e = connector(&options, &bad).err().expect("refused").to_string();
        assert!(e.contains("sslmode \"sometimes\""), "{e}");
    }
}
