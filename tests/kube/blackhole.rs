//! A loopback TCP proxy under the test's control: it forwards between a
//! host and the API server until it is *cut*, then holds every byte in both
//! directions without closing anything (the half-open case: a stalled
//! network path, a dead NAT entry), until it is restored. It records how
//! and when each host's connection ended.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How a host's connection ended: when, and whether by a reset (else by
/// a FIN).
#[derive(Clone, Copy, Debug)]
pub struct End {
    pub at: SystemTime,
    pub reset: bool,
}

pub struct BlackHole {
    pub port: u16,
    cut: Arc<AtomicBool>,
    ends: Arc<Mutex<Vec<End>>>,
}

impl BlackHole {
    /// Forwards 127.0.0.1:`port` to `upstream`.
    pub fn start(upstream: SocketAddr) -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let cut2 = cut.clone();
        let ends = Arc::new(Mutex::new(Vec::new()));
        let ends2 = ends.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for (from, to, ends) in [
                    (
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                        Some(ends2.clone()),
                    ),
                    (server, client, None),
                ] {
                    let cut = cut2.clone();
                    std::thread::spawn(move || pump(from, to, &cut, ends.as_deref()));
                }
            }
        });
        BlackHole { port, cut, ends }
    }

    /// How each host's connection ended, so far.
    pub fn ends(&self) -> Vec<End> {
        self.ends.lock().unwrap().clone()
    }

    /// Cuts (true) or restores (false) every connection, open or new.
    pub fn cut(&self, on: bool) {
        self.cut.store(on, Ordering::SeqCst);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool, ends: Option<&Mutex<Vec<End>>>) {
    let hold = || {
        while cut.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut buf = [0u8; 16 * 1024];
    loop {
        hold();
        let read = from.read(&mut buf);
        if let (Some(ends), Ok(0) | Err(_)) = (ends, &read) {
            let reset = matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
            ends.lock().unwrap().push(End {
                at: SystemTime::now(),
                reset,
            });
        }
        match read {
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
