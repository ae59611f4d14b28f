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
        webhook_configurations_only: false,
        ca_bundle_file: None,
    };
    assert_current(
        "manifests/install.yaml",
        &koord_webhook::cmd::manifests::render(&args).unwrap(),
    );
}
