//! The `.env` grammar as compose reads it: a file of statements, not of lines. A quoted value
//! runs to its closing quote, across line breaks, so a `#` or a reference on a later line
//! belongs to the value; a `#` where a statement would start is a comment to the end of its
//! line.
//!
//! As compose-go's dotenv reader (the one `docker compose` links) has it: blanks and line
//! breaks before a statement are skipped; `export` and blanks before a key are dropped; a key
//! is letters, digits, `_`, `.`, `-`, `[` and `]` up to `=` or `:` (a key alone on its line
//! takes its value from compose's own environment, not from the file); blanks after the
//! separator are skipped; a value in `"` or `'` ends at the first quote that no backslash
//! escapes (whatever follows on that line is read as the next statement); any other value
//! ends at the line break, is cut at the first ` #` and loses its trailing blanks. Text that
//! compose would reject (a key with another character or a blank inside, a quote never
//! closed) makes compose fail the whole file; the scan skips such a line, or takes an
//! unclosed quote to the end of the text, so that nothing a value could hold goes unseen.

/// One `KEY=value` statement: its key and where its value's text lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Statement<'a> {
    /// The key, as compose reads it.
    pub key: &'a str,
    /// The value's byte range in the text (inside its quotes) and its quote; `None` for a key
    /// with no value of the file's own.
    pub value: Option<Span>,
}

/// Where a value lies in the text and how it is quoted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: usize,
    pub end: usize,
    pub quote: Option<u8>,
}

impl Span {
    /// Whether byte `at` lies in the value.
    pub fn holds(&self, at: usize) -> bool {
        (self.start..self.end).contains(&at)
    }
}

/// Every statement of a `.env` text, and the byte offset of every comment's `#`.
#[derive(Debug, Default)]
pub(crate) struct Scan<'a> {
    pub statements: Vec<Statement<'a>>,
    pub comments: Vec<usize>,
}

impl Scan<'_> {
    /// The value that byte `at` lies in.
    pub fn value_at(&self, at: usize) -> Option<Span> {
        self.statements
            .iter()
            .filter_map(|s| s.value)
            .find(|v| v.holds(at) || (v.start == v.end && v.start == at))
    }

    /// Whether the line starting at byte `start` of `text` is a comment line: its first
    /// character that is not blank starts a comment.
    pub fn is_comment_line(&self, text: &str, start: usize) -> bool {
        let line = &text[start..];
        let blank = line.len() - line.trim_start_matches([' ', '\t']).len();
        self.comments.binary_search(&(start + blank)).is_ok()
    }
}

/// Blanks compose skips around keys and values: not a line break.
fn is_blank(c: char) -> bool {
    matches!(
        c,
        '\t' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{85}' | '\u{a0}'
    )
}

fn is_key_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '[' | ']')
}

/// Reads `text` as compose reads a `.env` file.
pub(crate) fn scan(text: &str) -> Scan<'_> {
    let mut out = Scan::default();
    let mut pos = 0;
    let line_end = |from: usize| text[from..].find('\n').map_or(text.len(), |n| from + n);
    while let Some(skip) = text[pos..].find(|c: char| !c.is_whitespace()) {
        pos += skip;
        if text[pos..].starts_with('#') {
            out.comments.push(pos);
            pos = line_end(pos);
            continue;
        }
        let mut key_start = pos;
        let rest = &text[pos..];
        if rest.starts_with("export") && rest[6..].starts_with(char::is_whitespace) {
            key_start += 6;
            key_start +=
                text[key_start..].len() - text[key_start..].trim_start_matches(is_blank).len();
        }
        let mut sep = None;
        for (i, c) in text[key_start..].char_indices() {
            if matches!(c, '=' | ':' | '\n') {
                sep = Some((key_start + i, c));
                break;
            }
            if !is_blank(c) && !is_key_char(c) {
                break;
            }
        }
        let Some((at, c)) = sep else {
            // compose refuses the file; nothing of this line is a value.
            pos = line_end(pos);
            continue;
        };
        let key = text[key_start..at].trim_end_matches(char::is_whitespace);
        if key.contains(char::is_whitespace) {
            pos = line_end(pos);
            continue;
        }
        if c == '\n' {
            out.statements.push(Statement { key, value: None });
            pos = at + 1;
            continue;
        }
        let mut v = at + 1;
        v += text[v..].len() - text[v..].trim_start_matches(is_blank).len();
        match text.as_bytes().get(v) {
            Some(&q @ (b'"' | b'\'')) => {
                let bytes = text.as_bytes();
                let mut j = v + 1;
                let mut escaped = false;
                while j < bytes.len() {
                    match bytes[j] {
                        b'\\' if !escaped => escaped = true,
                        b if b == q && !escaped => break,
                        _ => escaped = false,
                    }
                    j += 1;
                }
                out.statements.push(Statement {
                    key,
                    value: Some(Span {
                        start: v + 1,
                        end: j.min(bytes.len()),
                        quote: Some(q),
                    }),
                });
                pos = (j + 1).min(text.len());
            }
            _ => {
                let end = line_end(v);
                let body = &text[v..end];
                let body = body.find(" #").map_or(body, |n| &body[..n]);
                let body = body.trim_end_matches(char::is_whitespace);
                out.statements.push(Statement {
                    key,
                    value: Some(Span {
                        start: v,
                        end: v + body.len(),
                        quote: None,
                    }),
                });
                pos = end;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(key, value text)` of each statement.
    fn check(text: &str, expected: &[(&str, Option<&str>)]) {
        let got: Vec<(&str, Option<&str>)> = scan(text)
            .statements
            .iter()
            .map(|s| (s.key, s.value.map(|v| &text[v.start..v.end])))
            .collect();
        assert_eq!(got, expected, "{text:?}");
    }

    #[test]
    fn statements_are_read_as_compose_reads_them() {
        check(
            "A=1\n# B=2\n  # C=3\nD = 4 #x\n",
            &[("A", Some("1")), ("D", Some("4"))],
        );
        check("A=x\t#y\n", &[("A", Some("x\t#y"))]);
        check(
            "export A=1\nexport\tB='2'\n",
            &[("A", Some("1")), ("B", Some("2"))],
        );
        check("A: yaml\n", &[("A", Some("yaml"))]);
        check("INHERITED\nB=1\n", &[("INHERITED", None), ("B", Some("1"))]);
        check("a.b-c[0]=1\n", &[("a.b-c[0]", Some("1"))]);
        // A quoted value spans lines; a `#` or a reference inside it is the value's.
        check(
            "M=\"x\n# not a comment ${PW}\" B=2\nC=3\n",
            &[
                ("M", Some("x\n# not a comment ${PW}")),
                ("B", Some("2")),
                ("C", Some("3")),
            ],
        );
        check("S='a\\'b\nc'\n", &[("S", Some("a\\'b\nc"))]);
        check("D=\"a\\\"b\"\n", &[("D", Some("a\\\"b"))]);
        // What compose refuses is no value; an unclosed quote runs to the end.
        check("bad key=1\nA=1\n", &[("A", Some("1"))]);
        check("A=\"open\nB=1\n", &[("A", Some("open\nB=1\n"))]);
    }

    #[test]
    fn comment_lines_are_told_by_the_statement_they_are_in() {
        let text = "# top\nM=\"x\n#in\"\n  # after\n";
        let s = scan(text);
        let starts: Vec<usize> = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .filter(|i| *i < text.len())
            .collect();
        let comments: Vec<bool> = starts.iter().map(|i| s.is_comment_line(text, *i)).collect();
        assert_eq!(comments, [true, false, false, true]);
    }
}
