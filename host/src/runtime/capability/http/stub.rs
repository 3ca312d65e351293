//! Answers that stand in for the network: a harness (`baton test`) gives a
//! plugin's HTTP policy an [`HttpStub`], which answers every granted
//! request instead of a server and sees it as it would go on the wire,
//! with the host's `Baton-Lease` and `Baton-Term` headers.
//!
//! Everything before the network still applies: the grants (a request no
//! grant allows is refused as ever), the limits, the term's headers, and
//! the fence (no request once the term must stop).

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::{Capped, Sent, TERM_HEADER, internal};

/// A request as the stub sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StubRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// The whole URL.
    pub url: String,
    /// The `Baton-Term` header the host set, if any.
    pub term: Option<u64>,
    /// The body.
    pub body: Bytes,
}

/// The stub's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StubResponse {
    /// The status code.
    pub status: u16,
    /// Headers, as name and value.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
}

/// Answers requests instead of the network.
pub trait HttpStub: Send + Sync + std::fmt::Debug {
    /// The answer to `request`.
    fn answer(&self, request: StubRequest) -> StubResponse;
}

/// `request` (to `url`) answered by `stub`; its body read up to `limit`.
pub(super) async fn answer(
    stub: &Arc<dyn HttpStub>,
    url: &http::Uri,
    request: http::Request<WasiBody>,
    limit: u64,
) -> Sent {
    let (parts, body) = request.into_parts();
    let body = Capped::new(body, limit, |n| HttpError::HttpRequestBodySize(Some(n)))
        .collect()
        .await?
        .to_bytes();
    let term = parts
        .headers
        .get(TERM_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let answer = stub.answer(StubRequest {
        method: parts.method.to_string(),
        url: url.to_string(),
        term,
        body,
    });
    let mut response = http::Response::builder().status(answer.status);
    for (name, value) in &answer.headers {
        response = response.header(name, value);
    }
    let body = Full::new(answer.body)
        .map_err(|never| match never {})
        .boxed_unsync();
    let response = response.body(body).map_err(|_| internal("stub's response"))?;
    Ok((response, Box::new(async { Ok(()) })))
}
