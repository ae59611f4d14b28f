//! `crds/` and `manifests/` are generated from the code; a stale copy fails here.

use std::path::Path;

fn assert_current(relative: &str, rendered: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    let on_disk =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        on_disk == rendered,
        "{relative} is stale: regenerate it with `just gen` (or scripts/gen) and commit the result"
    );
}

#[test]
fn crds_are_current() {
    assert_current(
        "crds/crds.yaml",
        &koord_webhook::cmd::crds::render().unwrap(),
    );
}

#[test]
fn install_manifests_are_current() {
    let args = koord_webhook::cli::ManifestArgs {
        webhook_host: None,
        port: 9443,
        image: koord_webhook::install::DEFAULT_IMAGE.to_owned(),
        feature_gates: String::new(),
        entries: koord_webhook::cli::EntryFlags::default(),
        webhook_configurations_only: false,
        ca_bundle_file: None,
    };
    assert_current(
        "manifests/install.yaml",
        &koord_webhook::cmd::manifests::render(&args).unwrap(),
    );
}

/// `manifests` with entry settings: the configurations carry them, and so do the Deployment's
/// `serve` flags (so a configuration the operator re-creates has them too); a bad one is exit 1
/// with one line naming the entries there are.
#[test]
fn manifests_take_failure_policy_timeout_and_excluded_namespaces() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_koord-webhook"))
            .arg("manifests")
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&[
        "--failure-policy",
        "vpod.koordinator.sh=Ignore",
        "--webhook-timeout-seconds",
        "5",
        "--exclude-namespace",
        "batch-jobs",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_slice(&out.stdout)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let validating = docs
        .iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .unwrap();
    let vpod = validating["webhooks"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "vpod.koordinator.sh")
        .unwrap();
    assert_eq!(vpod["failurePolicy"], "Ignore");
    assert_eq!(vpod["timeoutSeconds"], 5);
    let excluded = &vpod["namespaceSelector"]["matchExpressions"][0]["values"];
    assert!(
        excluded
            .as_sequence()
            .unwrap()
            .iter()
            .any(|v| v == "batch-jobs"),
        "{excluded:?}"
    );
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let args =
        serde_yaml::to_string(&deployment["spec"]["template"]["spec"]["containers"][0]["args"])
            .unwrap();
    for flag in [
        "--failure-policy=vpod.koordinator.sh=Ignore",
        "--webhook-timeout-seconds=5",
        "--exclude-namespace=batch-jobs",
    ] {
        assert!(args.contains(flag), "{flag} not in {args}");
    }
    let bad = run(&["--failure-policy", "vpods=Ignore"]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("vpod.koordinator.sh"), "{stderr}");
}
