//! `[store] kind = "etcd"`: the endpoints' form, and the settings the file
//! leaves out taken from the `ETCDCTL_*` variables etcdctl's users already
//! set, when the store is opened (never into [`Config`](super::Config), so
//! that a reload compares the file alone).

use std::path::PathBuf;
use std::time::Duration;

use super::EtcdConfig;
use crate::store::etcd::EtcdOptions;

/// etcdctl's default endpoint.
const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:2379";

/// etcdctl's default dial timeout.
const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// etcdctl's default command timeout.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// `endpoint` as a URL: `http://` or `https://`, a host and a port (a bare
/// `host:port`, as etcdctl takes, is `http://`), or why it is not one.
pub fn etcd_endpoint(endpoint: &str) -> Result<String, String> {
    let url = if endpoint.contains("://") {
        endpoint.to_owned()
    } else {
        format!("http://{endpoint}")
    };
    let why = |what: &str| format!("field `endpoints`: {endpoint:?} {what}");
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| why("is not an http:// or https:// URL"))?;
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') {
        return Err(why("has a path; give the scheme, host and port only"));
    }
    let port = authority.rsplit_once(':').map(|(_, p)| p);
    if port.is_none_or(|p| p.parse::<u16>().is_err()) {
        return Err(why("has no port (etcd's client port is usually 2379)"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

impl EtcdConfig {
    /// The store's options: the file's settings, else the `ETCDCTL_*`
    /// variable of each (read through `env`), else etcdctl's defaults; or
    /// why they cannot work, naming the setting.
    pub fn options(&self, env: impl Fn(&str) -> Option<String>) -> Result<EtcdOptions, String> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let endpoints = if self.endpoints.is_empty() {
            match var("ETCDCTL_ENDPOINTS") {
                Some(list) => list
                    .split(',')
                    .map(|e| etcd_endpoint(e.trim()).map_err(|why| format!("ETCDCTL_ENDPOINTS: {why}")))
                    .collect::<Result<Vec<_>, _>>()?,
                None => vec![DEFAULT_ENDPOINT.to_owned()],
            }
        } else {
            self.endpoints
                .iter()
                .map(|e| etcd_endpoint(e))
                .collect::<Result<Vec<_>, _>>()?
        };
        let path =
            |field: &Option<PathBuf>, name: &str| field.clone().or_else(|| var(name).map(PathBuf::from));
        let (cert, key) = (path(&self.cert, "ETCDCTL_CERT"), path(&self.key, "ETCDCTL_KEY"));
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(
                    "a client certificate needs its key (cert and key, or ETCDCTL_CERT and ETCDCTL_KEY)"
                        .into(),
                );
            }
        };
        let duration = |field: Option<Duration>, name: &str, default: Duration| match field {
            Some(d) => Ok(d),
            None => var(name).map_or(Ok(default), |v| {
                humantime::parse_duration(v.trim()).map_err(|e| format!("{name}={v:?}: {e}"))
            }),
        };
        Ok(EtcdOptions {
            endpoints,
            prefix: self.prefix.clone(),
            ca: path(&self.ca, "ETCDCTL_CACERT"),
            identity,
            user: self.user_and_password(&var)?,
            dial_timeout: duration(self.dial_timeout, "ETCDCTL_DIAL_TIMEOUT", DEFAULT_DIAL_TIMEOUT)?,
            request_timeout: duration(
                self.request_timeout,
                "ETCDCTL_COMMAND_TIMEOUT",
                DEFAULT_REQUEST_TIMEOUT,
            )?,
        })
    }

    /// The user and password: `user` with `password-file`, else
    /// `ETCDCTL_USER` (`name` or `name:password`) and `ETCDCTL_PASSWORD`.
    fn user_and_password(
        &self,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<(String, String)>, String> {
        let (user, inline) = match (&self.user, var("ETCDCTL_USER")) {
            (Some(user), _) => (user.clone(), None),
            (None, Some(v)) => match v.split_once(':') {
                Some((user, password)) => (user.to_owned(), Some(password.to_owned())),
                None => (v, None),
            },
            (None, None) => {
                if self.password_file.is_some() {
                    return Err("field `password-file` without `user`".into());
                }
                return Ok(None);
            }
        };
        let password = match &self.password_file {
            Some(file) => std::fs::read_to_string(file)
                .map_err(|e| format!("field `password-file`: cannot read {}: {e}", file.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
            None => match inline.or_else(|| var("ETCDCTL_PASSWORD")) {
                Some(p) => p,
                None => {
                    return Err(format!(
                        "user {user:?} has no password: set `password-file` (or ETCDCTL_PASSWORD)"
                    ));
                }
            },
        };
        Ok(Some((user, password)))
    }
}
