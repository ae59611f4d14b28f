//! One pod AdmissionReview through /validate-pod and /mutate-pod (decode, every plugin, patch,
//! encode), without TLS or HTTP, for reviews of about 4 KiB and 15 KiB: the CPU the server spends per
//! request beside the transport. The state is the one `just bench` serves (bench/state).

use std::hint::black_box;
use std::path::Path;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

use koord_webhook::admission::Admission;
use koord_webhook::cache::load::load_state;
use koord_webhook::features::FeatureGates;
use koord_webhook::metrics::Metrics;

fn pod(labels: Value, containers: usize) -> Value {
    let env: Vec<Value> = (0..12)
        .map(|i| json!({"name": format!("SETTING_{i}"), "value": "x".repeat(24)}))
        .collect();
    let containers: Vec<Value> = (0..containers)
        .map(|c| {
            json!({
                "name": format!("worker-{c}"), "image": "registry.example.com/spark/executor:3.5.1",
                "args": ["--executor-cores", "2", "--executor-memory", "4g"], "env": env,
                "ports": [{"containerPort": 7078 + c, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
                "volumeMounts": [{"name": "spark-local", "mountPath": "/var/data"}]
            })
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "spark-exec-1", "namespace": "bench", "labels": labels,
                     "annotations": {"spark/app-id": "spark-4f1c2a7e9b", "owner": "data-platform"}},
        "spec": {"containers": containers, "volumes": [{"name": "spark-local", "emptyDir": {}}],
                 "restartPolicy": "Never", "serviceAccountName": "spark"}})
}

fn review(object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "2b7c5d3e-0000-4000-8000-000000000001", "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "spark-exec-1", "namespace": "bench",
            "userInfo": {"username": "system:serviceaccount:spark:spark-operator"},
            "object": object, "oldObject": null
        }
    }))
    .expect("serialisable")
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let state = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/state");
    let cache = load_state(&state).expect("bench/state").reader();
    let admission = Admission::new(cache, FeatureGates::default(), Metrics::default());
    let spark = json!({"app": "spark", "spark-role": "executor"});
    let be = json!({"app": "spark", "spark-role": "executor",
        "koordinator.sh/qosClass": "BE", "koordinator.sh/priority-class": "koord-batch"});

    let mut group = c.benchmark_group("pod review");
    for (containers, size) in [(3, "4 KiB"), (14, "15 KiB")] {
        for (path, labels, expect) in [
            ("/validate-pod", &be, r#""allowed":true"#),
            ("/mutate-pod", &spark, r#""patch":"#),
        ] {
            // The sizes bench/payload.py makes: about 4 KiB, and at least 15 KiB.
            let body = review(pod(labels.clone(), containers));
            let out = runtime
                .block_on(admission.review(path, &body, None))
                .expect("answered");
            let out = String::from_utf8_lossy(&out);
            assert!(out.contains(expect), "{path}: {out}");
            group.throughput(Throughput::Bytes(body.len() as u64));
            group.bench_function(BenchmarkId::new(path, size), |b| {
                b.iter(|| {
                    let out = runtime
                        .block_on(admission.review(path, black_box(&body), None))
                        .expect("answered");
                    black_box(out);
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
