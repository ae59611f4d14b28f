//! Reading one slo-controller-config key as Koordinator reads it (`go_json`: keys folded as Go
//! folds them, then decoded) against decoding the same text directly with serde (the reading before
//! the Go-compatible decoder: exact key names only), for a small and a large colocation config.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::json;

use koord_webhook::slo_config::go_json;
use koord_webhook::slo_config::types::ColocationCfg;

fn config(node_configs: usize) -> String {
    let strategies: Vec<_> = (0..node_configs)
        .map(|i| {
            json!({"name": format!("pool-{i}"),
                   "nodeSelector": {"matchLabels": {"pool": format!("p{i}")}},
                   "cpuReclaimThresholdPercent": 60, "memoryReclaimThresholdPercent": 65,
                   "degradeTimeMinutes": 15, "updateTimeThresholdSeconds": 300})
        })
        .collect();
    json!({"enable": true, "metricAggregateDurationSeconds": 60, "cpuReclaimThresholdPercent": 60,
           "memoryReclaimThresholdPercent": 65, "degradeTimeMinutes": 15,
           "updateTimeThresholdSeconds": 300, "resourceDiffThreshold": 0.1,
           "nodeConfigs": strategies})
    .to_string()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("colocation-config");
    for node_configs in [1, 100] {
        let text = config(node_configs);
        group.bench_with_input(
            BenchmarkId::new("serde exact keys", node_configs),
            &text,
            |b, t| b.iter(|| serde_json::from_str::<ColocationCfg>(black_box(t)).unwrap()),
        );
        group.bench_with_input(BenchmarkId::new("go_json", node_configs), &text, |b, t| {
            b.iter(|| go_json::from_str::<ColocationCfg>(black_box(t)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
