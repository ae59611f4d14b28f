"""The state the scale benchmark loads through the API server (bench/scale.py): its sizes, the
objects as clients create them (nodes with 20 labels and heartbeats' status, namespaces, quota
trees with Koordinator's annotations, Reservations with pod templates, pods of 4-8 KiB), the admin's
client, and the reset each build's run starts from."""
import concurrent.futures
import http.client
import json
import random
import ssl
import threading
import time

SIZES = {
    # nodes, namespaces, reservations, quota trees, children per tree, pods
    "S": dict(nodes=1000, namespaces=200, reservations=200, trees=20, children=49, pods=10000),
    "L1": dict(nodes=5000, namespaces=2000, reservations=1000, trees=100, children=99, pods=75000),
    "L0": dict(nodes=5000, namespaces=2000, reservations=1000, trees=100, children=99, pods=150000),
}


def last_applied(obj):
    """kubectl's client-side apply record: a copy of the object as the user wrote it."""
    obj.setdefault("metadata", {}).setdefault("annotations", {})[
        "kubectl.kubernetes.io/last-applied-configuration"] = json.dumps(obj, separators=(",", ":"))
    return obj


class Api:
    """The admin's HTTPS client to the API server, one keep-alive connection per thread."""

    def __init__(self, cp_dir, server):
        self.host, self.port = server.split("//")[1].split(":")
        self.ctx = ssl.create_default_context(cafile=f"{cp_dir}/ca.crt")
        self.ctx.load_cert_chain(f"{cp_dir}/admin.crt", f"{cp_dir}/admin.key")
        self.local = threading.local()

    def conn(self):
        c = getattr(self.local, "c", None)
        if c is None:
            c = http.client.HTTPSConnection(self.host, int(self.port), context=self.ctx, timeout=60)
            self.local.c = c
        return c

    def call(self, method, path, body=None, content_type="application/json", tries=8):
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        for attempt in range(tries):
            try:
                c = self.conn()
                c.request(method, path, body=data, headers={"Content-Type": content_type})
                r = c.getresponse()
                payload = r.read()
                if (r.status == 429 or r.status >= 500) and attempt < tries - 1:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                return r.status, payload
            except (OSError, http.client.HTTPException):
                self.local.c = None
                if attempt == tries - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))
        return 0, b""

    def create(self, path, body):
        status, payload = self.call("POST", path, body)
        if status not in (200, 201, 409):
            raise RuntimeError(f"POST {path}: {status} {payload[:300]!r}")


def node(i):
    name = f"node-{i:05d}"
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": f"ecs.g7.{4 << (i % 4)}xlarge",
              "topology.kubernetes.io/zone": f"zone-{i % 3}", "topology.kubernetes.io/region": "region-1",
              "node-pool": f"pool-{i % 16}", "node-role.kubernetes.io/worker": "",
              "koordinator.sh/colocation": "true" if i % 2 else "false"}
    labels.update({f"team.example.com/label-{k}": f"value-{(i + k) % 97}" for k in range(11)})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": labels,
        "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24"}}


def node_status(i, now):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    images = [{"names": [f"registry.example.com/team/app-{k}@sha256:{k:064x}", f"registry.example.com/team/app-{k}:v1"],
               "sizeBytes": 100000000 + k} for k in range(8)]
    return {"status": {
        "capacity": {"cpu": "64", "memory": "256Gi", "pods": "110", "kubernetes.io/batch-cpu": "32000",
                     "kubernetes.io/batch-memory": "128Gi"},
        "allocatable": {"cpu": "63", "memory": "250Gi", "pods": "110", "kubernetes.io/batch-cpu": "32000",
                        "kubernetes.io/batch-memory": "128Gi"},
        "conditions": [{"type": t, "status": "False" if t != "Ready" else "True", "reason": f"Kubelet{t}",
                        "message": f"kubelet reports {t}", "lastHeartbeatTime": stamp,
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}
                       for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
        "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:032x}", "bootID": f"{i:032x}",
                     "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12", "containerRuntimeVersion":
                     "containerd://1.7.24", "kubeletVersion": "v1.34.4", "kubeProxyVersion": "",
                     "operatingSystem": "linux", "architecture": "amd64"},
        "images": images}}


def namespace(i):
    return last_applied({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": f"ns-{i:04d}", "labels": {"team": f"team-{i % 50}", "env": "prod" if i % 3 else "dev"}}})


def quota(tree, child, size):
    """Tree `tree`'s parent (child None) or one of its children, in its own namespace."""
    ann = {"quota.scheduling.koordinator.sh/shared-weight": '{"cpu":"40","memory":"80Gi"}',
           "quota.scheduling.koordinator.sh/runtime": '{"cpu":"4","memory":"8Gi"}',
           "quota.scheduling.koordinator.sh/request": '{"cpu":"6","memory":"12Gi"}'}
    if child is None:
        meta = {"name": f"parent-{tree:03d}", "namespace": f"ns-{tree % size['namespaces']:04d}",
                "labels": {"quota.scheduling.koordinator.sh/is-parent": "true",
                           "quota.scheduling.koordinator.sh/parent": "koordinator-root-quota"},
                "annotations": ann}
        spec = {"min": {"cpu": "2000", "memory": "4000Gi"}, "max": {"cpu": "4000", "memory": "8000Gi"}}
    else:
        k = tree * size["children"] + child
        meta = {"name": f"child-{tree:03d}-{child:02d}",
                "namespace": f"ns-{k % size['namespaces']:04d}",
                "labels": {"quota.scheduling.koordinator.sh/parent": f"parent-{tree:03d}",
                           "quota.scheduling.koordinator.sh/is-parent": "false"},
                "annotations": dict(ann, **{"quota.scheduling.koordinator.sh/child-request": '{"cpu":"1"}'})}
        spec = {"min": {"cpu": "10", "memory": "20Gi"}, "max": {"cpu": "40", "memory": "80Gi"}}
    return last_applied({"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                         "metadata": meta, "spec": spec})


def reservation(i):
    env = [{"name": f"ENV_{k}", "value": "v" * 40} for k in range(12)]
    return last_applied({"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
                         "metadata": {"name": f"reserve-{i:04d}", "labels": {"app": f"app-{i % 20}"}},
                         "spec": {"allocateOnce": False, "ttl": "720h",
                                  "owners": [{"labelSelector": {"matchLabels": {"app": f"app-{i % 20}"}}}],
                                  "template": {"metadata": {"labels": {"app": f"app-{i % 20}"}},
                                               "spec": {"containers": [{
                                                   "name": "main", "image": "registry.example.com/app:v1", "env": env,
                                                   "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]}}}})


def pod(i, size, quotas):
    """A pod of 4-8 KiB bound to a node; 30 % name a child quota by label."""
    ns = f"ns-{i % size['namespaces']:04d}"
    labels = {"app": f"app-{i % 500}", "pod-template-hash": f"{i % 5000:08x}", "tier": "batch" if i % 4 else "web",
              "release": f"r{i % 7}"}
    if i % 10 < 3:
        labels["quota.scheduling.koordinator.sh/name"] = quotas[i % len(quotas)]
    env = [{"name": f"SETTING_{k}", "value": f"{k:02d}" + "x" * (40 + i % 80)} for k in range(30 + i % 30)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"pod-{i:06d}", "namespace": ns, "labels": labels,
        "annotations": {"example.com/build": f"{i:040x}", "prometheus.io/scrape": "true"}},
        "spec": {"nodeName": f"node-{i % size['nodes']:05d}", "containers": [{
            "name": "main", "image": f"registry.example.com/app-{i % 500}:v1", "env": env,
            "ports": [{"containerPort": 8080, "name": "http"}],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}}]}}


def parallel(api, jobs, workers=24, what=""):
    """Runs (method, path, body) jobs on `workers` threads; returns the objects per second."""
    start = time.time()
    done = 0
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(lambda j: api.create(*j), jobs):
            done += 1
            if done % 10000 == 0:
                log(f"  {what}: {done} ({done / (time.time() - start):.0f}/s)")
    return done / max(time.time() - start, 1e-9)


def log(msg):
    print(f"[scale {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load(api, size):
    log(f"loading {size}")
    rates = {}
    rates["namespaces"] = parallel(api, [("/api/v1/namespaces", namespace(i)) for i in range(size["namespaces"])],
                                   what="namespaces")
    rates["nodes"] = parallel(api, [("/api/v1/nodes", node(i)) for i in range(size["nodes"])], what="nodes")
    now = time.time()
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        list(pool.map(lambda i: api.call("PATCH", f"/api/v1/nodes/node-{i:05d}/status", node_status(i, now),
                                         "application/merge-patch+json"), range(size["nodes"])))
    group = "/apis/scheduling.koordinator.sh/v1alpha1/reservations"
    rates["reservations"] = parallel(api, [(group, reservation(i)) for i in range(size["reservations"])],
                                     what="reservations")
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        list(pool.map(lambda i: api.call(
            "PATCH", f"{group}/reserve-{i:04d}/status",
            {"status": {"phase": "Available", "nodeName": f"node-{i % size['nodes']:05d}",
                        "allocatable": {"cpu": "4", "memory": "8Gi"}, "allocated": {"cpu": "1"}}},
            "application/merge-patch+json"), range(size["reservations"])))
    eq = lambda ns: f"/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/elasticquotas"
    parents = [quota(t, None, size) for t in range(size["trees"])]
    parallel(api, [(eq(q["metadata"]["namespace"]), q) for q in parents], what="parent quotas")
    children = [quota(t, c, size) for t in range(size["trees"]) for c in range(size["children"])]
    rates["quotas"] = parallel(api, [(eq(q["metadata"]["namespace"]), q) for q in children], what="quotas")
    names = [q["metadata"]["name"] for q in children]
    pods = (pod(i, size, names) for i in range(size["pods"]))
    rates["pods"] = parallel(api, ((f"/api/v1/namespaces/{p['metadata']['namespace']}/pods", p) for p in pods),
                             what="pods")
    log("loaded: " + ", ".join(f"{k} {v:.0f}/s" for k, v in rates.items()))
    return names


def reset_child_requests(api, size):
    """Every child quota's `child-request` back to what the loader wrote (and no recent-admissions
    record), so that each build's leader meets the same first recount (9,900 corrections at L1)
    whether or not a build before it ran on this state."""
    # A build before this one left its webhook configurations behind, calling a relay that is gone:
    # the replicas about to start write their own.
    for kind, name in (("mutatingwebhookconfigurations", "koordinator-mutating-webhook-configuration"),
                       ("validatingwebhookconfigurations", "koordinator-validating-webhook-configuration")):
        status, payload = api.call("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
        if status not in (200, 404):
            raise RuntimeError(f"DELETE {kind}/{name}: {status} {payload[:300]!r}")
    eq = lambda ns: f"/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/elasticquotas"
    patch = {"metadata": {"annotations": {"quota.scheduling.koordinator.sh/child-request": '{"cpu":"1"}',
                                          "koord-webhook/child-request-recent": None}}}

    def one(q):
        path = f"{eq(q['metadata']['namespace'])}/{q['metadata']['name']}"
        status, payload = api.call("PATCH", path, patch, "application/merge-patch+json")
        if status != 200:
            raise RuntimeError(f"PATCH {path}: {status} {payload[:300]!r}")

    children = [quota(t, c, size) for t in range(size["trees"]) for c in range(size["children"])]
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        list(pool.map(one, children))
