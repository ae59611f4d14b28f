//! Every mutating endpoint is idempotent: what it answers for the object it already patched is no
//! patch. The shadow install rests on this: its validating entries see the object after
//! koord-manager's mutation and count a non-empty patch of our mutating rules as "koord-webhook would
//! still change this", which is sound only if our rules leave their own result unchanged.
//!
//! `/mutate-node-status` is not, and neither is Koordinator's (the `-again` conformance generator
//! shows both answer alike): it takes each status update as the kubelet's, whose allocatable is the
//! raw one, so an allocatable it already amplified is amplified again. The kubelet never sends one.

use super::{GENERATORS, Rng, ours_raw, with_object};

#[test]
fn mutating_rules_leave_their_own_result_unchanged() {
    let cases: u64 = std::env::var("CONFORMANCE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let mut checked = 0;
    let mut failures = Vec::new();
    let idempotent = |name: &str| {
        name.starts_with("mutate-") && !name.ends_with("-again") && name != "mutate-node-status"
    };
    for (name, generate) in GENERATORS.iter().filter(|(name, _)| idempotent(name)) {
        for seed in 0..cases {
            let case = generate(&mut Rng(seed ^ 0x1de3_0000));
            let (first, patched) = ours_raw(&case);
            if first["allowed"] != true || first.get("patch").is_none() {
                continue;
            }
            checked += 1;
            let (second, twice) = ours_raw(&with_object(case, patched.clone()));
            if second["allowed"] != true || second.get("patch").is_some() {
                failures.push(format!(
                    "{name} seed {seed}: first {patched}\n second answer {second}\n twice {twice}"
                ));
            }
        }
    }
    assert!(checked > 100, "only {checked} cases were patched");
    assert!(
        failures.is_empty(),
        "{} of {checked} patched objects patched again:\n{}",
        failures.len(),
        failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
