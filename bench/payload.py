"""Writes realistic pod AdmissionReviews (about 4 KiB) for the benchmark."""
import json, sys

def pod(labels):
    env = [{"name": f"SETTING_{i}", "value": "x" * 24} for i in range(12)]
    containers = [{
        "name": f"worker-{c}", "image": "registry.example.com/spark/executor:3.5.1",
        "args": ["--executor-cores", "2", "--executor-memory", "4g"],
        "env": env,
        "ports": [{"containerPort": 7078 + c, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        "volumeMounts": [{"name": "spark-local", "mountPath": "/var/data"}],
    } for c in range(2)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "spark-exec-1", "namespace": "bench", "labels": labels,
                         "annotations": {"spark/app-id": "spark-4f1c2a7e9b", "owner": "data-platform"}},
            "spec": {"containers": containers, "volumes": [{"name": "spark-local", "emptyDir": {}}],
                     "restartPolicy": "Never", "serviceAccountName": "spark"}}

def review(obj):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "2b7c5d3e-0000-4000-8000-000000000001", "operation": "CREATE",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "spark-exec-1", "namespace": "bench",
        "userInfo": {"username": "system:serviceaccount:spark:spark-operator", "groups": ["system:serviceaccounts"]},
        "object": obj, "oldObject": None, "dryRun": False}}

out = sys.argv[1]
spark = {"app": "spark", "spark-role": "executor"}
json.dump(review(pod(spark)), open(f"{out}/mutate-pod.json", "w"))
be = dict(spark, **{"koordinator.sh/qosClass": "BE", "koordinator.sh/priority-class": "koord-batch"})
json.dump(review(pod(be)), open(f"{out}/validate-pod.json", "w"))
