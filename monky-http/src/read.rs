//! Reading a peer's body under a size limit and the call's total deadline.

use std::io::Read;
use std::time::Instant;

/// Why [`read_capped`] stopped before the end of the body. Exhaustive on purpose: each client
/// classifies every way a read can fail.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The deadline passed between two reads.
    #[error("the call's deadline passed while reading the body")]
    Deadline,
    /// A read failed.
    #[error("reading the body failed")]
    Io(#[source] std::io::Error),
}

/// Reads `body` to its end, at most `limit` bytes, and gives up once `deadline` has passed;
/// `Ok(None)` when the body is longer than `limit`.
///
/// A body trickled a byte at a time must not outlast its call: the deadline is checked between
/// reads, whatever the reader's own timeouts. `size_hint` (a `Content-Length`) only sizes the
/// first allocation, never beyond `limit`.
///
/// # Errors
/// [`ReadError::Deadline`] past the deadline, [`ReadError::Io`] for a failed read.
pub fn read_capped(
    mut body: impl Read,
    size_hint: Option<u64>,
    limit: u64,
    deadline: Instant,
) -> Result<Option<Vec<u8>>, ReadError> {
    let hint = size_hint.unwrap_or(0).min(limit);
    let mut out = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if Instant::now() > deadline {
            return Err(ReadError::Deadline);
        }
        let n = match body.read(&mut chunk) {
            Ok(0) => return Ok(Some(out)),
            Ok(n) => n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(ReadError::Io(err)),
        };
        if out.len() as u64 + n as u64 > limit {
            return Ok(None);
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A body that gives one byte per read, forever, and counts the reads.
    struct Trickle(u64);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0 += 1;
            std::thread::sleep(Duration::from_millis(2));
            buf[0] = b'x';
            Ok(1)
        }
    }

    /// A body that is interrupted once, then fails.
    struct Failing(bool);

    impl Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            if std::mem::replace(&mut self.0, true) {
                Err(std::io::Error::other("reset"))
            } else {
                Err(std::io::ErrorKind::Interrupted.into())
            }
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[test]
    fn a_body_at_the_limit_is_read_and_one_byte_more_is_refused() {
        let body = vec![7u8; 40_000];
        assert_eq!(
            read_capped(&body[..], Some(40_000), 40_000, later()).unwrap(),
            Some(body.clone())
        );
        assert_eq!(read_capped(&body[..], None, 39_999, later()).unwrap(), None);
        // A lying length is only a hint.
        assert_eq!(
            read_capped(&body[..], Some(u64::MAX), 40_000, later()).unwrap(),
            Some(body)
        );
    }

    #[test]
    fn a_trickled_body_stops_at_the_deadline() {
        let mut trickle = Trickle(0);
        let deadline = Instant::now() + Duration::from_millis(50);
        let err = read_capped(&mut trickle, None, 1 << 20, deadline).unwrap_err();
        assert!(matches!(err, ReadError::Deadline), "{err:?}");
        assert!(trickle.0 < 1000, "{} reads", trickle.0);
    }

    #[test]
    fn an_interrupted_read_is_retried_and_a_failed_one_is_an_error() {
        let err = read_capped(Failing(false), None, 10, later()).unwrap_err();
        assert!(
            matches!(err, ReadError::Io(ref e) if e.to_string() == "reset"),
            "{err:?}"
        );
    }
}
