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
//!   [`connections`](super::connections)).
//! - **Limits** per plugin instance: requests in flight, request and
//!   response body sizes, and a timeout until the response's headers;
//!   exceeding one is an error inside the guest (`connection-limit-reached`,
//!   `HTTP-request-body-size`, `HTTP-response-body-size`,
//!   `connection-timeout`), never a failure of the host.
//!
//! Only HTTP/1.1 is spoken; each request opens its own connection.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use ipnet::IpNet;
use tokio::net::TcpStream;
use tokio::sync::{OnceCell, Semaphore};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::connections::Connections;
use super::kubernetes::{self, KUBERNETES_ORIGIN, KubeAccess};
use super::lookup::{self, LookupError};
use crate::election::Term;

/// The header that carries the lease name.
pub const LEASE_HEADER: &str = "baton-lease";
/// The header that carries the term number.
pub const TERM_HEADER: &str = "baton-term";

/// The host of an [`HttpGrant`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrantHost {
    /// Exactly this name (lowercase, no trailing dot).
    Name(String),
    /// Any name ending in `.` and this (`*.example.com`: `a.example.com`,
    /// `a.b.example.com`, not `example.com`).
    Subdomains(String),
    /// Addresses in this range (an address is a range of one).
    Addresses(IpNet),
}

/// Where a plugin may send HTTP requests.
///
/// Written as an origin: `SCHEME://HOST[:PORT]`, where `SCHEME` is `http`
/// or `https`, `HOST` a name, `*.` and a name, an IP address or a CIDR
/// range (IPv6 in brackets), and `PORT` a number or `*` (default: the
/// scheme's, 80 or 443):
///
/// ```
/// use baton::runtime::HttpGrant;
///
/// let api: HttpGrant = "https://api.example.com".parse().unwrap();
/// assert!(api.allows_name(true, "api.example.com", 443));
/// assert!(!api.allows_name(false, "api.example.com", 80));
/// assert!(!api.allows_name(true, "api.example.com", 8443));
///
/// let any: HttpGrant = "https://*.example.com:*".parse().unwrap();
/// assert!(any.allows_name(true, "a.b.example.com", 8443));
/// assert!(!any.allows_name(true, "example.com", 443));
///
/// let local: HttpGrant = "http://127.0.0.1:8080".parse().unwrap();
/// assert!(local.allows_address(false, "127.0.0.1".parse().unwrap(), 8080));
///
/// let err = "https://api.example.com/v1".parse::<HttpGrant>().unwrap_err();
/// assert!(err.contains("no path"), "{err}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpGrant {
    /// `https` (true) or `http`.
    pub https: bool,
    /// The host.
    pub host: GrantHost,
    /// The port; `None`: any.
    pub port: Option<u16>,
    /// Whether requests carry `Baton-Lease` and `Baton-Term` (default on).
    pub term_headers: bool,
    /// A PEM file of CA certificates trusted for this grant, besides the
    /// bundled web roots.
    pub ca: Option<PathBuf>,
}

impl HttpGrant {
    fn scheme_port(&self, https: bool, port: u16) -> bool {
        self.https == https && self.port.is_none_or(|p| p == port)
    }

    /// Whether a request to the name `host` (lowercase) is granted.
    pub fn allows_name(&self, https: bool, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.');
        self.scheme_port(https, port)
            && match &self.host {
                GrantHost::Name(n) => n == host,
                GrantHost::Subdomains(suffix) => host
                    .strip_suffix(suffix.as_str())
                    .is_some_and(|head| !head.is_empty()),
                GrantHost::Addresses(_) => false,
            }
    }

    /// Whether a request to (or a connection for a granted name to) the
    /// address `ip` is granted by an address grant.
    pub fn allows_address(&self, https: bool, ip: IpAddr, port: u16) -> bool {
        self.scheme_port(https, port) && matches!(&self.host, GrantHost::Addresses(net) if net.contains(&ip))
    }
}

impl FromStr for HttpGrant {
    type Err = String;

    fn from_str(text: &str) -> Result<HttpGrant, String> {
        let form = "write SCHEME://HOST[:PORT], for example https://api.example.com, \
                    https://*.example.com, http://127.0.0.1:8080, http://10.0.0.0/8:* or https://[::1]:8443";
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| format!("{text:?} has no scheme: {form}"))?;
        let https = match scheme {
            "https" => true,
            "http" => false,
            other => return Err(format!("{text:?}: scheme {other:?} is not http or https: {form}")),
        };
        // The port: after the last colon outside brackets.
        let (host, port) = match rest.rfind(':') {
            Some(i) if !rest[i..].contains(']') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        let port = match port {
            None => Some(if https { 443 } else { 80 }),
            Some("*") => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|&p| p != 0)
                    .ok_or_else(|| format!("{text:?}: port {p:?} is not 1-65535 or *: {form}"))?,
            ),
        };
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let host = if let Ok(net) = bare.parse::<IpNet>() {
            GrantHost::Addresses(net)
        } else if let Ok(ip) = bare.parse::<IpAddr>() {
            GrantHost::Addresses(IpNet::from(ip))
        } else if host.contains('/') || host.contains('?') || host.contains('#') {
            return Err(format!(
                "{text:?}: a grant is an origin and names no path (nor a query): {form}"
            ));
        } else {
            let lower = host.to_ascii_lowercase();
            let (wild, name) = match lower.strip_prefix("*.") {
                Some(name) => (true, name.to_owned()),
                None => (false, lower.clone()),
            };
            let valid = !name.is_empty()
                && name.len() <= 253
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                });
            if !valid {
                return Err(format!(
                    "{text:?}: {host:?} is not a host name, address or range: {form}"
                ));
            }
            if wild {
                GrantHost::Subdomains(format!(".{name}"))
            } else {
                GrantHost::Name(name)
            }
        };
        Ok(HttpGrant {
            https,
            host,
            port,
            term_headers: true,
            ca: None,
        })
    }
}

impl fmt::Display for HttpGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", if self.https { "https" } else { "http" })?;
        match &self.host {
            GrantHost::Name(n) => write!(f, "{n}")?,
            GrantHost::Subdomains(s) => write!(f, "*{s}")?,
            GrantHost::Addresses(net) if net.prefix_len() == net.max_prefix_len() => match net.addr() {
                IpAddr::V4(a) => write!(f, "{a}")?,
                IpAddr::V6(a) => write!(f, "[{a}]")?,
            },
            GrantHost::Addresses(IpNet::V4(net)) => write!(f, "{net}")?,
            GrantHost::Addresses(IpNet::V6(net)) => write!(f, "[{net}]")?,
        }
        match self.port {
            None => write!(f, ":*"),
            Some(p) if p == if self.https { 443 } else { 80 } => Ok(()),
            Some(p) => write!(f, ":{p}"),
        }
    }
}

/// Limits on one plugin instance's HTTP requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Requests in flight at once (from the call until the response body
    /// is dropped).
    pub concurrent: usize,
    /// The largest request body, in bytes.
    pub request_body: u64,
    /// The largest response body, in bytes.
    pub response_body: u64,
    /// How long a request may take until the response's headers arrive
    /// (connecting, TLS, sending, waiting).
    pub timeout: Duration,
}

impl Default for HttpLimits {
    /// 16 in flight, 10 MiB out, 64 MiB in, 30 s to the response headers:
    /// enough for an API client or a manifest applier; a plugin that needs
    /// more says so in its configuration.
    fn default() -> HttpLimits {
        HttpLimits {
            concurrent: 16,
            request_body: 10 << 20,
            response_body: 64 << 20,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A plugin's HTTP grants and limits, with each grant's TLS settings ready.
#[derive(Clone)]
pub struct HttpPolicy {
    grants: Arc<[(HttpGrant, Arc<rustls::ClientConfig>)]>,
    limits: HttpLimits,
    /// The `kubernetes` grant, if any (see [`super::kubernetes`]).
    kube: Option<Arc<KubeAccess>>,
}

impl fmt::Debug for HttpPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpPolicy")
            .field(
                "grants",
                &self.grants.iter().map(|(g, _)| g.to_string()).collect::<Vec<_>>(),
            )
            .field("limits", &self.limits)
            .field("kubernetes", &self.kube.as_ref().map(|k| &k.grant))
            .finish()
    }
}

impl Default for HttpPolicy {
    /// No grants: every request is refused.
    fn default() -> HttpPolicy {
        HttpPolicy {
            grants: Arc::from(Vec::new()),
            limits: HttpLimits::default(),
            kube: None,
        }
    }
}

impl HttpPolicy {
    /// Prepares `grants`: reads the CA files they name. The error names
    /// the grant and the file.
    pub fn new(grants: &[HttpGrant], limits: HttpLimits) -> Result<HttpPolicy, String> {
        let mut prepared = Vec::new();
        for grant in grants {
            let tls = tls_config(grant.ca.as_deref()).map_err(|e| format!("http grant {grant}: {e}"))?;
            prepared.push((grant.clone(), tls));
        }
        Ok(HttpPolicy {
            grants: Arc::from(prepared),
            limits,
            kube: None,
        })
    }

    /// Adds a `kubernetes` grant: requests to `http://kubernetes.baton` go
    /// to the API server through the host (see [`super::kubernetes`]).
    pub fn with_kubernetes(mut self, grant: kubernetes::KubeGrant) -> HttpPolicy {
        self.kube = Some(KubeAccess::new(grant));
        self
    }

    /// The `kubernetes` grant, if any.
    pub fn kubernetes(&self) -> Option<&kubernetes::KubeGrant> {
        self.kube.as_ref().map(|k| &k.grant)
    }

    /// The grants, as configured.
    pub fn grants(&self) -> impl Iterator<Item = &HttpGrant> {
        self.grants.iter().map(|(g, _)| g)
    }

    /// The limits.
    pub fn limits(&self) -> HttpLimits {
        self.limits
    }
}

/// TLS settings: the bundled web roots plus the certificates in `ca`.
fn tls_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    if let Some(ca) = ca {
        use rustls::pki_types::pem::PemObject;
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(ca)
            .map_err(|e| format!("cannot read the CA file {}: {e}", ca.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the CA file {} is not PEM certificates: {e}", ca.display()))?;
        if certs.is_empty() {
            return Err(format!("the CA file {} holds no certificate", ca.display()));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| format!("the CA file {}: {e}", ca.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Whether `ip` is an address of the host's own or a private network,
/// which a grant by name never reaches.
///
/// ```
/// use baton::runtime::http::is_internal;
///
/// for ip in ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
///            "100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fd00::1", "::ffff:10.0.0.1"] {
///     assert!(is_internal(ip.parse().unwrap()), "{ip}");
/// }
/// assert!(!is_internal("93.184.216.34".parse().unwrap()));
/// assert!(!is_internal("2606:2800:220:1::".parse().unwrap()));
/// ```
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            let [x, y, ..] = a.octets();
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                // Shared address space (carrier-grade NAT), 100.64/10.
                || (x == 100 && (64..128).contains(&y))
        }
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => is_internal(IpAddr::V4(v4)),
            None => {
                let first = a.segments()[0];
                a.is_loopback()
                    || a.is_unspecified()
                    // Link-local fe80::/10, unique local fc00::/7.
                    || (first & 0xffc0) == 0xfe80
                    || (first & 0xfe00) == 0xfc00
            }
        },
    }
}

/// The `wasi:http` hooks of one plugin instance: its grants, limits and
/// term.
pub struct GuestHttp {
    plugin: Arc<str>,
    policy: HttpPolicy,
    term: Arc<Term>,
    in_flight: Arc<Semaphore>,
    connections: Connections,
    /// The instance's own client of the Kubernetes API, made at its first
    /// request there.
    kube_client: Arc<OnceCell<kube::Client>>,
}

impl GuestHttp {
    /// The hooks of an instance of `plugin` in `term`, whose connections
    /// join `connections`.
    pub fn new(plugin: Arc<str>, policy: HttpPolicy, term: Arc<Term>, connections: Connections) -> GuestHttp {
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
type Sent = Result<(http::Response<WasiBody>, IoFuture), HttpError>;

impl WasiHttpHooks for GuestHttp {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = Sent> + Send> {
        drop(fut);
        let send = Sender {
            plugin: self.plugin.clone(),
            policy: self.policy.clone(),
            term: self.term.clone(),
            in_flight: self.in_flight.clone(),
            connections: self.connections.clone(),
            kube_client: self.kube_client.clone(),
        };
        Box::new(send.send(request, options))
    }
}

/// One request's share of [`GuestHttp`].
struct Sender {
    plugin: Arc<str>,
    policy: HttpPolicy,
    term: Arc<Term>,
    in_flight: Arc<Semaphore>,
    connections: Connections,
    kube_client: Arc<OnceCell<kube::Client>>,
}

/// Resolves at `term`'s force-stop time, once `connections` are reset:
/// before the request's future, and its connection, are dropped.
async fn stop_due(term: &Term, connections: &Connections) {
    term.stop_due().await;
    connections.reset_all();
}

impl Sender {
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
        let scheme = if https { "https" } else { "http" };
        let destination = format!("{scheme}://{host}:{port}");
        if bare == KUBERNETES_ORIGIN {
            return self.send_to_kubernetes(request).await;
        }
        let literal: Option<IpAddr> = bare.parse().ok();
        let grants = &self.policy.grants;
        let granted = grants.iter().find(|(g, _)| match literal {
            Some(ip) => g.allows_address(https, ip, port),
            None => g.allows_name(https, &bare, port),
        });
        let Some((grant, tls)) = granted.cloned() else {
            tracing::warn!(plugin = %self.plugin, %destination, "HTTP request refused: no http grant of the plugin allows it");
            return Err(HttpError::HttpRequestDenied);
        };
        let permit = place(&self.in_flight).await.map_err(|_| {
            tracing::warn!(plugin = %self.plugin, %destination, limit = self.policy.limits.concurrent,
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

        // The term, set by the host: the guest's own Baton-* headers go.
        if grant.term_headers {
            let headers = request.headers_mut();
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
        }

        let connect = async {
            // Addresses: a literal as it is; a name resolved here, and only
            // to addresses it may reach.
            let addrs: Vec<SocketAddr> = match literal {
                Some(ip) => vec![SocketAddr::new(ip, port)],
                None => {
                    let found: Vec<SocketAddr> = lookup::resolve(self.term.clone(), &bare)
                        .await
                        .map_err(|e| match e {
                            LookupError::NoAnswer => HttpError::DnsTimeout,
                            LookupError::TermOver => term_over(),
                            LookupError::InvalidName | LookupError::NoAddress => {
                                HttpError::DestinationNotFound
                            }
                        })?
                        .into_iter()
                        .map(|ip| SocketAddr::new(ip, port))
                        .collect();
                    let allowed: Vec<SocketAddr> = found
                        .iter()
                        .copied()
                        .filter(|a| {
                            !is_internal(a.ip())
                                || grants.iter().any(|(g, _)| g.allows_address(https, a.ip(), port))
                        })
                        .collect();
                    if allowed.is_empty() {
                        if found.is_empty() {
                            return Err(HttpError::DestinationNotFound);
                        }
                        tracing::warn!(plugin = %self.plugin, %destination, addresses = ?found,
                            "HTTP request refused: the granted name resolves only to internal addresses, which no address grant allows");
                        return Err(HttpError::DestinationIpProhibited);
                    }
                    allowed
                }
            };
            let mut last = HttpError::ConnectionRefused;
            for addr in addrs {
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
        };
        let exchange = async {
            let stream = connect.await?;
            let _ = stream.set_nodelay(true);
            let io: Box<dyn IoStream> = if https {
                let name = rustls::pki_types::ServerName::try_from(bare.clone())
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
                            tracing::warn!(plugin = %self.plugin, %destination, %reason,
                                "HTTP request failed: the server's certificate is not trusted (by the bundled web roots or the grant's `ca`)");
                            HttpError::TlsCertificateError
                        }
                        None => HttpError::Tls(e),
                    }
                })?;
                Box::new(tls)
            } else {
                Box::new(stream)
            };
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .map_err(from_hyper)?;
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
            let mut conn = Box::pin(conn);
            let response = {
                let send = sender.send_request(request);
                tokio::pin!(send);
                // Drive the connection while waiting for the response.
                tokio::select! {
                    response = &mut send => response.map_err(from_hyper)?,
                    done = &mut conn => {
                        done.map_err(from_hyper)?;
                        send.await.map_err(from_hyper)?
                    }
                }
            };
            Ok::<_, HttpError>((response, conn))
        };
        let (response, conn) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| HttpError::ConnectionTimeout)??;
        tracing::debug!(plugin = %self.plugin, %destination, status = response.status().as_u16(), "HTTP response");
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
}

impl Sender {
    /// A request to the virtual origin of the Kubernetes API: checked
    /// against the plugin's `kubernetes` grant, then sent by the host's own
    /// client (its credentials, never the guest's).
    async fn send_to_kubernetes(self, request: http::Request<WasiBody>) -> Sent {
        let Some(access) = self.policy.kube.clone() else {
            tracing::warn!(plugin = %self.plugin, destination = KUBERNETES_ORIGIN,
                "Kubernetes API request refused: the plugin has no `kubernetes` grant");
            return Err(HttpError::HttpRequestDenied);
        };
        let (mut parts, body) = request.into_parts();
        let path = parts.uri.path().to_owned();
        let query = parts.uri.query().map(str::to_owned);
        let Some(asked) = kubernetes::classify(&parts.method, &path, query.as_deref()) else {
            tracing::warn!(plugin = %self.plugin, method = %parts.method, %path,
                "Kubernetes API request refused: not a resource request (only /api/v1/... and /apis/GROUP/VERSION/... are forwarded)");
            return Err(HttpError::HttpRequestDenied);
        };
        if !access.allows(&asked) {
            tracing::warn!(plugin = %self.plugin, request = %asked, %path,
                "Kubernetes API request refused: the plugin's `kubernetes` grant does not allow it");
            return Err(HttpError::HttpRequestDenied);
        }
        let permit = place(&self.in_flight)
            .await
            .map_err(|_| HttpError::ConnectionLimitReached)?;
        let limits = self.policy.limits;
        // The host's credentials only: nothing of the guest's that could
        // authenticate, impersonate or forge the term.
        let headers = &mut parts.headers;
        let dropped: Vec<HeaderName> = headers
            .keys()
            .filter(|k| {
                let k = k.as_str();
                k == "authorization"
                    || k == "host"
                    || k.starts_with("impersonate-")
                    || k.starts_with("baton-")
            })
            .cloned()
            .collect();
        for k in dropped {
            headers.remove(&k);
        }
        if access.grant.term_headers {
            let lease = HeaderValue::from_str(self.term.lease()).map_err(|_| internal("lease name"))?;
            headers.insert(HeaderName::from_static(LEASE_HEADER), lease);
            headers.insert(
                HeaderName::from_static(TERM_HEADER),
                HeaderValue::from(self.term.number()),
            );
        }
        let exchange = async {
            let body = Capped::new(body, limits.request_body, |n| {
                HttpError::HttpRequestBodySize(Some(n))
            })
            .collect()
            .await?
            .to_bytes();
            let client = self.kube_client.get_or_try_init(|| access.client_for(&self.connections)).await.map_err(|e| {
                tracing::warn!(plugin = %self.plugin, error = %e, "Kubernetes API request failed: no client");
                HttpError::ConfigurationError
            })?;
            let target = match &query {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            parts.uri = target.parse().map_err(|_| HttpError::HttpRequestUriInvalid)?;
            let request = http::Request::from_parts(parts, kube::client::Body::from(body.to_vec()));
            client.send(request).await.map_err(|e| {
                tracing::debug!(plugin = %self.plugin, error = %e, "Kubernetes API request failed");
                HttpError::InternalError(Some(format!("the API server could not be reached: {e}")))
            })
        };
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
