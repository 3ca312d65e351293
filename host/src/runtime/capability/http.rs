//! Outgoing HTTP: `wasi:http/outgoing-handler` of WASI 0.2, under grants.
//!
//! A plugin may send HTTP requests only where its `http` grants allow: a
//! scheme, a host (a name, a `*.` wildcard of names, or an address range)
//! and a port, as Spin's `allowed_outbound_hosts` does. Everything else is
//! refused inside the guest with `wasi:http`'s `HTTP-request-denied` (or
//! `destination-IP-prohibited`), and logged with the plugin and the
//! destination.
//!
//! - **No rebinding into the host's network.** A grant by name allows that
//!   name only as long as it resolves to public addresses: an address that
//!   is loopback, link-local, private (RFC 1918, unique local), shared
//!   (100.64/10) or unspecified is refused unless an address grant allows
//!   it too. The host resolves the name itself and connects to the address
//!   it checked.
//! - **TLS** is rustls, with the bundled web roots (`webpki-roots`: an image
//!   without system roots still verifies) plus the CA a grant names.
//!   Verification is never turned off.
//! - **The term travels with every request.** Unless a grant turns it off,
//!   the host sets `Baton-Lease` and `Baton-Term` on every request (the
//!   lease name and the term number, the fencing token), replacing any
//!   `Baton-*` header the guest set. See `docs/fencing.md`.
//! - **Nothing after the term.** A request cannot start once the term must
//!   stop (the host-call fence traps the guest first), and a request in
//!   flight is dropped at the term's force-stop time, whatever the guest
//!   does, and its connection reset (what it still queued is dropped; see
//!   [`connections`](crate::runtime::fence::connections)).
//! - **Limits** per plugin instance: requests in flight, request and
//!   response body sizes, and a timeout until the response's headers;
//!   exceeding one is an error inside the guest (`connection-limit-reached`,
//!   `HTTP-request-body-size`, `HTTP-response-body-size`,
//!   `connection-timeout`), never a failure of the host.
//!
//! Only HTTP/1.1 is spoken; each request opens its own connection.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use tokio::net::TcpStream;
use tokio::sync::{OnceCell, Semaphore};
use wasmtime::component::Linker;
use wasmtime_wasi::WasiView;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{
    Error as HttpError, RequestOptions, WasiBody, WasiHttp, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks,
};

use super::sockets::lookup::{self, LookupError};
use super::unit::{Capability, GrantError, GrantSite, LoadContext, Setup, SetupError, Shared};
use crate::election::Term;
use crate::runtime::fence::connections::Connections;
use crate::runtime::store_term::StoreTerm;
use crate::runtime::world::World;
use kubernetes::{KUBERNETES_ORIGIN, KubeAccess};

mod grant;
pub mod kubernetes;
pub mod stub;

pub use grant::{
    GrantHost, HttpGrant, HttpGrantError, HttpLimits, HttpPolicy, HttpPolicyError, RawHttp, TlsConfigError,
    is_internal,
};

/// The capability: `wasi:http` 0.2's outgoing requests (and the
/// Kubernetes API through the host) under the plugin's `http` and
/// `kubernetes` grants.
pub struct Http;

/// One instance's part: `wasi:http`'s context and the hooks that send
/// its requests.
pub struct HttpCtx {
    ctx: WasiHttpCtx,
    hooks: GuestHttp,
}

impl Capability for Http {
    type Raw = RawHttp;
    type Grant = HttpPolicy;
    type Plugin = HttpPolicy;
    type Ctx = HttpCtx;
    type View<'a> = WasiHttpCtxView<'a>;

    fn grant(raw: RawHttp, site: &GrantSite<'_>) -> Result<HttpPolicy, GrantError> {
        raw.policy(site)
    }

    fn load(policy: &HttpPolicy, _: &LoadContext<'_>) -> Result<HttpPolicy, String> {
        Ok(policy.clone())
    }

    fn prepare(policy: &HttpPolicy, setup: &mut Setup<'_>) -> Result<HttpCtx, SetupError> {
        let (plugin, term) = (setup.plugin.clone(), setup.term.clone());
        Ok(HttpCtx {
            ctx: WasiHttpCtx::new(),
            hooks: GuestHttp::new(plugin, policy.clone(), term, setup.connections.clone()),
        })
    }

    fn view<'a>(ctx: &'a mut HttpCtx, shared: Shared<'a>) -> WasiHttpCtxView<'a> {
        WasiHttpCtxView {
            ctx: &mut ctx.ctx,
            table: shared.table,
            hooks: &mut ctx.hooks,
        }
    }

    /// `wasi:http/outgoing-handler` and `wasi:http/types`, as
    /// `wasmtime_wasi_http::p2::add_only_http_to_linker_async` links them.
    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        _: World,
        get: for<'a> fn(&'a mut T) -> WasiHttpCtxView<'a>,
    ) -> wasmtime::Result<()> {
        use wasmtime_wasi_http::p2::bindings::{LinkOptions, http};
        http::outgoing_handler::add_to_linker::<_, WasiHttp>(linker, get)?;
        http::types::add_to_linker::<_, WasiHttp>(linker, &LinkOptions::default().into(), get)
    }

    fn describe(policy: &HttpPolicy) -> Vec<String> {
        let mut parts = Vec::new();
        let http: Vec<String> = policy.grants().map(|g| g.to_string()).collect();
        if !http.is_empty() {
            parts.push(format!("http {}", http.join(",")));
        }
        if let Some(k) = policy.kubernetes() {
            let rules: Vec<String> = k
                .rules
                .iter()
                .map(|r| {
                    format!(
                        "{} {} in {}",
                        r.verbs.join("/"),
                        r.resources.join("/"),
                        r.namespaces.join("/")
                    )
                })
                .collect();
            parts.push(format!("kubernetes {}", rules.join(",")));
        }
        parts
    }
}

/// The header that carries the lease name.
pub const LEASE_HEADER: &str = "baton-lease";
/// The header that carries the term number.
pub const TERM_HEADER: &str = "baton-term";

/// The `wasi:http` hooks of one plugin instance: its grants, limits and
/// term. Each request is sent by a clone of its own (`send`), which shares
/// the instance's limits, connections and Kubernetes client.
#[derive(Clone)]
pub struct GuestHttp {
    plugin: Arc<str>,
    policy: HttpPolicy,
    term: StoreTerm,
    in_flight: Arc<Semaphore>,
    connections: Connections,
    /// The instance's own client of the Kubernetes API, made at its first
    /// request there.
    kube_client: Arc<OnceCell<kube::Client>>,
}

impl GuestHttp {
    /// The hooks of an instance of `plugin` in `term`, whose connections
    /// join `connections`.
    pub fn new(plugin: Arc<str>, policy: HttpPolicy, term: StoreTerm, connections: Connections) -> GuestHttp {
        let in_flight = Arc::new(Semaphore::new(policy.limits.concurrent));
        GuestHttp {
            plugin,
            policy,
            term,
            in_flight,
            connections,
            kube_client: Arc::default(),
        }
    }
}

/// How long a request waits for a place among the plugin's requests in
/// flight before it is refused. A request the guest drops gives its place
/// back when the host's runtime has dropped its task, a moment after the
/// guest's call returned: without this wait, a guest that drops a request
/// and sends another at once would be refused now and then.
const PLACE_WAIT: Duration = Duration::from_millis(100);

/// A place among the plugin's requests in flight, if one is free within
/// [`PLACE_WAIT`].
async fn place(in_flight: &Arc<Semaphore>) -> Result<tokio::sync::OwnedSemaphorePermit, ()> {
    if let Ok(permit) = in_flight.clone().try_acquire_owned() {
        return Ok(permit);
    }
    match tokio::time::timeout(PLACE_WAIT, in_flight.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(()),
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

/// A request's body as sent: capped at the plugin's limit.
type OutgoingBody = UnsyncBoxBody<Bytes, HttpError>;

/// An HTTP/1.1 connection, driven until the response's body is read.
type Connection = Pin<Box<hyper::client::conn::http1::Connection<TokioIo<Box<dyn IoStream>>, OutgoingBody>>>;
type Sent = Result<(http::Response<WasiBody>, IoFuture), HttpError>;

impl WasiHttpHooks for GuestHttp {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = Sent> + Send> {
        drop(fut);
        let send = self.clone();
        Box::new(send.send(request, options))
    }
}

/// Where a request goes: its scheme, host (lower case; `bare` without an
/// IPv6 literal's brackets, `literal` if it is an address) and port.
struct Destination {
    https: bool,
    host: String,
    bare: String,
    literal: Option<IpAddr>,
    port: u16,
}

impl Destination {
    /// The destination of `uri`: `http` or `https` only.
    fn of(uri: &http::Uri) -> Result<Destination, HttpError> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(HttpError::HttpProtocolError),
        };
        let host = uri
            .host()
            .ok_or(HttpError::HttpRequestUriInvalid)?
            .to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let bare = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        Ok(Destination {
            https,
            literal: bare.parse().ok(),
            host,
            bare,
            port,
        })
    }
}

impl std::fmt::Display for Destination {
    /// `scheme://host:port`, as logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}:{}", self.host, self.port)
    }
}

/// One request and its response over `io`, HTTP/1.1: the connection
/// driven while the response is awaited, and returned to be driven while
/// the body is read.
async fn exchange(
    io: Box<dyn IoStream>,
    request: http::Request<OutgoingBody>,
) -> Result<(http::Response<hyper::body::Incoming>, Connection), HttpError> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(from_hyper)?;
    let mut conn = Box::pin(conn);
    let send = sender.send_request(request);
    tokio::pin!(send);
    let response = tokio::select! {
        response = &mut send => response.map_err(from_hyper)?,
        done = &mut conn => {
            done.map_err(from_hyper)?;
            send.await.map_err(from_hyper)?
        }
    };
    Ok((response, conn))
}

/// Resolves at `term`'s force-stop time, once `connections` are reset:
/// before the request's future, and its connection, are dropped.
async fn stop_due(term: &Term, connections: &Connections) {
    term.stop_due().await;
    connections.reset_all();
}

impl GuestHttp {
    async fn send(self, request: http::Request<WasiBody>, options: Option<RequestOptions>) -> Sent {
        let term = self.term.clone();
        let connections = self.connections.clone();
        // Whatever the request is doing at the term's force-stop time, it
        // is dropped then, its connection reset.
        tokio::select! {
            biased;
            () = stop_due(&term, &connections) => Err(term_over()),
            sent = self.send_within_term(request, options) => sent,
        }
    }

    async fn send_within_term(
        self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Sent {
        let uri = request.uri().clone();
        let to = Destination::of(&uri)?;
        if to.bare == KUBERNETES_ORIGIN {
            return self.send_to_kubernetes(request).await;
        }
        let (grant, tls) = self.grant_for(&to)?;
        let permit = place(&self.in_flight).await.map_err(|_| {
            tracing::warn!(plugin = %self.plugin, destination = %to, limit = self.policy.limits.concurrent,
                "HTTP request refused: the plugin has as many requests in flight as it may");
            HttpError::ConnectionLimitReached
        })?;
        let limits = self.policy.limits;
        let timeout = [
            options.and_then(|o| o.connect_timeout),
            options.and_then(|o| o.first_byte_timeout),
        ]
        .into_iter()
        .flatten()
        .fold(limits.timeout, Duration::min);
        if grant.term_headers {
            self.set_term_headers(request.headers_mut())?;
        }
        if let Some(stub) = &self.policy.stub {
            let _permit = permit;
            return stub::answer(stub, &uri, request, limits.request_body).await;
        }
        // Origin form on the wire: the path and query only.
        *request.uri_mut() = http::Uri::builder()
            .path_and_query(uri.path_and_query().map_or("/", |p| p.as_str()))
            .build()
            .map_err(|_| HttpError::HttpRequestUriInvalid)?;
        let request = request.map(|body| {
            Capped::new(body, limits.request_body, |n| {
                HttpError::HttpRequestBodySize(Some(n))
            })
            .boxed_unsync()
        });
        let exchange = async {
            let stream = self.connect(&to).await?;
            let _ = stream.set_nodelay(true);
            let io = self.secure(stream, &to, tls).await?;
            exchange(io, request).await
        };
        let (response, conn) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| HttpError::ConnectionTimeout)??;
        tracing::debug!(plugin = %self.plugin, destination = %to, status = response.status().as_u16(), "HTTP response");
        let response = response.map(|body| {
            Capped::new(body.map_err(HttpError::from), limits.response_body, |n| {
                HttpError::HttpResponseBodySize(Some(n))
            })
            .boxed_unsync()
        });
        let term = self.term.clone();
        let connections = self.connections.clone();
        let io: IoFuture = Box::new(async move {
            let _permit = permit;
            tokio::select! {
                biased;
                () = stop_due(&term, &connections) => Err(term_over()),
                done = conn => done.map_err(from_hyper),
            }
        });
        Ok((response, io))
    }

    /// The grant that allows `to`, with its TLS settings; refused (and
    /// logged) if none does.
    fn grant_for(&self, to: &Destination) -> Result<(HttpGrant, Arc<rustls::ClientConfig>), HttpError> {
        let granted = self.policy.grants.iter().find(|(g, _)| match to.literal {
            Some(ip) => g.allows_address(to.https, ip, to.port),
            None => g.allows_name(to.https, &to.bare, to.port),
        });
        granted.cloned().ok_or_else(|| {
            tracing::warn!(plugin = %self.plugin, destination = %to, "HTTP request refused: no http grant of the plugin allows it");
            HttpError::HttpRequestDenied
        })
    }

    /// The term, set by the host: the guest's own `Baton-*` headers go.
    fn set_term_headers(&self, headers: &mut http::HeaderMap) -> Result<(), HttpError> {
        let own: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("baton-"))
            .cloned()
            .collect();
        for k in own {
            headers.remove(&k);
        }
        let lease = HeaderValue::from_str(self.term.lease()).map_err(|_| internal("lease name"))?;
        headers.insert(HeaderName::from_static(LEASE_HEADER), lease);
        headers.insert(
            HeaderName::from_static(TERM_HEADER),
            HeaderValue::from(self.term.number()),
        );
        Ok(())
    }

    /// The addresses of `to`: a literal as it is; a name resolved here
    /// (bounded by the term), and only to addresses the plugin may reach:
    /// an internal address only if an address grant allows it.
    async fn addresses(&self, to: &Destination) -> Result<Vec<SocketAddr>, HttpError> {
        if let Some(ip) = to.literal {
            return Ok(vec![SocketAddr::new(ip, to.port)]);
        }
        let found: Vec<SocketAddr> = lookup::resolve(Arc::clone(&self.term), &to.bare)
            .await
            .map_err(|e| match e {
                LookupError::NoAnswer => HttpError::DnsTimeout,
                LookupError::TermOver => term_over(),
                LookupError::InvalidName | LookupError::NoAddress => HttpError::DestinationNotFound,
            })?
            .into_iter()
            .map(|ip| SocketAddr::new(ip, to.port))
            .collect();
        let grants = &self.policy.grants;
        let allowed: Vec<SocketAddr> = found
            .iter()
            .copied()
            .filter(|a| {
                !is_internal(a.ip())
                    || grants
                        .iter()
                        .any(|(g, _)| g.allows_address(to.https, a.ip(), to.port))
            })
            .collect();
        if allowed.is_empty() {
            if found.is_empty() {
                return Err(HttpError::DestinationNotFound);
            }
            tracing::warn!(plugin = %self.plugin, destination = %to, addresses = ?found,
                "HTTP request refused: the granted name resolves only to internal addresses, which no address grant allows");
            return Err(HttpError::DestinationIpProhibited);
        }
        Ok(allowed)
    }

    /// A TCP connection to the first of `to`'s addresses that answers,
    /// joined to the instance's connections (reset at the force-stop).
    async fn connect(&self, to: &Destination) -> Result<TcpStream, HttpError> {
        let mut last = HttpError::ConnectionRefused;
        for addr in self.addresses(to).await? {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    use std::os::fd::AsRawFd;
                    self.connections.add(stream.as_raw_fd());
                    return Ok(stream);
                }
                Err(e) => last = HttpError::Connect(e),
            }
        }
        Err(last)
    }

    /// `stream` as is for `http`, or under TLS for `https`, the server's
    /// certificate checked by `tls` (a refusal logged with its reason).
    async fn secure(
        &self,
        stream: TcpStream,
        to: &Destination,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<Box<dyn IoStream>, HttpError> {
        if !to.https {
            return Ok(Box::new(stream));
        }
        let name = rustls::pki_types::ServerName::try_from(to.bare.clone())
            .map_err(|_| HttpError::HttpRequestUriInvalid)?;
        let connector = tokio_rustls::TlsConnector::from(tls);
        let tls = connector.connect(name, stream).await.map_err(|e| {
            let rejected = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .filter(|r| matches!(r, rustls::Error::InvalidCertificate(_)))
                .map(|r| r.to_string());
            match rejected {
                Some(reason) => {
                    tracing::warn!(plugin = %self.plugin, destination = %to, %reason,
                        "HTTP request failed: the server's certificate is not trusted (by the bundled web roots or the grant's `ca`)");
                    HttpError::TlsCertificateError
                }
                None => HttpError::Tls(e),
            }
        })?;
        Ok(Box::new(tls))
    }
}

impl GuestHttp {
    /// A request to the virtual origin of the Kubernetes API: checked
    /// against the plugin's `kubernetes` grant, then sent by the host's own
    /// client (its credentials, never the guest's).
    async fn send_to_kubernetes(self, request: http::Request<WasiBody>) -> Sent {
        let (mut parts, body) = request.into_parts();
        let (access, asked) = self.admit_to_kubernetes(&parts)?;
        let permit = place(&self.in_flight)
            .await
            .map_err(|_| HttpError::ConnectionLimitReached)?;
        let limits = self.policy.limits;
        strip_guest_credentials(&mut parts.headers);
        if access.grant.term_headers {
            self.set_term_headers(&mut parts.headers)?;
        }
        let exchange = self.exchange_with_kubernetes(&access, parts, body);
        let response = tokio::time::timeout(limits.timeout, exchange)
            .await
            .map_err(|_| HttpError::ConnectionTimeout)??;
        tracing::debug!(plugin = %self.plugin, request = %asked, status = response.status().as_u16(), "Kubernetes API response");
        let response = response.map(|body| {
            Capped::new(
                body.map_err(|e| HttpError::InternalError(Some(e.to_string()))),
                limits.response_body,
                |n| HttpError::HttpResponseBodySize(Some(n)),
            )
            .holding(permit)
            .boxed_unsync()
        });
        // The host's client keeps its own connections.
        let io: IoFuture = Box::new(async { Ok(()) });
        Ok((response, io))
    }

    /// The plugin's `kubernetes` grant and what the request asks of the
    /// API server, if the grant allows it; refused (and logged) if not.
    fn admit_to_kubernetes(
        &self,
        parts: &http::request::Parts,
    ) -> Result<(Arc<KubeAccess>, kubernetes::ApiRequest), HttpError> {
        let Some(access) = self.policy.kube.clone() else {
            tracing::warn!(plugin = %self.plugin, destination = KUBERNETES_ORIGIN,
                "Kubernetes API request refused: the plugin has no `kubernetes` grant");
            return Err(HttpError::HttpRequestDenied);
        };
        let path = parts.uri.path();
        let Some(asked) = kubernetes::classify(&parts.method, path, parts.uri.query()) else {
            tracing::warn!(plugin = %self.plugin, method = %parts.method, %path,
                "Kubernetes API request refused: not a resource request (only /api/v1/... and /apis/GROUP/VERSION/... are forwarded)");
            return Err(HttpError::HttpRequestDenied);
        };
        if !access.allows(&asked) {
            tracing::warn!(plugin = %self.plugin, request = %asked, %path,
                "Kubernetes API request refused: the plugin's `kubernetes` grant does not allow it");
            return Err(HttpError::HttpRequestDenied);
        }
        Ok((access, asked))
    }

    /// Sends the request, its body within the plugin's limit, by the
    /// instance's own client of the API server (made at its first request).
    async fn exchange_with_kubernetes(
        &self,
        access: &KubeAccess,
        mut parts: http::request::Parts,
        body: WasiBody,
    ) -> Result<http::Response<kube::client::Body>, HttpError> {
        let limit = self.policy.limits.request_body;
        let body = Capped::new(body, limit, |n| HttpError::HttpRequestBodySize(Some(n)))
            .collect()
            .await?
            .to_bytes();
        let client = self
            .kube_client
            .get_or_try_init(|| access.client_for(&self.connections))
            .await
            .map_err(|e| {
                tracing::warn!(plugin = %self.plugin, error = %e, "Kubernetes API request failed: no client");
                HttpError::ConfigurationError
            })?;
        let target = match parts.uri.query() {
            Some(q) => format!("{}?{q}", parts.uri.path()),
            None => parts.uri.path().to_owned(),
        };
        parts.uri = target.parse().map_err(|_| HttpError::HttpRequestUriInvalid)?;
        let request = http::Request::from_parts(parts, kube::client::Body::from(body.to_vec()));
        client.send(request).await.map_err(|e| {
            tracing::debug!(plugin = %self.plugin, error = %e, "Kubernetes API request failed");
            HttpError::InternalError(Some(format!("the API server could not be reached: {e}")))
        })
    }
}

/// The host's credentials only: nothing of the guest's that could
/// authenticate, impersonate or forge the term.
fn strip_guest_credentials(headers: &mut http::HeaderMap) {
    let dropped: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            let k = k.as_str();
            k == "authorization" || k == "host" || k.starts_with("impersonate-") || k.starts_with("baton-")
        })
        .cloned()
        .collect();
    for k in dropped {
        headers.remove(&k);
    }
}

/// A hyper error as the guest should see it: the limit a body broke, if
/// that is why, else the error itself.
fn from_hyper(e: hyper::Error) -> HttpError {
    match std::error::Error::source(&e).and_then(|s| s.downcast_ref::<HttpError>()) {
        Some(HttpError::HttpRequestBodySize(n)) => HttpError::HttpRequestBodySize(*n),
        Some(HttpError::HttpResponseBodySize(n)) => HttpError::HttpResponseBodySize(*n),
        Some(other) => HttpError::InternalError(Some(other.to_string())),
        None => HttpError::from(e),
    }
}

/// What a guest sees of a request dropped at its term's end.
fn term_over() -> HttpError {
    HttpError::InternalError(Some("the plugin's term is over".into()))
}

fn internal(what: &str) -> HttpError {
    HttpError::InternalError(Some(format!("cannot send the {what}")))
}

/// A stream to the server, plain or TLS.
trait IoStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> IoStream for T {}

/// A body that fails once more than `limit` bytes went through.
struct Capped<B> {
    inner: B,
    left: u64,
    limit: u64,
    error: fn(u64) -> HttpError,
    /// A place in the plugin's requests in flight, held while the body is.
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<B> Capped<B> {
    fn new(inner: B, limit: u64, error: fn(u64) -> HttpError) -> Capped<B> {
        Capped {
            inner,
            left: limit,
            limit,
            error,
            permit: None,
        }
    }

    fn holding(mut self, permit: tokio::sync::OwnedSemaphorePermit) -> Capped<B> {
        self.permit = Some(permit);
        self
    }
}

impl<B> Body for Capped<B>
where
    B: Body<Data = Bytes, Error = HttpError> + Unpin,
{
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            let n = data.len() as u64;
            if n > self.left {
                return Poll::Ready(Some(Err((self.error)(self.limit))));
            }
            self.left -= n;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
