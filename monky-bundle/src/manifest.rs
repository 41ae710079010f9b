//! `secrets.manifest.json`: which secrets an environment needs, as paths and versions only.

use serde_json::{Map, Value};

use crate::interp::is_env_name;
use crate::refusal::{Refusal, RefusalCode, printable};

/// The `use` value that marks the registry pull credential.
pub const REGISTRY_AUTH_USE: &str = "registry-auth";

const FILE: &str = "secrets.manifest.json";

/// The parsed manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// `vault_mode`, e.g. `openbao` (empty when absent).
    pub vault_mode: String,
    /// The entries, in manifest order.
    pub entries: Vec<ManifestEntry>,
}

/// One secret the environment needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    /// The environment variable it becomes. Always a valid name for an env entry; a
    /// registry-auth entry may omit it (then empty), since it never becomes a variable.
    pub var: String,
    /// The KV path, e.g. `monky/env-qa-02/see/pg_password` (mapped by `monky-bao-client`).
    pub path: String,
    /// `supplied`, `generated`, ... (empty when absent).
    pub kind: String,
    /// The pinned KV version; `None` (JSON `null` or absent) means latest.
    pub version: Option<u64>,
    /// `use`: `Some("registry-auth")` for the registry credential, otherwise `None`.
    pub use_: Option<String>,
}

impl ManifestEntry {
    /// Whether this entry is the registry pull credential rather than an env var.
    pub fn is_registry_auth(&self) -> bool {
        self.use_.as_deref() == Some(REGISTRY_AUTH_USE)
    }
}

impl Manifest {
    /// Keys that would put secret material into the manifest. Matched case-insensitively on
    /// any entry (and at the top level); the manifest carries paths, never values.
    pub const VALUE_KEYS: [&str; 10] = [
        "value",
        "values",
        "secret",
        "secrets",
        "secret_value",
        "data",
        "plaintext",
        "password",
        "token",
        "content",
    ];

    /// Parses and validates the manifest.
    ///
    /// Refusals: `MANIFEST_VALUE_REFUSED` naming every entry's var that carries a value-like
    /// key (`value`, `secret`, `data`, ...); `BUNDLE_INVALID` for malformed JSON, an invalid or
    /// duplicate var name, a missing path, a version that is not a non-negative integer or
    /// null, or a `use` other than `registry-auth` (an unknown use is refused rather than
    /// guessed to be an env var).
    pub fn parse(bytes: &[u8]) -> Result<Manifest, Refusal> {
        let root = parse_json(FILE, bytes)?;
        let Value::Object(root) = root else {
            return Err(Refusal::invalid(format!("{FILE}: not a json object")));
        };
        if root.keys().any(|k| is_value_key(k)) {
            return Err(Refusal::one(
                RefusalCode::ManifestValueRefused,
                "(top level)",
            ));
        }
        let vault_mode = opt_str(&root, "vault_mode", FILE)?.unwrap_or_default();
        let raw_entries = match root.get("entries") {
            None | Some(Value::Null) => &Vec::new(),
            Some(Value::Array(a)) => a,
            Some(_) => return Err(Refusal::invalid(format!("{FILE}: entries is not a list"))),
        };

        // Values are refused before anything else is judged, and all of them are named.
        let mut carrying = Vec::new();
        for (n, e) in raw_entries.iter().enumerate() {
            if let Value::Object(m) = e
                && m.keys().any(|k| is_value_key(k))
            {
                let label = entry_label(m, n);
                if !carrying.contains(&label) {
                    carrying.push(label);
                }
            }
        }
        if !carrying.is_empty() {
            return Err(Refusal::new(RefusalCode::ManifestValueRefused, carrying));
        }

        let mut entries: Vec<ManifestEntry> = Vec::with_capacity(raw_entries.len());
        for (n, e) in raw_entries.iter().enumerate() {
            let Value::Object(m) = e else {
                return Err(Refusal::invalid(format!(
                    "{FILE}: entry {n} is not an object"
                )));
            };
            let entry = parse_entry(m, n)?;
            if !entry.is_registry_auth()
                && entries
                    .iter()
                    .any(|o| !o.is_registry_auth() && o.var == entry.var)
            {
                return Err(Refusal::invalid(format!(
                    "{FILE}: {}: duplicate var",
                    entry.var
                )));
            }
            entries.push(entry);
        }
        Ok(Manifest {
            vault_mode,
            entries,
        })
    }

    /// Entries that become variables in `.env`.
    pub fn env_entries(&self) -> impl Iterator<Item = &ManifestEntry> {
        self.entries.iter().filter(|e| !e.is_registry_auth())
    }

    /// Entries that hold the registry pull credential (never env vars).
    pub fn registry_entries(&self) -> impl Iterator<Item = &ManifestEntry> {
        self.entries.iter().filter(|e| e.is_registry_auth())
    }
}

fn is_value_key(key: &str) -> bool {
    Manifest::VALUE_KEYS
        .iter()
        .any(|v| v.eq_ignore_ascii_case(key))
}

/// How an entry is named in a refusal: its var when that is a valid name, else its index.
fn entry_label(m: &Map<String, Value>, n: usize) -> String {
    match m.get("var") {
        Some(Value::String(v)) if is_env_name(v) => v.clone(),
        _ => format!("entry {n}"),
    }
}

fn parse_entry(m: &Map<String, Value>, n: usize) -> Result<ManifestEntry, Refusal> {
    let label = entry_label(m, n);
    let where_ = format!("{FILE}: {label}");
    let use_ = opt_str(m, "use", &where_)?;
    if let Some(u) = &use_
        && u != REGISTRY_AUTH_USE
    {
        return Err(Refusal::invalid(format!(
            "{where_}: unknown use {}",
            printable(u, 40)
        )));
    }
    let registry = use_.is_some();
    let var = match m.get("var") {
        Some(Value::String(v)) if is_env_name(v) => v.clone(),
        None | Some(Value::Null) if registry => String::new(),
        Some(Value::String(v)) => {
            return Err(Refusal::invalid(format!(
                "{FILE}: entry {n}: invalid var name {}",
                printable(v, 40)
            )));
        }
        Some(_) => {
            return Err(Refusal::invalid(format!(
                "{FILE}: entry {n}: var is not a string"
            )));
        }
        None => return Err(Refusal::invalid(format!("{FILE}: entry {n}: missing var"))),
    };
    let path = match opt_str(m, "path", &where_)? {
        Some(p) if !p.is_empty() => p,
        _ => return Err(Refusal::invalid(format!("{where_}: missing path"))),
    };
    let kind = opt_str(m, "kind", &where_)?.unwrap_or_default();
    let version = match m.get("version") {
        None | Some(Value::Null) => None,
        Some(Value::Number(v)) => match v.as_u64() {
            Some(v) => Some(v),
            None => {
                return Err(Refusal::invalid(format!(
                    "{where_}: version is not a non-negative integer"
                )));
            }
        },
        Some(_) => {
            return Err(Refusal::invalid(format!(
                "{where_}: version is not a number"
            )));
        }
    };
    Ok(ManifestEntry {
        var,
        path,
        kind,
        version,
        use_,
    })
}

/// A string field, `None` when absent or null, refused when another type.
pub(crate) fn opt_str(
    m: &Map<String, Value>,
    key: &str,
    where_: &str,
) -> Result<Option<String>, Refusal> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Refusal::invalid(format!("{where_}: {key} is not a string"))),
    }
}

/// Parses JSON, reporting only the position of a syntax error (never the content).
pub(crate) fn parse_json(file: &str, bytes: &[u8]) -> Result<Value, Refusal> {
    serde_json::from_slice(bytes).map_err(|e| {
        Refusal::invalid(format!(
            "{file}: invalid json at line {} column {}",
            e.line(),
            e.column()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_keys_are_pinned() {
        // The property tests draw from the list itself; this line keeps a key from going.
        let spec = "value values secret secrets secret_value data plaintext password token content";
        assert_eq!(Manifest::VALUE_KEYS.join(" "), spec);
    }

    fn check(json: &str, expected: &str) {
        let got = match Manifest::parse(json.as_bytes()) {
            Ok(m) => format!(
                "ok {} env=[{}] registry=[{}]",
                m.vault_mode,
                m.env_entries()
                    .map(|e| format!("{}@{}:{:?}", e.var, e.path, e.version))
                    .collect::<Vec<_>>()
                    .join(" "),
                m.registry_entries()
                    .map(|e| e.path.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Err(r) => r.to_string(),
        };
        assert_eq!(got, expected, "{json}");
    }

    #[test]
    fn accepted_shapes() {
        check(
            r#"{"vault_mode":"openbao","entries":[
                {"var":"GEMINI_API_KEY","path":"monky/e/see/g","kind":"supplied","version":2},
                {"var":"PG","path":"monky/e/see/pg","kind":"generated","version":null},
                {"var":"HARBOR","path":"monky/e/see/harbor","kind":"supplied","use":"registry-auth"},
                {"path":"monky/e/see/harbor2","use":"registry-auth","note":"ignored"}]}"#,
            "ok openbao env=[GEMINI_API_KEY@monky/e/see/g:Some(2) PG@monky/e/see/pg:None] \
             registry=[monky/e/see/harbor monky/e/see/harbor2]",
        );
        check(
            r#"{"vault_mode":"openbao"}"#,
            "ok openbao env=[] registry=[]",
        );
    }

    #[test]
    fn values_are_refused_naming_the_vars() {
        check(
            r#"{"entries":[{"var":"A","path":"p","value":"s3cret"},{"var":"B","path":"p"},
                {"var":"C","path":"p","Secret":"x"},{"var":"bad name","path":"p","data":{}}]}"#,
            "MANIFEST_VALUE_REFUSED: A, C, entry 3",
        );
        check(
            r#"{"values":{"A":"x"},"entries":[]}"#,
            "MANIFEST_VALUE_REFUSED: (top level)",
        );
    }

    #[test]
    fn malformed_entries_are_invalid() {
        check(
            "{",
            "BUNDLE_INVALID: secrets.manifest.json: invalid json at line 1 column 1",
        );
        check(
            "[]",
            "BUNDLE_INVALID: secrets.manifest.json: not a json object",
        );
        check(
            r#"{"entries":{}}"#,
            "BUNDLE_INVALID: secrets.manifest.json: entries is not a list",
        );
        check(
            r#"{"entries":[{"var":"1X","path":"p"}]}"#,
            "BUNDLE_INVALID: secrets.manifest.json: entry 0: invalid var name 1X",
        );
        check(
            r#"{"entries":[{"path":"p"}]}"#,
            "BUNDLE_INVALID: secrets.manifest.json: entry 0: missing var",
        );
        check(
            r#"{"entries":[{"var":"A"}]}"#,
            "BUNDLE_INVALID: secrets.manifest.json: A: missing path",
        );
        check(
            r#"{"entries":[{"var":"A","path":"p","version":-1}]}"#,
            "BUNDLE_INVALID: secrets.manifest.json: A: version is not a non-negative integer",
        );
        check(
            r#"{"entries":[{"var":"A","path":"p","version":"2"}]}"#,
            "BUNDLE_INVALID: secrets.manifest.json: A: version is not a number",
        );
        check(
            r#"{"entries":[{"var":"A","path":"p","use":"file"}]}"#,
            "BUNDLE_INVALID: secrets.manifest.json: A: unknown use file",
        );
        check(
            r#"{"entries":[{"var":"A","path":"p"},{"var":"A","path":"q"}]}"#,
            "BUNDLE_INVALID: secrets.manifest.json: A: duplicate var",
        );
    }
}
