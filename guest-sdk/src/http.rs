//! Outgoing HTTP requests, over `wasi:http/outgoing-handler` (WASI 0.2).
//!
//! Needs the `http` feature, and works in both worlds. The host sends a
//! request only where the plugin's `http` grants allow (other destinations
//! fail with [`Error::Request`] and the code `HttpRequestDenied`), adds the
//! lease and the term as `Baton-Lease` and `Baton-Term` headers (a guest
//! cannot set them), and drops a request still in flight when the term's
//! grace is over. See `docs/configuration.md` of the baton repository.
//!
//! | world      | call                                   | waits by                            |
//! |------------|----------------------------------------|-------------------------------------|
//! | `pollable` | [`Request::send`]                      | blocking                            |
//! | `pollable` | [`Request::send_until`]                | blocking, ends early on a change    |
//! | `future`   | [`Request::send_async`]                | awaiting (see below)                |
//!
//! A whole request (headers, body and response body) is kept in memory: the
//! host's `http-limits` bound both bodies (64 MiB by default for a
//! response).
//!
//! # In the `future` world
//!
//! `wasi:http` 0.2 responses and bodies are WASI 0.2 pollables, which
//! wasmtime 48 cannot wait on together with component-model futures. So
//! [`Request::send_async`] waits on the request for at most 4 ms at a time
//! and then awaits a 1 ms timer, so that other futures of the task (above
//! all the change signal) are polled between: a change is noticed within
//! about 5 ms, and a response is read the moment it is ready. Race it
//! against the change with [`future::until_change`](crate::future::until_change);
//! dropping the future drops the request, and the host closes its
//! connection. (WASI 0.3's `wasi:http` will make this a plain await.)
//!
//! # Example
//!
//! ```no_run
//! use baton_guest::http::Request;
//! # fn f(term: u64) -> Result<(), baton_guest::http::Error> {
//! let response = Request::post("https://api.example.com/v1/reports")
//!     .header("content-type", "application/json")
//!     .body(format!("{{\"term\":{term}}}"))
//!     .send()?;
//! println!("{} {}", response.status, response.text());
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

#[cfg(feature = "future")]
use crate::__private::wasi_bindings::wasi::clocks0_2_12::monotonic_clock;
use crate::__private::wasi_bindings::wasi::http::outgoing_handler;
use crate::__private::wasi_bindings::wasi::http::types::{
    ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
#[cfg(any(feature = "future", feature = "pollable"))]
use crate::__private::wasi_bindings::wasi::io::poll;
use crate::__private::wasi_bindings::wasi::io::poll::Pollable;
use crate::__private::wasi_bindings::wasi::io::streams::StreamError;

/// How much of a body is read or written per call.
const CHUNK: u64 = 64 * 1024;

/// An HTTP request: a method, an absolute `http://` or `https://` URL,
/// headers and a body. Build it, then send it.
#[derive(Clone, Debug)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    timeout: Option<Duration>,
}

impl Request {
    /// A request with `method` (`"GET"`, `"POST"`, ... or any other token)
    /// to `url`.
    pub fn new(method: &str, url: impl Into<String>) -> Request {
        Request {
            method: method.to_owned(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: None,
        }
    }

    /// A `GET` request.
    pub fn get(url: impl Into<String>) -> Request {
        Request::new("GET", url)
    }

    /// A `POST` request.
    pub fn post(url: impl Into<String>) -> Request {
        Request::new("POST", url)
    }

    /// A `PUT` request.
    pub fn put(url: impl Into<String>) -> Request {
        Request::new("PUT", url)
    }

    /// A `DELETE` request.
    pub fn delete(url: impl Into<String>) -> Request {
        Request::new("DELETE", url)
    }

    /// Adds a header. Headers the host owns (`Baton-*`, and `Authorization`
    /// towards the Kubernetes API) are replaced or removed by the host.
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Request {
        self.headers
            .push((name.to_ascii_lowercase(), value.as_ref().to_vec()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// How long to wait for the response's headers (at most the host's
    /// `http-limits` timeout, 30 s by default).
    pub fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = Some(timeout);
        self
    }

    /// Sends the request and reads the whole response, blocking until it
    /// is in.
    ///
    /// In the `future` world this blocks the whole task, change signal
    /// included: use [`Request::send_async`] there.
    pub fn send(&self) -> Result<Response, Error> {
        block(exchange(self, Blocking))
    }

    /// Like [`Request::send`], but gives up, dropping the request, as soon
    /// as `change` fires: then it returns [`Error::StatusChanged`].
    #[cfg(feature = "pollable")]
    pub fn send_until(&self, change: &crate::pollable::Change) -> Result<Response, Error> {
        block(exchange(self, BlockingUntil(change.as_pollable())))
    }

    /// Sends the request and reads the whole response, awaiting it (see
    /// the [module docs](self#in-the-future-world) for how it waits).
    #[cfg(feature = "future")]
    pub async fn send_async(&self) -> Result<Response, Error> {
        exchange(self, Awaiting).await
    }
}

/// A response: its status, headers and whole body.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case, in the order received.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not an absolute `http://` or `https://` URL.
    InvalidUrl(String),
    /// A header the host does not accept (a forbidden or malformed one).
    InvalidHeader(String),
    /// The request failed: the `wasi:http` error code, e.g.
    /// `HttpRequestDenied` (no grant allows the destination),
    /// `DestinationIpProhibited` (a granted name resolved to an internal
    /// address), `ConnectionLimitReached` (too many requests in flight),
    /// `HttpRequestBodySize`, `ConnectionRefused`, `ConnectionTimeout`.
    Request(String),
    /// Writing the request body or reading the response body failed (a
    /// response body over the host's limit ends this way).
    Body(String),
    /// The lease status changed before the response was in (only from
    /// [`Request::send_until`]).
    StatusChanged,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidUrl(url) => write!(f, "not an absolute http(s) URL: {url}"),
            Error::InvalidHeader(name) => write!(f, "header refused: {name}"),
            Error::Request(code) => write!(f, "request failed: {code}"),
            Error::Body(e) => write!(f, "body failed: {e}"),
            Error::StatusChanged => f.write_str("the lease status changed before the response"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ErrorCode> for Error {
    fn from(code: ErrorCode) -> Error {
        let text = format!("{code:?}");
        Error::Request(text.strip_prefix("ErrorCode::").unwrap_or(&text).to_owned())
    }
}

/// How a request waits for a pollable (its response, a body stream).
trait Wait {
    /// Returns once `pollable` is ready, or fails with why it gave up.
    async fn ready(&self, pollable: &Pollable) -> Result<(), Error>;
}

/// Blocks until ready.
struct Blocking;

impl Wait for Blocking {
    async fn ready(&self, pollable: &Pollable) -> Result<(), Error> {
        pollable.block();
        Ok(())
    }
}

/// Blocks until ready, or until the change signal (the pollable held) is.
#[cfg(feature = "pollable")]
struct BlockingUntil<'a>(&'a Pollable);

#[cfg(feature = "pollable")]
impl Wait for BlockingUntil<'_> {
    async fn ready(&self, pollable: &Pollable) -> Result<(), Error> {
        let ready = poll::poll(&[pollable, self.0]);
        if ready.contains(&0) {
            Ok(())
        } else {
            Err(Error::StatusChanged)
        }
    }
}

/// Waits in short blocking slices with a component-model await between
/// them (see the module docs).
#[cfg(feature = "future")]
struct Awaiting;

#[cfg(feature = "future")]
impl Wait for Awaiting {
    async fn ready(&self, pollable: &Pollable) -> Result<(), Error> {
        /// The longest the task blocks at once: how late it may notice a
        /// change.
        const SLICE: Duration = Duration::from_millis(4);
        /// The await between slices: a real suspension, so the executor
        /// delivers the task's other events (a zero wait returns at once).
        const BREATH: Duration = Duration::from_millis(1);
        loop {
            if pollable.ready() {
                return Ok(());
            }
            let slice = monotonic_clock::subscribe_duration(crate::nanos(SLICE));
            poll::poll(&[pollable, &slice]);
            if pollable.ready() {
                return Ok(());
            }
            crate::future::sleep(BREATH).await;
        }
    }
}

/// Runs a future whose awaits never pend (those of [`Blocking`] and
/// [`BlockingUntil`]) to its end.
fn block<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("a blocking wait never pends"),
    }
}

/// Splits an absolute URL into scheme, authority and path with query.
fn split_url(url: &str) -> Result<(Scheme, &str, String), Error> {
    let invalid = || Error::InvalidUrl(url.to_owned());
    let (scheme, rest) = url.split_once("://").ok_or_else(invalid)?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return Err(invalid()),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() {
        return Err(invalid());
    }
    let path = path.split('#').next().unwrap_or_default();
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Ok((scheme, authority, path))
}

fn method(name: &str) -> Method {
    match name.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "OPTIONS" => Method::Options,
        _ => Method::Other(name.to_owned()),
    }
}

/// Sends `request` and reads the whole response, waiting with `wait`.
async fn exchange(request: &Request, wait: impl Wait) -> Result<Response, Error> {
    let (scheme, authority, path) = split_url(&request.url)?;
    // A body goes with its length (else the host sends it chunked, which
    // not every server takes).
    let mut list = request.headers.clone();
    if !request.body.is_empty() && !list.iter().any(|(n, _)| n == "content-length") {
        list.push((
            "content-length".into(),
            request.body.len().to_string().into_bytes(),
        ));
    }
    let headers = Fields::from_list(&list).map_err(|e| Error::InvalidHeader(format!("{e:?}")))?;
    let outgoing = OutgoingRequest::new(headers);
    let url_part = |_| Error::InvalidUrl(request.url.clone());
    outgoing
        .set_method(&method(&request.method))
        .map_err(|_| Error::Request(format!("method {:?} refused", request.method)))?;
    outgoing.set_scheme(Some(&scheme)).map_err(url_part)?;
    outgoing.set_authority(Some(authority)).map_err(url_part)?;
    outgoing.set_path_with_query(Some(&path)).map_err(url_part)?;
    let options = request.timeout.map(|t| {
        let options = RequestOptions::new();
        let _ = options.set_first_byte_timeout(Some(crate::nanos(t)));
        options
    });
    let body = outgoing
        .body()
        .map_err(|_| Error::Body("the request body was taken".into()))?;
    let pending = outgoing_handler::handle(outgoing, options)?;

    // The body, written as fast as the host takes it.
    let mut write_error = None;
    if !request.body.is_empty() {
        let stream = body
            .write()
            .map_err(|_| Error::Body("the body stream was taken".into()))?;
        let mut rest = request.body.as_slice();
        while !rest.is_empty() {
            match stream.check_write() {
                Ok(0) => wait.ready(&stream.subscribe()).await?,
                Ok(n) => {
                    let n = rest
                        .len()
                        .min(usize::try_from(n.min(CHUNK)).unwrap_or(usize::MAX));
                    if let Err(e) = stream.write(&rest[..n]) {
                        write_error = Some(stream_error(e));
                        break;
                    }
                    rest = &rest[n..];
                }
                Err(e) => {
                    write_error = Some(stream_error(e));
                    break;
                }
            }
        }
        if write_error.is_none() && stream.flush().is_ok() {
            wait.ready(&stream.subscribe()).await?;
        }
    }
    let finished = OutgoingBody::finish(body, None);

    wait.ready(&pending.subscribe()).await?;
    let response = pending
        .get()
        .ok_or_else(|| Error::Request("no response after it was ready".into()))?
        .map_err(|_| Error::Request("the response was taken".into()))??;
    // A failed write is reported only if the response does not say why.
    if let Some(e) = write_error {
        return Err(e);
    }
    finished?;

    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value))
        .collect();
    let incoming = response
        .consume()
        .map_err(|_| Error::Body("the response body was taken".into()))?;
    let stream = incoming
        .stream()
        .map_err(|_| Error::Body("the response body stream was taken".into()))?;
    let mut bytes = Vec::new();
    loop {
        match stream.read(CHUNK) {
            Ok(chunk) if chunk.is_empty() => wait.ready(&stream.subscribe()).await?,
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(e) => return Err(stream_error(e)),
        }
    }
    drop(stream);
    let _trailers = IncomingBody::finish(incoming);
    Ok(Response {
        status,
        headers,
        body: bytes,
    })
}

fn stream_error(e: StreamError) -> Error {
    match e {
        StreamError::Closed => Error::Body("the stream was closed".into()),
        StreamError::LastOperationFailed(e) => Error::Body(e.to_debug_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_scheme_authority_and_path() {
        let (s, a, p) = split_url("https://api.example.com:8443/v1/x?y=1#frag").unwrap();
        assert!(matches!(s, Scheme::Https));
        assert_eq!((a, p.as_str()), ("api.example.com:8443", "/v1/x?y=1"));
        let (s, a, p) = split_url("http://127.0.0.1:8080").unwrap();
        assert!(matches!(s, Scheme::Http));
        assert_eq!((a, p.as_str()), ("127.0.0.1:8080", "/"));
        assert_eq!(split_url("http://h?q").unwrap().2, "/?q");
        for bad in ["ftp://h/", "/relative", "http:///path", "h:80"] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }
}
