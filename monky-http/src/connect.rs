//! The connection check: a hook that sees each new connection's two ends before a request's
//! first byte is written on it, and can refuse the connection.
//!
//! reqwest runs it as a connector layer: the inner connector has connected (and, for `https`,
//! finished the TLS handshake), nothing of a request has been written yet, and the refusal
//! drops the connection. Which peers to trust is the caller's policy; this module only carries
//! the decision. Both clients take the same hook, so a caller writes one check for both.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::{Connection, HttpInfo};

/// An error a [`ConnectionCheck`] returns, of the caller's own type.
pub type CheckError = Box<dyn std::error::Error + Send + Sync>;

/// Decides whether a new connection may carry requests, from its local and peer addresses
/// (`(local, peer)`); an `Err` drops the connection before anything is sent on it.
///
/// The check runs on the calling thread, inside the client's runtime, once per new connection,
/// so it may do a short blocking look (a file under `/proc`), not a long wait.
pub type ConnectionCheck =
    Arc<dyn Fn(SocketAddr, SocketAddr) -> Result<(), CheckError> + Send + Sync>;

/// A check's refusal, as it travels up through reqwest's error; the client finds it again
/// with [`refusal_in`].
#[derive(Debug)]
pub struct Refused(pub CheckError);

/// A [`ConnectionCheck`] kept in a client's builder, which prints itself without the closure.
#[derive(Clone)]
pub struct CheckHook(pub ConnectionCheck);

impl fmt::Debug for CheckHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConnectionCheck")
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "connection refused by the connection check: {}", self.0)
    }
}

impl std::error::Error for Refused {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// The check's own error when `err`'s chain holds a refusal of the connection check.
pub fn refusal_in<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a (dyn std::error::Error + Send + Sync + 'static)> {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(Refused(inner)) = e.downcast_ref::<Refused>() {
            return Some(&**inner);
        }
        cause = e.source();
    }
    None
}

/// The connector layer that runs a [`ConnectionCheck`].
#[derive(Clone)]
pub struct CheckLayer(pub ConnectionCheck);

impl<S> tower_layer::Layer<S> for CheckLayer {
    type Service = CheckService<S>;

    fn layer(&self, inner: S) -> CheckService<S> {
        CheckService {
            inner,
            check: Arc::clone(&self.0),
        }
    }
}

/// The connector service [`CheckLayer`] wraps around reqwest's own.
#[derive(Clone)]
pub struct CheckService<S> {
    inner: S,
    check: ConnectionCheck,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, R> tower_service::Service<R> for CheckService<S>
where
    S: tower_service::Service<R, Error = BoxError>,
    S::Response: Connection + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let connecting = self.inner.call(req);
        let check = Arc::clone(&self.check);
        Box::pin(async move {
            let conn = connecting.await?;
            let mut facts = http::Extensions::new();
            conn.connected().get_extras(&mut facts);
            // Without both addresses nothing can be judged: fail closed.
            let Some(info) = facts.get::<HttpInfo>() else {
                return Err(
                    Box::new(Refused("the connection's addresses are unknown".into())) as BoxError,
                );
            };
            check(info.local_addr(), info.remote_addr())
                .map_err(|e| Box::new(Refused(e)) as BoxError)?;
            Ok(conn)
        })
    }
}
