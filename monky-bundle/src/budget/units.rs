//! The size, count and duration grammars the budget reads values in: docker's sizes
//! (`RAMInBytes`), compose's durations (Go's `ParseDuration`) and the kernel's `memparse` for
//! tmpfs options, and how a finding shows bytes and durations.

use std::time::Duration;

use serde_json::Value;

pub(super) const KIB: u64 = 1024;
pub(super) const MIB: u64 = 1024 * KIB;
pub(super) const GIB: u64 = 1024 * MIB;

/// A size as docker reads one (`RAMInBytes`): digits with an optional fraction, an optional
/// space, and an optional binary unit `k`, `m`, `g`, `t`, `p` (any case) with an optional `i`
/// and `b`: `1g`, `1.5GiB`, `512m`, `100 kb`, `1024`.
///
/// ```
/// use monky_bundle::budget::parse_size;
/// assert_eq!(parse_size("1.5g"), Some(1_610_612_736));
/// assert_eq!(parse_size("64M"), Some(64 << 20));
/// assert_eq!(parse_size("1x"), None);
/// ```
#[must_use]
pub fn parse_size(text: &str) -> Option<u64> {
    let s = text.trim();
    let digits = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, rest) = s.split_at(digits);
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return None;
    }
    let rest = rest.strip_prefix(' ').unwrap_or(rest).to_ascii_lowercase();
    let mut unit = rest.as_str();
    let mult = match unit.chars().next() {
        Some('k') => KIB,
        Some('m') => MIB,
        Some('g') => GIB,
        Some('t') => GIB * KIB,
        Some('p') => GIB * MIB,
        _ => 1,
    };
    if mult > 1 {
        unit = &unit[1..];
    }
    unit = unit.strip_prefix('i').unwrap_or(unit);
    unit = unit.strip_prefix('b').unwrap_or(unit);
    if !unit.is_empty() {
        return None;
    }
    // docker reads `1.5.3` as 1.5 (its pattern allows more fractions); so does this.
    let mut parts = number.split('.');
    let whole: f64 = parts.next()?.parse().ok()?;
    let frac: f64 = parts
        .next()
        .map_or(Some(0.0), |f| format!("0.{f}").parse().ok())?;
    let bytes = (whole + frac) * mult as f64;
    // `as` saturates: a size past u64::MAX is over every limit anyway.
    Some(bytes as u64)
}

/// A duration as compose reads one (Go's `ParseDuration`): a sequence of numbers with units
/// `ns`, `us`, `µs`, `ms`, `s`, `m`, `h`, e.g. `1m30s`, `1.5h`, `500ms`; `0` alone is zero.
///
/// ```
/// use std::time::Duration;
/// use monky_bundle::budget::parse_duration;
/// assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
/// assert_eq!(parse_duration("1ms"), Some(Duration::from_millis(1)));
/// assert_eq!(parse_duration("10"), None);
/// ```
#[must_use]
pub fn parse_duration(text: &str) -> Option<Duration> {
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return None;
    }
    let mut rest = s;
    let mut total = 0.0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[u..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total).ok()
}

pub(super) fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f.max(0.0) as u64)),
        Value::String(s) => parse_size(s),
        _ => None,
    }
}

pub(super) fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn as_duration(v: &Value) -> Option<Duration> {
    v.as_str().and_then(parse_duration)
}

/// Bytes as a finding shows them: `1 GiB`, `64 MiB`, `1.5 GiB`, plain bytes below a KiB.
pub(super) fn human(bytes: u64) -> String {
    for (unit, size) in [
        ("EiB", GIB * GIB),
        ("PiB", GIB * MIB),
        ("TiB", GIB * KIB),
        ("GiB", GIB),
        ("MiB", MIB),
        ("KiB", KIB),
    ] {
        if bytes >= size {
            let n = bytes as f64 / size as f64;
            return if n.fract() == 0.0 {
                format!("{n:.0} {unit}")
            } else {
                format!("{n:.1} {unit}")
            };
        }
    }
    format!("{bytes} bytes")
}

pub(super) fn secs(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) || ms == 0 {
        format!("{ms}ms")
    } else {
        format!("{}s", ms / 1000)
    }
}

/// A size as the kernel's tmpfs reads one (`memparse`): an integer in C's notation (`0x` hex,
/// a leading `0` octal, else decimal; no digits at all is 0), then at most one of the suffixes
/// `k`, `m`, `g`, `t`, `p`, `e` (either case, binary), then, for `size=` alone, an optional
/// `%` of the host's memory. `1e` is an exbibyte, `0x40000000` a gibibyte, `010m` 8 MiB, and
/// `1.5g` fails the mount. `None` for anything else, and for a number past 64 bits (the kernel
/// wraps it silently).
///
/// ```
/// use monky_bundle::budget::{parse_kernel_size, KernelSize};
/// assert_eq!(parse_kernel_size("1e"), Some(KernelSize::Bytes(1 << 60)));
/// assert_eq!(parse_kernel_size("0x400k"), Some(KernelSize::Bytes(1 << 20)));
/// assert_eq!(parse_kernel_size("50%"), Some(KernelSize::Percent(50)));
/// assert_eq!(parse_kernel_size("1.5g"), None);
/// ```
#[must_use]
pub fn parse_kernel_size(text: &str) -> Option<KernelSize> {
    let (n, rest) = memparse(text)?;
    match rest {
        "" => Some(KernelSize::Bytes(n)),
        "%" => Some(KernelSize::Percent(n)),
        _ => None,
    }
}

/// A tmpfs size as [`parse_kernel_size`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSize {
    /// Bytes; 0 is no limit at all.
    Bytes(u64),
    /// A share of the host's memory, in percent (it may be over 100).
    Percent(u64),
}

/// `memparse`'s number and suffix, and the text after them; `None` past 64 bits.
pub(super) fn memparse(text: &str) -> Option<(u64, &str)> {
    let b = text.as_bytes();
    let (radix, start) =
        if b.len() > 2 && b[0] == b'0' && (b[1] | 0x20) == b'x' && b[2].is_ascii_hexdigit() {
            (16, 2)
        } else if b.first() == Some(&b'0') {
            (8, 0)
        } else {
            (10, 0)
        };
    let end = text[start..]
        .find(|c: char| !c.is_digit(radix))
        .map_or(text.len(), |i| start + i);
    let n = if end == start {
        0
    } else {
        u64::from_str_radix(&text[start..end], radix).ok()?
    };
    let mut rest = &text[end..];
    let shift = match rest.bytes().next().map(|c| c | 0x20) {
        Some(b'e') => 60,
        Some(b'p') => 50,
        Some(b't') => 40,
        Some(b'g') => 30,
        Some(b'm') => 20,
        Some(b'k') => 10,
        _ => 0,
    };
    if shift > 0 {
        rest = &rest[1..];
    }
    let n = n.checked_mul(1u64 << shift)?;
    Some((n, rest))
}
