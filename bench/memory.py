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


def post(port, path, body_file):
    out = subprocess.run(
        ["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "60",
         "-H", "Content-Type: application/json", "--data-binary", f"@{body_file}",
         f"https://127.0.0.1:{port}{path}?timeout=30s"],
        capture_output=True, text=True)
    return out.stdout.strip()


def run(log, record, koord, out):
    for size in SIZES_MIB:
        for path in ("/validate-pod", "/mutate-pod"):
            body_file = os.path.join(out, f"labels-{size}.json")
            if not os.path.exists(body_file):
                with open(body_file, "wb") as f:
                    f.write(label_pod_review(path, size))
            for n in CONCURRENCY:
                server = koord(f"memory-{size}-{n}", 19531, os.path.join(os.path.dirname(__file__), "state"))
                idle = server.rss()
                with concurrent.futures.ThreadPoolExecutor(n) as pool:
                    codes = list(pool.map(lambda _: post(19531, path, body_file), range(n)))
                peak = server.peak()
                server.stop()
                record("largest-reviews", "koord-webhook", path.lstrip("/"),
                       {"body_mib": round(os.path.getsize(body_file) / 2**20, 2), "concurrent": n,
                        "idle_mib": idle, "peak_mib": peak,
                        "answered": codes.count("200"), "refused_503": codes.count("503"),
                        "other": len([c for c in codes if c not in ("200", "503")])})
