//! TCP connections across the force-stop: the `probe-pollable` guest in
//! `stream` mode writes 1 KiB term-tagged records back to back over a
//! granted connection to a server run by the test, which reads each
//! connection's first record and then stops reading the connection of the
//! term that is about to end, so the kernel queues what the guest writes.
//! Once the next term's first record has arrived, and two seconds more, the
//! server reads the old connection to its end: what it gets is what was
//! still queued, at the receiver (bounded by its receive buffer) and at
//! the sender (bounded by the plugin's `send-buffer`, twice over, as the
//! kernel sizes it).

use std::io::{ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use crate::support::*;
use crate::witness::force_stop_at;

const SECS: fn(u64) -> Duration = Duration::from_secs;
const RECORD: usize = 1024;
/// The receive buffer the server asks for; the kernel doubles it.
const RECEIVE_BUFFER: libc::c_int = 16 << 10;

/// A connection the server accepted, after its first record.
struct Conn {
    term: u64,
    first_at: SystemTime,
    stream: TcpStream,
}

/// How reading an old connection to its end went.
#[derive(Debug)]
struct Drained {
    bytes: usize,
    terms: std::collections::BTreeSet<u64>,
    reset: bool,
}

fn socket_int(fd: i32, option: libc::c_int) -> libc::c_int {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "getsockopt");
    value
}

/// Listens on loopback with a small receive buffer (inherited by each
/// accepted connection) and hands over each connection once its first
/// record is read.
fn serve() -> (u16, mpsc::Receiver<Conn>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&RECEIVE_BUFFER as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt SO_RCVBUF");
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut first = [0u8; RECORD];
            if stream.read_exact(&mut first).is_err() {
                continue;
            }
            let conn = Conn {
                term: term_of(&first),
                first_at: SystemTime::now(),
                stream,
            };
            if tx.send(conn).is_err() {
                return;
            }
        }
    });
    (port, rx)
}

fn term_of(record: &[u8]) -> u64 {
    let text = std::str::from_utf8(&record[..32]).unwrap_or("");
    let rest = text
        .strip_prefix("term=")
        .unwrap_or_else(|| panic!("not a record: {text:?}"));
    rest[..rest.find(' ').unwrap()].parse().unwrap()
}

/// Reads `stream` until the peer ends it, by FIN or by reset.
fn drain(mut stream: TcpStream) -> Drained {
    stream.set_read_timeout(Some(SECS(10))).unwrap();
    let mut seen = Drained {
        bytes: 0,
        terms: Default::default(),
        reset: false,
    };
    let mut record = [0u8; RECORD];
    let mut filled = 0;
    loop {
        match stream.read(&mut record[filled..]) {
            Ok(0) => return seen,
            Ok(n) => {
                seen.bytes += n;
                filled += n;
                if filled == RECORD {
                    seen.terms.insert(term_of(&record));
                    filled = 0;
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                seen.reset = true;
                return seen;
            }
            Err(e) => panic!("reading the old connection: {e}"),
        }
    }
}

/// Starts two hosts whose `stream` guest writes to the server, the first
/// alone until its guest has connected and filled the kernel's buffers;
/// returns them and the first term's connection, unread since its first
/// record.
fn two_hosts_streaming(s: &Scratch, port: u16, rx: &mpsc::Receiver<Conn>) -> (Host, Host, Conn) {
    let mut text = config(&s.store(), &[]);
    text.push_str(&format!(
        "\n[[plugin]]\nname = \"stream\"\npath = {:?}\nlease = \"demo\"\n\
         env = {{ PROBE_MODE = \"stream\", PROBE_CONNECT = \"127.0.0.1:{port}\" }}\n\
         connect = [\"127.0.0.1:{port}\"]\n",
        guest("probe_pollable.wasm").display().to_string(),
    ));
    let cfg = s.write("baton.toml", &text);
    let first = Host::start("stream-a", &cfg);
    let old = rx.recv_timeout(SECS(60)).expect("the first term's connection");
    let second = Host::start("stream-b", &cfg);
    second.wait_for(SECS(60), "plugins loaded", |e| {
        e.message() == "compiled-code cache"
    });
    // Back to back for a second: both ends' buffers are full long before.
    std::thread::sleep(SECS(1));
    (first, second, old)
}

/// Waits for the next term's connection, then two seconds, then reads the
/// old one to its end; returns when the next term's first record came.
fn after_the_next_term(rx: &mpsc::Receiver<Conn>, old: Conn) -> (SystemTime, Drained) {
    let new = rx.recv_timeout(SECS(30)).expect("the next term's connection");
    assert!(new.term > old.term, "terms {} then {}", old.term, new.term);
    let reader = new.stream.try_clone().unwrap();
    std::thread::spawn(move || drain(reader));
    std::thread::sleep(SECS(2));
    let receive_buffer = socket_int(old.stream.as_raw_fd(), libc::SO_RCVBUF);
    let drained = drain(old.stream);
    println!(
        "old term {} read 2 s after term {}'s first record: {} bytes ({} records), ended by {}; receive buffer {} bytes",
        old.term,
        new.term,
        drained.bytes,
        drained.bytes / RECORD,
        if drained.reset { "a reset" } else { "a FIN" },
        receive_buffer
    );
    assert_eq!(
        drained.terms.iter().copied().collect::<Vec<_>>(),
        if drained.bytes >= RECORD {
            vec![old.term]
        } else {
            vec![]
        },
        "the old connection carried only its own term"
    );
    (new.first_at, drained)
}

/// A term ended by SIGTERM and the grace: at its force-stop the guest's
/// connection is reset, so nothing more of the old term is sent; the
/// server gets at most what its own receive buffer already held.
#[test]
fn no_byte_of_a_force_stopped_term_reaches_a_server_after_the_next_terms_first() {
    let (port, rx) = serve();
    let s = Scratch::new();
    let (mut first, mut second, old) = two_hosts_streaming(&s, port, &rx);
    let receive_buffer = socket_int(old.stream.as_raw_fd(), libc::SO_RCVBUF) as usize;
    let termed = first.sigterm();
    let stopped = first.wait_for(SECS(10), "the forced stop", |e| {
        e.is("leader task stopped", Some("stream"))
    });
    assert!(first.wait_exit(SECS(10)).success());
    let force_stop = force_stop_at(&stopped);
    assert!(ms_between(termed, force_stop) >= 450.0, "the grace was honoured");
    let (next_first, drained) = after_the_next_term(&rx, old);
    println!(
        "SIGTERM, force-stop {:.0} ms later, next term's first record {:.0} ms after the force-stop",
        ms_between(termed, force_stop),
        ms_between(force_stop, next_first)
    );
    assert!(
        drained.reset,
        "the old connection was reset, not closed in order: {drained:?}"
    );
    assert!(
        drained.bytes <= receive_buffer,
        "{} bytes of the old term, more than the receiver held ({receive_buffer}): sent after the force-stop",
        drained.bytes
    );
    second.sigterm();
    second.wait_exit(SECS(15));
}

/// A host killed mid-term: nothing of it runs to reset the connection, so
/// the kernel delivers what it had queued, and then a FIN. That is at most
/// twice the plugin's `send-buffer` (default 64 KiB) plus what the
/// receiver held: the bound `docs/fencing.md` states.
#[test]
fn a_killed_hosts_connection_delivers_at_most_its_bounded_send_queue() {
    let (port, rx) = serve();
    let s = Scratch::new();
    let (mut first, mut second, old) = two_hosts_streaming(&s, port, &rx);
    let receive_buffer = socket_int(old.stream.as_raw_fd(), libc::SO_RCVBUF) as usize;
    first.sigkill();
    let (_, drained) = after_the_next_term(&rx, old);
    let bound = 2 * (64 << 10) + receive_buffer;
    println!("killed: bound {bound} bytes (twice the send buffer and the receive buffer)");
    assert!(
        drained.bytes <= bound,
        "{} bytes of the old term after the next term's first, more than the bound {bound}",
        drained.bytes
    );
    assert!(
        drained.bytes > receive_buffer,
        "the killed host's queue was delivered ({} bytes): the test saw what it means to",
        drained.bytes
    );
    second.sigterm();
    second.wait_exit(SECS(15));
}
