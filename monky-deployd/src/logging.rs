//! Logging: tracing to stderr (the journal under systemd), redacted, with this tick's lines kept
//! for the report's `log_tail`.

use std::io::{self, Write};
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::redact::{Redacted, redact};

/// The most the report's `log_tail` carries (tenancy keeps the first 2 KiB in its audit log).
pub(crate) const LOG_TAIL_MAX: usize = 16 * 1024;

/// This tick's log lines, each redacted once, on its way to stderr.
fn captured() -> &'static Mutex<Redacted> {
    static CAPTURED: OnceLock<Mutex<Redacted>> = OnceLock::new();
    CAPTURED.get_or_init(|| Mutex::new(Redacted::default()))
}

/// The HTTP stack's own crates: at debug they log every pool checkout and TLS record (104 of
/// 116 lines of a debug tick), while the calls themselves are logged by the agent. Kept at
/// warn unless `RUST_LOG` names them.
const QUIET_CRATES: &[&str] = &["hyper", "hyper_util", "reqwest", "rustls", "h2", "tower"];

/// Starts the subscriber; `level` is the config's `log_level`, `RUST_LOG` wins when set. The
/// filter is built from the level itself, not from its name: a name tracing does not know
/// (`warning`) would parse as a target and silence every line.
pub(crate) fn init(level: tracing::Level) {
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| {
        QUIET_CRATES.iter().fold(
            EnvFilter::default()
                .add_directive(tracing::level_filters::LevelFilter::from_level(level).into()),
            |f, krate| match format!("{krate}=warn").parse() {
                Ok(d) => f.add_directive(d),
                Err(_) => f,
            },
        )
    });
    // A second init (tests, or status after run) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .without_time()
        .with_ansi(false)
        .with_writer(Sink)
        .try_init();
}

/// Starts a new tick's capture.
pub(crate) fn start_capture() {
    *captured().lock().unwrap_or_else(|p| p.into_inner()) = Redacted::default();
}

/// This tick's log lines (redacted as they were written), the end kept within `max` bytes.
pub(crate) fn tail(max: usize) -> Redacted {
    captured()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .tail(max)
}

/// Whether stderr is the journal: `JOURNAL_STREAM` (`<dev>:<inode>`, set by systemd for a
/// unit's stdout/stderr stream) names stderr's own device and inode. A child that inherited the
/// variable but writes elsewhere (a pipe, a file) does not match, so it gets no prefixes.
fn stderr_is_journal() -> bool {
    static IS: OnceLock<bool> = OnceLock::new();
    *IS.get_or_init(|| {
        let Ok(value) = std::env::var("JOURNAL_STREAM") else {
            return false;
        };
        rustix::fs::fstat(io::stderr())
            .is_ok_and(|st| journal_stream_matches(&value, st.st_dev, st.st_ino))
    })
}

/// `JOURNAL_STREAM`'s `<dev>:<inode>` (decimal) against a file's device and inode.
pub(crate) fn journal_stream_matches(value: &str, dev: u64, ino: u64) -> bool {
    value
        .split_once(':')
        .and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)))
        .is_some_and(|(d, i)| d == dev && i == ino)
}

/// The sd-daemon prefix for a level (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug), so
/// `journalctl -p warning` finds the agent's warnings and errors.
pub(crate) fn priority(level: tracing::Level) -> &'static str {
    match level {
        tracing::Level::ERROR => "<3>",
        tracing::Level::WARN => "<4>",
        tracing::Level::INFO => "<6>",
        _ => "<7>",
    }
}

/// Each line of `text` with the level's prefix: the journal splits a stream at newlines and
/// reads a prefix on each line.
pub(crate) fn with_priority(text: &str, level: tracing::Level) -> String {
    let p = priority(level);
    let mut out = String::with_capacity(text.len() + 8);
    for line in text.split_inclusive('\n') {
        out.push_str(p);
        out.push_str(line);
    }
    out
}

/// One formatted event as the journal gets it: control characters escaped, and each line
/// after the first marked `  | `, so it can never read as an event of its own.
fn event_lines(event: &str) -> String {
    let body = event.strip_suffix('\n').unwrap_or(event);
    let mut out = String::with_capacity(event.len() + 8);
    for (n, line) in body.split('\n').enumerate() {
        if n > 0 {
            out.push_str("\n  | ");
        }
        out.push_str(&crate::redact::escape_controls(line, false));
    }
    out.push('\n');
    out
}

/// Where formatted events go: redacted to stderr, and into the tick's capture.
#[derive(Clone, Copy)]
struct Sink;

impl<'a> MakeWriter<'a> for Sink {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(Vec::new(), tracing::Level::INFO)
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        LineWriter(Vec::new(), *meta.level())
    }
}

/// Buffers one event, then writes it out whole on drop.
struct LineWriter(Vec<u8>, tracing::Level);

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        // The one redaction of a log line: callers log raw text, error chains included. Then
        // every control character a peer's text may carry is escaped, and a line break inside
        // the event starts a continuation line marked `  | `: no peer forges a line of its own.
        let redacted = redact(&String::from_utf8_lossy(&self.0));
        let line = event_lines(redacted.as_str());
        if stderr_is_journal() {
            let _ = io::stderr().write_all(with_priority(&line, self.1).as_bytes());
        } else {
            let _ = io::stderr().write_all(line.as_bytes());
        }
        let mut cap = captured().lock().unwrap_or_else(|p| p.into_inner());
        cap.push_lines(&redacted);
        if cap.as_str().len() > 4 * LOG_TAIL_MAX {
            *cap = cap.tail(LOG_TAIL_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_line_break_or_control_character_never_makes_a_line_of_its_own() {
        assert_eq!(event_lines("ERROR x\n"), "ERROR x\n");
        assert_eq!(
            event_lines("ERROR tenancy: bad\r INFO applied abc healthy\n"),
            "ERROR tenancy: bad\\r INFO applied abc healthy\n"
        );
        assert_eq!(
            event_lines(" WARN a\n INFO forged\u{1b}[1A\n"),
            " WARN a\n  |  INFO forged\\u{1b}[1A\n"
        );
    }

    #[test]
    fn journal_lines_carry_sd_daemon_priorities() {
        use tracing::Level;
        assert_eq!(
            with_priority("ERROR UNHEALTHY: web-1\n", Level::ERROR),
            "<3>ERROR UNHEALTHY: web-1\n"
        );
        assert_eq!(
            with_priority(" WARN a\nb\n", Level::WARN),
            "<4> WARN a\n<4>b\n"
        );
        assert_eq!(priority(Level::INFO), "<6>");
        assert_eq!(priority(Level::DEBUG), "<7>");
        assert_eq!(priority(Level::TRACE), "<7>");
    }

    #[test]
    fn journal_stream_names_stderrs_device_and_inode() {
        assert!(journal_stream_matches("64769:123456", 64769, 123_456));
        assert!(!journal_stream_matches("64769:123456", 64769, 1));
        assert!(!journal_stream_matches("1:123456", 64769, 123_456));
        assert!(!journal_stream_matches("", 0, 0));
        assert!(!journal_stream_matches("x:y", 0, 0));
        // the real check, on this process's own stderr
        let st = rustix::fs::fstat(io::stderr()).unwrap();
        let value = format!("{}:{}", st.st_dev, st.st_ino);
        assert!(journal_stream_matches(&value, st.st_dev, st.st_ino));
    }

    #[test]
    fn the_http_stacks_chatter_is_filtered_unless_asked_for() {
        let filter = QUIET_CRATES.iter().fold(
            EnvFilter::default().add_directive(tracing::level_filters::LevelFilter::DEBUG.into()),
            |f, krate| f.add_directive(format!("{krate}=warn").parse().unwrap()),
        );
        let text = filter.to_string();
        for krate in ["hyper", "reqwest", "rustls"] {
            assert!(text.contains(&format!("{krate}=warn")), "{text}");
        }
    }
}
