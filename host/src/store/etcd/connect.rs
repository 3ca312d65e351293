//! Connecting to the cluster (TLS through rustls, authentication) and
//! telling the store's errors from what the client says.

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use tonic::Code;

use super::route::Route;
use super::{EtcdOptions, store_refused};
use crate::store::StoreError;

/// The route to the cluster at `options.endpoints`: a client per member,
/// every request marked to need a raft leader (a member cut off from its
/// cluster refuses at once rather than hanging); a client's only retry is
/// of a request refused for an expired authentication token, once, after a
/// new one (the elector retries everything else). Without a user nothing
/// is sent here; with one, the first member that answers authenticates,
/// so that a wrong password is refused at once.
pub(super) async fn route(options: &EtcdOptions) -> Result<Route, StoreError> {
    if options.endpoints.is_empty() {
        return Err(store_refused("no etcd endpoints configured".into()));
    }
    let mut connect = ConnectOptions::new()
        .with_connect_timeout(options.dial_timeout)
        .with_require_leader(true)
        .with_keep_alive_while_idle(false)
        .with_auto_token_refresh(true);
    let tls = options
        .endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if tls != 0 && tls != options.endpoints.len() {
        return Err(store_refused(format!(
            "the etcd endpoints mix http:// and https:// ({}): use one scheme for all",
            options.endpoints.join(",")
        )));
    }
    if tls == 0 && (options.ca.is_some() || options.identity.is_some()) {
        return Err(store_refused(format!(
            "a CA or client certificate is configured, but the etcd endpoints ({}) are http://: use https://",
            options.endpoints.join(",")
        )));
    }
    if tls != 0 {
        let mut config = TlsOptions::new().with_webpki_roots();
        if let Some(ca) = &options.ca {
            let pem = std::fs::read(ca)
                .map_err(|e| store_refused(format!("cannot read the etcd CA {}: {e}", ca.display())))?;
            config = TlsOptions::new().ca_certificate(Certificate::from_pem(pem));
        }
        if let Some((cert, key)) = &options.identity {
            let read = |p: &std::path::PathBuf, what: &str| {
                std::fs::read(p).map_err(|e| {
                    store_refused(format!("cannot read the etcd client {what} {}: {e}", p.display()))
                })
            };
            config = config.identity(Identity::from_pem(read(cert, "certificate")?, read(key, "key")?));
        }
        connect = connect.with_tls(config.assume_http2(true));
    }
    if let Some((user, password)) = &options.user {
        connect = connect.with_user(user, password);
    }
    // With a user, connecting authenticates (one request); bounded as a
    // dial and a request are.
    let bound = options.dial_timeout + options.request_timeout;
    let route = Route::new(options.endpoints.clone(), connect, bound);
    if options.user.is_some() {
        let mut last = None;
        for _ in &options.endpoints {
            match route.attempt().await {
                Ok(mut attempt) => {
                    attempt.succeeded();
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            return Err(map_error(
                crate::store::ANY_LEASE,
                &format!("connect to {}", options.endpoints.join(",")),
                e,
            ));
        }
    }
    Ok(route)
}

/// The store's error for the client's error `e` of `what` on `lease`.
pub fn map_error(lease: &str, what: &str, e: etcd_client::Error) -> StoreError {
    let lease = lease.to_owned();
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let detail = format!("{what}: {} ({:?})", status.message(), status.code());
            match status.code() {
                Code::PermissionDenied | Code::Unauthenticated => StoreError::Refused {
                    lease,
                    detail: format!(
                        "{detail}: the etcd user needs read and write permission on the key prefix \
                         (etcdctl role grant-permission ROLE readwrite --prefix=true PREFIX)"
                    ),
                },
                Code::InvalidArgument => StoreError::Refused { lease, detail },
                _ => StoreError::Unavailable { lease, detail },
            }
        }
        etcd_client::Error::InvalidArgs(_)
        | etcd_client::Error::InvalidUri(_)
        | etcd_client::Error::EndpointError(_) => StoreError::Refused {
            lease,
            detail: format!("{what}: {e}"),
        },
        _ => StoreError::Unavailable {
            lease,
            detail: format!("{what}: {e}"),
        },
    }
}
