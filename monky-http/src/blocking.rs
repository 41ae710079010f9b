//! A blocking client without a thread of its own: reqwest's async client, driven on the
//! caller's thread by a current-thread runtime that the client owns.
//!
//! reqwest's own blocking client starts a thread with a runtime for every client built and
//! passes each request and each read of a body across to it. The agent makes a few small
//! calls a tick, one at a time, so that thread is pure overhead: measured from outside, a
//! heartbeat cost 13 % less CPU without it. Here the calling thread runs the runtime while it waits,
//! so the API stays blocking and nothing runs between two calls.

use std::io::Read;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use url::Url;

/// A blocking HTTP client: a built [`reqwest::Client`] and the runtime that drives it on the
/// caller's thread. Cheap to clone; clones share the runtime and the connection pool.
#[derive(Clone)]
pub struct Client {
    // Dropped before the runtime it was built on.
    http: reqwest::Client,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Client {
    /// Builds `builder` on a new current-thread runtime (IO and timers).
    ///
    /// # Errors
    /// The runtime's own error (no epoll or eventfd left), or reqwest's.
    pub(crate) fn build(builder: reqwest::ClientBuilder) -> Result<Client, crate::BuildError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(crate::BuildError::Runtime)?;
        // reqwest builds its connector inside the runtime: its timers need one.
        let http = {
            let _entered = runtime.enter();
            builder.build().map_err(crate::BuildError::Build)?
        };
        Ok(Client {
            http,
            runtime: Arc::new(runtime),
        })
    }

    /// A request to `url`, to be sent with [`Client::execute`].
    pub fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        self.http.request(method, url)
    }

    /// A `GET` of `url`.
    pub fn get(&self, url: Url) -> reqwest::RequestBuilder {
        self.http.get(url)
    }

    /// A `POST` to `url`.
    pub fn post(&self, url: Url) -> reqwest::RequestBuilder {
        self.http.post(url)
    }

    /// Builds and sends `request`, as [`Client::execute`] does.
    ///
    /// # Errors
    /// As for [`Client::execute`], and reqwest's error for a request that does not build.
    pub fn send(&self, request: reqwest::RequestBuilder) -> Result<Response, reqwest::Error> {
        self.execute(request.build()?)
    }

    /// Sends `request` and waits for the answer's head; the body is read from the
    /// [`Response`].
    ///
    /// # Errors
    /// reqwest's error for a connection, a timeout or a refused connection check.
    pub fn execute(&self, request: reqwest::Request) -> Result<Response, reqwest::Error> {
        // Made inside the runtime: reqwest arms the request's timeout as it makes the future.
        let inner = self
            .runtime
            .block_on(async { self.http.execute(request).await })?;
        Ok(Response {
            inner,
            runtime: Arc::clone(&self.runtime),
            pending: Bytes::new(),
        })
    }
}

/// An answer whose head has arrived; reading it (it is [`Read`]) waits for its body.
pub struct Response {
    inner: reqwest::Response,
    runtime: Arc<tokio::runtime::Runtime>,
    /// What the last chunk held beyond the last read's buffer.
    pending: Bytes,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.inner.status())
            .finish_non_exhaustive()
    }
}

impl Response {
    /// The answer's status.
    #[must_use]
    pub fn status(&self) -> StatusCode {
        self.inner.status()
    }

    /// The answer's headers.
    #[must_use]
    pub fn headers(&self) -> &HeaderMap {
        self.inner.headers()
    }

    /// The `Content-Length` the answer claims, if any: a hint, never trusted as a bound.
    #[must_use]
    pub fn content_length(&self) -> Option<u64> {
        self.inner.content_length()
    }
}

impl Read for Response {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.is_empty() {
            match self.runtime.block_on(self.inner.chunk()) {
                Ok(Some(chunk)) => self.pending = chunk,
                Ok(None) => return Ok(0),
                Err(e) if e.is_timeout() => {
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, e));
                }
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.advance(n);
        Ok(n)
    }
}
