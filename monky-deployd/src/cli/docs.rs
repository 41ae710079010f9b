//! The package's manual pages and shell completions, generated from the clap definition by the
//! binary itself (`monky-deployd generate-docs DIR`, hidden), so `cargo xtask dist` packages
//! what the shipped binary says about itself and xtask needs none of the agent's crates.
//!
//! `DIR` must not exist; it receives `man1/<page>.1` (roff, uncompressed) for the top page and
//! every subcommand, nested ones included, and `completions/{bash,zsh,fish}`.

use std::fs;
use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;
use clap::CommandFactory as _;
use clap_complete::Shell;
use clap_mangen::roff::{Roff, bold, roman};

use super::Cli;

/// The shells a completion is written for, with their file names under `completions/`.
pub(crate) const SHELLS: [(Shell, &str); 3] = [
    (Shell::Bash, "bash"),
    (Shell::Zsh, "zsh"),
    (Shell::Fish, "fish"),
];

/// Writes the man pages and completions into `dir`, which this creates.
///
/// # Errors
///
/// When `dir` exists already or a file cannot be written.
pub(crate) fn write(dir: &Path) -> anyhow::Result<()> {
    let man = dir.join("man1");
    let completions = dir.join("completions");
    for d in [dir, &man, &completions] {
        fs::create_dir(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    for page in man_pages()? {
        write_new(&man.join(&page.file), &page.roff)?;
    }
    for (shell, name) in SHELLS {
        write_new(&completions.join(name), &completion(shell))?;
    }
    Ok(())
}

fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .with_context(|| format!("cannot write {}", path.display()))
}

/// One generated manual page.
struct ManPage {
    file: String,
    roff: Vec<u8>,
}

/// The command line as a reader sees it: hidden commands left out.
fn visible(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set())
}

/// monky-deployd(1) and one page per subcommand, from the clap definition, plus the sections
/// clap cannot know: exit status and files.
fn man_pages() -> anyhow::Result<Vec<ManPage>> {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    let mut pages = Vec::new();
    let mut top = Vec::new();
    clap_mangen::Man::new(cli.clone())
        .manual("monky-deployd manual")
        .render(&mut top)?;
    let mut extra = Roff::new();
    tagged_section(
        &mut extra,
        "EXIT STATUS",
        &[
            (
                "0",
                "converged, heartbeat sent, offline in laptop mode, or another tick holds the lock",
            ),
            (
                "1",
                "a refusal or failure, reported to tenancy as failed with CODE: names",
            ),
            (
                "75",
                "temporary: tenancy or OpenBao unreachable, 429 or 5xx; the next tick retries (the unit counts it as success)",
            ),
            (
                "78",
                "the token belongs to another env, or the configuration is unusable; not retried",
            ),
        ],
    );
    tagged_section(
        &mut extra,
        "FILES",
        &[
            (
                "/etc/monky-deployd/config.yaml",
                "the configuration; every key is explained in /usr/share/doc/monky-deployd/config.example.yaml",
            ),
            (
                "/etc/monky-deployd/bootstrap.jwt",
                "the install kit's one-time deploy grant, deleted once used",
            ),
            (
                "/var/lib/monky-deployd/",
                "the OpenBao token, state.json, the releases and the agent's own DOCKER_CONFIG",
            ),
        ],
    );
    extra.control("SH", ["SEE ALSO"]);
    extra.text([roman(
        "systemctl(1), journalctl(1); /usr/share/doc/monky-deployd/ for the config example and install.sh",
    )]);
    top.extend_from_slice(extra.render().as_bytes());
    pages.push(ManPage {
        file: "monky-deployd.1".into(),
        roff: top,
    });
    // One page per subcommand, nested ones too (`monky-deployd-bundle-check`), since each
    // page's SUBCOMMANDS section points at them.
    let mut queue: Vec<(String, String, clap::Command)> = visible(&cli)
        .map(|s| {
            (
                format!("monky-deployd-{}", s.get_name()),
                format!("monky-deployd {}", s.get_name()),
                s.clone(),
            )
        })
        .collect();
    while let Some((name, bin, sub)) = queue.pop() {
        for nested in visible(&sub) {
            queue.push((
                format!("{name}-{}", nested.get_name()),
                format!("{bin} {}", nested.get_name()),
                nested.clone(),
            ));
        }
        let mut roff = Vec::new();
        clap_mangen::Man::new(sub.display_name(name.clone()).bin_name(bin))
            .manual("monky-deployd manual")
            .render(&mut roff)?;
        pages.push(ManPage {
            file: format!("{name}.1"),
            roff,
        });
    }
    pages[1..].sort_by(|a, b| a.file.cmp(&b.file));
    Ok(pages)
}

fn completion(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut completed(), "monky-deployd", &mut out);
    out
}

/// The command line a completion offers: the arguments and visible subcommands (clap's
/// completions would offer hidden ones too, and clap cannot remove a subcommand).
fn completed() -> clap::Command {
    let full = Cli::command();
    clap::Command::new("monky-deployd")
        .version(crate::host::VERSION)
        .args(full.get_arguments().cloned())
        .subcommands(visible(&full).cloned())
}

/// A man page section of tagged paragraphs: each term in bold, its meaning below it.
fn tagged_section(roff: &mut Roff, title: &str, items: &[(&str, &str)]) {
    roff.control("SH", [title]);
    for (term, meaning) in items {
        roff.control("TP", [] as [&str; 0]);
        roff.text([bold(*term)]);
        roff.text([roman(*meaning)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // roff escapes hyphens; the text a reader sees has them plain.
    fn plain(roff: &[u8]) -> String {
        String::from_utf8(roff.to_vec())
            .unwrap()
            .replace("\\-", "-")
    }

    #[test]
    fn man_pages_cover_every_subcommand_and_the_exit_codes() {
        let pages = man_pages().unwrap();
        let files: Vec<&str> = pages.iter().map(|p| p.file.as_str()).collect();
        let cli = Cli::command();
        let mut expected: Vec<String> = visible(&cli)
            .flat_map(|s| {
                let page = format!("monky-deployd-{}", s.get_name());
                std::iter::once(format!("{page}.1"))
                    .chain(visible(s).map(move |n| format!("{page}-{}.1", n.get_name())))
            })
            .collect();
        expected.sort();
        expected.insert(0, "monky-deployd.1".to_string());
        assert_eq!(files, expected);
        assert!(files.contains(&"monky-deployd-run.1"));
        assert!(files.contains(&"monky-deployd-bundle-check.1"));
        let top = plain(&pages[0].roff);
        for needle in ["EXIT STATUS", "75", "78", "/etc/monky-deployd/config.yaml"] {
            assert!(top.contains(needle), "{needle} missing");
        }
        let run = pages
            .iter()
            .find(|p| p.file == "monky-deployd-run.1")
            .unwrap();
        let run = plain(&run.roff);
        assert!(run.contains("--once") && run.contains("--prune"), "{run}");
        assert!(run.contains("monky-deployd-run"), "{run}");
    }

    #[test]
    fn completions_know_the_subcommands() {
        let bash = String::from_utf8(completion(Shell::Bash)).unwrap();
        for sub in ["run", "status", "bootstrap", "--once", "--json"] {
            assert!(bash.contains(sub), "{sub} missing in the bash completion");
        }
    }

    #[test]
    fn the_generator_itself_is_in_no_page_and_no_completion() {
        let cli = Cli::command();
        let hidden: Vec<&str> = cli
            .get_subcommands()
            .filter(|s| s.is_hide_set())
            .map(|s| s.get_name())
            .collect();
        assert_eq!(hidden, ["generate-docs"]);
        for page in man_pages().unwrap() {
            assert!(
                !plain(&page.roff).contains("generate-docs"),
                "{}",
                page.file
            );
        }
        for (shell, name) in SHELLS {
            let text = String::from_utf8(completion(shell)).unwrap();
            assert!(!text.contains("generate-docs"), "{name} completion");
        }
    }

    #[test]
    fn write_fills_a_new_directory_and_refuses_an_existing_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("docs");
        write(&dir).unwrap();
        let mut man: Vec<String> = fs::read_dir(dir.join("man1"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        man.sort();
        let mut expected: Vec<String> = man_pages().unwrap().into_iter().map(|p| p.file).collect();
        expected.sort();
        assert_eq!(man, expected);
        for (_, name) in SHELLS {
            assert!(
                fs::metadata(dir.join("completions").join(name))
                    .unwrap()
                    .len()
                    > 0,
                "{name}"
            );
        }
        let err = write(&dir).unwrap_err();
        assert!(format!("{err:#}").contains("cannot create"), "{err:#}");
    }
}
