//! Validating one ElasticQuota update in a tree of 10,000 quotas, through the whole chain (decode,
//! rules, topology update, encode) and the rules alone, for trees of three shapes: the cost should
//! follow the depth of the tree, not its size or the number of siblings.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};

use koord_webhook::admission::Admission;
use koord_webhook::admission::elastic_quota::tree_checks::check_update;
use koord_webhook::apis::ElasticQuota;
use koord_webhook::cache::{CacheWriter, CachedObject};
use koord_webhook::features::FeatureGates;
use koord_webhook::metrics::Metrics;

const QUOTAS: usize = 10_000;
const PATH: &str = "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota";

fn quota(name: &str, parent: Option<&str>, is_parent: bool, min_cpu: u64, min_mem: &str) -> Value {
    let mut labels = json!({"quota.scheduling.koordinator.sh/tree-id": "t"});
    if let Some(p) = parent {
        labels["quota.scheduling.koordinator.sh/parent"] = json!(p);
    }
    if is_parent {
        labels["quota.scheduling.koordinator.sh/is-parent"] = json!("true");
    }
    json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": name, "namespace": "quotas", "labels": labels},
        "spec": {"min": {"cpu": format!("{min_cpu}m"), "memory": min_mem},
                 "max": {"cpu": "100000", "memory": "100Ti"}}
    })
}

/// `levels[i]` parents at depth i, each level spread evenly under the one above, then leaves
/// under the last level up to 10,000 quotas. Returns the quotas and one leaf to update.
fn tree(levels: &[usize]) -> (Vec<Value>, Value) {
    let mut quotas = Vec::with_capacity(QUOTAS);
    let mut above: Vec<String> = Vec::new();
    for (depth, &count) in levels.iter().enumerate() {
        let names: Vec<String> = (0..count).map(|i| format!("p{depth}-{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            let parent = (!above.is_empty()).then(|| above[i % above.len()].as_str());
            // Generous mins so that every leaf fits: each level gets the whole of the one above.
            quotas.push(quota(name, parent, true, 1_000_000_000, "10Pi"));
        }
        above = names;
    }
    let leaves = QUOTAS - quotas.len();
    for i in 0..leaves {
        let parent = &above[i % above.len()];
        quotas.push(quota(&format!("leaf-{i}"), Some(parent), false, 10, "1Gi"));
    }
    let leaf = quotas.last().cloned().expect("a leaf");
    (quotas, leaf)
}

fn review(old: &Value, new: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "bench", "operation": "UPDATE", "name": new["metadata"]["name"],
            "namespace": "quotas", "userInfo": {"username": "bench"},
            "kind": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "kind": "ElasticQuota"},
            "resource": {"group": "scheduling.sigs.k8s.io", "version": "v1alpha1", "resource": "elasticquotas"},
            "object": new, "oldObject": old
        }
    }))
    .expect("serialisable")
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let shapes: [(&str, &[usize]); 3] = [
        ("wide (depth 2, 9,999 siblings)", &[1]),
        ("balanced (depth 4)", &[10, 100, 1000]),
        ("deep (depth 51)", &[1; 50]),
    ];
    let mut group = c.benchmark_group("elastic-quota update, 10,000 quotas");
    for (shape, levels) in shapes {
        let (quotas, leaf) = tree(levels);
        let mut writer = CacheWriter::default();
        for q in &quotas {
            writer.apply(CachedObject::ElasticQuota(
                serde_json::from_value(q.clone()).expect("a quota"),
            ));
        }
        let cache = writer.reader();
        let gates = FeatureGates::default();
        let admission = Admission::new(cache.clone(), gates, Metrics::default());

        // Two updates of the leaf's min that undo each other, so the tree stays the same.
        let mut bigger = leaf.clone();
        bigger["spec"]["min"]["cpu"] = json!("20m");
        let there = review(&leaf, &bigger);
        let back = review(&bigger, &leaf);
        for body in [&there, &back] {
            let out = runtime
                .block_on(admission.review(PATH, body, None))
                .expect("answered");
            let out = String::from_utf8_lossy(&out);
            assert!(out.contains(r#""allowed":true"#), "{shape}: {out}");
        }
        let mut forth = false;
        group.bench_function(BenchmarkId::new("admission review", shape), |b| {
            b.iter(|| {
                forth = !forth;
                let body = if forth { &there } else { &back };
                let out = runtime
                    .block_on(admission.review(PATH, black_box(body), None))
                    .expect("answered");
                black_box(out);
            })
        });

        let (old, new): (ElasticQuota, ElasticQuota) = (
            serde_json::from_value(leaf.clone()).expect("a quota"),
            serde_json::from_value(bigger.clone()).expect("a quota"),
        );
        group.bench_function(BenchmarkId::new("tree rules only", shape), |b| {
            b.iter(|| {
                let topology = cache.topology();
                let info =
                    check_update(&topology, black_box(&old), black_box(&new), &gates, &cache)
                        .expect("allowed");
                black_box(info);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
