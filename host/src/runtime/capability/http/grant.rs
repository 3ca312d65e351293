//! What a plugin may send over HTTP: its grants (an origin, or a name or
//! address range with a port), the limits of its requests, and the policy
//! made of both with each grant's TLS settings.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use bytesize::ByteSize;
use toml::Spanned;

use super::kubernetes::{self, KubeAccess, RawKubeGrant};
use crate::runtime::capability::unit::{GrantError, GrantSite};

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
/// let err = "https://api.example.com/v1".parse::<HttpGrant>().unwrap_err().to_string();
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

/// How an `http` grant is written, as its errors say.
const FORM: &str = "write SCHEME://HOST[:PORT], for example https://api.example.com, \
                    https://*.example.com, http://127.0.0.1:8080, http://10.0.0.0/8:* or https://[::1]:8443";

/// An `http` grant written wrong; each names the grant as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HttpGrantError {
    /// No `SCHEME://`.
    #[error("{text:?} has no scheme: {FORM}")]
    NoScheme {
        /// The grant as written.
        text: String,
    },
    /// A scheme other than `http` and `https`.
    #[error("{text:?}: scheme {scheme:?} is not http or https: {FORM}")]
    BadScheme {
        /// The grant as written.
        text: String,
        /// The scheme as written.
        scheme: String,
    },
    /// The port is neither a port number nor `*`.
    #[error("{text:?}: port {port:?} is not 1-65535 or *: {FORM}")]
    BadPort {
        /// The grant as written.
        text: String,
        /// The port as written.
        port: String,
    },
    /// A path, query or fragment after the origin.
    #[error("{text:?}: a grant is an origin and names no path (nor a query): {FORM}")]
    NotAnOrigin {
        /// The grant as written.
        text: String,
    },
    /// The host is not a name, an address or a range.
    #[error("{text:?}: {host:?} is not a host name, address or range: {FORM}")]
    BadHost {
        /// The grant as written.
        text: String,
        /// The host as written.
        host: String,
    },
}

impl FromStr for HttpGrant {
    type Err = HttpGrantError;

    fn from_str(text: &str) -> Result<HttpGrant, HttpGrantError> {
        let written = || text.to_owned();
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| HttpGrantError::NoScheme { text: written() })?;
        let https = match scheme {
            "https" => true,
            "http" => false,
            other => {
                return Err(HttpGrantError::BadScheme {
                    text: written(),
                    scheme: other.to_owned(),
                });
            }
        };
        // The port: after the last colon outside brackets.
        let (host, port) = match rest.rfind(':') {
            Some(i) if !rest[i..].contains(']') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        let port =
            match port {
                None => Some(if https { 443 } else { 80 }),
                Some("*") => None,
                Some(p) => Some(p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
                    HttpGrantError::BadPort {
                        text: written(),
                        port: p.to_owned(),
                    }
                })?),
            };
        Ok(HttpGrant {
            https,
            host: grant_host(text, host)?,
            port,
            term_headers: true,
            ca: None,
        })
    }
}

/// The host of the grant `text`, written `host`: an address or a range
/// (IPv6 in brackets), a name, or `*.` and a name.
fn grant_host(text: &str, host: &str) -> Result<GrantHost, HttpGrantError> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(net) = bare.parse::<IpNet>() {
        return Ok(GrantHost::Addresses(net));
    }
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(GrantHost::Addresses(IpNet::from(ip)));
    }
    if host.contains('/') || host.contains('?') || host.contains('#') {
        return Err(HttpGrantError::NotAnOrigin {
            text: text.to_owned(),
        });
    }
    let lower = host.to_ascii_lowercase();
    let (wild, name) = match lower.strip_prefix("*.") {
        Some(name) => (true, name.to_owned()),
        None => (false, lower.clone()),
    };
    if !is_host_name(&name) {
        return Err(HttpGrantError::BadHost {
            text: text.to_owned(),
            host: host.to_owned(),
        });
    }
    Ok(if wild {
        GrantHost::Subdomains(format!(".{name}"))
    } else {
        GrantHost::Name(name)
    })
}

/// Whether `name` is a DNS host name: at most 253 bytes of labels of 1 to
/// 63 letters, digits and hyphens, none at a label's ends.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
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
    pub(super) grants: Arc<[(HttpGrant, Arc<rustls::ClientConfig>)]>,
    pub(super) limits: HttpLimits,
    /// The `kubernetes` grant, if any (see [`kubernetes`](crate::runtime::kubernetes)).
    pub(super) kube: Option<Arc<KubeAccess>>,
    /// Answers instead of the network (a harness's), if any.
    pub(super) stub: Option<Arc<dyn super::stub::HttpStub>>,
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
            .field("stub", &self.stub.is_some())
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
            stub: None,
        }
    }
}

impl HttpPolicy {
    /// Prepares `grants`: reads the CA files they name. The error names
    /// the grant and the file.
    pub fn new(grants: &[HttpGrant], limits: HttpLimits) -> Result<HttpPolicy, HttpPolicyError> {
        let mut prepared = Vec::new();
        for grant in grants {
            let tls = tls_config(grant.ca.as_deref()).map_err(|reason| HttpPolicyError {
                grant: grant.to_string(),
                reason,
            })?;
            prepared.push((grant.clone(), tls));
        }
        Ok(HttpPolicy {
            grants: Arc::from(prepared),
            limits,
            kube: None,
            stub: None,
        })
    }

    /// The policy with `stub` answering every granted request instead of
    /// the network, and `origins` granted besides its own grants.
    pub fn with_stub(
        self,
        stub: Arc<dyn super::stub::HttpStub>,
        origins: &[HttpGrant],
    ) -> Result<HttpPolicy, HttpPolicyError> {
        let mut grants: Vec<HttpGrant> = self.grants().cloned().collect();
        grants.extend(
            origins
                .iter()
                .filter(|o| !grants.contains(o))
                .cloned()
                .collect::<Vec<_>>(),
        );
        let mut policy = HttpPolicy::new(&grants, self.limits)?;
        policy.kube = self.kube;
        policy.stub = Some(stub);
        Ok(policy)
    }

    /// Adds a `kubernetes` grant: requests to `http://kubernetes.baton` go
    /// to the API server through the host (see [`kubernetes`](crate::runtime::kubernetes)).
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

/// A grant whose TLS settings cannot be made; names the grant.
#[derive(Debug, thiserror::Error)]
#[error("http grant {grant}: {reason}")]
pub struct HttpPolicyError {
    /// The grant, as written.
    pub grant: String,
    /// Why its TLS settings cannot be made.
    pub reason: TlsConfigError,
}

/// Why a grant's TLS settings cannot be made: its CA file, or rustls.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// The CA file cannot be read.
    #[error("cannot read the CA file {}: {error}", path.display())]
    Unreadable {
        /// The CA file.
        path: PathBuf,
        /// What reading it said.
        error: rustls::pki_types::pem::Error,
    },
    /// The CA file holds something other than PEM certificates.
    #[error("the CA file {} is not PEM certificates: {error}", path.display())]
    NotPem {
        /// The CA file.
        path: PathBuf,
        /// What parsing it said.
        error: rustls::pki_types::pem::Error,
    },
    /// The CA file holds no certificate.
    #[error("the CA file {} holds no certificate", path.display())]
    NoCertificate {
        /// The CA file.
        path: PathBuf,
    },
    /// A certificate of the CA file is refused as a root.
    #[error("the CA file {}: {error}", path.display())]
    Refused {
        /// The CA file.
        path: PathBuf,
        /// What rustls said.
        error: rustls::Error,
    },
    /// rustls refused the settings.
    #[error("TLS: {0}")]
    Tls(rustls::Error),
}

/// TLS settings: the bundled web roots plus the certificates in `ca`.
fn tls_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsConfigError> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.into(),
    };
    if let Some(ca) = ca {
        use rustls::pki_types::pem::PemObject;
        let path = || ca.to_owned();
        let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(ca)
            .map_err(|error| TlsConfigError::Unreadable { path: path(), error })?
            .collect::<Result<_, _>>()
            .map_err(|error| TlsConfigError::NotPem { path: path(), error })?;
        if certs.is_empty() {
            return Err(TlsConfigError::NoCertificate { path: path() });
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|error| TlsConfigError::Refused { path: path(), error })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Whether `ip` is an address of the host's own or a private network,
/// which a grant by name never reaches.
///
/// ```
/// use baton::runtime::capability::http::is_internal;
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
/// An `http` grant, as written: an origin, or a table with options.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub enum RawHttpGrant {
    /// `"https://api.example.com"`.
    Origin(String),
    /// `{ url = "…", ca = "…", term-headers = false }`.
    Table(RawHttpGrantTable),
}

/// An `http` grant's table, as written.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RawHttpGrantTable {
    url: String,
    ca: Option<PathBuf>,
    term_headers: Option<bool>,
}

/// `http-limits`, as written.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RawHttpLimits {
    concurrent: Option<usize>,
    request_body: Option<ByteSize>,
    response_body: Option<ByteSize>,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
}

crate::raw_keys! {
    /// `http`, `http-limits` and `kubernetes`.
    pub struct RawHttp {
        grants: Vec<Spanned<RawHttpGrant>> = "http",
        limits: RawHttpLimits = "http-limits",
        kubernetes: RawKubeGrant = "kubernetes",
    }
}

impl RawHttp {
    /// The policy: each grant parsed (an error points at it), the limits
    /// defaulted and able to let a request through, the Kubernetes grant.
    pub fn policy(self, site: &GrantSite<'_>) -> Result<HttpPolicy, GrantError> {
        let mut grants = Vec::new();
        for grant in self.grants.unwrap_or_default() {
            let at = grant.span().start;
            let field_err = |e: HttpGrantError| site.error("http", e).at(at);
            let parsed = match grant.into_inner() {
                RawHttpGrant::Origin(url) => url.parse::<HttpGrant>().map_err(field_err)?,
                RawHttpGrant::Table(t) => {
                    let mut g = t.url.parse::<HttpGrant>().map_err(field_err)?;
                    g.ca = t.ca.as_deref().map(|ca| site.resolve(ca));
                    g.term_headers = t.term_headers.unwrap_or(true);
                    g
                }
            };
            grants.push(parsed);
        }
        let limits = limits(self.limits, site)?;
        let http = HttpPolicy::new(&grants, limits).map_err(|e| site.error("http", e))?;
        match self.kubernetes {
            Some(k) => Ok(http.with_kubernetes(k.grant(site)?)),
            None => Ok(http),
        }
    }
}

/// `http-limits`, each field defaulted.
fn limits(raw: Option<RawHttpLimits>, site: &GrantSite<'_>) -> Result<HttpLimits, GrantError> {
    let defaults = HttpLimits::default();
    let limits = match raw {
        None => defaults,
        Some(l) => HttpLimits {
            concurrent: l.concurrent.unwrap_or(defaults.concurrent),
            request_body: l.request_body.map_or(defaults.request_body, |b| b.as_u64()),
            response_body: l.response_body.map_or(defaults.response_body, |b| b.as_u64()),
            timeout: l.timeout.unwrap_or(defaults.timeout),
        },
    };
    if limits.concurrent == 0 || limits.timeout.is_zero() {
        return Err(site.error(
            "http-limits",
            "`concurrent` and `timeout` must be above zero (to refuse every request, grant no `http`)",
        ));
    }
    Ok(limits)
}
