//! An instance's TCP connections: a bounded send queue each, and none of
//! them left open past the force-stop (Linux).
//!
//! Every TCP connection of an instance, a `wasi:sockets` one or a
//! `wasi:http` request's, is registered here once connected: its send
//! buffer is set to the plugin's `send-buffer` (`SO_SNDBUF`, which also
//! stops the kernel from growing it), and at the term's force-stop time it
//! is reset, whoever still holds its descriptor: `SO_LINGER` 0, then a
//! disconnect (`connect` to `AF_UNSPEC`), so the kernel drops what is
//! still queued and sends the peer a RST instead of the queue and a FIN.
//! Without this, a closed socket's queue leaves in order after the
//! instance is gone, seconds after the force-stop to a slow reader.
//!
//! A connection is known by its descriptor and its socket's inode, checked
//! on a descriptor of our own (`dup`) before it is touched, so a
//! descriptor number the guest closed and the process reused is left
//! alone. What the bound cannot cover (the process paused or killed across
//! the force-stop) is in `docs/fencing.md`.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::runtime::store_term::StoreTerm;

/// The default `send-buffer`: 64 KiB.
pub const DEFAULT_SEND_BUFFER: u64 = 64 << 10;

/// The TCP connections of one instance (cheap to clone: shared).
#[derive(Clone)]
pub struct Connections {
    inner: Arc<Inner>,
}

struct Inner {
    plugin: Arc<str>,
    term: StoreTerm,
    send_buffer: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    live: Vec<Socket>,
    /// The force-stop reset them: a connection added later is reset at once.
    reset: bool,
    /// A task resets them at the force-stop time.
    watched: bool,
}

#[derive(Clone, Copy, Debug)]
struct Socket {
    fd: RawFd,
    ino: u64,
}

impl Connections {
    /// The connections of an instance of `plugin` in `term`, each with a
    /// send buffer of `send_buffer` bytes (until [`set_send_buffer`](Self::set_send_buffer)).
    pub fn new(plugin: Arc<str>, term: StoreTerm, send_buffer: u64) -> Connections {
        Connections {
            inner: Arc::new(Inner {
                plugin,
                term,
                send_buffer: AtomicU64::new(send_buffer),
                state: Mutex::default(),
            }),
        }
    }

    /// The send buffer each connection gets.
    pub fn send_buffer(&self) -> u64 {
        self.inner.send_buffer.load(Ordering::Relaxed)
    }

    /// Sets the send buffer of the connections registered from now on
    /// (the plugin's `send-buffer`, as its instance is made).
    pub fn set_send_buffer(&self, bytes: u64) {
        self.inner.send_buffer.store(bytes, Ordering::Relaxed);
    }

    /// Registers the connected TCP socket `fd`: its send buffer is bounded
    /// now, and it is reset at the force-stop time.
    pub fn add(&self, fd: RawFd) {
        let Some(ino) = inode(fd) else { return };
        let bytes = libc::c_int::try_from(self.send_buffer()).unwrap_or(libc::c_int::MAX);
        if let Err(e) = set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes) {
            tracing::warn!(plugin = %self.inner.plugin, error = %e, "cannot bound a connection's send buffer");
        }
        let socket = Socket { fd, ino };
        let mut state = self.lock();
        if state.reset || self.inner.term.must_stop() {
            drop(state);
            reset(socket);
            return;
        }
        // Forget those closed since (a long term opens many).
        state.live.retain(|s| inode(s.fd) == Some(s.ino));
        state.live.push(socket);
        if !state.watched {
            state.watched = true;
            let this = self.clone();
            let watch = async move {
                this.inner.term.stop_due().await;
                this.reset_all();
            };
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(watch);
            }
        }
    }

    /// Registers the connected socket of a `wasi:sockets` TCP socket, found
    /// among the process's descriptors by its two addresses.
    pub fn add_by_address(&self, local: SocketAddr, remote: SocketAddr) {
        match find(local, remote) {
            Some(fd) => self.add(fd),
            None => tracing::warn!(plugin = %self.inner.plugin, %local, %remote,
                "cannot find a new connection's socket: it is neither bounded nor reset at the force-stop"),
        }
    }

    /// Resets every connection still open (at the force-stop time; more
    /// calls do nothing more), and any added later.
    pub fn reset_all(&self) {
        let live = {
            let mut state = self.lock();
            state.reset = true;
            std::mem::take(&mut state.live)
        };
        let mut n = 0;
        for s in live {
            n += usize::from(reset(s));
        }
        if n > 0 {
            tracing::info!(plugin = %self.inner.plugin, term = self.inner.term.number(), connections = n,
                "connections reset at the force-stop time (what they still queued is dropped)");
        }
    }

    /// The instance is gone: at or after the force-stop time its
    /// connections are reset now (before its resources close them in
    /// order).
    pub fn instance_ended(&self) {
        if self.inner.term.must_stop() {
            self.reset_all();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The inode of socket `fd`, if it is a socket.
fn inode(fd: RawFd) -> Option<u64> {
    // SAFETY: fstat(2) into a zeroed stat.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFSOCK).then_some(st.st_ino)
    }
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt(2) with an int that outlives the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Resets `s` if its descriptor still names its socket; whether it did.
fn reset(s: Socket) -> bool {
    // SAFETY: a descriptor of our own on whatever `s.fd` names now, checked
    // before use and closed after; setsockopt(2) and connect(2) on it.
    unsafe {
        let own = libc::fcntl(s.fd, libc::F_DUPFD_CLOEXEC, 0);
        if own < 0 {
            return false;
        }
        let ours = inode(own) == Some(s.ino);
        if ours {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            libc::setsockopt(
                own,
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
            // A disconnect: the queue is dropped and the peer sent a RST
            // now, while the owner still holds its descriptor.
            let mut unspec: libc::sockaddr = std::mem::zeroed();
            unspec.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
            libc::connect(
                own,
                &unspec,
                std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
            );
        }
        libc::close(own);
        ours
    }
}

/// The address of `fd`'s own end (`peer`: the other end).
fn address(fd: RawFd, peer: bool) -> Option<SocketAddr> {
    // SAFETY: getsockname(2)/getpeername(2) into a sockaddr_storage of the
    // length given; read back only as the family it says.
    unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let p = (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
        let r = if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        };
        if r != 0 {
            return None;
        }
        match storage.ss_family as libc::c_int {
            libc::AF_INET => {
                let a = &*(p as *const libc::sockaddr_in);
                Some(SocketAddr::from((
                    u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let a = &*(p as *const libc::sockaddr_in6);
                Some(SocketAddr::from((a.sin6_addr.s6_addr, u16::from_be(a.sin6_port))))
            }
            _ => None,
        }
    }
}

/// The descriptor of the connection from `local` to `remote` (unique while
/// it is open).
fn find(local: SocketAddr, remote: SocketAddr) -> Option<RawFd> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
        .find(|&fd| {
            inode(fd).is_some() && address(fd, true) == Some(remote) && address(fd, false) == Some(local)
        })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use super::*;
    use crate::election::{Term, TermClock};

    #[test]
    fn a_reset_drops_the_queue_and_the_peer_sees_a_reset() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let (mut peer, _) = server.accept().unwrap();
        let clock = TermClock::system();
        let term = Term::begin(
            "l",
            1,
            Duration::ZERO,
            clock.clone(),
            clock.now() + Duration::from_secs(60),
        );
        let conns = Connections::new("p".into(), StoreTerm::of(term), 16 << 10);
        assert_eq!(
            find(client.local_addr().unwrap(), client.peer_addr().unwrap()),
            Some(client.as_raw_fd())
        );
        conns.add_by_address(client.local_addr().unwrap(), client.peer_addr().unwrap());
        client.set_nonblocking(true).unwrap();
        let mut queued = 0;
        while let Ok(n) = client.write(&[7u8; 4096]) {
            queued += n;
        }
        // Bounded: the peer's receive buffer and twice the send buffer.
        assert!(queued < 8 << 20, "{queued}");
        conns.reset_all();
        drop(client);
        let mut got = 0;
        let mut buf = [0u8; 65536];
        let end = loop {
            match peer.read(&mut buf) {
                Ok(0) => break "eof",
                Ok(n) => got += n,
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
                    break "reset";
                }
            }
        };
        // (On loopback the queue has mostly moved to the peer's receive
        // buffer already; what matters is the reset instead of a FIN.)
        assert_eq!(end, "reset", "after {got} of {queued} bytes");
    }
}
