//! The store's HTTP client: kube's own stack (rustls, the API server's
//! address, the credentials, extra headers) on connections with
//! `TCP_NODELAY` set. kube's default connector leaves Nagle's algorithm
//! on, and the first request on a new TLS connection then waited for the
//! API server's delayed ACK: 48 ms of a 62 ms hand-over, measured on the
//! test API server. No retries of its own (the elector retries) and no
//! read timeout (the elector bounds requests; watches have theirs).

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use tower::ServiceBuilder;

/// A client for `config`, whose connections have `TCP_NODELAY` and its
/// connect timeout.
pub(super) fn client(config: &kube::Config) -> Result<kube::Client, kube::Error> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(tcp)?;
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}
