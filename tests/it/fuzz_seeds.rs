//! Every fuzz target's seeds (and any input a fuzzing run saved as a finding under
//! `fuzz/artifacts/TARGET`) through the same function the target calls, in the ordinary test build:
//! CI's small form of the fuzzing. `scripts/fuzz` (libFuzzer, nightly, its own sanitizer build)
//! is the run that explores; its first build alone took longer than a tenth of CI's time limit.

use std::path::Path;

use koord_webhook::entries::EndpointName;

#[path = "../../fuzz/src/lib.rs"]
pub(crate) mod harness;

/// What the target of this name calls, as its `fuzz_targets/NAME.rs` does.
fn target(name: &str) -> Option<fn(&[u8])> {
    use EndpointName::*;
    Some(match name {
        "mutate_elastic_quota" => |b| harness::review(MutateElasticQuota, b),
        "mutate_node_status" => |b| harness::review(MutateNodeStatus, b),
        "mutate_pod" => |b| harness::review(MutatePod, b),
        "mutate_reservation" => |b| harness::review(MutateReservation, b),
        "validate_colocation_profile" => |b| harness::review(ValidateColocationProfile, b),
        "validate_configmap" => |b| harness::review(ValidateConfigMap, b),
        "validate_elastic_quota" => |b| harness::review(ValidateElasticQuota, b),
        "validate_node" => |b| harness::review(ValidateNode, b),
        "validate_pod" => |b| harness::review(ValidatePod, b),
        "quantity" => harness::quantity,
        "slo_config" => harness::slo_config,
        "strategic_merge" => harness::strategic_merge,
        _ => return None,
    })
}

fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    found.sort();
    found
}

#[test]
fn every_fuzz_targets_seeds_and_findings_pass_through_it() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let targets = files(&fuzz.join("fuzz_targets"));
    assert!(targets.len() >= 12, "fuzz targets: {targets:?}");
    let mut replayed = 0;
    for source in targets {
        let name = source.file_stem().unwrap().to_str().unwrap().to_owned();
        let run = target(&name).unwrap_or_else(|| {
            panic!("fuzz target {name} has no replay here: add what fuzz_targets/{name}.rs calls")
        });
        let seeds = files(&fuzz.join("seeds").join(&name));
        assert!(!seeds.is_empty(), "fuzz/seeds/{name} is empty");
        for input in seeds
            .iter()
            .chain(&files(&fuzz.join("artifacts").join(&name)))
        {
            let bytes = std::fs::read(input).unwrap();
            // A panic names the input: the harness's own assertions say what broke.
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(outcome.is_ok(), "{name}: {} fails", input.display());
            replayed += 1;
        }
    }
    eprintln!("fuzz seeds: {replayed} inputs replayed");
}

/// `fuzz/Cargo.toml` declares one `[[bin]]` per file of `fuzz_targets/`, named as the file: a target
/// without its entry is never built by `cargo fuzz`, an entry without its file breaks the crate.
#[test]
fn every_fuzz_target_has_its_bin_entry_and_no_more() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let manifest: toml_edit::DocumentMut = std::fs::read_to_string(fuzz.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let mut declared: Vec<(String, String)> = manifest["bin"]
        .as_array_of_tables()
        .expect("[[bin]] entries in fuzz/Cargo.toml")
        .iter()
        .map(|bin| {
            let field = |key: &str| {
                bin.get(key)
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_owned()
            };
            (field("name"), field("path"))
        })
        .collect();
    declared.sort();
    let files: Vec<(String, String)> = files(&fuzz.join("fuzz_targets"))
        .iter()
        .map(|f| {
            let name = f.file_stem().unwrap().to_str().unwrap().to_owned();
            let path = format!("fuzz_targets/{name}.rs");
            (name, path)
        })
        .collect();
    assert_eq!(
        declared, files,
        "fuzz/Cargo.toml's [[bin]] list against fuzz_targets/"
    );
}
