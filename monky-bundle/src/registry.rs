//! The registry pull credential: parsed from its KV value, turned into a Docker `config.json`.

use std::fmt;

use base64::Engine as _;
use secrecy::zeroize::Zeroizing;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::error::{Error, Result};

/// A registry credential (the `use: registry-auth` manifest entry). `Debug` hides the password.
#[derive(Clone)]
pub struct RegistryAuth {
    registry: String,
    username: String,
    password: SecretString,
}

impl fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("registry", &self.registry)
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}

fn problem(problem: &'static str) -> Error {
    Error::RegistryCredential { problem }
}

/// A non-empty string field of the JSON shape, `None` when absent, null or empty.
fn field(
    m: &mut serde_json::Map<String, Value>,
    key: &str,
    wrong_type: &'static str,
) -> Result<Option<Zeroizing<String>>> {
    match m.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(Zeroizing::new(s))),
        Some(_) => Err(problem(wrong_type)),
    }
}

impl RegistryAuth {
    /// Parses the credential's KV value. Two shapes are accepted, because the seeded robot
    /// account exists in both:
    ///
    /// - a JSON object `{"registry": ..., "username": ..., "password": ...}`; `registry` may be
    ///   left out when `default_registry` is given;
    /// - `username:password` (split at the first `:`), with the registry from
    ///   `default_registry` (the agent's configured registry host).
    ///
    /// Errors name the problem, never the value.
    ///
    /// ```
    /// use secrecy::{ExposeSecret, SecretString};
    /// use monky_bundle::RegistryAuth;
    ///
    /// let auth = RegistryAuth::parse(&SecretString::from("robot$pull:p4:ss"), Some("harbor.example"))?;
    /// assert_eq!(auth.registry(), "harbor.example");
    /// assert_eq!(
    ///     auth.docker_config_json().expose_secret(),
    ///     r#"{"auths":{"harbor.example":{"auth":"cm9ib3QkcHVsbDpwNDpzcw=="}}}"#
    /// );
    /// # Ok::<(), monky_bundle::Error>(())
    /// ```
    pub fn parse(value: &SecretString, default_registry: Option<&str>) -> Result<RegistryAuth> {
        let text = value.expose_secret().trim();
        if text.is_empty() {
            return Err(problem("value is empty"));
        }
        let default_registry = default_registry.map(str::trim).filter(|r| !r.is_empty());
        let (registry, username, password) = if text.starts_with('{') {
            let json: Value =
                serde_json::from_str(text).map_err(|_| problem("value is not valid json"))?;
            let Value::Object(mut m) = json else {
                return Err(problem("json value is not an object"));
            };
            let username = field(&mut m, "username", "json username is not a string")?
                .ok_or_else(|| problem("json has no username"))?;
            let password = field(&mut m, "password", "json password is not a string")?
                .ok_or_else(|| problem("json has no password"))?;
            let registry = match field(&mut m, "registry", "json registry is not a string")? {
                Some(r) => r.to_string(),
                None => default_registry
                    .ok_or_else(|| {
                        problem("json names no registry and no registry host is configured")
                    })?
                    .to_owned(),
            };
            (registry, username.to_string(), password)
        } else {
            let Some((user, pass)) = text.split_once(':') else {
                return Err(problem("value is neither json nor username:password"));
            };
            if user.is_empty() {
                return Err(problem("username is empty"));
            }
            if pass.is_empty() {
                return Err(problem("password is empty"));
            }
            let registry = default_registry
                .ok_or_else(|| problem("username:password needs a configured registry host"))?;
            (
                registry.to_owned(),
                user.to_owned(),
                Zeroizing::new(pass.to_owned()),
            )
        };
        if username.contains(':') {
            return Err(problem("username contains ':'"));
        }
        if username.chars().any(char::is_control) {
            return Err(problem("username contains a control character"));
        }
        if registry.is_empty() || !registry.chars().all(|c| c.is_ascii_graphic()) {
            return Err(problem("registry host is not a plain host name"));
        }
        Ok(RegistryAuth {
            registry,
            username,
            password: SecretString::from(password.as_str()),
        })
    }

    /// The registry host the credential is for, e.g. `harbor.tikali.net`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The user name (not a secret: it shows in registry audit logs anyway).
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password.
    pub fn password(&self) -> &SecretString {
        &self.password
    }

    /// The Docker CLI `config.json` for this credential:
    /// `{"auths": {"<registry>": {"auth": "<base64(user:password)>"}}}`. There is never a
    /// `credsStore` or `credHelpers` key: with one the CLI would ignore the inline `auths`.
    pub fn docker_config_json(&self) -> SecretString {
        let pair = Zeroizing::new(format!(
            "{}:{}",
            self.username,
            self.password.expose_secret()
        ));
        let auth =
            Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(pair.as_bytes()));
        // The host is JSON-escaped by serde_json; base64 needs no escaping.
        let host = Value::String(self.registry.clone()).to_string();
        let json = Zeroizing::new(format!(
            "{{\"auths\":{{{host}:{{\"auth\":\"{}\"}}}}}}",
            auth.as_str()
        ));
        SecretString::from(json.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "p4ss-w0rd";

    fn parse(value: &str, default: Option<&str>) -> Result<RegistryAuth> {
        RegistryAuth::parse(&SecretString::from(value), default)
    }

    fn check(value: &str, default: Option<&str>, expected: &str) {
        let got = match parse(value, default) {
            Ok(a) => format!(
                "{} {} {}",
                a.registry(),
                a.username(),
                a.password().expose_secret()
            ),
            Err(e) => {
                let shown = format!("{e} {e:?}");
                assert!(!shown.contains(SECRET), "error leaks the value: {shown}");
                shown
                    .split(" RegistryCredential")
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            }
        };
        assert_eq!(got, expected, "{value}");
    }

    #[test]
    fn accepted_shapes() {
        check(
            &format!(
                r#"{{"registry":"harbor.tikali.net","username":"robot$pull","password":"{SECRET}"}}"#
            ),
            Some("ignored.example"),
            &format!("harbor.tikali.net robot$pull {SECRET}"),
        );
        check(
            &format!(r#"  {{"username":"u","password":"{SECRET}"}}  "#),
            Some("h.example"),
            &format!("h.example u {SECRET}"),
        );
        check(
            &format!("robot$pull:{SECRET}"),
            Some("harbor.tikali.net"),
            &format!("harbor.tikali.net robot$pull {SECRET}"),
        );
        check("u:a:b", Some("h"), "h u a:b");
    }

    #[test]
    fn refusals_name_the_problem_only() {
        for (value, default, expected) in [
            ("", Some("h"), "registry credential: value is empty"),
            ("   ", Some("h"), "registry credential: value is empty"),
            (
                "no-colon-here",
                Some("h"),
                "registry credential: value is neither json nor username:password",
            ),
            (
                r#"{"username":"u"}"#,
                Some("h"),
                "registry credential: json has no password",
            ),
            (
                "{not json p4ss-w0rd",
                Some("h"),
                "registry credential: value is not valid json",
            ),
            (
                "[1]",
                Some("h"),
                "registry credential: value is neither json nor username:password",
            ),
            (
                r#"{"username":"u","password":"p4ss-w0rd"}"#,
                None,
                "registry credential: json names no registry and no registry host is configured",
            ),
            (
                r#"{"username":"u","password":7}"#,
                Some("h"),
                "registry credential: json password is not a string",
            ),
            (
                r#"{"username":"u:x","password":"p4ss-w0rd"}"#,
                Some("h"),
                "registry credential: username contains ':'",
            ),
            (
                "u:p4ss-w0rd",
                None,
                "registry credential: username:password needs a configured registry host",
            ),
            (
                "u:p4ss-w0rd",
                Some("bad host"),
                "registry credential: registry host is not a plain host name",
            ),
            (
                ":p4ss-w0rd",
                Some("h"),
                "registry credential: username is empty",
            ),
            ("u:", Some("h"), "registry credential: password is empty"),
        ] {
            check(value, default, expected);
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let a = parse(&format!("u:{SECRET}"), Some("h")).unwrap();
        assert!(!format!("{a:?}").contains(SECRET));
    }

    #[test]
    fn docker_config_has_auths_only() {
        let a = parse(&format!("robot$pull:{SECRET}"), Some("harbor.tikali.net")).unwrap();
        let cfg: Value = serde_json::from_str(a.docker_config_json().expose_secret()).unwrap();
        let auth = cfg["auths"]["harbor.tikali.net"]["auth"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth)
            .unwrap();
        assert_eq!(decoded, format!("robot$pull:{SECRET}").as_bytes());
        assert_eq!(
            cfg.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["auths"]
        );
    }
}
