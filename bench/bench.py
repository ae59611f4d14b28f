"""The benchmark driver behind `just bench` (bench/run builds what it needs, then calls this).

Each server runs pinned to core 0 and the load generator to core 1. Maximum throughput over
HTTP/1.1 comes from wrk; every fixed-rate run comes from oha with latency correction
(latency counted from when a request was due, not from when it was sent). Every phase writes one
JSON line to target/bench/results.jsonl; bench/report.py turns them into bench/RESULTS.md.
Timings are reported, never asserted.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import apiserver
import memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "target", "bench")
DURATION = int(os.environ.get("BENCH_DURATION", "10"))
OHA = os.environ.get("OHA", "oha")
# KOORD=path compares another build of the server (e.g. an older commit) under the same load.
KOORD = os.environ.get("KOORD", os.path.join(ROOT, "target", "release", "koord-webhook"))
TICKS = os.sysconf("SC_CLK_TCK")


def log(message):
    print(f"== {message}", file=sys.stderr, flush=True)


class Server:
    """A server process pinned to core 0, with its RSS and CPU time read from /proc."""

    def __init__(self, name, port, argv):
        self.name, self.port = name, port
        self.log = open(os.path.join(OUT, f"{name}.log"), "w")
        self.proc = subprocess.Popen(["taskset", "-c", "0", *argv], stdout=self.log, stderr=self.log)
        deadline = time.time() + 300
        # Any HTTP answer means the server is up (the peer has no /healthz).
        while subprocess.run(["curl", "-sk", "-o", "/dev/null", f"https://127.0.0.1:{port}/healthz"]).returncode:
            if self.proc.poll() is not None or time.time() > deadline:
                sys.exit(f"{name} did not start; see {self.log.name}")
            time.sleep(0.2)
        time.sleep(1)

    def status(self, field):
        for line in open(f"/proc/{self.proc.pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # MiB
        return 0.0

    def rss(self):
        return self.status("VmRSS")

    def peak(self):
        return self.status("VmHWM")

    def cpu_seconds(self):
        fields = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def url(server, endpoint):
    return f"https://127.0.0.1:{server.port}/{endpoint}"


def wrk(server, endpoint, body, connections=16):
    """Maximum throughput over HTTP/1.1 keep-alive."""
    env = dict(os.environ, BODY=os.path.join(OUT, f"{body}.json"))
    cpu = server.cpu_seconds()
    out = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{DURATION}s", "-s",
         os.path.join(ROOT, "bench", "post.lua"), url(server, endpoint)],
        env=env, check=True, capture_output=True, text=True).stdout
    w = json.loads(out.strip().splitlines()[-1])
    requests = max(w["requests"], 1)
    return {
        "rps": w["requests"] / (w["duration_us"] / 1e6),
        "p50_ms": w["p50_us"] / 1000, "p99_ms": w["p99_us"] / 1000, "p999_ms": w["p999_us"] / 1000,
        "errors": w["errors"] + w["non2xx"], "requests": w["requests"],
        "cpu_ms_per_1000": (server.cpu_seconds() - cpu) * 1000 / requests * 1000,
    }


def oha(server, endpoint, body, rate=None, keepalive=True, connections=16,
        duration=None):
    """One oha run; with `rate`, an open-loop fixed rate with latency correction."""
    argv = ["taskset", "-c", "1", OHA, "--no-tui", "--output-format", "json", "--insecure",
            "-z", f"{duration or DURATION}s", "-w", "-c", str(connections)]
    if body:
        argv += ["-m", "POST", "-T", "application/json", "-D", os.path.join(OUT, f"{body}.json")]
    if rate:
        argv += ["-q", str(rate), "--latency-correction"]
    if not keepalive:
        argv += ["--disable-keepalive"]
    cpu = server.cpu_seconds()
    result = json.loads(subprocess.run(argv + [url(server, endpoint)], check=True,
                                       capture_output=True, text=True).stdout)
    cpu = server.cpu_seconds() - cpu
    summary, pct = result["summary"], result["latencyPercentiles"]
    codes = result.get("statusCodeDistribution", {})
    ok = sum(n for code, n in codes.items() if code == "200")
    errors = sum(result.get("errorDistribution", {}).values()) + sum(
        n for code, n in codes.items() if code != "200")
    return {
        "rps": summary["requestsPerSec"],
        "p50_ms": (pct.get("p50") or 0) * 1000, "p99_ms": (pct.get("p99") or 0) * 1000,
        "p999_ms": (pct.get("p99.9") or 0) * 1000,
        "errors": errors, "requests": ok,
        "cpu_ms_per_1000": cpu * 1000 / max(ok, 1) * 1000,
    }


results = []


def record(phase, server, endpoint, figures, **extra):
    row = {"phase": phase, "server": server, "endpoint": endpoint, **figures, **extra}
    results.append(row)
    log(f"{phase} {server} /{endpoint}: " + ", ".join(
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))


def self_signed(directory, name):
    os.makedirs(directory, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", os.path.join(directory, "tls.key"), "-out", os.path.join(directory, "tls.crt")],
        check=True, capture_output=True)


def koord(name, port, state, *extra):
    return Server(name, port, [KOORD, "serve", "--port", str(port), "--bind-address", "127.0.0.1",
                               "--metrics-bind-address", "0", "--health-bind-address", "0", "--state", state, "--tls-cert-file", os.path.join(OUT, "tls.crt"),
                               "--tls-key-file", os.path.join(OUT, "tls.key"), *extra])


def peer_comparison():
    """Both servers, the same payloads: throughput, latency at fixed rates, CPU and memory."""
    peer_max = {}
    for name in ("go-peer", "koord-webhook"):
        log(name)
        if name == "go-peer":
            server = Server(name, 19502, [os.path.join(OUT, "go-peer"), "--port", "19502",
                                          "--cert-dir", OUT])
        else:
            server = koord(name, 19501, os.path.join(ROOT, "bench", "state"))
        record("memory", name, "-", {"rss_idle_mib": server.rss()})
        if name == "koord-webhook":
            # What loopback, TLS and the load generator cost alone: the floor under every latency.
            record("floor-2000", name, "healthz", oha(server, "healthz", None, rate=2000), rate=2000)
        for endpoint in ("validate-pod", "mutate-pod"):
            figures = wrk(server, endpoint, endpoint)
            record("max-http1", name, endpoint, figures)
            if name == "go-peer":
                peer_max[endpoint] = figures["rps"]
            # No HTTP/2 phase: the admission port speaks HTTP/1.1 only, as the API server calls it.
            half = max(100, int(peer_max[endpoint] / 2))
            for rate in sorted({half, 2000}):
                record(f"rate-{rate}", name, endpoint, oha(server, endpoint, endpoint, rate=rate),
                       rate=rate)
            record("max-http1-15k", name, endpoint, wrk(server, endpoint, f"{endpoint}-15k"))
        record("memory-after-load", name, "-", {"rss_mib": server.rss(), "peak_mib": server.peak()})
        server.stop()


def node_status():
    """The largest objects the webhook sees: node status updates, object and old object 64 KiB each."""
    server = koord("koord-webhook", 19503, os.path.join(ROOT, "bench", "state"))
    record("rate-1000-64k", "koord-webhook", "mutate-node-status",
           oha(server, "mutate-node-status", "mutate-node-status", rate=1000), rate=1000)
    record("max-http1-64k", "koord-webhook", "mutate-node-status",
           wrk(server, "mutate-node-status", "mutate-node-status"))
    server.stop()


def scale():
    """10,000 quotas, 100,000 pods and 5,000 nodes cached: memory, and latency against a small cache."""
    state = os.path.join(OUT, "scale-state")
    if not os.path.exists(os.path.join(state, "3-pods.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale_state.py"), state,
                        "10000", "100000", "5000"], check=True)
    shutil.copy(os.path.join(ROOT, "bench", "state", "colocation.yaml"), state)
    for label, directory in (("small", os.path.join(ROOT, "bench", "scale-small")), ("large", state)):
        if label == "small":
            os.makedirs(directory, exist_ok=True)
            subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale_state.py"), directory,
                            "100", "0", "0"], check=True)
            shutil.copy(os.path.join(ROOT, "bench", "state", "colocation.yaml"), directory)
        started = time.time()
        server = koord(f"koord-webhook-{label}", 19504, directory)
        record("scale-memory", label, "-", {"rss_idle_mib": server.rss(), "start_s": time.time() - started})
        for endpoint, body in (("validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota",
                                "validate-elastic-quota"), ("validate-pod", "validate-pod")):
            record(f"scale-rate-1000-{label}", label, endpoint,
                   oha(server, endpoint, body, rate=1000), rate=1000)
        record("scale-memory-after-load", label, "-", {"rss_mib": server.rss(), "peak_mib": server.peak()})
        server.stop()
    shutil.rmtree(os.path.join(ROOT, "bench", "scale-small"), ignore_errors=True)


def rotation():
    """p99 at a fixed rate with a new TLS handshake per request, without and with 20 serving-certificate
    rotations (the files replaced once a second, re-read every 200 ms)."""
    live = os.path.join(OUT, "rotation")
    self_signed(live, "rotation-0")
    pairs = [os.path.join(OUT, "rotation-pairs", str(i)) for i in range(1, 21)]
    for i, pair in enumerate(pairs, 1):
        self_signed(pair, f"rotation-{i}")
    server = Server("koord-webhook-rotation", 19505, [
        KOORD, "serve", "--port", "19505", "--bind-address", "127.0.0.1",
        "--metrics-bind-address", "127.0.0.1:19506", "--health-bind-address", "0", "--state", os.path.join(ROOT, "bench", "state"),
        "--tls-cert-file", os.path.join(live, "tls.crt"), "--tls-key-file", os.path.join(live, "tls.key"),
        "--tls-reload-interval", "200ms"])
    seconds = 22
    for label in ("without", "with"):
        load = subprocess.Popen(
            ["taskset", "-c", "1", OHA, "--no-tui", "--output-format", "json", "--insecure",
             "-z", f"{seconds}s", "-w", "-c", "16", "-q", "500", "--latency-correction", "--disable-keepalive",
             "-m", "POST", "-T", "application/json", "-D", os.path.join(OUT, "validate-pod.json"),
             url(server, "validate-pod")], stdout=subprocess.PIPE, text=True)
        if label == "with":
            time.sleep(1)
            for pair in pairs:
                # Key first, then certificate, each by rename: the reader may see a mismatched pair
                # for a moment, which it refuses and retries.
                for f in ("tls.key", "tls.crt"):
                    shutil.copy(os.path.join(pair, f), os.path.join(live, f + ".new"))
                    os.replace(os.path.join(live, f + ".new"), os.path.join(live, f))
                time.sleep(1)
        result = json.loads(load.communicate()[0])
        codes = result.get("statusCodeDistribution", {})
        pct = result["latencyPercentiles"]
        record(f"rotation-{label}", "koord-webhook", "validate-pod", {
            "rps": result["summary"]["requestsPerSec"],
            "p50_ms": (pct.get("p50") or 0) * 1000, "p99_ms": (pct.get("p99") or 0) * 1000,
            "p999_ms": (pct.get("p99.9") or 0) * 1000,
            "errors": sum(result.get("errorDistribution", {}).values())
            + sum(n for c, n in codes.items() if c != "200"),
            "requests": codes.get("200", 0)}, rate=500)
    metrics = subprocess.run(["curl", "-s", "http://127.0.0.1:19506/metrics"], capture_output=True, text=True).stdout
    reloads = sum(float(line.split()[-1]) for line in metrics.splitlines()
                  if line.startswith('koord_webhook_certificate_rotations_total{certificate="serving"}'))
    record("rotation-count", "koord-webhook", "-", {"reloads": int(reloads)})
    server.stop()


def bench_phase(row):
    """The `bench/run` phase that wrote a results row."""
    name = row["phase"]
    if name.startswith("scale"):
        return "scale"
    if name.startswith("rotation"):
        return "rotation"
    if name == "apiserver":
        return "apiserver"
    if name in ("largest-reviews", "hostile-shapes"):
        return "memory"
    if row.get("endpoint") == "mutate-node-status":
        return "node"
    return "peer"


def main():
    os.makedirs(OUT, exist_ok=True)
    self_signed(OUT, "bench")
    phases = sys.argv[1:] or ["peer", "node", "scale", "rotation", "memory", "apiserver"]
    # A static binary is the musl build, the image's (src/memory/counting.rs gives it mimalloc).
    linkage = subprocess.run(["ldd", KOORD], capture_output=True, text=True)
    record("build", "koord-webhook", "-", {"binary": os.path.relpath(KOORD, ROOT),
                                            "static": "not a dynamic" in linkage.stdout + linkage.stderr
                                            or "statically linked" in linkage.stdout})
    for phase in phases:
        {"peer": peer_comparison, "node": node_status, "scale": scale, "rotation": rotation,
         "apiserver": lambda: apiserver.run(log, record, OHA, KOORD, DURATION),
         "memory": lambda: memory.run(log, record, koord, OUT)}[phase]()
    # Phases not run this time keep their rows from the previous run, so RESULTS.md stays whole.
    path = os.path.join(OUT, "results.jsonl")
    kept = []
    if os.path.exists(path):
        kept = [row for row in map(json.loads, open(path))
                if bench_phase(row) not in phases and row["phase"] != "build"]
    with open(path, "w") as f:
        for row in kept + results:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
