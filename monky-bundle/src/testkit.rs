//! A raw tar writer for tests (feature `testkit`): it writes what `tar::Builder` refuses to
//! (any name bytes, `..`, links, devices, PAX records), so hostile bundles can be built.

/// Octal field: digits, then NUL.
fn octal(field: &mut [u8], value: u64) {
    let width = field.len() - 1;
    field[..width].copy_from_slice(format!("{value:0width$o}").as_bytes());
    field[width] = 0;
}

/// One raw ustar header: any name bytes (up to 100), prefix (up to 155), type flag and link.
pub fn raw_header(name: &[u8], prefix: &[u8], typeflag: u8, size: u64, link: &[u8]) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0);
    h[156] = typeflag;
    h[157..157 + link.len()].copy_from_slice(link);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[345..345 + prefix.len()].copy_from_slice(prefix);
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|b| u64::from(*b)).sum();
    octal(&mut h[148..155], sum);
    h[155] = b' ';
    h
}

/// A raw entry under a ustar `prefix`: header, data, padding to the next 512-byte block.
pub fn prefixed_entry(
    prefix: &[u8],
    name: &[u8],
    typeflag: u8,
    content: &[u8],
    link: &[u8],
) -> Vec<u8> {
    let mut out = raw_header(name, prefix, typeflag, content.len() as u64, link).to_vec();
    out.extend_from_slice(content);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// A raw entry: header, data, padding to the next 512-byte block.
pub fn raw_entry(name: &[u8], typeflag: u8, content: &[u8], link: &[u8]) -> Vec<u8> {
    prefixed_entry(b"", name, typeflag, content, link)
}

/// A PAX record line: `<len> <key>=<value>\n`, where len counts the whole line.
pub fn pax_record(key: &str, value: &str) -> String {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while len.to_string().len() + body.len() != len {
        len += 1;
    }
    format!("{len}{body}")
}
