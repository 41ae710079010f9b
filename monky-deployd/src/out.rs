//! The commands' printers: `outln!` and `outblock!` for their output, `errln!` for their notes
//! on stderr, every one escaping peers' control characters, and a closed pipe ending the
//! process quietly.

/// `println!` for the commands' output, which may go to a pipe whose reader has gone
/// (`status --json | head`): a closed pipe ends the process quietly with status 0 instead of
/// the panic `println!` gives, because the reader has already taken all it wanted.
///
/// One call is one line: a line break or any other control character in what it prints (a
/// peer's text) comes out escaped. [`outblock!`] prints a document of several lines.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::write_out(::std::format_args!($($arg)*), false)
    };
}

/// [`outln!`] for a document of several lines (`--json`): its line breaks stay, every other
/// control character comes out escaped.
macro_rules! outblock {
    ($($arg:tt)*) => {
        $crate::out::write_out(::std::format_args!($($arg)*), true)
    };
}

/// `eprintln!` for the commands' own notes on stderr: control characters escaped, as every
/// printer escapes them.
macro_rules! errln {
    ($($arg:tt)*) => {
        ::std::eprintln!(
            "{}",
            $crate::redact::escape_controls(&::std::format!($($arg)*), false)
        )
    };
}

/// Writes one line of a command's output; see [`outln!`].
pub(crate) fn write_out(args: std::fmt::Arguments<'_>, block: bool) {
    use std::io::Write;
    let text = args.to_string();
    // Peers' text on a terminal: every control character escaped, line breaks too unless the
    // caller prints a block.
    let text = crate::redact::escape_controls(&text, block);
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"));
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("monky-deployd: cannot write to stdout: {e}");
            std::process::exit(1);
        }
    }
}
