//! A loopback TCP proxy under the test's control: it forwards between a
//! host and the API server until it is *cut*, then holds every byte in both
//! directions without closing anything (the half-open case: a stalled
//! network path, a dead NAT entry), until it is restored.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub struct BlackHole {
    pub port: u16,
    cut: Arc<AtomicBool>,
}

impl BlackHole {
    /// Forwards 127.0.0.1:`port` to `upstream`.
    pub fn start(upstream: SocketAddr) -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let cut2 = cut.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let cut = cut2.clone();
                    std::thread::spawn(move || pump(from, to, &cut));
                }
            }
        });
        BlackHole { port, cut }
    }

    /// Cuts (true) or restores (false) every connection, open or new.
    pub fn cut(&self, on: bool) {
        self.cut.store(on, Ordering::SeqCst);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool) {
    let hold = || {
        while cut.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut buf = [0u8; 16 * 1024];
    loop {
        hold();
        match from.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                hold();
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
