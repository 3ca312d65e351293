//! Name lookups bounded by the term: `wasi:sockets/ip-name-lookup` and the
//! names of `wasi:http` requests.
//!
//! wasmtime-wasi (and tokio's `lookup_host`) resolve names with
//! `getaddrinfo` on the blocking pool, which nothing can cancel: a lookup
//! started just before the force-stop goes on sending queries for the
//! resolver's whole retry schedule (`resolv.conf`: 5 s, twice, per server).
//! Here a lookup is made by `hickory-resolver` on the host's runtime,
//! configured from the system's `resolv.conf` and hosts file. Its queries
//! are futures of the instance: dropped with the Store at the force-stop
//! (a lookup's task aborts when its resource goes), and each query datagram
//! is sent by one system call in the term's kernel-closed window
//! ([`fence::fenced`]), so none leaves after the force-stop time even when
//! the host was held up between the last check and the send.
//!
//! Invariant: every query goes over UDP through [`FencedUdp`]; name
//! servers reached over TCP are left out (a truncated answer is used as it
//! is), so no query can take a path the window does not cover.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::GenericConnector;
use hickory_resolver::proto::runtime::iocompat::AsyncIoTokioAsStd;
use hickory_resolver::proto::runtime::{RuntimeProvider, TokioHandle, TokioRuntimeProvider, TokioTime};
use hickory_resolver::proto::udp::DnsUdpSocket;
use hickory_resolver::proto::xfer::Protocol;
use hickory_resolver::{Name, Resolver};
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceType};
use wasmtime_wasi::p2::bindings::sockets::network::{ErrorCode, IpAddress};
use wasmtime_wasi::p2::{DynPollable, Network, Pollable, subscribe};
use wasmtime_wasi::runtime::AbortOnDropJoinHandle;

use wasmtime_wasi::WasiView;

use super::SocketsView;
use crate::election::Term;
use crate::runtime::fence;

/// The WASI 0.2 name-lookup interface that [`add_to_linker`] replaces (the
/// version wasmtime-wasi 48 serves; older 0.2 imports are linked to it).
const IP_NAME_LOOKUP: &str = "wasi:sockets/ip-name-lookup@0.2.12";

/// Why a lookup found no address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// Not a name or an address.
    #[error("not a valid name")]
    InvalidName,
    /// The name has no address.
    #[error("the name has no address")]
    NoAddress,
    /// No name server answered in time, or it failed.
    #[error("no name server answered")]
    NoAnswer,
    /// The term ended first.
    #[error("the plugin's term is over")]
    TermOver,
}

impl From<LookupError> for ErrorCode {
    fn from(e: LookupError) -> ErrorCode {
        match e {
            LookupError::InvalidName => ErrorCode::InvalidArgument,
            LookupError::NoAddress => ErrorCode::NameUnresolvable,
            LookupError::NoAnswer => ErrorCode::TemporaryResolverFailure,
            LookupError::TermOver => ErrorCode::PermanentResolverFailure,
        }
    }
}

/// Resolves `name` (an address is returned as it is) for `term`: ends at
/// its force-stop time, and sends no query after it.
pub async fn resolve(term: Arc<Term>, name: &str) -> Result<Vec<IpAddr>, LookupError> {
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    // International names become their ASCII form here.
    let domain = Name::from_utf8(name).map_err(|_| LookupError::InvalidName)?;
    if term.must_stop() {
        return Err(LookupError::TermOver);
    }
    let (config, options) = system_config();
    let provider = GenericConnector::new(FencedRuntime {
        tokio: TokioRuntimeProvider::default(),
        term: term.clone(),
    });
    let resolver = Resolver::builder_with_config(config.clone(), provider)
        .with_options(options.clone())
        .build();
    tokio::select! {
        biased;
        () = term.stop_due() => Err(LookupError::TermOver),
        found = resolver.lookup_ip(domain.clone()) => match found {
            Ok(found) => Ok(found.iter().map(|ip| ip.to_canonical()).collect()),
            Err(e) if e.is_no_records_found() => Err(LookupError::NoAddress),
            Err(e) => {
                tracing::debug!(name = %domain, error = %e, "name lookup failed");
                Err(if term.must_stop() { LookupError::TermOver } else { LookupError::NoAnswer })
            }
        },
    }
}

/// The system's resolver configuration, read once: `resolv.conf` (or the
/// test hook `BATON_TEST_NAME_SERVER`, `address:port`, which replaces its
/// name servers), UDP servers only.
fn system_config() -> &'static (ResolverConfig, ResolverOpts) {
    static CONFIG: OnceLock<(ResolverConfig, ResolverOpts)> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let (read, mut options) = hickory_resolver::system_conf::read_system_conf().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the system's resolver configuration: plugins resolve names from the hosts file only");
            (ResolverConfig::new(), ResolverOpts::default())
        });
        let mut servers: Vec<NameServerConfig> = read
            .name_servers()
            .iter()
            .filter(|s| s.protocol == Protocol::Udp)
            .cloned()
            .collect();
        if let Some(addr) = test_name_server() {
            servers = vec![NameServerConfig::new(addr, Protocol::Udp)];
            options.timeout = Duration::from_millis(200);
            options.attempts = 100;
        }
        let mut config = ResolverConfig::from_parts(read.domain().cloned(), read.search().to_vec(), vec![]);
        for server in servers {
            config.add_name_server(server);
        }
        (config, options)
    })
}

/// The test hook `BATON_TEST_NAME_SERVER`: the one name server lookups
/// ask, with a 200 ms timeout and 100 attempts, so a test can see every
/// query a lookup sends. Read only in a build with the `test-hooks`
/// feature.
fn test_name_server() -> Option<SocketAddr> {
    if !cfg!(feature = "test-hooks") {
        return None;
    }
    let addr = std::env::var("BATON_TEST_NAME_SERVER").ok()?.parse().ok()?;
    tracing::warn!(%addr, "test hook: plugins' name lookups ask only this name server");
    Some(addr)
}

/// hickory's tokio runtime, with UDP sockets whose sends are fenced by the
/// term.
#[derive(Clone)]
struct FencedRuntime {
    tokio: TokioRuntimeProvider,
    term: Arc<Term>,
}

impl RuntimeProvider for FencedRuntime {
    type Handle = TokioHandle;
    type Timer = TokioTime;
    type Udp = FencedUdp;
    type Tcp = AsyncIoTokioAsStd<tokio::net::TcpStream>;

    fn create_handle(&self) -> Self::Handle {
        self.tokio.create_handle()
    }

    /// Never used: only UDP name servers are configured.
    fn connect_tcp(
        &self,
        server: SocketAddr,
        _bind: Option<SocketAddr>,
        _timeout: Option<Duration>,
    ) -> Pin<Box<dyn Send + Future<Output = io::Result<Self::Tcp>>>> {
        Box::pin(async move {
            Err(io::Error::other(format!(
                "no DNS over TCP to {server} from a plugin's term"
            )))
        })
    }

    fn bind_udp(
        &self,
        local: SocketAddr,
        _server: SocketAddr,
    ) -> Pin<Box<dyn Send + Future<Output = io::Result<Self::Udp>>>> {
        let term = self.term.clone();
        Box::pin(async move {
            let socket = tokio::net::UdpSocket::bind(local).await?;
            Ok(FencedUdp { socket, term })
        })
    }
}

/// A UDP socket whose every datagram is sent inside the term's window.
struct FencedUdp {
    socket: tokio::net::UdpSocket,
    term: Arc<Term>,
}

impl DnsUdpSocket for FencedUdp {
    type Time = TokioTime;

    fn poll_recv_from(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<(usize, SocketAddr)>> {
        DnsUdpSocket::poll_recv_from(&self.socket, cx, buf)
    }

    fn poll_send_to(&self, cx: &mut Context<'_>, buf: &[u8], target: SocketAddr) -> Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.socket.poll_send_ready(cx))?;
            let fd = self.socket.as_raw_fd();
            match fence::fenced(&[fd], &self.term, || self.socket.try_send_to(buf, target)) {
                None => return Poll::Ready(Err(io::Error::other("the plugin's term is over"))),
                Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Some(sent) => return Poll::Ready(sent),
            }
        }
    }
}

/// A guest's lookup: its task (aborted when the resource is dropped), then
/// the addresses it found.
pub struct FencedLookup(Lookup);

enum Lookup {
    Waiting(AbortOnDropJoinHandle<Result<Vec<IpAddr>, LookupError>>),
    Done(Result<std::vec::IntoIter<IpAddr>, LookupError>),
}

impl FencedLookup {
    /// Polls the task once without waiting: `false` while it runs.
    fn poll_done(&mut self, cx: &mut Context<'_>) -> bool {
        if let Lookup::Waiting(task) = &mut self.0 {
            match Pin::new(task).poll(cx) {
                Poll::Ready(found) => self.0 = Lookup::Done(found.map(Vec::into_iter)),
                Poll::Pending => return false,
            }
        }
        true
    }
}

#[async_trait::async_trait]
impl Pollable for FencedLookup {
    async fn ready(&mut self) {
        std::future::poll_fn(|cx| {
            if self.poll_done(cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// Replaces wasmtime-wasi's `ip-name-lookup`: `resolve-addresses` starts a
/// [`resolve`] in a task of its own, `resolve-address-stream` is a
/// [`FencedLookup`].
pub fn add_to_linker<T: WasiView + 'static>(
    linker: &mut Linker<T>,
    get: for<'a> fn(&'a mut T) -> SocketsView<'a>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut lookup = linker.instance(IP_NAME_LOOKUP)?;
    lookup.resource(
        "resolve-address-stream",
        ResourceType::host::<FencedLookup>(),
        move |mut store, rep| {
            get(store.data_mut())
                .table
                .delete(Resource::<FencedLookup>::new_own(rep))?;
            Ok(())
        },
    )?;
    lookup.func_wrap(
        "resolve-addresses",
        move |mut store: StoreContextMut<'_, T>, (network, name): (Resource<Network>, String)| {
            let state = get(store.data_mut());
            state.table.get(&network)?;
            if !state.name_lookup {
                return Ok((Err(ErrorCode::PermanentResolverFailure),));
            }
            let term = Arc::clone(state.term);
            let task = wasmtime_wasi::runtime::spawn(async move { resolve(term, &name).await });
            let mut found = FencedLookup(Lookup::Waiting(task));
            // Errors known at once (an invalid name) surface at once.
            if found.poll_done(&mut Context::from_waker(Waker::noop()))
                && let Lookup::Done(Err(e)) = &found.0
            {
                return Ok((Err(ErrorCode::from(*e)),));
            }
            Ok((Ok(state.table.push(found)?),))
        },
    )?;
    lookup.func_wrap(
        "[method]resolve-address-stream.resolve-next-address",
        move |mut store: StoreContextMut<'_, T>, (this,): (Resource<FencedLookup>,)| {
            let state = get(store.data_mut());
            let found = state.table.get_mut(&this)?;
            found.poll_done(&mut Context::from_waker(Waker::noop()));
            let next: Result<Option<IpAddress>, ErrorCode> = match &mut found.0 {
                Lookup::Done(Ok(addrs)) => Ok(addrs.next().map(IpAddress::from)),
                Lookup::Done(Err(e)) => Err(ErrorCode::from(*e)),
                Lookup::Waiting(_) => Err(ErrorCode::WouldBlock),
            };
            Ok((next,))
        },
    )?;
    lookup.func_wrap(
        "[method]resolve-address-stream.subscribe",
        move |mut store: StoreContextMut<'_, T>, (this,): (Resource<FencedLookup>,)| {
            let pollable: Resource<DynPollable> = subscribe(get(store.data_mut()).table, this)?;
            Ok((pollable,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}
