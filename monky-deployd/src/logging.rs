//! Logging: tracing to stderr (the journal under systemd), redacted, with this tick's lines kept
//! for the report's `log_tail`.

use std::io::{self, Write};
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::redact::redact;

/// The most the report's `log_tail` carries (tenancy keeps the first 2 KiB in its audit log).
pub const LOG_TAIL_MAX: usize = 16 * 1024;

fn captured() -> &'static Mutex<String> {
    static CAPTURED: OnceLock<Mutex<String>> = OnceLock::new();
    CAPTURED.get_or_init(|| Mutex::new(String::new()))
}

/// Starts the subscriber; `level` is the config's `log_level`, `RUST_LOG` wins when set. The
/// filter is built from the level itself, not from its name: a name tracing does not know
/// (`warning`) would parse as a target and silence every line.
pub fn init(level: tracing::Level) {
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| {
        EnvFilter::default()
            .add_directive(tracing::level_filters::LevelFilter::from_level(level).into())
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
pub fn start_capture() {
    captured().lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// This tick's log lines, redacted, the end kept within `max` bytes.
pub fn tail(max: usize) -> String {
    let text = captured().lock().unwrap_or_else(|p| p.into_inner()).clone();
    tail_of(&redact(&text), max)
}

/// The last `max` bytes of `text`, cut at a line start where possible.
pub fn tail_of(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let cut = &text[start..];
    match cut.find('\n') {
        Some(i) if i + 1 < cut.len() => cut[i + 1..].to_string(),
        _ => cut.to_string(),
    }
}

/// Where formatted events go: redacted to stderr, and into the tick's capture.
#[derive(Clone, Copy)]
struct Sink;

impl<'a> MakeWriter<'a> for Sink {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(Vec::new())
    }
}

/// Buffers one event, then writes it out whole on drop.
struct LineWriter(Vec<u8>);

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
        let line = redact(&String::from_utf8_lossy(&self.0));
        let _ = io::stderr().write_all(line.as_bytes());
        let mut cap = captured().lock().unwrap_or_else(|p| p.into_inner());
        cap.push_str(&line);
        if cap.len() > 4 * LOG_TAIL_MAX {
            *cap = tail_of(&cap, LOG_TAIL_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end_at_a_line_start() {
        assert_eq!(tail_of("a\nb\nc\n", 100), "a\nb\nc\n");
        assert_eq!(tail_of("first line\nsecond\nthird\n", 12), "third\n");
        let long = "é".repeat(50);
        assert!(tail_of(&long, 7).len() <= 7);
    }
}
