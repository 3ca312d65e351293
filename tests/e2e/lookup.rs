//! Name lookups across the force-stop: the `probe-pollable` guest in
//! `lookup` mode resolves a name over and over, ignoring the change, with
//! its host's lookups sent to a name server run by the test (the test hook
//! `BATON_TEST_NAME_SERVER`: a 200 ms timeout and 100 attempts per
//! lookup), which answers `answered.baton.test` (127.0.0.9) and records
//! when each other query arrives, and for which name (the guest puts its
//! term in it), answering none.

use std::net::UdpSocket;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::support::*;
use crate::witness::force_stop_at;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The name the test's name server answers, and its address.
const ANSWERED: &str = "answered.baton.test";

/// The queries a name server received: when each arrived, and its name.
type Queries = Arc<Mutex<Vec<(SystemTime, String)>>>;

/// A name server that answers [`ANSWERED`] (A: 127.0.0.9, AAAA: none) and
/// nothing else: the arrival time and the name of every other query.
fn silent_name_server() -> (String, Queries) {
    use hickory_resolver::proto::op::{Message, MessageType};
    use hickory_resolver::proto::rr::rdata::A;
    use hickory_resolver::proto::rr::{RData, Record, RecordType};
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let at = SystemTime::now();
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let Some(q) = query.queries().first() else {
                continue;
            };
            let name = q.name().to_ascii().trim_end_matches('.').to_owned();
            if name != ANSWERED {
                log.lock().unwrap().push((at, name));
                continue;
            }
            let mut answer = Message::new();
            answer
                .set_id(query.id())
                .set_message_type(MessageType::Response)
                .set_recursion_desired(true)
                .set_recursion_available(true)
                .add_query(q.clone());
            if q.query_type() == RecordType::A {
                answer.add_answer(Record::from_rdata(
                    q.name().clone(),
                    60,
                    RData::A(A::new(127, 0, 0, 9)),
                ));
            }
            let _ = socket.send_to(&answer.to_vec().unwrap(), from);
        }
    });
    (addr, seen)
}

/// A name the server answers resolves. A host paused past its lease while
/// its guest waits for a lookup: on
/// waking it finds the term over and stops the guest at once; the lookup's
/// retries (one every 200 ms until then) stop with it, and no query leaves
/// after the force-stop time.
#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs the test hook BATON_TEST_NAME_SERVER: a build with --features test-hooks"
)]
fn names_resolve_through_the_name_server_and_no_query_leaves_after_the_force_stop() {
    let (server, seen) = silent_name_server();
    let s = Scratch::new();
    let mut text = config(&s.store(), &[]);
    text.push_str(&format!(
        "\n[[plugin]]\nname = \"lookup\"\npath = {0:?}\nlease = \"demo\"\n\
         env = {{ PROBE_MODE = \"lookup\", PROBE_LOOKUP = \"slow.baton.test\" }}\nname-lookup = true\n\
         \n[[plugin]]\nname = \"answered\"\npath = {0:?}\nlease = \"demo\"\n\
         env = {{ PROBE_MODE = \"sandbox\", PROBE_LOOKUP = {ANSWERED:?} }}\nname-lookup = true\n",
        guest("probe_pollable.wasm").display().to_string(),
    ));
    let cfg = s.write("baton.toml", &text);
    let mut h = Host::start_opts(
        "lookup",
        &cfg,
        Opts {
            env: &[("BATON_TEST_NAME_SERVER", server.as_str())],
            ..Opts::default()
        },
    );
    // Names the server answers resolve.
    h.wait_for(SECS(60), "the answered lookup", |e| {
        e.guest_line("answered", &format!("probe lookup {ANSWERED} ok"))
    });
    let until = std::time::Instant::now() + SECS(60);
    while seen.lock().unwrap().len() < 5 {
        assert!(std::time::Instant::now() < until, "the lookup sent no queries");
        std::thread::sleep(Duration::from_millis(20));
    }
    let paused = h.signal(libc::SIGSTOP);
    std::thread::sleep(LEASE_DURATION + SECS(1));
    h.signal(libc::SIGCONT);
    let stopped = h.wait_for(SECS(10), "the forced stop", |e| {
        e.is("leader task stopped", Some("lookup"))
    });
    let force_stop = force_stop_at(&stopped);
    let term = stopped.u64("term").expect("the stopped term");
    std::thread::sleep(SECS(1));
    // Its name, or its name under a search domain of the system's.
    let ours = format!("t{term}.slow.baton.test");
    let queries: Vec<SystemTime> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, name)| name.starts_with(&ours))
        .map(|(at, _)| *at)
        .collect();
    let late: Vec<f64> = queries
        .iter()
        .filter(|t| **t > force_stop)
        .map(|t| ms_between(force_stop, *t))
        .collect();
    println!(
        "lookup in term {term}: {} queries before the pause; paused {:.0} ms before the force-stop; {} queries after it: {late:?}",
        queries.iter().filter(|t| **t < paused).count(),
        ms_between(paused, force_stop),
        late.len()
    );
    assert!(
        queries.len() >= 3,
        "term {term}'s lookup sent {} queries",
        queries.len()
    );
    assert!(late.is_empty(), "queries sent after the force-stop: {late:?} ms");
    h.sigterm();
    h.wait_exit(SECS(15));
}
