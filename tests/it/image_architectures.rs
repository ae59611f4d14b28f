//! The image for every platform (`scripts/image --all`): one OCI index listing linux/amd64 and
//! linux/arm64, each image's binary a static ELF of its architecture, and the arm64 binary answering
//! a fixture review under emulation (`qemu-aarch64-static`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::fixture;

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// A blob of the extracted layout by its digest.
fn blob(layout: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    layout.join("blobs/sha256").join(hex)
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every image manifest reachable from `index`, with its platform.
fn manifests(layout: &Path, index: &Value, out: &mut Vec<(String, Value)>) {
    for entry in index["manifests"].as_array().into_iter().flatten() {
        let digest = entry["digest"].as_str().unwrap();
        let body = json(&blob(layout, digest));
        if body["manifests"].is_array() {
            manifests(layout, &body, out);
        } else {
            let platform = &entry["platform"];
            let name = format!(
                "{}/{}",
                platform["os"].as_str().unwrap_or("?"),
                platform["architecture"].as_str().unwrap_or("?")
            );
            out.push((name, body));
        }
    }
}

/// The ELF machine of a binary (62 x86-64, 183 AArch64) and whether it asks for an interpreter
/// (a dynamic executable).
fn elf(path: &Path) -> (u16, bool) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF", "{}", path.display());
    assert_eq!(bytes[4], 2, "64-bit");
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let machine = u16_at(18);
    let (offset, size, count) = (
        u64_at(32) as usize,
        u16_at(54) as usize,
        u16_at(56) as usize,
    );
    let interpreted = (0..count).any(|i| {
        let at = offset + i * size;
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) == 3
    });
    (machine, interpreted)
}

fn succeeded(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn one_index_holds_a_static_image_for_amd64_and_arm64() {
    let version = env!("CARGO_PKG_VERSION");
    let archive = repo(&format!(
        "target/image/koord-webhook-{version}-multiarch.oci.tar"
    ));
    assert!(
        archive.is_file(),
        "{} is missing: scripts/test builds it (scripts/image --all) before the tests; its log: target/image/all.log",
        archive.display()
    );
    let layout = tempfile::tempdir().unwrap();
    succeeded(
        Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(layout.path()),
    );
    let mut found = Vec::new();
    manifests(
        layout.path(),
        &json(&layout.path().join("index.json")),
        &mut found,
    );
    let mut platforms: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);

    for (platform, manifest) in &found {
        let root = layout.path().join(platform.replace('/', "-"));
        std::fs::create_dir_all(&root).unwrap();
        for layer in manifest["layers"].as_array().unwrap() {
            let file = blob(layout.path(), layer["digest"].as_str().unwrap());
            succeeded(
                Command::new("tar")
                    .arg("-xf")
                    .arg(&file)
                    .arg("-C")
                    .arg(&root),
            );
        }
        let binary = root.join("koord-webhook");
        let (machine, interpreted) = elf(&binary);
        let want = if platform.ends_with("amd64") { 62 } else { 183 };
        assert_eq!(machine, want, "{platform}: ELF machine");
        assert!(!interpreted, "{platform}: a static binary, no interpreter");
        if platform.ends_with("arm64") {
            answers_under_emulation(&binary);
        }
    }
}

/// The arm64 binary under `qemu-aarch64-static`: its version, and a fixture review's denial.
fn answers_under_emulation(binary: &Path) {
    let qemu = "qemu-aarch64-static";
    assert!(
        Command::new(qemu).arg("--version").output().is_ok(),
        "{qemu} is missing: scripts/test installs Debian's qemu-user-static"
    );
    let version = succeeded(Command::new(qemu).arg(binary).arg("--version"));
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    let answer = succeeded(
        Command::new(qemu)
            .arg(binary)
            .args(["review", "--state"])
            .arg(fixture("state"))
            .args(["--path", "/validate-pod", "--request"])
            .arg(fixture("requests/validate-pod-reserve-annotation.json")),
    );
    let response: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(response["response"]["allowed"], false, "{answer}");
    assert_eq!(
        response["response"]["status"]["message"],
        "annotations.scheduling.koordinator.sh/reserve-pod: Forbidden: cannot set in annotations"
    );
}
