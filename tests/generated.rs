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
