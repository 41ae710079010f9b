//! tmpfs options as the kernel reads them, in one parser: a service's `tmpfs` entries
//! (`/run:size=64m,mode=1777`), a top-level volume's `driver_opts.o`, and the bytes and inodes
//! the budget allows one mount.

use serde_json::Value;

use super::Budget;
use super::units::{KernelSize, human, memparse, parse_kernel_size};

/// A page as tmpfs counts `nr_inodes` against its size: the budget allows one inode per page
/// of [`Budget::max_tmpfs_size`], the kernel's own default ratio.
const PAGE: u64 = 4096;

/// One option of a tmpfs mount's comma-separated list (`size=64m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TmpfsOption<'a> {
    /// The option as written, between its commas.
    pub(crate) text: &'a str,
    /// The option's name, before any `=`, without surrounding whitespace.
    pub(crate) name: &'a str,
    /// What follows the `=`, as written; empty without one.
    pub(crate) value: &'a str,
    /// Whether whitespace sits between the name and its `=` (`size =64m`): the kernel reads
    /// that as an option of another name.
    pub(crate) spaced_name: bool,
}

/// The options of a tmpfs mount (`size=64m,mode=1777`), blank ones skipped.
pub(crate) fn tmpfs_options(opts: &str) -> impl Iterator<Item = TmpfsOption<'_>> {
    opts.split(',')
        .filter(|o| !o.trim().is_empty())
        .map(|text| {
            let (name, value, spaced_name) = match text.split_once('=') {
                Some((key, value)) => (key.trim(), value, key.trim_start() != key.trim()),
                None => (text.trim(), "", false),
            };
            TmpfsOption {
                text,
                name,
                value,
                spaced_name,
            }
        })
}

/// The options part of each entry of a service's `tmpfs` (one string or a list of
/// `target[:options]`); empty for an entry without options.
pub(super) fn service_tmpfs_options(v: Option<&Value>) -> Vec<String> {
    let entries = match v {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    entries
        .into_iter()
        .map(|t| t.split_once(':').map_or("", |(_, o)| o).to_string())
        .collect()
}

impl Budget {
    /// Bytes of one tmpfs mount's options (`size=64m,mode=1777`) as the kernel reads them:
    /// `Ok(None)` without a size, `Err` a finding's text for what the budget cannot allow.
    pub(super) fn tmpfs_bytes(&self, opts: &str) -> Result<Option<u64>, String> {
        let mut bytes = None;
        for o in tmpfs_options(opts) {
            match o.name {
                "size" => bytes = Some(self.tmpfs_size(o)?),
                // The kernel takes the last of `size=` and `nr_blocks=`; a size in pages is
                // refused rather than read against a page size the budget cannot see.
                "nr_blocks" => {
                    return Err(format!(
                        "{} is a size in pages the budget does not read (write it as size=64m, up to budget.max_tmpfs_size {})",
                        o.text,
                        human(self.max_tmpfs_size)
                    ));
                }
                "nr_inodes" => self.tmpfs_inodes(o)?,
                _ => {}
            }
        }
        Ok(bytes)
    }

    /// The bytes of one `size=` option; `Err` for unlimited, a share of a memory the budget does
    /// not know, or a size the kernel reads otherwise.
    fn tmpfs_size(&self, o: TmpfsOption<'_>) -> Result<u64, String> {
        let (value, o, limit) = (o.value, o.text, human(self.max_tmpfs_size));
        match parse_kernel_size(value) {
            Some(KernelSize::Bytes(0)) => Err(format!(
                "{o} (unlimited) over budget.max_tmpfs_size {limit}"
            )),
            Some(KernelSize::Bytes(n)) => Ok(n),
            Some(KernelSize::Percent(pct)) => match self.max_memory {
                Some(m) => {
                    Ok(((u128::from(m) * u128::from(pct)) / 100).min(u128::from(u64::MAX)) as u64)
                }
                None => Err(format!(
                    "{o} is a share of the host's memory, which the budget does not know (write it as size=64m, up to budget.max_tmpfs_size {limit})"
                )),
            },
            None => Err(format!(
                "{o} is not a size the kernel reads as the budget does (write it as size=64m, up to budget.max_tmpfs_size {limit})"
            )),
        }
    }

    /// Inodes cost kernel memory outside the size: `nr_inodes=0` is no limit, and the budget
    /// allows one per page of `max_tmpfs_size`.
    fn tmpfs_inodes(&self, o: TmpfsOption<'_>) -> Result<(), String> {
        let (limit, most) = (human(self.max_tmpfs_size), self.max_tmpfs_size / PAGE);
        let o_text = o.text;
        match memparse(o.value) {
            Some((0, "")) => Err(format!(
                "{o_text} (unlimited) over budget.max_tmpfs_size {limit} (one inode per 4 KiB: {most})"
            )),
            Some((n, "")) if n <= most => Ok(()),
            Some((_, "")) => Err(format!(
                "{o_text} over budget.max_tmpfs_size {limit} (one inode per 4 KiB: {most})"
            )),
            _ => Err(format!(
                "{o_text} is not a count the kernel reads as the budget does (up to {most}, one inode per 4 KiB of budget.max_tmpfs_size {limit})"
            )),
        }
    }

    /// The size of a top-level volume of the local driver's tmpfs shape
    /// (`driver_opts: {type: tmpfs, o: size=...}`), as the kernel reads its `o`.
    pub(super) fn tmpfs_volume(&self, vol: &Value) -> Result<Option<u64>, String> {
        let Some(opts) = vol.get("driver_opts") else {
            return Ok(None);
        };
        if opts.get("type").and_then(Value::as_str) != Some("tmpfs") {
            return Ok(None);
        }
        match opts.get("o").and_then(Value::as_str) {
            Some(o) => self.tmpfs_bytes(o),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_read_as_one_list_for_the_budget_and_the_policy() {
        let read: Vec<_> = tmpfs_options(" size=64m, ,mode =1777,noexec ,nr_inodes")
            .map(|o| (o.text, o.name, o.value, o.spaced_name))
            .collect();
        assert_eq!(
            read,
            [
                (" size=64m", "size", "64m", false),
                ("mode =1777", "mode", "1777", true),
                ("noexec ", "noexec", "", false),
                ("nr_inodes", "nr_inodes", "", false),
            ]
        );
    }

    #[test]
    fn service_entries_give_their_options() {
        let v = serde_json::json!(["/run:size=64m,mode=1777", "/tmp", 3]);
        assert_eq!(service_tmpfs_options(Some(&v)), ["size=64m,mode=1777", ""]);
        let one = serde_json::json!("/t:size=1g");
        assert_eq!(service_tmpfs_options(Some(&one)), ["size=1g"]);
    }
}
