//! The crypto set-up stays as chosen (docs/architecture.md, "Crypto"): one backend, AWS-LC, in
//! every dependency tree the project builds, and built without its CPU jitter entropy source,
//! whose one-time seeding would otherwise cost every TLS-speaking tick tens of milliseconds.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Crates that bring a crypto backend other than AWS-LC: TLS providers, their C libraries, and
/// the pure-Rust signature implementations jsonwebtoken's other backend pulls in.
const OTHER_BACKENDS: &[&str] = &[
    "ring",
    "openssl",
    "openssl-sys",
    "boring",
    "boring-sys",
    "aws-lc-fips-sys",
    "native-tls",
    "rustls-rustcrypto",
    "rustls-openssl",
    "rustls-mbedtls-provider-utils",
    "mbedtls",
    "botan",
    "p256",
    "p384",
    "rsa",
    "ed25519-dalek",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds the crate")
        .to_path_buf()
}

/// Every package (`name version`) in the feature-resolved tree of `manifest` for this host: what
/// a build or a test run really compiles.
fn packages(manifest: &Path, args: &[&str]) -> Vec<(String, String)> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .arg("tree")
        .arg("--manifest-path")
        .arg(manifest)
        .args([
            "--locked",
            "--offline",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree for {}: {}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut pkgs: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect();
    pkgs.sort();
    pkgs.dedup();
    pkgs
}

/// What is wrong with a tree's crypto: another backend, or not exactly one AWS-LC.
fn backend_problems(pkgs: &[(String, String)]) -> Vec<String> {
    let mut problems: Vec<String> = pkgs
        .iter()
        .filter(|(name, _)| OTHER_BACKENDS.contains(&name.as_str()))
        .map(|(name, version)| format!("a second crypto backend: {name} {version}"))
        .collect();
    for one in ["aws-lc-rs", "aws-lc-sys"] {
        let versions: Vec<&str> = pkgs
            .iter()
            .filter(|(name, _)| name == one)
            .map(|(_, v)| v.as_str())
            .collect();
        if versions.len() != 1 {
            problems.push(format!("{one} should be there once, found {versions:?}"));
        }
    }
    problems
}

#[test]
fn one_crypto_backend_in_every_dependency_tree() {
    let root = workspace_root();
    let trees = [
        // What ci builds and tests: every crate, every feature (the testkits included).
        (
            root.join("Cargo.toml"),
            vec!["--workspace", "--all-features", "-e", "normal,build,dev"],
        ),
        // What ships: the agent alone.
        (
            root.join("Cargo.toml"),
            vec!["-p", "monky-deployd", "-e", "normal,build"],
        ),
    ];
    for (manifest, args) in trees {
        let pkgs = packages(&manifest, &args);
        assert!(pkgs.len() > 20, "{}: {pkgs:?}", manifest.display());
        let problems = backend_problems(&pkgs);
        assert!(
            problems.is_empty(),
            "{} {args:?}: {problems:#?}",
            manifest.display()
        );
    }
}

/// `(name, version)` of every package in a lock file.
fn locked(lock: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(lock).expect("read the lock file");
    let mut pkgs = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            pkgs.push((n, v.trim_matches('"').to_string()));
        }
    }
    pkgs
}

/// The fuzz targets are a workspace of their own, whose tree cargo cannot resolve offline before
/// libFuzzer's crate is fetched; they get their crypto only through the agent's crates, so their
/// lock file must hold the same AWS-LC and rustls as the workspace's.
#[test]
fn the_fuzz_workspace_locks_the_same_crypto() {
    let root = workspace_root();
    let crypto = |pkgs: Vec<(String, String)>| {
        pkgs.into_iter()
            .filter(|(n, _)| {
                ["aws-lc-rs", "aws-lc-sys", "rustls", "rustls-webpki"].contains(&n.as_str())
            })
            .collect::<Vec<_>>()
    };
    let ours = crypto(locked(&root.join("Cargo.lock")));
    let fuzz = crypto(locked(&root.join("fuzz/Cargo.lock")));
    assert_eq!(ours.len(), 4, "{ours:?}");
    assert_eq!(
        fuzz, ours,
        "fuzz/Cargo.lock: cargo update --manifest-path fuzz/Cargo.toml"
    );
}

#[test]
fn backend_check_names_what_it_refuses() {
    let pkg = |n: &str, v: &str| (n.to_string(), v.to_string());
    let good = vec![pkg("aws-lc-rs", "v1.19.0"), pkg("aws-lc-sys", "v0.47.0")];
    assert!(backend_problems(&good).is_empty());
    let mut with_ring = good.clone();
    with_ring.push(pkg("ring", "v0.17.14"));
    assert_eq!(
        backend_problems(&with_ring),
        ["a second crypto backend: ring v0.17.14"]
    );
    let mut two = good;
    two.push(pkg("aws-lc-sys", "v0.46.0"));
    assert_eq!(backend_problems(&two).len(), 1);
    assert_eq!(backend_problems(&[]).len(), 2);
}

#[test]
fn the_agent_binary_carries_no_jitter_entropy() {
    let bin = Path::new(env!("CARGO_BIN_EXE_monky-deployd"));
    let bytes = std::fs::read(bin).expect("read the agent binary");
    // Symbol names are ASCII; the lossy text lets the optimised `str` search scan the binary.
    let text = String::from_utf8_lossy(&bytes);
    // The symbol table is there (tests build unstripped) and AWS-LC's random generator is
    // linked, so the absence below means something.
    assert!(
        text.contains("RAND_bytes"),
        "{}: no AWS-LC symbols to judge by (stripped, or another backend)",
        bin.display()
    );
    // The jitter library's own entry points (AWS-LC keeps empty stubs of its wrappers).
    for symbol in ["jent_entropy_init", "jent_read_entropy"] {
        assert!(
            !text.contains(symbol),
            "{}: AWS-LC was built with CPU jitter entropy ({}): build inside the checkout, \
             whose .cargo/config.toml sets AWS_LC_SYS_NO_JITTER_ENTROPY=1",
            bin.display(),
            symbol
        );
    }
}
