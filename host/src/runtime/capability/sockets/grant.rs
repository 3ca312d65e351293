//! Network grants: the outbound TCP connections a plugin may make.
//!
//! A plugin has no network unless its configuration grants it. A grant is
//! an address range and a port (or any port) the plugin may *connect* to
//! over TCP through `wasi:sockets`; listening, accepting and UDP stay
//! refused. Name lookups (`wasi:sockets/ip-name-lookup`) are a separate
//! grant: resolving a name opens no connection, but the query reaches the
//! host's resolver and whatever it forwards to, so a plugin that may look up
//! names can send data out in the names it asks for, with or without an
//! address grant. Grant it only to plugins trusted that far.
//!
//! A wide range is as wide as it looks: `0.0.0.0/0` includes the host's
//! loopback services and link-local addresses such as a cloud's metadata
//! endpoint (169.254.169.254).
//!
//! The grant covers the WASI 0.2 and 0.3 sockets interfaces alike:
//! wasmtime-wasi checks both against the same context.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::sockets::SocketAddrUse;

/// An address range and port a plugin may connect to.
///
/// Written `ADDRESS:PORT`, where `ADDRESS` is an IP address or a CIDR range
/// (IPv6 in brackets) and `PORT` a port number or `*` for any port:
///
/// ```
/// use baton::runtime::ConnectGrant;
///
/// let db: ConnectGrant = "10.0.0.0/8:5432".parse().unwrap();
/// assert!(db.allows("10.1.2.3:5432".parse().unwrap()));
/// assert!(!db.allows("10.1.2.3:22".parse().unwrap()));
/// assert!(!db.allows("192.168.0.1:5432".parse().unwrap()));
///
/// let local: ConnectGrant = "[::1]:*".parse().unwrap();
/// assert!(local.allows("[::1]:8080".parse().unwrap()));
///
/// let err = "db.internal:5432".parse::<ConnectGrant>().unwrap_err().to_string();
/// assert!(err.contains("not an IP address or CIDR range"), "{err}");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectGrant {
    /// The addresses.
    pub net: IpNet,
    /// The port; `None`: any port.
    pub port: Option<u16>,
}

impl ConnectGrant {
    /// Whether a connection to `addr` is granted.
    pub fn allows(&self, addr: SocketAddr) -> bool {
        self.net.contains(&addr.ip()) && self.port.is_none_or(|p| p == addr.port())
    }
}

/// How a `connect` grant is written, as its errors say.
const FORM: &str = "write ADDRESS:PORT, for example 10.0.0.5:5432, 10.0.0.0/8:443, [::1]:8080 or 127.0.0.1:*";

/// A `connect` grant written wrong; each names the grant as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConnectGrantError {
    /// No `:PORT`.
    #[error("{text:?} has no port: {FORM}")]
    NoPort {
        /// The grant as written.
        text: String,
    },
    /// The port is neither a port number nor `*`.
    #[error("{text:?}: port {port:?} is not 1-65535 or *: {FORM}")]
    BadPort {
        /// The grant as written.
        text: String,
        /// The port as written.
        port: String,
    },
    /// An IPv6 address or range without brackets.
    #[error("{text:?}: an IPv6 address or range goes in brackets, before the port: {FORM}")]
    Unbracketed {
        /// The grant as written.
        text: String,
    },
    /// Not an address or a range (a name, say).
    #[error(
        "{text:?}: {address:?} is not an IP address or CIDR range (names are not granted; \
         grant the addresses they resolve to, and `name-lookup` to resolve them): {FORM}"
    )]
    NotAnAddress {
        /// The grant as written.
        text: String,
        /// The address part as written.
        address: String,
    },
    /// A range with bits set after its prefix.
    #[error(
        "{text:?}: the range {address} has bits set after its prefix; write {fixed} (the \
         same addresses) or the single address without a prefix"
    )]
    BitsAfterPrefix {
        /// The grant as written.
        text: String,
        /// The range as written.
        address: String,
        /// The same addresses, written right.
        fixed: String,
    },
    /// The unspecified address (`0.0.0.0`, `::`), which no connection reaches.
    #[error(
        "{text:?}: the unspecified address cannot be connected to; to grant every address \
         write 0.0.0.0/0 or [::/0]"
    )]
    Unspecified {
        /// The grant as written.
        text: String,
    },
}

impl FromStr for ConnectGrant {
    type Err = ConnectGrantError;

    fn from_str(text: &str) -> Result<ConnectGrant, ConnectGrantError> {
        let written = || text.to_owned();
        let (address, port) = text
            .rsplit_once(':')
            .ok_or_else(|| ConnectGrantError::NoPort { text: written() })?;
        let port =
            match port {
                "*" => None,
                p => Some(p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
                    ConnectGrantError::BadPort {
                        text: written(),
                        port: p.to_owned(),
                    }
                })?),
            };
        let bracketed = address.strip_prefix('[').and_then(|a| a.strip_suffix(']'));
        if bracketed.is_none() && address.contains(':') {
            return Err(ConnectGrantError::Unbracketed { text: written() });
        }
        let address = bracketed.unwrap_or(address);
        let net = address
            .parse::<IpNet>()
            .or_else(|_| address.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| ConnectGrantError::NotAnAddress {
                text: written(),
                address: address.to_owned(),
            })?;
        if net != net.trunc() {
            let fixed = match net.trunc() {
                IpNet::V6(n) => format!("[{n}]"),
                IpNet::V4(n) => n.to_string(),
            };
            return Err(ConnectGrantError::BitsAfterPrefix {
                text: written(),
                address: address.to_owned(),
                fixed,
            });
        }
        if net.prefix_len() == net.max_prefix_len() && net.addr().is_unspecified() {
            return Err(ConnectGrantError::Unspecified { text: written() });
        }
        Ok(ConnectGrant { net, port })
    }
}

impl fmt::Display for ConnectGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One address prints as itself, a range with its prefix length.
        let net = if self.net.prefix_len() == self.net.max_prefix_len() {
            self.net.addr().to_string()
        } else {
            self.net.to_string()
        };
        let net = match self.net {
            IpNet::V6(_) => format!("[{net}]"),
            IpNet::V4(_) => net,
        };
        match self.port {
            Some(p) => write!(f, "{net}:{p}"),
            None => write!(f, "{net}:*"),
        }
    }
}

/// What a plugin may do on the network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkGrant {
    /// Where it may connect over TCP; empty: nowhere.
    pub connect: Vec<ConnectGrant>,
    /// Whether it may resolve names.
    pub name_lookup: bool,
}

impl NetworkGrant {
    /// Applies the grant to a WASI context (which starts with no network).
    pub fn add_to_wasi(&self, wasi: &mut WasiCtxBuilder) {
        wasi.allow_ip_name_lookup(self.name_lookup);
        if self.connect.is_empty() {
            return;
        }
        wasi.allow_tcp(true);
        let grants: Arc<[ConnectGrant]> = self.connect.clone().into();
        wasi.socket_addr_check(move |addr, usage| {
            let allowed = match usage {
                SocketAddrUse::TcpConnect => grants.iter().any(|g| g.allows(addr)),
                // The implicit bind of a connecting socket: any local
                // address and port, chosen by the system. An explicit bind
                // to a chosen address or port is a server's first step.
                SocketAddrUse::TcpBind => addr.ip().is_unspecified() && addr.port() == 0,
                _ => false,
            };
            Box::pin(async move { allowed })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_parse_and_print_back() {
        for text in [
            "10.0.0.5:5432",
            "10.0.0.0/8:443",
            "[::1]:8080",
            "127.0.0.1:*",
            "[fd00::/8]:*",
            "0.0.0.0/0:443",
            "[::/0]:*",
        ] {
            let grant: ConnectGrant = text.parse().unwrap();
            let printed = grant.to_string();
            assert_eq!(printed, text);
            assert_eq!(printed.parse::<ConnectGrant>().unwrap(), grant);
        }
    }

    #[test]
    fn bad_grants_say_what_is_wrong() {
        for (text, says) in [
            ("10.0.0.5", "has no port"),
            ("10.0.0.5:0", "port \"0\" is not 1-65535"),
            ("10.0.0.5:http", "port \"http\" is not"),
            ("db:5432", "not an IP address or CIDR range"),
            ("10.0.0.0/33:1", "not an IP address or CIDR range"),
            ("10.0.0.5/8:5432", "write 10.0.0.0/8 "),
            ("[2001:db8::1/32]:443", "write [2001:db8::/32] "),
            ("2001:db8::5432", "goes in brackets"),
            ("::1:80", "goes in brackets"),
            ("0.0.0.0:80", "unspecified address"),
            ("[::]:*", "unspecified address"),
        ] {
            let err = text.parse::<ConnectGrant>().unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_grant_allows_its_range_and_port_only() {
        let g: ConnectGrant = "192.168.1.0/24:443".parse().unwrap();
        assert!(g.allows("192.168.1.200:443".parse().unwrap()));
        assert!(!g.allows("192.168.2.1:443".parse().unwrap()));
        assert!(!g.allows("192.168.1.1:80".parse().unwrap()));
        assert!(!g.allows("[::ffff:192.168.1.1]:443".parse().unwrap()));
    }
}
