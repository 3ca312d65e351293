//! What a plugin may send over HTTP: its grants (an origin, or a name or
//! address range with a port), the limits of its requests, and the policy
//! made of both with each grant's TLS settings.

use super::*;

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
    pub(super) grants: Arc<[(HttpGrant, Arc<rustls::ClientConfig>)]>,
    pub(super) limits: HttpLimits,
    /// The `kubernetes` grant, if any (see [`kubernetes`](crate::runtime::kubernetes)).
    pub(super) kube: Option<Arc<KubeAccess>>,
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
