//! The release artefacts (`scripts/release`, docs/release.md): the SBOM names the crates the binary
//! links, the provenance names the commit, `Cargo.lock` and the index it built, the signature checks
//! with the release's public key, and `--verify` refuses a changed file or a changed digest. The
//! binaries carry their dependency list (cargo auditable). The second build compared byte for byte
//! is `scripts/release --reproduce`, which `scripts/test` runs on its own (`--warm-deps`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn release(args: &[&str]) -> Output {
    Command::new(repo("scripts/release"))
        .args(args)
        .output()
        .expect("scripts/release runs")
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

#[test]
fn a_release_is_described_signed_and_refused_when_changed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rel");
    // The archive `scripts/image --all` made (scripts/test runs it first; other tests read it meanwhile).
    let built = release(&["--out", out.to_str().unwrap(), "--prebuilt"]);
    assert!(
        built.status.success(),
        "scripts/release failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("koord-webhook-{version}");
    let file = |suffix: &str| out.join(format!("{name}{suffix}"));

    // The SBOM: CycloneDX, the binary as its subject, the crates it links among its components.
    let sbom = json(&file(".cdx.json"));
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    let components: Vec<&str> = sbom["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    for linked in ["kube-client", "rustls", "actix-web", "serde_json"] {
        assert!(
            components.contains(&linked),
            "{linked} missing from the SBOM"
        );
    }

    // The provenance: what was built (the signed index digest), from what and how.
    let digests = std::fs::read_to_string(file(".digests")).unwrap();
    let index = digests
        .lines()
        .find_map(|l| l.strip_prefix("index sha256:"))
        .and_then(|l| l.split_whitespace().next())
        .expect("an index line");
    let provenance = json(&file(".provenance.json"));
    assert_eq!(provenance["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(provenance["subject"][0]["digest"]["sha256"], index);
    let commit = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repo(""))
        .output()
        .unwrap();
    let build = &provenance["predicate"]["buildDefinition"];
    assert_eq!(
        build["externalParameters"]["source"]["commit"],
        String::from_utf8_lossy(&commit.stdout).trim()
    );
    assert_eq!(
        build["resolvedDependencies"][1]["digest"]["sha256"],
        sha256(&repo("Cargo.lock"))
    );
    for target in ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"] {
        let binary =
            std::fs::read(repo(&format!("target/{target}/release/koord-webhook"))).unwrap();
        let section = b".dep-v0";
        assert!(
            binary.windows(section.len()).any(|w| w == section),
            "{target}: no cargo-auditable section"
        );
    }

    // Verified as shipped; a changed SBOM, then a changed digest line, refused.
    let verify = || release(&["--verify", out.to_str().unwrap()]);
    let ok = verify();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let sbom_text = std::fs::read(file(".cdx.json")).unwrap();
    std::fs::write(file(".cdx.json"), [&sbom_text[..], b" "].concat()).unwrap();
    let changed = verify();
    let why = String::from_utf8_lossy(&changed.stderr);
    assert!(!changed.status.success(), "a changed SBOM passed");
    assert!(why.contains(&format!("{name}.cdx.json")), "{why}");
    std::fs::write(file(".cdx.json"), &sbom_text).unwrap();
    let forged = digests.replacen(index, &"0".repeat(64), 1);
    std::fs::write(file(".digests"), forged).unwrap();
    let unsigned = verify();
    let why = String::from_utf8_lossy(&unsigned.stderr);
    assert!(!unsigned.status.success(), "a changed digest passed");
    assert!(why.contains("signature"), "{why}");
}
