//! Who else on the box could read a container's secrets: without a user namespace remap, a
//! container's uid is the host's. The kernel lets a process read another's
//! `/proc/<pid>/environ`, and follow its `/proc/<pid>/root` to the files it sees (a secret's
//! file under `/run/secrets` included), when `ptrace_may_access` passes: the reader's uid
//! equals the target's real, effective and saved uid and its gid the target's three gids (or
//! it has `CAP_SYS_PTRACE`), and the target is dumpable, as a process that was started as its
//! uid is. So a secret given as a file is as readable as one in the environment.
//!
//! A service that gets a secret and runs as a uid a host account also has is refused
//! `SECRET_READABLE_ON_HOST` before anything starts. It is judged by the uid alone, on
//! purpose: the account takes its primary gid at login and, with `newgrp`/`sg`, any group it
//! is a member of, and a file the container writes is the uid's whatever its gid (in a bind
//! the account can reach, it reads it as the owner).
//!
//! An account that is root's equal already (uid 0, or in the `docker`, `sudo`, `wheel`,
//! `admin` or `root` group) does not count: it reads every secret of the box anyway.

use std::collections::{BTreeMap, BTreeSet};

use monky_bundle::RunsAs;

/// Groups whose members can become root or drive the engine.
const ROOT_EQUAL_GROUPS: &[&str] = &["root", "docker", "sudo", "wheel", "admin"];

/// The box's accounts by uid, without those that are root's equal.
#[derive(Debug, Default)]
pub struct HostAccounts {
    by_uid: BTreeMap<u32, Vec<String>>,
}

impl HostAccounts {
    /// From the box's `/etc/passwd` and `/etc/group`.
    #[must_use]
    pub fn read() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        Self::parse(&read("/etc/passwd"), &read("/etc/group"))
    }

    /// From the text of a passwd and a group file.
    #[must_use]
    pub(crate) fn parse(passwd: &str, group: &str) -> Self {
        let mut equal_gids = BTreeSet::new();
        let mut equal_members = BTreeSet::new();
        for line in group.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if let [name, _, gid, members, ..] = f[..]
                && ROOT_EQUAL_GROUPS.contains(&name)
            {
                equal_gids.extend(gid.parse::<u32>().ok());
                equal_members.extend(members.split(',').filter(|m| !m.is_empty()));
            }
        }
        let mut by_uid: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (name, uid, gid) in entries(passwd) {
            if uid == 0 || equal_gids.contains(&gid) || equal_members.contains(name) {
                continue;
            }
            by_uid.entry(uid).or_default().push(name.to_owned());
        }
        Self { by_uid }
    }

    /// The accounts at `uid` that are not root's equal.
    #[must_use]
    pub fn at(&self, uid: u32) -> &[String] {
        self.by_uid.get(&uid).map_or(&[], Vec::as_slice)
    }
}

/// `(name, uid, gid)` of each line of a passwd file.
fn entries(passwd: &str) -> impl Iterator<Item = (&str, u32, u32)> {
    passwd.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        match f[..] {
            [name, _, uid, gid, ..] => Some((name, uid.parse().ok()?, gid.parse().ok()?)),
            _ => None,
        }
    })
}

/// The uid a `user` spec names without the image's `passwd`: a number (which the runtime
/// always takes as a uid, even where a name spelled so exists), or `root`, which is uid 0 in
/// every `passwd` (and an image without one does not start as `root` by name at all).
#[must_use]
pub(crate) fn plain_uid(user: &str) -> Option<u32> {
    monky_bundle::numeric_uid(user)
        .or_else(|| (user.split(':').next().unwrap_or_default().trim() == "root").then_some(0))
}

/// The uid a `user` spec names in a container: as [`plain_uid`] tells it, else a name by the
/// image's own `passwd` (the file the runtime reads); `Err` says why it cannot be told.
pub(crate) fn uid_of(user: &str, image_passwd: Option<&str>) -> Result<u32, String> {
    if let Some(uid) = plain_uid(user) {
        return Ok(uid);
    }
    let name = user.split(':').next().unwrap_or_default().trim();
    let passwd =
        image_passwd.ok_or_else(|| format!("user {name:?}: the image has no /etc/passwd"))?;
    entries(passwd)
        .find(|(n, ..)| *n == name)
        .map(|(_, uid, _)| uid)
        .ok_or_else(|| format!("user {name:?} is not in the image's /etc/passwd"))
}

/// One finding per service of `runs` that gets a secret (in its environment or as a file) and
/// runs as a uid `accounts` has (unless `allowed` names it). `user_of` gives a service's
/// effective uid (its own `user`, else its image's `USER`, names resolved; `None`: root);
/// each service's secret names only.
pub(crate) fn findings(
    runs: &[RunsAs],
    accounts: &HostAccounts,
    allowed: &[u32],
    user_of: &dyn Fn(&RunsAs) -> Result<Option<u32>, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for r in runs.iter().filter(|r| r.gets_a_secret()) {
        let secrets = gets(r);
        match user_of(r) {
            Ok(None | Some(0)) => {}
            Ok(Some(uid)) if allowed.contains(&uid) => {}
            Ok(Some(uid)) => {
                let names = accounts.at(uid);
                if !names.is_empty() {
                    out.push(format!(
                        "{}: runs as uid {uid}, which the host account {} has too, and gets \
                         {secrets}",
                        r.service,
                        names.join(", ")
                    ));
                }
            }
            Err(why) => out.push(format!(
                "{}: cannot tell which uid it runs as ({why}), and it gets {secrets}",
                r.service
            )),
        }
    }
    out
}

/// Which secrets a service gets, and how: `A, B in its environment`, `C as a file under
/// /run/secrets`, `D as a config file`.
fn gets(r: &RunsAs) -> String {
    let list =
        |s: &std::collections::BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
    let routes: Vec<String> = [
        (&r.secrets, "in its environment"),
        (&r.files, "as a file under /run/secrets"),
        (&r.configs, "as a config file"),
    ]
    .into_iter()
    .filter(|(keys, _)| !keys.is_empty())
    .map(|(keys, how)| format!("{} {how}", list(keys)))
    .collect();
    routes.join(" and ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0::/root:/bin/sh\n\
        nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n\
        dev:x:1000:1000::/home/dev:/bin/bash\n\
        ops:x:1001:1001::/home/ops:/bin/bash\n\
        ci:x:1002:999::/home/ci:/bin/bash\n";
    const GROUP: &str = "root:x:0:\nsudo:x:27:ops\ndocker:x:999:\nnobody:x:65534:\n";

    fn runs(user: Option<&str>, secrets: &[&str]) -> RunsAs {
        RunsAs {
            service: "web".into(),
            image: "app:1".into(),
            user: user.map(str::to_owned),
            secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
            files: std::collections::BTreeSet::new(),
            configs: std::collections::BTreeSet::new(),
            vars: std::collections::BTreeSet::new(),
        }
    }

    #[test]
    fn accounts_that_are_roots_equal_do_not_count() {
        let a = HostAccounts::parse(PASSWD, GROUP);
        assert_eq!(a.at(65534), ["nobody"]);
        assert_eq!(a.at(1000), ["dev"]);
        assert!(a.at(1001).is_empty(), "in sudo");
        assert!(a.at(1002).is_empty(), "docker is its primary group");
        assert!(a.at(0).is_empty());
        assert!(a.at(4242).is_empty());
    }

    #[test]
    fn a_name_is_read_from_the_image_s_own_passwd() {
        let image = "node:x:1000:1000::/home/node:/bin/sh\n";
        assert_eq!(uid_of("node", Some(image)), Ok(1000));
        assert_eq!(uid_of("node:node", Some(image)), Ok(1000));
        assert_eq!(uid_of("65534:65534", None), Ok(65534));
        // root is uid 0 without a look at the image (no probe container for it).
        assert_eq!(plain_uid("root"), Some(0));
        assert_eq!(plain_uid("root:wheel"), Some(0));
        assert_eq!(plain_uid("node"), None);
        assert!(uid_of("app", Some(image)).unwrap_err().contains("\"app\""));
        assert!(uid_of("app", None).unwrap_err().contains("no /etc/passwd"));
    }

    #[test]
    fn a_service_with_a_secret_at_a_shared_uid_is_a_finding_and_others_are_not() {
        let a = HostAccounts::parse(PASSWD, GROUP);
        let uid = |r: &RunsAs| Ok(r.user.as_deref().and_then(monky_bundle::numeric_uid));
        let found = findings(&[runs(Some("65534"), &["DB_PW"])], &a, &[], &uid);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].contains("uid 65534")
                && found[0].contains("nobody")
                && found[0].contains("DB_PW"),
            "{found:?}"
        );
        // No secret, root, an unshared or root-equal uid, or the admin's waiver: nothing.
        assert!(findings(&[runs(Some("65534"), &[])], &a, &[], &uid).is_empty());
        assert!(findings(&[runs(None, &["DB_PW"])], &a, &[], &uid).is_empty());
        assert!(findings(&[runs(Some("4242"), &["DB_PW"])], &a, &[], &uid).is_empty());
        assert!(findings(&[runs(Some("1001"), &["DB_PW"])], &a, &[], &uid).is_empty());
        assert!(findings(&[runs(Some("65534"), &["DB_PW"])], &a, &[65534], &uid).is_empty());
        // A secret as a file is read through /proc/<pid>/root as the environment is read.
        let mut file_only = runs(Some("65534"), &[]);
        file_only.files.insert("DB_PW".to_owned());
        let found = findings(std::slice::from_ref(&file_only), &a, &[], &uid);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("uid 65534") && found[0].contains("DB_PW as a file"),
            "{found:?}"
        );
        assert!(findings(&[file_only], &a, &[65534], &uid).is_empty());
        // So is a config file, and every route is named.
        let mut all = runs(Some("65534"), &["DB_PW"]);
        all.configs.insert("DATABASE_URL".to_owned());
        let found = findings(&[all], &a, &[], &uid);
        assert!(
            found[0].ends_with("DB_PW in its environment and DATABASE_URL as a config file"),
            "{found:?}"
        );
        // A uid that cannot be told is a finding too.
        let unknown = |_: &RunsAs| Err("user \"app\" is not in the image's /etc/passwd".to_owned());
        let found = findings(&[runs(Some("app"), &["DB_PW"])], &a, &[], &unknown);
        assert!(found[0].contains("cannot tell"), "{found:?}");
    }
}
