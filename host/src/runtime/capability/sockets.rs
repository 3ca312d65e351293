//! Sockets: `wasi:sockets` under the plugin's `connect` and `name-lookup`
//! grants, with the send buffer of its `send-buffer`.
//!
//! - `grant`: where a plugin may connect ([`NetworkGrant`]), checked by
//!   WASI's socket address check.
//! - here: `tcp-socket.finish-connect` registers each connection with the
//!   instance's [`Connections`] (reset at the force-stop) and
//!   `set-send-buffer-size` is capped at the plugin's `send-buffer`.
//! - [`lookup`]: name lookups that end at the force-stop and send no query
//!   after it.

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::sockets::network::ErrorCode;
use wasmtime_wasi::p2::bindings::sockets::tcp::HostTcpSocket;
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, TcpSocket};
use wasmtime_wasi::sockets::WasiSocketsCtxView;
use wasmtime_wasi::{WasiCtx, WasiView};

use bytesize::ByteSize;
use toml::Spanned;

use super::unit::{Capability, GrantError, GrantSite, LoadContext, Setup, SetupError, Shared};
use crate::runtime::fence::connections::{Connections, DEFAULT_SEND_BUFFER};
use crate::runtime::store_term::StoreTerm;
use crate::runtime::world::World;

mod grant;
pub mod lookup;

pub use grant::{ConnectGrant, ConnectGrantError, NetworkGrant};

/// The capability.
pub struct Sockets;

/// What a plugin's table grants of sockets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketsGrant {
    /// Where it may connect, and whether it may resolve names.
    pub network: NetworkGrant,
    /// The send buffer of each of its TCP connections (`SO_SNDBUF`), in
    /// bytes: what one may still deliver if the host is paused or killed
    /// across its force-stop.
    pub send_buffer: u64,
}

impl Default for SocketsGrant {
    /// Nowhere, no lookups, 64 KiB.
    fn default() -> SocketsGrant {
        SocketsGrant {
            network: NetworkGrant::default(),
            send_buffer: DEFAULT_SEND_BUFFER,
        }
    }
}

crate::raw_keys! {
    /// `connect`, `name-lookup` and `send-buffer`.
    pub struct RawSockets {
        connect: Vec<Spanned<String>> = "connect",
        name_lookup: bool = "name-lookup",
        send_buffer: ByteSize = "send-buffer",
    }
}

/// What its host functions see of a Store.
pub struct SocketsView<'a> {
    wasi: &'a mut WasiCtx,
    pub(crate) table: &'a mut ResourceTable,
    pub(crate) term: &'a StoreTerm,
    connections: &'a Connections,
    /// Whether it may resolve names (its `name-lookup` grant).
    pub(crate) name_lookup: bool,
}

impl SocketsView<'_> {
    /// wasmtime-wasi's view of the instance's sockets.
    fn sockets(&mut self) -> WasiSocketsCtxView<'_> {
        WasiSocketsCtxView {
            ctx: self.wasi.sockets(),
            table: self.table,
        }
    }
}

impl Capability for Sockets {
    type Raw = RawSockets;
    type Grant = SocketsGrant;
    type Plugin = SocketsGrant;
    /// Whether it may resolve names.
    type Ctx = bool;
    type View<'a> = SocketsView<'a>;

    /// Each `connect` entry parsed (an error points at it); `send-buffer`
    /// between 4 KiB and 64 MiB.
    fn grant(raw: RawSockets, site: &GrantSite<'_>) -> Result<SocketsGrant, GrantError> {
        let mut connect = Vec::new();
        for entry in raw.connect.unwrap_or_default() {
            let at = entry.span().start;
            let parsed = entry.get_ref().parse::<ConnectGrant>();
            connect.push(parsed.map_err(|e| site.error("connect", e).at(at))?);
        }
        let send_buffer = raw.send_buffer.map_or(DEFAULT_SEND_BUFFER, |b| b.as_u64());
        if !(4 << 10..=64 << 20).contains(&send_buffer) {
            return Err(site.error(
                "send-buffer",
                format!(
                    "{} is not between 4 KiB and 64 MiB (what each TCP connection may queue in the kernel)",
                    ByteSize::b(send_buffer)
                ),
            ));
        }
        let name_lookup = raw.name_lookup.unwrap_or(false);
        Ok(SocketsGrant {
            network: NetworkGrant { connect, name_lookup },
            send_buffer,
        })
    }

    fn load(grant: &SocketsGrant, _: &LoadContext<'_>) -> Result<SocketsGrant, String> {
        Ok(grant.clone())
    }

    fn prepare(grant: &SocketsGrant, setup: &mut Setup<'_>) -> Result<bool, SetupError> {
        grant.network.add_to_wasi(setup.wasi);
        setup.connections.set_send_buffer(grant.send_buffer);
        Ok(grant.network.name_lookup)
    }

    fn view<'a>(name_lookup: &'a mut bool, shared: Shared<'a>) -> SocketsView<'a> {
        SocketsView {
            wasi: shared.wasi,
            table: shared.table,
            term: shared.term,
            connections: shared.connections,
            name_lookup: *name_lookup,
        }
    }

    fn add_to_linker<T: WasiView + 'static>(
        linker: &mut Linker<T>,
        _: World,
        get: for<'a> fn(&'a mut T) -> SocketsView<'a>,
    ) -> wasmtime::Result<()> {
        add_tcp_to_linker(linker, get)?;
        lookup::add_to_linker(linker, get)
    }

    fn describe(grant: &SocketsGrant) -> Vec<String> {
        let mut parts = Vec::new();
        if !grant.network.connect.is_empty() {
            let to: Vec<String> = grant.network.connect.iter().map(|g| g.to_string()).collect();
            parts.push(format!("connect {}", to.join(",")));
        }
        if grant.network.name_lookup {
            parts.push("name-lookup".into());
        }
        parts
    }
}

/// The WASI 0.2 TCP interface that [`Sockets`] overrides (the
/// version wasmtime-wasi 48 serves; older 0.2 imports are linked to it).
const SOCKETS_TCP: &str = "wasi:sockets/tcp@0.2.12";

type Streams = (Resource<DynInputStream>, Resource<DynOutputStream>);

/// Replaces `tcp-socket.finish-connect` (the connection is registered in
/// the instance's [`Connections`]) and `tcp-socket.set-send-buffer-size`
/// (a guest's own size is capped at the plugin's `send-buffer`).
fn add_tcp_to_linker<T: WasiView + 'static>(
    linker: &mut Linker<T>,
    get: for<'a> fn(&'a mut T) -> SocketsView<'a>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut tcp = linker.instance(SOCKETS_TCP)?;
    tcp.func_wrap(
        "[method]tcp-socket.finish-connect",
        move |mut store: StoreContextMut<'_, T>, (this,): (Resource<TcpSocket>,)| {
            let mut state = get(store.data_mut());
            let rep = this.rep();
            let mut view = state.sockets();
            let streams: Result<Streams, ErrorCode> = match HostTcpSocket::finish_connect(&mut view, this) {
                Ok(streams) => Ok(streams),
                Err(e) => Err(e.downcast()?),
            };
            if streams.is_ok() {
                let local = HostTcpSocket::local_address(&mut view, Resource::new_borrow(rep));
                let remote = HostTcpSocket::remote_address(&mut view, Resource::new_borrow(rep));
                if let (Ok(local), Ok(remote)) = (local, remote) {
                    state.connections.add_by_address(local.into(), remote.into());
                }
            }
            Ok((streams,))
        },
    )?;
    tcp.func_wrap(
        "[method]tcp-socket.set-send-buffer-size",
        move |mut store: StoreContextMut<'_, T>, (this, value): (Resource<TcpSocket>, u64)| {
            let mut state = get(store.data_mut());
            let value = value.min(state.connections.send_buffer());
            let done: Result<(), ErrorCode> =
                match HostTcpSocket::set_send_buffer_size(&mut state.sockets(), this, value) {
                    Ok(()) => Ok(()),
                    Err(e) => Err(e.downcast()?),
                };
            Ok((done,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}
