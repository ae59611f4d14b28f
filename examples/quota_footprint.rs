//! What one cached quota costs a replica: the store's slim object and the quota tree's record.
//!
//! `cargo run --release --example quota_footprint` builds 100,000 quotas shaped like the scale
//! benchmark's (bench/scale_load.py) and prints the resident bytes each adds (glibc's allocator, so
//! a figure per object, not the image's peak; docs/scale.md).

use koord_webhook::apis::ElasticQuota;
use koord_webhook::cache::QuotaTopology;
use koord_webhook::cache::store::Writer;

fn rss() -> isize {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    s.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<isize>()
        .unwrap()
        * 4096
}

fn quota(tree: usize, child: usize) -> ElasticQuota {
    let last = "x".repeat(1500);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
        "metadata": {"name": format!("child-{tree:03}-{child:02}"), "namespace": format!("ns-{:04}", (tree*99+child)%2000),
          "uid": "0a6b8c6e-7d9f-4a47-9f0c-6c3f1b0d2e11", "resourceVersion": "123456789",
          "labels": {"quota.scheduling.koordinator.sh/parent": format!("parent-{tree:03}"),
                     "quota.scheduling.koordinator.sh/is-parent": "false"},
          "annotations": {"quota.scheduling.koordinator.sh/shared-weight": "{\"cpu\":\"40\",\"memory\":\"80Gi\"}",
             "quota.scheduling.koordinator.sh/runtime": "{\"cpu\":\"4\",\"memory\":\"8Gi\"}",
             "quota.scheduling.koordinator.sh/request": "{\"cpu\":\"6\",\"memory\":\"12Gi\"}",
             "quota.scheduling.koordinator.sh/child-request": "{\"cpu\":\"1\"}",
             "kubectl.kubernetes.io/last-applied-configuration": last}},
        "spec": {"min": {"cpu": "10", "memory": "20Gi"}, "max": {"cpu": "40", "memory": "80Gi"}}
    }))
    .unwrap()
}

fn main() {
    let n = 100_000;
    let quotas: Vec<_> = (0..100)
        .flat_map(|t| (0..n / 100).map(move |c| quota(t, c)))
        .collect();
    let before = rss();
    let mut w = Writer::<ElasticQuota>::default();
    for q in quotas.iter().cloned() {
        w.upsert(q);
    }
    let store = rss() - before;
    let before = rss();
    let topo = QuotaTopology::from_quotas(&quotas);
    let topology = rss() - before;
    println!(
        "per quota: store {} B, topology {} B ({} quotas)",
        store / n as isize,
        topology / n as isize,
        topo.len()
    );
    assert_eq!(w.as_reader().len(), topo.len());
}
