//! The listeners this agent has already found to be the box's own, named by the kernel's
//! cookie for each socket ([`Socket::cookie`]). Finding the process that holds a listening
//! socket means reading every process's descriptors under `/proc` (milliseconds per hundred
//! processes): a tick whose peer still listens on a socket judged before skips that look.
//!
//! A cookie is valid for one boot (the kernel's counter starts again), so the memory is kept
//! with the boot id and forgotten after a reboot. Only a verdict for the box is kept; a
//! container's listener is refused at every connection.

use std::net::SocketAddr;
use std::sync::Mutex;

use super::owner::Socket;
use crate::layout::Layout;

/// How many listeners are remembered: the agent's own peers are two, the registry a third.
const KEEP: usize = 8;

/// See the module's doc.
#[derive(Debug, Default)]
pub(crate) struct Listeners {
    boot: String,
    known: Mutex<Known>,
}

#[derive(Debug, Default)]
struct Known {
    entries: Vec<(SocketAddr, u64, u32)>,
    changed: bool,
}

impl Listeners {
    /// What the state dir remembers for this boot; nothing where the boot has no id or the
    /// file is missing, from another boot or unreadable.
    #[must_use]
    pub(crate) fn load(layout: &Layout) -> Self {
        let Some(boot) = crate::clock::boot().map(|b| b.boot_id) else {
            return Self::default();
        };
        let text = layout.peek_listeners().unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let mut lines = text.lines();
        let entries = if lines.next() == Some(boot.as_str()) {
            lines.filter_map(parse).take(KEEP).collect()
        } else {
            Vec::new()
        };
        Self {
            boot,
            known: Mutex::new(Known {
                entries,
                changed: false,
            }),
        }
    }

    /// Whether `listening`, the socket listening for `addr` now, was judged the box's before.
    pub(super) fn knows(&self, addr: SocketAddr, listening: &Socket) -> bool {
        let Some(cookie) = listening.cookie else {
            return false;
        };
        !self.boot.is_empty()
            && self
                .known
                .lock()
                .is_ok_and(|k| k.entries.contains(&(addr, cookie, listening.uid)))
    }

    /// Remembers `listening` as the box's.
    pub(super) fn learn(&self, addr: SocketAddr, listening: &Socket) {
        let (Some(cookie), false) = (listening.cookie, self.boot.is_empty()) else {
            return;
        };
        if let Ok(mut k) = self.known.lock() {
            k.entries.retain(|(a, ..)| *a != addr);
            k.entries.insert(0, (addr, cookie, listening.uid));
            k.entries.truncate(KEEP);
            k.changed = true;
        }
    }

    /// Writes what was learnt during this tick, when anything was.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub(crate) fn save(&self, layout: &Layout) -> anyhow::Result<()> {
        let Ok(k) = self.known.lock() else {
            return Ok(());
        };
        if !k.changed {
            return Ok(());
        }
        let mut text = format!("{}\n", self.boot);
        for (addr, cookie, uid) in &k.entries {
            text.push_str(&format!("{addr} {cookie} {uid}\n"));
        }
        layout.write_listeners(text.as_bytes())
    }
}

fn parse(line: &str) -> Option<(SocketAddr, u64, u32)> {
    let mut f = line.split(' ');
    let entry = (
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
    );
    f.next().is_none().then_some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket(cookie: u64, uid: u32) -> Socket {
        Socket {
            uid,
            cookie: Some(cookie),
            cgroup: None,
            inode: None,
        }
    }

    #[test]
    fn a_listener_is_known_by_its_cookie_and_uid_for_this_boot_only() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::open_at(tmp.path(), "env-test").unwrap();
        let addr: SocketAddr = "127.0.0.1:18443".parse().unwrap();
        let mem = Listeners::load(&layout);
        assert!(!mem.knows(addr, &socket(7, 0)));
        mem.learn(addr, &socket(7, 0));
        mem.save(&layout).unwrap();

        let mem = Listeners::load(&layout);
        assert!(mem.knows(addr, &socket(7, 0)));
        // Another socket on the same port, another owner, another address: not known.
        assert!(!mem.knows(addr, &socket(8, 0)));
        assert!(!mem.knows(addr, &socket(7, 65534)));
        assert!(!mem.knows("127.0.0.1:18200".parse().unwrap(), &socket(7, 0)));
        // A socket table's answer has no cookie: never known.
        let mut no_cookie = socket(7, 0);
        no_cookie.cookie = None;
        assert!(!mem.knows(addr, &no_cookie));

        // Written at another boot: forgotten.
        let text = String::from_utf8(layout.peek_listeners().unwrap()).unwrap();
        let other = text.replacen(&mem.boot, "another-boot", 1);
        layout.write_listeners(other.as_bytes()).unwrap();
        assert!(!Listeners::load(&layout).knows(addr, &socket(7, 0)));
    }
}
