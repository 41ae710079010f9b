//! A raw HTTP peer for client tests: one connection on 127.0.0.1, answered with bytes a test
//! writes itself (a redirect, a body trickled a byte at a time, an endless chunked stream), and
//! the request head it received. The fakes speak the protocols; this speaks whatever a test
//! needs a misbehaving server to say. Also what the hardening tests (monky-http's) use: the
//! checklist's ids and a process with proxy variables set.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How a [`RawPeer`] sends the body after the head.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RawBody {
    /// These bytes at once.
    Whole(Vec<u8>),
    /// These bytes one at a time, `pace` apart.
    Trickle {
        /// The body.
        bytes: Vec<u8>,
        /// The pause before each byte.
        pace: Duration,
    },
    /// `chunks` chunks of 64 KiB of `x` in chunked framing, then the last chunk; the head must
    /// say `Transfer-Encoding: chunked`.
    Chunked {
        /// How many 64 KiB chunks.
        chunks: usize,
    },
}

/// A one-connection HTTP server on 127.0.0.1: it reads the request head, answers with the
/// given head and body, and counts the body bytes the client took before it went away.
#[derive(Debug)]
pub struct RawPeer {
    addr: SocketAddr,
    head: Arc<Mutex<Option<String>>>,
    sent: Arc<AtomicUsize>,
}

impl RawPeer {
    /// Answers the first connection with `head` (status line and headers, blank line
    /// included) and then `body`.
    ///
    /// # Panics
    /// When 127.0.0.1:0 cannot be bound.
    #[must_use]
    pub fn start(head: impl Into<String>, body: RawBody) -> RawPeer {
        let head = head.into();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let seen = Arc::new(Mutex::new(None));
        let sent = Arc::new(AtomicUsize::new(0));
        let (seen_by_server, sent_by_server) = (Arc::clone(&seen), Arc::clone(&sent));
        std::thread::spawn(move || {
            let Ok((mut stream, _)) = listener.accept() else {
                return;
            };
            let mut buf = [0u8; 8192];
            let n = stream.read(&mut buf).unwrap_or(0);
            *seen_by_server
                .lock()
                .unwrap_or_else(PoisonError::into_inner) =
                Some(String::from_utf8_lossy(&buf[..n]).into_owned());
            if stream.write_all(head.as_bytes()).is_err() {
                return;
            }
            let count = |n: usize| sent_by_server.fetch_add(n, Ordering::SeqCst);
            match body {
                RawBody::Whole(bytes) => {
                    if stream.write_all(&bytes).is_ok() {
                        count(bytes.len());
                    }
                }
                RawBody::Trickle { bytes, pace } => {
                    for byte in bytes {
                        std::thread::sleep(pace);
                        if stream
                            .write_all(&[byte])
                            .and_then(|()| stream.flush())
                            .is_err()
                        {
                            return;
                        }
                        count(1);
                    }
                }
                RawBody::Chunked { chunks } => {
                    let chunk = vec![b'x'; 64 * 1024];
                    let framed =
                        [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
                    for _ in 0..chunks {
                        if stream.write_all(&framed).is_err() {
                            return;
                        }
                        count(chunk.len());
                    }
                    let _ = stream.write_all(b"0\r\n\r\n");
                }
            }
        });
        RawPeer {
            addr,
            head: seen,
            sent,
        }
    }

    /// Answers the first connection with `status` (e.g. `200 OK`) and a JSON `body`, at once.
    #[must_use]
    pub fn json(status: &str, body: &str) -> RawPeer {
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            body.len()
        );
        RawPeer::start(head, RawBody::Whole(body.as_bytes().to_vec()))
    }

    /// Answers with `200 OK` and the JSON `body` one byte every `pace`, after a head that
    /// announces its length.
    #[must_use]
    pub fn trickle_json(body: &str, pace: Duration) -> RawPeer {
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let bytes = body.as_bytes().to_vec();
        RawPeer::start(head, RawBody::Trickle { bytes, pace })
    }

    /// Answers with `200 OK` and a JSON content type, then a GiB of `x` chunked, without a
    /// length: only reading tells the client the size.
    #[must_use]
    pub fn endless_json() -> RawPeer {
        RawPeer::start(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            RawBody::Chunked { chunks: 16 * 1024 },
        )
    }

    /// The address to send the client to.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>/`.
    ///
    /// # Panics
    /// Never: a socket address always makes a URL.
    #[must_use]
    pub fn url(&self) -> url::Url {
        url::Url::parse(&format!("http://{}/", self.addr)).expect("a url")
    }

    /// The request head the peer read, once a client has connected.
    #[must_use]
    pub fn request_head(&self) -> Option<String> {
        self.head
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many body bytes the client took so far.
    #[must_use]
    pub fn body_bytes_sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }
}

/// The variable that marks the child process of [`with_proxy_env`].
const PROXY_ENV_CHILD: &str = "MONKY_TEST_PROXY_ENV_CHILD";

/// Runs `check` in a fresh process of the calling test binary, whose proxy variables
/// (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, upper and lower case) all name a loopback
/// [`RawPeer`], and asserts that it passed and that the proxy saw no request. A test's own
/// process cannot set variables for a client safely, as other tests run beside it.
///
/// `test` is the calling test's name, which the child runs alone; in the child this runs
/// `check` and returns.
///
/// # Panics
/// When the child fails or the proxy was dialled.
pub fn with_proxy_env(test: &str, check: impl FnOnce()) {
    if std::env::var(PROXY_ENV_CHILD).as_deref() == Ok(test) {
        check();
        return;
    }
    let proxy = RawPeer::json("200 OK", "{}");
    let url = format!("http://{}", proxy.addr());
    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"));
    child
        .args([test, "--exact", "--test-threads=1"])
        .env(PROXY_ENV_CHILD, test)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy");
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        child.env(name, &url).env(name.to_lowercase(), &url);
    }
    let out = child.output().expect("run the test binary again");
    // A name that matches no test would pass with nothing run.
    let ran = String::from_utf8_lossy(&out.stdout).contains(" 1 passed");
    assert!(
        out.status.success() && ran,
        "{test} under proxy variables: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(proxy.request_head(), None, "the client dialled the proxy");
}

/// The ids of docs/architecture.md's "HTTP clients: the hardening checklist", in order: the
/// first backquoted word of each of the section's list items.
///
/// # Panics
/// When the section is missing.
#[must_use]
pub fn hardening_checklist() -> Vec<&'static str> {
    const DOC: &str = include_str!("../../docs/architecture.md");
    const HEADING: &str = "\n## HTTP clients: the hardening checklist\n";
    let (_, section) = DOC
        .split_once(HEADING)
        .expect("docs/architecture.md has the hardening checklist");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|line| line.strip_prefix("- `")?.split_once('`'))
        .map(|(id, _)| id)
        .collect()
}

/// monky-http's hardening test table: the cases, by name, in the checklist's order. It makes the
/// test `the_table_is_the_checklist`, which fails when the names are not the checklist's ids
/// ([`assert_table_is_the_checklist`]); naming a missing case does not compile.
#[macro_export]
macro_rules! hardening_table {
    ($($case:ident),* $(,)?) => {
        #[test]
        fn the_table_is_the_checklist() {
            let _cases: &[fn()] = &[$($case),*];
            $crate::raw::assert_table_is_the_checklist(&[$(stringify!($case)),*]);
        }
    };
}

/// Asserts that the hardening test table has exactly the checklist's ids, in order, so no rule
/// is dropped or added without the doc following.
///
/// # Panics
/// When `table` differs from [`hardening_checklist`].
pub fn assert_table_is_the_checklist(table: &[&str]) {
    assert_eq!(
        table,
        hardening_checklist().as_slice(),
        "tests/hardening.rs and docs/architecture.md's hardening checklist differ"
    );
}
