//! A test plugin (pollable world) that sends HTTP requests through
//! `wasi:http/outgoing-handler` while it leads. Built against the
//! repository's `wit/` alone, with wit-bindgen and no SDK.
//!
//! Variables (the host passes those the config grants):
//!
//! - `HTTP_URL`: where to send (`http://HOST:PORT/PATH` or `https://...`).
//! - `HTTP_MODE`:
//!   - `ticks` (default): a `GET` every `HTTP_TICK_MS` milliseconds (default
//!     100) until the status changes, then returns `Ok`;
//!   - `once`: one request, then returns `Ok`;
//!   - `hang`: one request, waiting for its answer however long it takes,
//!     ignoring the change (only the force-stop ends it).
//!   - `apply`: the applier pattern, through the Kubernetes API at
//!     `http://kubernetes.baton` (the host's `kubernetes` grant): every
//!     `HTTP_TICK_MS`, reads the ConfigMap `K8S_NAME` in namespace `K8S_NS`
//!     and writes it back (creates it if missing) with its term in the
//!     annotation `baton.dev/term` and in `data.term`, `PROBE_HOST` in
//!     `data.writer`, a round counter in `data.round`, and the
//!     `resourceVersion` it read (so a write based on
//!     an older read conflicts). It refuses to write over an object whose
//!     annotation names a newer term. Prints `http apply ok term=N rv=RV`,
//!     `http apply conflict term=N`, `http apply newer term=N object=M` or
//!     `http apply error E term=N`. First it tries to list the Secrets of
//!     `K8S_NS` and prints `http secrets ...` (its grant does not allow it).
//!     With `PROBE_TRAP_AT_END` set, it panics (a trap) once its term is
//!     over, so that a host with a core dump folder dumps its memory.
//!   - `parallel`: starts `HTTP_PARALLEL` requests at once without waiting
//!     for any, waits until one is answered (at most 10 s) and 500 ms
//!     more, and prints
//!     `http parallel started=N refused=R pending=P errors=E term=N`
//!     (refused: `connection-limit-reached`); then drops them all and
//!     sends one more, printing its `http ok ...` or `http error ...` line
//!     (the dropped requests must have given their places back).
//! - `HTTP_BODY_BYTES`: send a `POST` with a body of that many bytes
//!   instead of a `GET`.
//!
//! Every request carries `x-probe: yes` and a forged `baton-term: 999`,
//! which the host must replace with the real term. Each prints one line:
//! `http ok status=S bytes=B body=TEXT term=N` (the first 200 bytes of the
//! body) or `http error E term=N`.

wit_bindgen::generate!({
    world: "probe:http/http-probe@0.1.0",
    path: ["../../../wit/v0.1.0", "wit"],
    generate_all,
});

use baton::leader::status_pollable::current_status;
use baton::leader::types::Role;
use exports::baton::leader::task_sync::{Guest, Status};
use wasi::clocks0_2_12::monotonic_clock;
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasi::io::poll::Pollable;
use wasi::io::streams::StreamError;

struct Probe;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Sends one request; the status and the body, or the error.
fn send(url: &str, body: Option<usize>) -> Result<(u16, Vec<u8>), String> {
    match body {
        Some(n) => request(Method::Post, url, None, Some(vec![b'x'; n])),
        None => request(Method::Get, url, None, None),
    }
}

/// Sends one request with `method`, a content type and a body.
fn request(
    method: Method,
    url: &str,
    content_type: Option<&str>,
    body: Option<Vec<u8>>,
) -> Result<(u16, Vec<u8>), String> {
    let (scheme, rest) = url.split_once("://").ok_or("the URL has no scheme")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut list = vec![
        ("x-probe".to_owned(), b"yes".to_vec()),
        ("baton-term".to_owned(), b"999".to_vec()),
    ];
    if let Some(ct) = content_type {
        list.push(("content-type".to_owned(), ct.as_bytes().to_vec()));
    }
    let headers = Fields::from_list(&list).map_err(|e| format!("headers: {e:?}"))?;
    let request = OutgoingRequest::new(headers);
    request.set_method(&method).map_err(|_| "method")?;
    let scheme = if scheme == "https" {
        Scheme::Https
    } else {
        Scheme::Http
    };
    request.set_scheme(Some(&scheme)).map_err(|_| "scheme")?;
    request.set_authority(Some(authority)).map_err(|_| "authority")?;
    request.set_path_with_query(Some(path)).map_err(|_| "path")?;
    let outgoing = request.body().map_err(|_| "body")?;
    let response = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    // A write that fails (the host stopped taking the body) is reported
    // only if the response does not say why.
    let mut write_error = None;
    if let Some(bytes) = body {
        let stream = outgoing.write().map_err(|_| "body stream")?;
        for chunk in bytes.chunks(4096) {
            if let Err(e) = stream.blocking_write_and_flush(chunk) {
                write_error = Some(format!("writing the body: {e:?}"));
                break;
            }
        }
        drop(stream);
    }
    let finished = OutgoingBody::finish(outgoing, None);
    response.subscribe().block();
    let response = response
        .get()
        .ok_or("no response after the pollable was ready")?
        .map_err(|_| "response taken twice")?
        .map_err(|e| format!("{e:?}"))?;
    if let Some(e) = write_error {
        return Err(e);
    }
    finished.map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    let incoming = response.consume().map_err(|_| "consume")?;
    let stream = incoming.stream().map_err(|_| "stream")?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                drop(stream);
                return Err(format!("reading the body: {}", e.to_debug_string()));
            }
        }
    }
    drop(stream);
    let _ = IncomingBody::finish(incoming);
    Ok((status, bytes))
}

/// Starts `n` requests to `url` at once; see `parallel` in the module docs.
fn parallel(url: &str, n: usize, term: u64) {
    let mut pending = Vec::new();
    let (mut refused, mut errors) = (0, 0);
    for _ in 0..n {
        let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let request = OutgoingRequest::new(Fields::new());
        let scheme = if scheme == "https" {
            Scheme::Https
        } else {
            Scheme::Http
        };
        request.set_scheme(Some(&scheme)).unwrap();
        request.set_authority(Some(authority)).unwrap();
        request
            .set_path_with_query(Some(if path.is_empty() { "/" } else { path }))
            .unwrap();
        match outgoing_handler::handle(request, None) {
            Ok(response) => pending.push(response),
            Err(wasi::http::types::ErrorCode::ConnectionLimitReached) => refused += 1,
            Err(_) => errors += 1,
        }
    }
    // Until one of them is answered (a refusal comes once the host has
    // waited for a place) or 10 s, then 500 ms for any other. A fixed wait
    // read a refusal that a loaded machine was slow to make as a request
    // in flight.
    {
        let answers: Vec<_> = pending.iter().map(|r| r.subscribe()).collect();
        let give_up = monotonic_clock::subscribe_duration(10_000_000_000);
        let mut any: Vec<&Pollable> = answers.iter().collect();
        any.push(&give_up);
        wasi::io::poll::poll(&any);
    }
    monotonic_clock::subscribe_duration(500_000_000).block();
    let mut waiting = 0;
    for response in &pending {
        // `get` answers only for a response whose pollable found it ready.
        response.subscribe().ready();
        match response.get() {
            None => waiting += 1,
            Some(Ok(Err(wasi::http::types::ErrorCode::ConnectionLimitReached))) => refused += 1,
            Some(_) => errors += 1,
        }
    }
    println!("http parallel started={n} refused={refused} pending={waiting} errors={errors} term={term}");
    drop(pending);
}

fn report(url: &str, body: Option<usize>, term: u64) {
    match send(url, body) {
        Ok((status, bytes)) => {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).replace('\n', " ");
            println!(
                "http ok status={status} bytes={} body={text} term={term}",
                bytes.len()
            );
        }
        Err(e) => println!("http error {e} term={term}"),
    }
}

/// The string value of `"key":"..."` in a JSON text (enough for the API
/// server's answers; this guest carries no JSON library).
fn json_string(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let end = text[at..].find('"')?;
    Some(text[at..at + end].to_owned())
}

/// How many rounds this instance's applier ran (each writes a new
/// version: the API server drops an update that changes nothing).
static ROUNDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One round of the applier: read the object, write it back in this term.
fn apply(ns: &str, name: &str, host: &str, term: u64) {
    let round = ROUNDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let base = format!("http://kubernetes.baton/api/v1/namespaces/{ns}/configmaps");
    let (status, body) = match request(Method::Get, &format!("{base}/{name}"), None, None) {
        Ok(r) => r,
        Err(e) => return println!("http apply error {e} term={term}"),
    };
    let text = String::from_utf8_lossy(&body);
    let (method, url, rv) = match status {
        200 => {
            let seen: Option<u64> = json_string(&text, "baton.dev/term").and_then(|t| t.parse().ok());
            if let Some(seen) = seen.filter(|&s| s > term) {
                return println!("http apply newer term={term} object={seen}");
            }
            let rv = json_string(&text, "resourceVersion").unwrap_or_default();
            (Method::Put, format!("{base}/{name}"), Some(rv))
        }
        404 => (Method::Post, base.clone(), None),
        other => return println!("http apply error status={other} term={term}"),
    };
    let rv_field = rv
        .map(|rv| format!(",\"resourceVersion\":\"{rv}\""))
        .unwrap_or_default();
    let object = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"{ns}\"{rv_field},\
         \"annotations\":{{\"baton.dev/term\":\"{term}\"}}}},\"data\":{{\"term\":\"{term}\",\"writer\":\"{host}\",\"round\":\"{round}\"}}}}"
    );
    match request(method, &url, Some("application/json"), Some(object.into_bytes())) {
        Ok((200 | 201, body)) => {
            let rv = json_string(&String::from_utf8_lossy(&body), "resourceVersion").unwrap_or_default();
            println!("http apply ok term={term} rv={rv}");
        }
        Ok((409, _)) => println!("http apply conflict term={term}"),
        Ok((status, body)) => println!(
            "http apply error status={status} {} term={term}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ),
        Err(e) => println!("http apply error {e} term={term}"),
    }
}

/// Waits for the next tick or a change of status; `false` once this task
/// no longer leads in `term`.
fn next_tick(term: u64, tick_ms: u64) -> bool {
    let (now, change) = current_status();
    if now.role != Role::Leading || now.term != term {
        println!("http stop term={term}");
        return false;
    }
    let timer = monotonic_clock::subscribe_duration(tick_ms * 1_000_000);
    wasi::io::poll::poll(&[&change, &timer]);
    true
}

impl Guest for Probe {
    fn run(status: Status) -> Result<(), String> {
        let url = env("HTTP_URL").unwrap_or_default();
        let body = env("HTTP_BODY_BYTES").map(|n| n.parse::<usize>().expect("HTTP_BODY_BYTES is a number"));
        let tick: u64 = env("HTTP_TICK_MS").map_or(100, |t| t.parse().expect("HTTP_TICK_MS is a number"));
        let term = status.term;
        match env("HTTP_MODE").as_deref().unwrap_or("ticks") {
            "parallel" => {
                let n = env("HTTP_PARALLEL").map_or(2, |n| n.parse().expect("HTTP_PARALLEL is a number"));
                parallel(&url, n, term);
                let after = env("HTTP_AFTER_URL").unwrap_or_else(|| url.clone());
                report(&after, None, term);
                Ok(())
            }
            "once" | "hang" => {
                report(&url, body, term);
                Ok(())
            }
            "ticks" => {
                loop {
                    let (now, _) = current_status();
                    if now.role != Role::Leading || now.term != term {
                        break;
                    }
                    report(&url, body, term);
                    if !next_tick(term, tick) {
                        break;
                    }
                }
                Ok(())
            }
            "apply" => {
                let ns = env("K8S_NS").ok_or("K8S_NS is not set")?;
                let name = env("K8S_NAME").ok_or("K8S_NAME is not set")?;
                let host = env("PROBE_HOST").unwrap_or_default();
                let secrets = format!("http://kubernetes.baton/api/v1/namespaces/{ns}/secrets");
                match request(Method::Get, &secrets, None, None) {
                    Ok((status, _)) => println!("http secrets status={status} term={term}"),
                    Err(e) => println!("http secrets error {e} term={term}"),
                }
                loop {
                    apply(&ns, &name, &host, term);
                    if !next_tick(term, tick) {
                        if env("PROBE_TRAP_AT_END").is_some() {
                            panic!("trapping at the end of term {term}, for the core dump");
                        }
                        return Ok(());
                    }
                }
            }
            other => Err(format!("unknown HTTP_MODE: {other}")),
        }
    }
}

export!(Probe);
