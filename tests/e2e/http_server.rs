//! A small HTTP/1.1 server for tests, on loopback: it records every
//! request (method, path, headers, body size) in the order its connection
//! was opened and, for `/hang`, when the client gave up the connection. Used by the end-to-end HTTP tests and the
//! polyglot tests of the `baton new` templates.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// One request a test server received.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The connection's place in the order they were accepted: the kernel
    /// queues connections in the order their handshakes completed, so this
    /// is the order the clients connected in, whichever thread ran first.
    pub accepted: usize,
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: usize,
    /// When the client closed the connection (for `/hang`, which never
    /// answers).
    pub closed: Option<SystemTime>,
}

/// An HTTP/1.1 server on loopback: `/hello` answers `hello`, `/big`
/// answers 2 MiB, `/hang` never answers and records when the client gives
/// up the connection. Every request is recorded; [`Server::seen`] lists
/// them in the order their connections were opened.
pub struct Server {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    pub fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        std::thread::spawn(move || {
            for (accepted, conn) in listener.incoming().enumerate() {
                let Ok(conn) = conn else { return };
                let log = log.clone();
                std::thread::spawn(move || serve(accepted, conn, &log));
            }
        });
        Server { addr, seen }
    }

    /// The requests so far, in the order their connections were opened
    /// (not the order their threads read them, which load can change).
    pub fn seen(&self) -> Vec<Seen> {
        let mut seen = self.seen.lock().unwrap().clone();
        seen.sort_by_key(|s| s.accepted);
        seen
    }
}

fn serve(accepted: usize, conn: TcpStream, log: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 {
            return;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    // The body: by length or chunked; a body cut off counts what came.
    let mut body = 0usize;
    if let Some(n) = headers
        .get("content-length")
        .and_then(|n| n.parse::<usize>().ok())
    {
        let mut buf = vec![0u8; n];
        body = read_up_to(&mut reader, &mut buf);
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        loop {
            let mut size = String::new();
            if reader.read_line(&mut size).unwrap_or(0) == 0 {
                break;
            }
            let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
                break;
            };
            let mut buf = vec![0u8; n + 2];
            let got = read_up_to(&mut reader, &mut buf);
            body += got.min(n);
            if n == 0 || got < n + 2 {
                break;
            }
        }
    }
    let index = {
        let mut log = log.lock().unwrap();
        log.push(Seen {
            accepted,
            method,
            path: path.clone(),
            headers,
            body,
            closed: None,
        });
        log.len() - 1
    };
    let mut conn = conn;
    match path.as_str() {
        "/hang" => {
            // Never answer; wait for the client to give up.
            let mut sink = [0u8; 1024];
            while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
            log.lock().unwrap()[index].closed = Some(SystemTime::now());
        }
        "/big" => {
            let big = vec![b'b'; 2 << 20];
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                big.len()
            );
            let _ = conn.write_all(&big);
        }
        _ => {
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello");
        }
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    got
}
