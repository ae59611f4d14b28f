"""The memory phase: the largest objects the API server can send, several at once.

A pod of labels decodes into far more memory than its bytes (every label a map entry of two
strings). Each case starts a fresh server (so its peak is that case's), posts N copies of one body
at once to /validate-pod and /mutate-pod, and records the process's peak RSS (VmHWM) and how many
requests were answered and how many refused with 503 (the memory budget). Reported, never asserted.
"""
import concurrent.futures
import json
import os
import subprocess

SIZES_MIB = (3, 7.5)
CONCURRENCY = (1, 2, 4, 8)


def label_pod_review(path, size_mib):
    """An AdmissionReview of a pod whose labels fill about `size_mib` MiB (short keys and values:
    the most entries per byte)."""
    pairs = int(size_mib * 1024 * 1024 / 24)
    labels = {f"k{i:07d}": f"v{i:07d}" for i in range(pairs)}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "big", "namespace": "default", "labels": labels},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "resource": {"group": "", "version": "v1", "resource": "pods"},
                                   "namespace": "default", "operation": "CREATE",
                                   "userInfo": {"username": "bench"}, "object": pod}}).encode()


def review(kind, resource, group, version, operation, obj, old=None, options=None):
    request = {"uid": "u", "kind": {"group": group, "version": version, "kind": kind},
               "resource": {"group": group, "version": version, "resource": resource},
               "operation": operation, "userInfo": {"username": "bench"}, "object": obj}
    if obj.get("metadata", {}).get("namespace"):
        request["namespace"] = obj["metadata"]["namespace"]
    if old is not None:
        request["oldObject"] = old
    if options is not None:
        request["options"] = options
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": request}, separators=(",", ":")).encode()


def zeros(size_mib):
    """A JSON array of zeros about `size_mib` MiB long: the most values per byte (2 bytes each)."""
    return [0] * int(size_mib * 1024 * 1024 / 2)


def options_zeros_review(size_mib):
    """A pod review whose `request.options` is an array of zeros (issue 41: decoded, it held 285 MiB)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    return review("Pod", "pods", "", "v1", "CREATE", pod, options={"zeros": zeros(size_mib)})


def managed_fields_quota_review(size_mib):
    """An ElasticQuota whose managedFields' fieldsV1 is an array of zeros (any kind decoded with
    k8s-openapi's ObjectMeta reads managedFields)."""
    quota = {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
             "metadata": {"name": "q", "namespace": "default",
                          "managedFields": [{"manager": "m", "operation": "Update",
                                             "fieldsType": "FieldsV1",
                                             "fieldsV1": {"f:x": zeros(size_mib)}}]},
             "spec": {"max": {"cpu": "1"}}}
    return review("ElasticQuota", "elasticquotas", "scheduling.sigs.k8s.io", "v1alpha1", "CREATE", quota)


def profile_patch_review(size_mib):
    """A ClusterColocationProfile UPDATE whose `spec.patch` holds zeros, twice (object and old):
    what the API server itself can send."""
    profile = {"apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
               "metadata": {"name": "p"},
               "spec": {"selector": {"matchLabels": {"a": "b"}}, "patch": {"zeros": zeros(size_mib)}}}
    return review("ClusterColocationProfile", "clustercolocationprofiles", "config.koordinator.sh",
                  "v1alpha1", "UPDATE", profile, old=profile)


# Issue 41's hostile shapes: (name, path, body, size in MiB).
SHAPES = (
    ("options-zeros", "/validate-pod", options_zeros_review, 7.9),
    ("managedfields-zeros", "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota",
     managed_fields_quota_review, 7.9),
    ("profile-patch-zeros", "/validate-clustercolocationprofile", profile_patch_review, 3),
    # The largest of each that fits the budget: decoded, so these show what reading them costs.
    ("managedfields-zeros-2mib", "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota",
     managed_fields_quota_review, 2),
    ("profile-patch-zeros-1mib", "/validate-clustercolocationprofile", profile_patch_review, 1),
)


def post(port, path, body_file):
    out = subprocess.run(
        ["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "60",
         "-H", "Content-Type: application/json", "--data-binary", f"@{body_file}",
         f"https://127.0.0.1:{port}{path}?timeout=30s"],
        capture_output=True, text=True)
    return out.stdout.strip()


def measure(koord, name, path, body_file, n, *extra):
    """A fresh server, `n` copies of the body at once: its idle and peak RSS and the answers."""
    server = koord(name, 19531, os.path.join(os.path.dirname(__file__), "state"), *extra)
    idle = server.rss()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        codes = list(pool.map(lambda _: post(19531, path, body_file), range(n)))
    peak = server.peak()
    server.stop()
    return {"body_mib": round(os.path.getsize(body_file) / 2**20, 2), "concurrent": n,
            "idle_mib": idle, "peak_mib": peak,
            "answered": codes.count("200"), "refused_503": codes.count("503"),
            "other": [c for c in codes if c not in ("200", "503")]}


def write_once(body_file, make):
    if not os.path.exists(body_file):
        with open(body_file, "wb") as f:
            f.write(make())


def run(log, record, koord, out):
    for size in SIZES_MIB:
        for path in ("/validate-pod", "/mutate-pod"):
            body_file = os.path.join(out, f"labels-{size}.json")
            write_once(body_file, lambda: label_pod_review(path, size))
            for n in CONCURRENCY:
                row = measure(koord, f"memory-{size}-{n}", path, body_file, n)
                row["other"] = len(row["other"])
                record("largest-reviews", "koord-webhook", path.lstrip("/"), row)
    # Issue 41's shapes, each alone and two at once, under the chart's limit (256Mi: decode budget
    # 96 MiB, in-flight bytes 64 MiB).
    for name, path, make, size in SHAPES:
        body_file = os.path.join(out, f"{name}.json")
        write_once(body_file, lambda: make(size))
        for n in (1, 2):
            row = measure(koord, f"memory-{name}-{n}", path, body_file, n, "--memory-limit", str(256 << 20))
            row["other"] = " ".join(sorted(row["other"]))
            record("hostile-shapes", "koord-webhook", f"{name} {path.lstrip('/')}", row)
