//! `[store] kind = "postgres"`: the fields' checks, and the store's
//! options with what the file leaves out taken from libpq's variables when
//! the store is opened (never into [`Config`](super::Config), so that a
//! reload compares the file alone).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::PostgresConfig;
use crate::store::postgres::{DEFAULT_SCHEMA, PostgresOptions, WatchMode};

/// The pool's size unless configured.
const DEFAULT_POOL_SIZE: usize = 4;

/// The bounds unless configured.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The `[store]` fields of a PostgreSQL store as written.
pub(super) struct RawFields {
    pub url: Option<String>,
    pub url_file: Option<PathBuf>,
    pub schema: Option<String>,
    pub ca: Option<PathBuf>,
    pub pool_size: Option<usize>,
    pub connect_timeout: Option<Duration>,
    pub request_timeout: Option<Duration>,
    pub watch: Option<String>,
    pub poll_interval: Option<Duration>,
}

/// The checked settings, paths resolved by `resolve`; or why not, naming
/// the field.
pub(super) fn parse(raw: RawFields, resolve: impl Fn(&Path) -> PathBuf) -> Result<PostgresConfig, String> {
    if raw.url.is_some() && raw.url_file.is_some() {
        return Err("fields `url` and `url-file`: give one of them".into());
    }
    if let Some(url) = &raw.url
        && !(url.starts_with("postgres://") || url.starts_with("postgresql://") || url.contains('='))
    {
        return Err(format!(
            "field `url`: {:?} is neither a postgres:// URL nor a key=value connection string",
            redact(url)
        ));
    }
    let schema = raw.schema.unwrap_or_else(|| DEFAULT_SCHEMA.into());
    crate::store::postgres::validate_schema(&schema).map_err(|e| match e {
        crate::store::StoreError::Refused { detail, .. } => detail,
        other => other.to_string(),
    })?;
    let pool_size = raw.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
    if !(1..=64).contains(&pool_size) {
        return Err(format!("field `pool-size`: {pool_size} is not between 1 and 64"));
    }
    for (field, d) in [
        ("connect-timeout", raw.connect_timeout),
        ("request-timeout", raw.request_timeout),
        ("poll-interval", raw.poll_interval),
    ] {
        if d.is_some_and(|d| d.is_zero()) {
            return Err(format!("field `{field}`: must be above zero"));
        }
    }
    let watch = match raw.watch.as_deref() {
        None | Some("notify") => WatchMode::Notify,
        Some("poll") => WatchMode::Poll,
        Some(other) => return Err(format!("field `watch`: {other:?} is not \"notify\" or \"poll\"")),
    };
    Ok(PostgresConfig {
        url: raw.url,
        url_file: raw.url_file.map(|p| resolve(&p)),
        schema,
        ca: raw.ca.map(|p| resolve(&p)),
        pool_size,
        connect_timeout: raw.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        request_timeout: raw.request_timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT),
        watch,
        poll_interval: raw.poll_interval.unwrap_or(DEFAULT_POLL_INTERVAL),
    })
}

impl super::parse::Source<'_> {
    /// `[store] kind = "postgres"`.
    pub(super) fn postgres_store(
        &self,
        raw: super::RawStore,
    ) -> Result<super::StoreConfig, super::ConfigError> {
        let super::RawStore::Postgres {
            url,
            url_file,
            schema,
            ca,
            pool_size,
            connect_timeout,
            request_timeout,
            watch,
            poll_interval,
        } = raw
        else {
            unreachable!("called for a postgres store")
        };
        let raw = RawFields {
            url,
            url_file,
            schema,
            ca,
            pool_size,
            connect_timeout,
            request_timeout,
            watch,
            poll_interval,
        };
        parse(raw, |p| self.resolve(p))
            .map(super::StoreConfig::Postgres)
            .map_err(|why| self.err(super::ConfigErrorKind::Postgres(why)))
    }
}

/// `url` with its password replaced, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

impl PostgresConfig {
    /// The store's options: the URL (or the file's), the rest as
    /// configured; libpq's variables fill in what the URL leaves out when
    /// the store connects.
    pub fn options(&self) -> Result<PostgresOptions, String> {
        let url = match (&self.url, &self.url_file) {
            (Some(url), _) => Some(url.clone()),
            (None, Some(file)) => Some(
                std::fs::read_to_string(file)
                    .map_err(|e| format!("field `url-file`: cannot read {}: {e}", file.display()))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        Ok(PostgresOptions {
            url,
            schema: self.schema.clone(),
            ca: self.ca.clone(),
            pool_size: self.pool_size,
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            watch: self.watch,
            poll_interval: self.poll_interval,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawFields {
        RawFields {
            url: None,
            url_file: None,
            schema: None,
            ca: None,
            pool_size: None,
            connect_timeout: None,
            request_timeout: None,
            watch: None,
            poll_interval: None,
        }
    }

    #[test]
    fn fields_are_checked_and_named() {
        let ok = parse(raw(), Path::to_path_buf).expect("defaults");
        assert_eq!(
            (ok.schema.as_str(), ok.pool_size, ok.watch),
            ("baton", 4, WatchMode::Notify)
        );
        let e = parse(
            RawFields {
                url: Some("mysql://u:secret@h/db".into()),
                ..raw()
            },
            Path::to_path_buf,
        )
        .unwrap_err();
        assert!(e.contains("field `url`") && !e.contains("secret"), "{e}");
        let e = parse(
            RawFields {
                pool_size: Some(0),
                ..raw()
            },
            Path::to_path_buf,
        )
        .unwrap_err();
        assert!(e.contains("field `pool-size`"), "{e}");
        let e = parse(
            RawFields {
                watch: Some("often".into()),
                ..raw()
            },
            Path::to_path_buf,
        )
        .unwrap_err();
        assert!(e.contains("field `watch`"), "{e}");
        let e = parse(
            RawFields {
                schema: Some("Bad".into()),
                ..raw()
            },
            Path::to_path_buf,
        )
        .unwrap_err();
        assert!(e.contains("field `schema`"), "{e}");
    }
}
