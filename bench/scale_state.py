"""Writes a large cluster state for `serve --state`: QUOTAS ElasticQuotas (parents of 99 children
each), PODS pods and NODES nodes, as JSON lists, plus the benchmark's colocation state."""
import json, os, sys

out, quotas, pods, nodes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(out, exist_ok=True)

def dump(name, items):
    with open(f"{out}/{name}.json", "w") as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f, separators=(",", ":"))

parents = max(1, quotas // 100)
items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"ns-{p}"}} for p in range(parents)]
items.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
dump("0-namespaces", items)

items = []
for p in range(parents):
    items.append({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                  "metadata": {"name": f"parent-{p}", "namespace": f"ns-{p}",
                               "labels": {"quota.scheduling.koordinator.sh/is-parent": "true"}},
                  "spec": {"min": {"cpu": "200", "memory": "400Gi"}, "max": {"cpu": "400", "memory": "800Gi"}}})
    for c in range(min(99, quotas - len(items))):
        items.append({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                      "metadata": {"name": f"child-{p}-{c}", "namespace": f"ns-{p}",
                                   "labels": {"quota.scheduling.koordinator.sh/parent": f"parent-{p}"},
                                   "annotations": {"quota.scheduling.koordinator.sh/shared-weight": '{"cpu":"4","memory":"8Gi"}'}},
                      "spec": {"min": {"cpu": "1", "memory": "2Gi"}, "max": {"cpu": "3", "memory": "8Gi"}}})
dump("1-quotas", items[:quotas])

dump("2-nodes", [{"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": f"node-{n:05d}", "uid": f"00000000-0000-4000-8000-{n:012d}",
                               "labels": {"kubernetes.io/hostname": f"node-{n:05d}", "node-pool": f"pool-{n % 8}",
                                          "topology.kubernetes.io/zone": f"zone-{n % 3}"},
                               "annotations": {"node.koordinator.sh/resource-amplification-ratio": '{"cpu": 1.5}'}},
                  "status": {"capacity": {"cpu": "64", "memory": "256Gi"}}} for n in range(nodes)])

dump("3-pods", [{"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": f"worker-{i:06d}", "namespace": f"ns-{i % parents}",
                              "uid": f"00000000-0000-4000-9000-{i:012d}", "resourceVersion": str(1000 + i),
                              "labels": {"app": f"app-{i % 500}", "pod-template-hash": f"{i % 9973:08x}",
                                         "quota.scheduling.koordinator.sh/name": f"child-{i % parents}-{i % 99}"},
                              "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                   "name": f"app-{i % 500}-{i % 9973:08x}",
                                                   "uid": f"00000000-0000-4000-a000-{i % 500:012d}",
                                                   "controller": True}]},
                 "spec": {"nodeName": f"node-{i % max(nodes, 1):05d}",
                          "containers": [{"name": "main", "image": "registry.example.com/app:1",
                                          "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]}}
                for i in range(pods)])
