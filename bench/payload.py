"""Writes the benchmark's AdmissionReviews into the directory given: pods of about 4 KiB and at least 15 KiB,
a node-status update of 2 x 64 KiB, and an ElasticQuota update for the scale state."""
import json, sys

UID = "2b7c5d3e-0000-4000-8000-000000000001"

def pod(labels, containers=2, env_per_container=12):
    env = [{"name": f"SETTING_{i}", "value": "x" * 24} for i in range(env_per_container)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "spark-exec-1", "namespace": "bench", "labels": labels,
                         "annotations": {"spark/app-id": "spark-4f1c2a7e9b", "owner": "data-platform"}},
            "spec": {"containers": [{
                "name": f"worker-{c}", "image": "registry.example.com/spark/executor:3.5.1",
                "args": ["--executor-cores", "2", "--executor-memory", "4g"],
                "env": env,
                "ports": [{"containerPort": 7078 + c, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
                "volumeMounts": [{"name": "spark-local", "mountPath": "/var/data"}],
            } for c in range(containers)],
                     "volumes": [{"name": "spark-local", "emptyDir": {}}],
                     "restartPolicy": "Never", "serviceAccountName": "spark"}}

def review(obj, resource, kind, group="", version="v1", operation="CREATE", old=None, sub=None):
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": resource}
    request = {
        "uid": UID, "operation": operation, "kind": gvk, "resource": gvr,
        "requestKind": gvk, "requestResource": gvr,
        "name": obj["metadata"]["name"], "namespace": obj["metadata"].get("namespace"),
        "userInfo": {"username": "system:serviceaccount:spark:spark-operator", "groups": ["system:serviceaccounts"]},
        "object": obj, "oldObject": old, "dryRun": False}
    if sub:
        request["subResource"] = sub
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}

def node(name, image_count):
    # What makes real node objects big: the image list kubelet reports in status.
    images = [{"names": [f"registry.example.com/team-{i % 40}/service-{i}@sha256:{i:064x}",
                         f"registry.example.com/team-{i % 40}/service-{i}:v1.{i % 17}.{i % 5}"],
               "sizeBytes": 100_000_000 + i} for i in range(image_count)]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "node-pool": "batch"},
                         "annotations": {"node.koordinator.sh/resource-amplification-ratio": '{"cpu": 1.5, "memory": 1.2}'}},
            "status": {"capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                       "allocatable": {"cpu": "62", "memory": "250Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "lastHeartbeatTime": "2026-11-23T07:00:00Z"}],
                       "images": images}}

def sized(make, target_bytes):
    """The smallest object from make(n) whose JSON is at least target_bytes."""
    n = 1
    while len(json.dumps(review(make(n), "x", "X"), separators=(",", ":"))) < target_bytes:
        n += 1
    return make(n)

def about(make, target_bytes):
    """The object from make(n) whose review is closest to target_bytes."""
    size = lambda n: len(json.dumps(review(make(n), "x", "X"), separators=(",", ":")))
    return make(min(range(1, 64), key=lambda n: abs(size(n) - target_bytes)))

def write(name, value):
    data = json.dumps(value, separators=(",", ":"))
    open(f"{out}/{name}.json", "w").write(data)
    return len(data)

out = sys.argv[1]
spark = {"app": "spark", "spark-role": "executor"}
be = dict(spark, **{"koordinator.sh/qosClass": "BE", "koordinator.sh/priority-class": "koord-batch"})
sizes = {
    "mutate-pod": write("mutate-pod", review(about(lambda n: pod(spark, containers=n), 4 * 1024), "pods", "Pod")),
    "validate-pod": write("validate-pod", review(about(lambda n: pod(be, containers=n), 4 * 1024), "pods", "Pod")),
    "validate-pod-15k": write("validate-pod-15k", review(
        sized(lambda n: pod(be, containers=n), 15 * 1024), "pods", "Pod")),
    "mutate-pod-15k": write("mutate-pod-15k", review(
        sized(lambda n: pod(spark, containers=n), 15 * 1024), "pods", "Pod")),
}
big = sized(lambda n: node("node-big", n), 64 * 1024)
old = json.loads(json.dumps(big))
old["status"]["allocatable"]["cpu"] = "60"
sizes["mutate-node-status"] = write("mutate-node-status", review(
    big, "nodes", "Node", operation="UPDATE", old=old, sub="status"))
# An update of one child quota in the scale tree (see scale_state.py): max raised within its parent.
quota = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
         "metadata": {"name": "child-0-7", "namespace": "ns-0",
                      "labels": {"quota.scheduling.koordinator.sh/parent": "parent-0"},
                      "annotations": {"quota.scheduling.koordinator.sh/shared-weight": '{"cpu":"4","memory":"8Gi"}'}},
         "spec": {"min": {"cpu": "1", "memory": "2Gi"}, "max": {"cpu": "4", "memory": "8Gi"}}}
old_quota = json.loads(json.dumps(quota))
old_quota["spec"]["max"]["cpu"] = "3"
sizes["validate-elastic-quota"] = write("validate-elastic-quota", review(
    quota, "elasticquotas", "ElasticQuota", group="scheduling.sigs.k8s.io", version="v1alpha1",
    operation="UPDATE", old=old_quota))
json.dump(sizes, open(f"{out}/payload-sizes.json", "w"))
