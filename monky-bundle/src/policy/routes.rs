//! Routing labels: the hosts a label-driven reverse proxy on the box (traefik's docker
//! provider, caddy-docker-proxy) would send to a container, judged against the env's own. Such
//! a proxy acts on every container's labels, so a label naming another env's host takes that
//! env's traffic; a rule whose hosts cannot be read off it is refused like one that names
//! another's.

/// What a label says about the hosts it routes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Not a routing label, or one that names only allowed hosts.
    Own,
    /// It names this host, which is not allowed.
    Foreign(String),
    /// Its hosts cannot be read off it: the reason.
    Unjudged(&'static str),
}

/// Judges the label `key: value` against the `allowed` hosts (exact names, `*.suffix` for the
/// names below a domain, `*` for any).
pub(super) fn judge(key: &str, value: &str, allowed: &[String]) -> Route {
    if allowed.iter().any(|a| a.trim() == "*") {
        return Route::Own;
    }
    let key = key.trim().to_ascii_lowercase();
    let hosts = if key.starts_with("traefik.") && key.ends_with(".rule") {
        match Parser::new(value).rule() {
            None => return Route::Unjudged("it is not a rule the agent can read"),
            Some(None) => {
                return Route::Unjudged("it does not limit the router to named hosts");
            }
            Some(Some(hosts)) => hosts,
        }
    } else if key == "caddy"
        || key
            .strip_prefix("caddy_")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    {
        match caddy_hosts(value) {
            Ok(hosts) => hosts,
            Err(why) => return Route::Unjudged(why),
        }
    } else {
        return Route::Own;
    };
    match hosts.into_iter().find(|h| !allowed_host(h, allowed)) {
        Some(h) => Route::Foreign(h),
        None => Route::Own,
    }
}

fn allowed_host(host: &str, allowed: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    allowed.iter().any(|a| {
        let a = a.trim().trim_end_matches('.').to_ascii_lowercase();
        a == "*"
            || a == host
            || a.strip_prefix('*').is_some_and(|dot_suffix| {
                dot_suffix.starts_with('.')
                    && host.len() > dot_suffix.len()
                    && host.ends_with(dot_suffix)
            })
    })
}

/// The hosts of caddy-docker-proxy's site address label (`a.example.com, http://b:8080`);
/// a snippet's name (`(name)`) and an empty value (the global options) name none.
fn caddy_hosts(value: &str) -> Result<Vec<String>, &'static str> {
    let mut hosts = Vec::new();
    for addr in value
        .split([',', ' ', '\t', '\n'])
        .filter(|a| !a.is_empty())
    {
        if addr.starts_with('(') && addr.ends_with(')') {
            continue;
        }
        if addr.contains('{') {
            return Err("its address is a placeholder the agent cannot read");
        }
        let bare = addr
            .strip_prefix("https://")
            .or_else(|| addr.strip_prefix("http://"))
            .unwrap_or(addr);
        let bare = bare.split('/').next().unwrap_or(bare);
        let host = if let Some(v6) = bare.strip_prefix('[') {
            v6.split(']').next().unwrap_or(v6)
        } else {
            match bare.rsplit_once(':') {
                Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
                _ => bare,
            }
        };
        if host.is_empty() {
            return Err("an address without a host serves every host");
        }
        hosts.push(host.to_string());
    }
    Ok(hosts)
}

/// A reader of traefik's rule language (v2 and v3): matchers `Name(arg, ...)` with quoted
/// arguments, `&&`, `||`, `!` and parentheses.
struct Parser<'a> {
    text: &'a [u8],
    at: usize,
}

/// The hosts a part of a rule can match: `None` for any host.
type Bound = Option<Vec<String>>;

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            text: text.as_bytes(),
            at: 0,
        }
    }

    /// The hosts the whole rule can match (`Some(None)`: any), or `None` when it does not read.
    fn rule(mut self) -> Option<Bound> {
        let bound = self.or()?;
        self.space();
        (self.at == self.text.len()).then_some(bound)
    }

    fn space(&mut self) {
        while self.text.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        self.space();
        if self.text[self.at..].starts_with(token.as_bytes()) {
            self.at += token.len();
            true
        } else {
            false
        }
    }

    fn or(&mut self) -> Option<Bound> {
        let mut bound = self.and()?;
        while self.eat("||") {
            let other = self.and()?;
            bound = match (bound, other) {
                (Some(mut a), Some(b)) => {
                    a.extend(b);
                    Some(a)
                }
                _ => None,
            };
        }
        Some(bound)
    }

    fn and(&mut self) -> Option<Bound> {
        let mut bound = self.unary()?;
        while self.eat("&&") {
            let other = self.unary()?;
            bound = match (bound, other) {
                (Some(a), Some(b)) => Some(
                    a.into_iter()
                        .filter(|h| b.iter().any(|o| o.eq_ignore_ascii_case(h)))
                        .collect(),
                ),
                (Some(a), None) => Some(a),
                (None, b) => b,
            };
        }
        Some(bound)
    }

    fn unary(&mut self) -> Option<Bound> {
        if self.eat("!") {
            // What a negation leaves is every host but some: no bound.
            self.unary()?;
            return Some(None);
        }
        if self.eat("(") {
            let bound = self.or()?;
            return self.eat(")").then_some(bound);
        }
        self.matcher()
    }

    fn matcher(&mut self) -> Option<Bound> {
        self.space();
        let start = self.at;
        while self
            .text
            .get(self.at)
            .is_some_and(u8::is_ascii_alphanumeric)
        {
            self.at += 1;
        }
        let name = std::str::from_utf8(&self.text[start..self.at])
            .ok()?
            .to_ascii_lowercase();
        if name.is_empty() || !self.eat("(") {
            return None;
        }
        let mut args = Vec::new();
        if !self.eat(")") {
            loop {
                args.push(self.string()?);
                if self.eat(")") {
                    break;
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        Some(match name.as_str() {
            "host" | "hostheader" => Some(args),
            "hostsni" => (!args.iter().any(|a| a == "*")).then_some(args),
            "hostregexp" | "hostsniregexp" => args.iter().map(|a| literal_regexp(a)).collect(),
            _ => None,
        })
    }

    fn string(&mut self) -> Option<String> {
        self.space();
        let quote = *self.text.get(self.at)?;
        if !matches!(quote, b'`' | b'"' | b'\'') {
            return None;
        }
        let start = self.at + 1;
        let len = self.text[start..].iter().position(|b| *b == quote)?;
        self.at = start + len + 1;
        String::from_utf8(self.text[start..start + len].to_vec()).ok()
    }
}

/// The one host a regexp matches when it is a host name spelled as a regexp
/// (`^api\.example\.com$`), else `None`.
fn literal_regexp(re: &str) -> Option<String> {
    let re = re.strip_prefix('^').unwrap_or(re);
    let re = re.strip_suffix('$').unwrap_or(re);
    let host = re.replace("\\.", ".");
    host.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        .then_some(host)
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(key: &str, value: &str, want: &Route) {
        let allowed = ["qa.example.com".to_string(), "*.qa.example.com".to_string()];
        assert_eq!(&judge(key, value, &allowed), want, "{key}: {value}");
    }

    #[test]
    fn own_hosts_pass_and_others_are_named() {
        use Route::{Foreign, Own, Unjudged};
        let r = "traefik.http.routers.web.rule";
        check(r, "Host(`qa.example.com`)", &Own);
        check(r, "Host(`qa.example.com`) && PathPrefix(`/api`)", &Own);
        check(r, "Host(`api.qa.example.com`, `QA.example.com`)", &Own);
        check(
            r,
            "PathPrefix(`/`) && (Host(`qa.example.com`) || Host(`a.qa.example.com`))",
            &Own,
        );
        check(r, "HostRegexp(`^qa\\.example\\.com$`)", &Own);
        check(
            "traefik.tcp.routers.db.rule",
            "HostSNI(`db.qa.example.com`)",
            &Own,
        );
        check(
            r,
            "Host(`other-env.example.com`)",
            &Foreign("other-env.example.com".into()),
        );
        check(
            r,
            "Host(`qa.example.com`) || Host(`other.example.com`)",
            &Foreign("other.example.com".into()),
        );
        check(
            r,
            "Host(`qa.example.com.evil.com`)",
            &Foreign("qa.example.com.evil.com".into()),
        );
        check(
            r,
            "PathPrefix(`/`)",
            &Unjudged("it does not limit the router to named hosts"),
        );
        check(
            r,
            "Host(`qa.example.com`) || PathPrefix(`/`)",
            &Unjudged("it does not limit the router to named hosts"),
        );
        check(
            r,
            "!Host(`qa.example.com`)",
            &Unjudged("it does not limit the router to named hosts"),
        );
        check(
            r,
            "HostRegexp(`^.+\\.example\\.com$`)",
            &Unjudged("it does not limit the router to named hosts"),
        );
        check(
            "traefik.tcp.routers.db.rule",
            "HostSNI(`*`)",
            &Unjudged("it does not limit the router to named hosts"),
        );
        check(
            r,
            "Host:qa.example.com",
            &Unjudged("it is not a rule the agent can read"),
        );
        check("caddy", "qa.example.com", &Own);
        check(
            "caddy_1",
            "https://api.qa.example.com:8443, (snippet)",
            &Own,
        );
        check("caddy", "", &Own);
        check(
            "caddy",
            "other.example.com",
            &Foreign("other.example.com".into()),
        );
        check("caddy_0", "*.example.com", &Foreign("*.example.com".into()));
        check(
            "caddy",
            ":80",
            &Unjudged("an address without a host serves every host"),
        );
        check("caddy.reverse_proxy", "{{upstreams 80}}", &Own);
        check("com.example.note", "Host(`other.example.com`)", &Own);
    }
}
