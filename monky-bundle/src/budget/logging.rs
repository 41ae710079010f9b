//! Logs on the box's disk or journal: the `json-file` and `local` drivers' `max-size` and
//! `max-file` up to the box's, a service that names no driver judged as the `json-file` the
//! agent supplies it, and the host's journal only where the box allows it.

use serde_json::{Map, Value};

use super::units::{as_i64, as_u64, human};
use super::{Budget, Shown, at};

impl Budget {
    /// The sizes of a named `json-file` or `local` driver: `max-size` read (the daemon reads it
    /// with Go's float syntax, so `1e3g` is 1000 GB on a current dockerd: a size this check
    /// cannot read is refused, never skipped) and up to `max_log_size`, `max-file` up to
    /// `max_log_files`. The agent supplies the box's `max-size` to `json-file` without one; on
    /// compose's model with the override in force (`need_pids`), a `json-file` still without
    /// one means it did not land.
    pub(super) fn log_sizes(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        need_pids: bool,
        out: &mut Vec<String>,
    ) {
        let Some(logging) = at(svc, "logging").and_then(Value::as_object) else {
            return;
        };
        let driver = logging.get("driver").and_then(Value::as_str).map(str::trim);
        let opts = logging.get("options").and_then(Value::as_object);
        let opt = |k: &str| opts.and_then(|o| o.get(k)).filter(|v| !v.is_null());
        if driver == Some("json-file") && opt("max-size").is_none() && need_pids {
            out.push(format!(
                "logging json-file without max-size (the box's {} was not supplied)",
                human(self.default_log_size)
            ));
        }
        if !matches!(driver, Some("json-file" | "local")) {
            return;
        }
        if let Some(v) = opt("max-size")
            && as_u64(v).is_none()
        {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            out.push(format!(
                "{} is not a size the budget reads (write it as 10m, up to budget.max_log_size {})",
                shown.show("logging max-size", &text),
                human(self.max_log_size)
            ));
        }
        if let Some(size) = opt("max-size").and_then(as_u64)
            && size > self.max_log_size
        {
            let max = human(self.max_log_size);
            shown.over(out, "logging max-size", &human(size), "max_log_size", &max);
        }
        if let Some(n) = opt("max-file").and_then(as_i64)
            && n > 0
            && n as u64 > self.max_log_files
        {
            let max = self.max_log_files.to_string();
            shown.over(
                out,
                "logging max-file",
                &n.to_string(),
                "max_log_files",
                &max,
            );
        }
    }

    /// Logging that the box's disk or journal pays for, whatever shape it takes. A service that
    /// names no driver (no `logging`, `driver: ""`, `options` alone) would get the daemon's
    /// default driver with the bundle's options over `daemon.json`'s, so the agent supplies
    /// `json-file` with the box's defaults and the bundle's options are judged as `json-file`
    /// reads them; on compose's model (`supplied`) every service must then show a driver.
    pub(super) fn logging_bounds(
        &self,
        svc: &Map<String, Value>,
        shown: &Shown<'_>,
        supplied: bool,
        out: &mut Vec<String>,
    ) {
        let logging = svc.get("logging").filter(|v| !v.is_null());
        let opts = logging
            .and_then(|l| l.get("options"))
            .and_then(Value::as_object);
        match logging
            .and_then(|l| l.get("driver"))
            .filter(|d| !d.is_null())
        {
            None => {}
            Some(Value::String(d)) if d.is_empty() => {}
            Some(Value::String(d)) if d == "journald" => {
                if !self.allow_journald {
                    out.push(format!(
                        "{} writes to the host's journal, shared with the host and every env, which no budget bounds (allowed by budget.allow_journald)",
                        shown.show("logging driver", d)
                    ));
                }
                return;
            }
            Some(Value::String(d)) if d == "json-file" || d == "local" => {
                self.log_files(opts, shown, out);
                return;
            }
            Some(_) => return,
        }
        if supplied {
            out.push(format!(
                "logging names no driver (the box's json-file with max-size {} was not supplied)",
                human(self.default_log_size)
            ));
            return;
        }
        self.unnamed_driver_bounds(opts, shown, out);
    }

    /// The options of a service that names no logging driver, read as `json-file` reads them.
    fn unnamed_driver_bounds(
        &self,
        opts: Option<&Map<String, Value>>,
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        if let Some(size) = opts
            .and_then(|o| o.get("max-size"))
            .filter(|v| !v.is_null())
        {
            let hint = format!(
                "write it as 10m, up to budget.max_log_size {}",
                human(self.max_log_size)
            );
            match as_u64(size) {
                None => shown.unread(out, "logging max-size", size, "a size", &hint),
                Some(n) if n > self.max_log_size => out.push(format!(
                    "{} over budget.max_log_size {}",
                    shown.show("logging max-size", &human(n)),
                    human(self.max_log_size)
                )),
                Some(_) => {}
            }
        }
        self.log_files(opts, shown, out);
        if let Some(n) = opts
            .and_then(|o| o.get("max-file"))
            .and_then(as_i64)
            .filter(|n| *n > 0 && *n as u64 > self.max_log_files)
        {
            out.push(format!(
                "{} over budget.max_log_files {}",
                shown.show("logging max-file", &n.to_string()),
                self.max_log_files
            ));
        }
    }

    /// A `max-file` the daemon reads as a whole number (`strconv.Atoi`); anything else is
    /// refused rather than skipped.
    fn log_files(
        &self,
        opts: Option<&Map<String, Value>>,
        shown: &Shown<'_>,
        out: &mut Vec<String>,
    ) {
        if let Some(v) = opts
            .and_then(|o| o.get("max-file"))
            .filter(|v| !v.is_null())
            && as_i64(v).is_none()
        {
            let hint = format!(
                "write it as \"3\", up to budget.max_log_files {}",
                self.max_log_files
            );
            shown.unread(out, "logging max-file", v, "a count", &hint);
        }
    }
}
