//! The admin endpoints, on the configured admin address: `/metrics`
//! ([`Metrics`]), `/healthz` and `/readyz` ([`Health`]), and `/leases`
//! ([`leases`](crate::ops::leases)).
//!
//! Served by hyper (HTTP/1.1) on a thread of its own (`baton-admin`) with
//! a single-threaded tokio runtime of its own: the runtimes that liveness
//! watches (the guests' and the election's) are not the one that answers,
//! so a stalled runtime is reported instead of stalling the answer. Each
//! connection gets [`CONNECTION_LIMIT`] in all.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use wasmtime_wasi_http::io::TokioIo;

use crate::ops::health::{Health, Verdict};
use crate::ops::leases::{self, Host};
use crate::ops::metrics::{self, Metrics};

/// How long one connection may take, from accepting it to its last answer.
pub const CONNECTION_LIMIT: Duration = Duration::from_secs(10);

/// What the admin endpoints of one run serve: its metrics and its
/// health.
pub struct Monitoring {
    /// The metrics `/metrics` serves.
    pub metrics: Arc<Metrics>,
    /// What `/healthz` and `/readyz` answer from.
    pub health: Arc<Health>,
}

/// The running admin server; dropping it stops it.
pub struct AdminServer {
    address: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl AdminServer {
    /// Where it listens (the port picked, for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds `address` (an error if it cannot) and serves the endpoints of
/// `host` from a thread of its own until the returned server is dropped.
pub fn start(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    host: Host,
) -> std::io::Result<AdminServer> {
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("baton-admin".into())
        .spawn(move || runtime.block_on(serve(listener, metrics, health, host, stopped)))?;
    Ok(AdminServer {
        address: bound,
        stop: Some(stop),
    })
}

async fn serve(
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    host: Host,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let host = Arc::new(host);
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "the admin endpoints cannot listen");
            return;
        }
    };
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(error = %e, "admin endpoints: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (metrics, health, host) = (metrics.clone(), health.clone(), host.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let answer = answer(request.method(), request.uri().path(), &metrics, &health, &host);
                async move { Ok::<_, Infallible>(answer) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIMIT, connection).await;
        });
    }
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CACHE_CONTROL, "no-store")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

fn verdict(v: Verdict) -> Response<Full<Bytes>> {
    let status = if v.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    text(status, "text/plain; charset=utf-8", v.body)
}

/// The answer to `method path`.
fn answer(
    method: &Method,
    path: &str,
    metrics: &Metrics,
    health: &Health,
    host: &Host,
) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET and HEAD\n".into(),
        );
    }
    match path {
        "/metrics" => text(StatusCode::OK, metrics::CONTENT_TYPE, metrics.encode()),
        "/healthz" => verdict(health.live()),
        "/readyz" => verdict(health.ready()),
        "/leases" => text(StatusCode::OK, "application/json", leases::json(host, health)),
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: baton serves /metrics, /healthz, /readyz and /leases\n".into(),
        ),
    }
}
