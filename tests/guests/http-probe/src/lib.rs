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
//! - `HTTP_BODY_BYTES`: send a `POST` with a body of that many bytes
//!   instead of a `GET`.
//!
//! Every request carries `x-probe: yes` and a forged `baton-term: 999`,
//! which the host must replace with the real term. Each prints one line:
//! `http ok status=S bytes=B body=TEXT term=N` (the first 200 bytes of the
//! body) or `http error E term=N`.

wit_bindgen::generate!({
    world: "probe:http/http-probe@0.1.0",
    path: ["../../../wit", "wit"],
    generate_all,
});

use baton::leader::status_pollable::current_status;
use baton::leader::types::Role;
use exports::baton::leader::task_sync::{Guest, Status};
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasi::io::streams::StreamError;

struct Probe;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Sends one request; the status and the body, or the error.
fn send(url: &str, body: Option<usize>) -> Result<(u16, Vec<u8>), String> {
    let (scheme, rest) = url.split_once("://").ok_or("HTTP_URL has no scheme")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let headers = Fields::from_list(&[
        ("x-probe".to_owned(), b"yes".to_vec()),
        ("baton-term".to_owned(), b"999".to_vec()),
    ])
    .map_err(|e| format!("headers: {e:?}"))?;
    let request = OutgoingRequest::new(headers);
    request
        .set_method(if body.is_some() {
            &Method::Post
        } else {
            &Method::Get
        })
        .map_err(|_| "method")?;
    request
        .set_scheme(Some(if scheme == "https" {
            &Scheme::Https
        } else {
            &Scheme::Http
        }))
        .map_err(|_| "scheme")?;
    request.set_authority(Some(authority)).map_err(|_| "authority")?;
    request.set_path_with_query(Some(path)).map_err(|_| "path")?;
    let outgoing = request.body().map_err(|_| "body")?;
    let response = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    // A write that fails (the host stopped taking the body) is reported
    // only if the response does not say why.
    let mut write_error = None;
    if let Some(n) = body {
        let stream = outgoing.write().map_err(|_| "body stream")?;
        let chunk = vec![b'x'; 4096];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len());
            if let Err(e) = stream.blocking_write_and_flush(&chunk[..k]) {
                write_error = Some(format!("writing the body: {e:?}"));
                break;
            }
            left -= k;
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

impl Guest for Probe {
    fn run(status: Status) -> Result<(), String> {
        let url = env("HTTP_URL").ok_or("HTTP_URL is not set")?;
        let body = env("HTTP_BODY_BYTES").map(|n| n.parse::<usize>().expect("HTTP_BODY_BYTES is a number"));
        let tick: u64 = env("HTTP_TICK_MS").map_or(100, |t| t.parse().expect("HTTP_TICK_MS is a number"));
        let term = status.term;
        match env("HTTP_MODE").as_deref().unwrap_or("ticks") {
            "once" | "hang" => {
                report(&url, body, term);
                Ok(())
            }
            "ticks" => loop {
                let (now, change) = current_status();
                if now.role != Role::Leading || now.term != term {
                    println!("http stop term={term}");
                    return Ok(());
                }
                report(&url, body, term);
                let timer = wasi::clocks0_2_12::monotonic_clock::subscribe_duration(tick * 1_000_000);
                wasi::io::poll::poll(&[&change, &timer]);
            },
            other => Err(format!("unknown HTTP_MODE: {other}")),
        }
    }
}

export!(Probe);
