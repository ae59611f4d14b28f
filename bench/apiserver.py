"""The `apiserver` phase of `just bench`: what a webhook adds to a pod create, with the API server as
its client. On the one-node cluster of scripts/cluster (kube-apiserver, etcd, kubelet, containerd in
a network namespace), pod creates go through the API server at fixed rates and at the most the client
reaches, dry-run and real, in three cases measured in one run on the same machine:

- none: no webhook configured;
- koord-webhook: manifests/install.yaml as users apply it (two replicas behind the Service), measured
  once the leader has narrowed the pod entries (the plain pods of the load carry nothing Koordinator
  reads, so the API server skips the webhook; docs/narrowing.md);
- koord-webhook wide: the same rendered with `--narrow-calls=off` (every pod sent, as before narrowing
  and as Koordinator registers its entries);
- go-peer: bench/go-peer (controller-runtime) in its own image, two replicas behind a Service, with
  the same pod entries as koord-webhook's (rules, namespace selector, failurePolicy, timeout);
- floor: the same Pods run with `--floor`, answering "allowed" without reading the object: what any
  webhook costs at the least, same entries, same Service path;
- floor patched: the same with `--floor-patch`: once the peer has made a patch (the first Koordinator
  pod; the warm-up's plain pods need none), /mutate-pod answers every pod with it, a constant (the
  Koordinator pods differ only in their generated names): what any webhook that makes Koordinator's
  patch costs at the least (the Koordinator workload only: plain pods would be patched too);
- conditions only: koord-webhook's pod entries with the matchConditions its leader wrote, and no
  koord-webhook running (the Service points nowhere, failurePolicy Ignore): what the API server spends
  deciding to skip a plain pod, without the operator's own API traffic;
- condition false: the same entries with the one condition `false`: what evaluating any condition
  costs (the pod's conversion for CEL), whatever the expression.

Two workloads: plain pods (nothing Koordinator reads) dry-run and real at every rate, and Koordinator
pods (labelled app=spark, which a ClusterColocationProfile turns into BE batch pods) dry-run at 50/s
and 200/s.

Every figure is the median of three runs (BENCH_ROUNDS; single 10 s runs move by tens of percent),
one per round; each round installs every case in turn (in reverse order every other round), so a
drift of the API server over the sitting reaches every case alike. koord-webhook is installed with
`--narrow-hold=10s` (when the leader narrows after the install, not what a narrowed entry costs).
Per run: the new TCP connections the API server's network namespace opened per 1,000 webhook calls
(4 of them are the client's own, and the kubelet's probes), the new connections to the webhook's
Service among them (conntrack), the client's p50/p99/p99.9 (oha, HTTP/2, latency counted from when a request was due), the
API server's own histogram of the webhook calls (share in its first bucket, 5 ms), its rejections,
its CPU per 1,000 creates, and the webhook Pods' CPU and working set from the kubelet. Real creates
name a node that does not exist, so nothing schedules or runs them, and are deleted after each run.
"""
import base64
import datetime
import json
import os
import re
import statistics
import subprocess
import threading
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "target", "bench")
CLUSTER = os.path.join(ROOT, "scripts", "cluster")
NODE_IP, NODE_NAME = "10.250.0.1", "koord-node"
API = f"https://{NODE_IP}:6443"
NAMESPACE = "bench"
# Fully qualified: the kubelet looks an unqualified name up as docker.io/...
PEER_NAMESPACE, PEER_IMAGE = "koord-bench", "localhost/koord-bench/go-peer:dev"
POD_PATHS = ("/mutate-pod", "/validate-pod")
RATES = (50, 200, None)  # None: as fast as the client goes
FIRST_BUCKET = "0.005"
# Each figure is the median of this many runs.
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
# Which workloads and cases to run (comma-separated; all by default): `BENCH_WORKLOADS=koordinator
# BENCH_CASES=none,koord-webhook,go-peer,floor` is issue 45's comparison alone (about 15 minutes).
WORKLOADS = set(filter(None, os.environ.get("BENCH_WORKLOADS", "plain,koordinator").split(",")))
CASES = os.environ.get("BENCH_CASES")
# How long the API server is watched idle in each case (nothing sent), to tell its background cost
# (the webhook's own API traffic: leases, readiness reads, watches) from its cost per create.
IDLE_SECONDS = int(os.environ.get("BENCH_IDLE_SECONDS", "30"))
# A directory: the API server's CPU profile of every run is saved there
# (`go tool pprof -top FILE`), to see where its time goes per webhook.
PPROF = os.environ.get("BENCH_PPROF")
# An image archive of a baseline build (`scripts/image --tag before` at the baseline commit): the
# case `koord-webhook before` runs it from the same manifests, for a before/after in one sitting.
BEFORE = os.environ.get("BENCH_KOORD_BEFORE")
BEFORE_IMAGE = "ghcr.io/koord-webhook/koord-webhook:before"


def pod_body(app="bench"):
    """A pod of about 1 KiB: both webhooks run their whole pod chains and allow it. `spark`: one the
    profile of the Koordinator workload selects."""
    env = [{"name": f"SETTING_{i}", "value": "x" * 24} for i in range(8)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "bench-", "labels": {"app": app, "tier": "batch"}},
            "spec": {"nodeName": "bench-nowhere", "containers": [{
                "name": "main", "image": "registry.invalid/bench:1", "env": env,
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                              "limits": {"cpu": "100m", "memory": "64Mi"}}}]}}


class Cluster:
    def __init__(self, directory):
        self.d = directory
        pki = os.path.join(directory, "pki")
        self.tls = ["--cacert", f"{pki}/ca.crt", "--cert", f"{pki}/admin.crt", "--key", f"{pki}/admin.key"]

    def up(self):
        subprocess.run([CLUSTER, "up", self.d], check=True, stdout=subprocess.DEVNULL)

    def down(self):
        subprocess.run([CLUSTER, "down", self.d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def run(self, *argv, stdin=None, check=True):
        done = subprocess.run([CLUSTER, "exec", self.d, *argv], input=stdin, capture_output=True,
                              text=True)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def kubectl(self, *args, stdin=None, check=True):
        return self.run("kubectl", *args, stdin=stdin, check=check)

    def apply(self, docs):
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def api(self, method, path):
        return self.run("curl", "-fsS", "-X", method, *self.tls, f"{API}{path}")

    def tcp_active_opens(self):
        """TCP connections opened so far from the cluster's network namespace (the API server's)."""
        lines = [line.split() for line in self.run("cat", "/proc/net/snmp").splitlines()
                 if line.startswith("Tcp:")]
        return int(dict(zip(lines[0][1:], lines[1][1:]))["ActiveOpens"])

    def webhook_connections(self):
        """The TCP connections to port 9443 that conntrack knows (open ones, and closed ones for two
        minutes), as (source, source port, destination): the API server's to the webhook Pods (it
        routes to endpoints, --enable-aggregator-routing; no probe of either webhook uses 9443)."""
        out = self.run("conntrack", "-L", "-p", "tcp", "--dport", "9443", check=False)
        return set(re.findall(r"src=(\S+) dst=(\S+) sport=(\d+) dport=9443", out))

    def apiserver_cpu(self):
        pid = [line.split()[1] for line in open(os.path.join(self.d, "pids"))
               if line.split()[0] == "kube-apiserver"][-1]
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def pod_stats(self, namespace):
        """CPU seconds used so far, when the kubelet sampled them (Unix seconds), and working set
        (MiB), summed over the namespace's Pods."""
        summary = json.loads(self.kubectl("get", "--raw",
                                          f"/api/v1/nodes/{NODE_NAME}/proxy/stats/summary"))
        cpu = memory = sampled = 0
        for pod in summary.get("pods", []):
            if pod["podRef"]["namespace"] == namespace:
                stats = pod.get("cpu", {})
                cpu += stats.get("usageCoreNanoSeconds", 0)
                memory += pod.get("memory", {}).get("workingSetBytes", 0)
                if "time" in stats:
                    stamp = datetime.datetime.fromisoformat(stats["time"].replace("Z", "+00:00"))
                    sampled = max(sampled, stamp.timestamp())
        return cpu / 1e9, sampled, memory / 2**20

    def webhook_metrics(self, names):
        """Calls of the named webhooks, those in the first bucket, and rejections, so far."""
        calls = first = rejections = 0
        for line in self.api("GET", "/metrics").splitlines():
            if line.startswith("#"):
                continue
            name = re.search(r'[{,]name="([^"]+)"', line)
            if not name or name.group(1) not in names:
                continue
            value = float(line.rsplit(" ", 1)[1])
            if line.startswith("apiserver_admission_webhook_admission_duration_seconds_count"):
                calls += value
            elif line.startswith("apiserver_admission_webhook_admission_duration_seconds_bucket") \
                    and f'le="{FIRST_BUCKET}"' in line:
                first += value
            elif line.startswith("apiserver_admission_webhook_rejection_count"):
                rejections += value
        return calls, first, rejections

    def wait_for_admission(self, what):
        """Until a server-side dry-run create passes (the webhook answers with the right caBundle)."""
        manifest = json.dumps(dict(pod_body(), metadata={"name": "probe", "namespace": NAMESPACE}))
        deadline = time.time() + 180
        while True:
            done = subprocess.run([CLUSTER, "exec", self.d, "kubectl", "create", "--dry-run=server",
                                   "-f", "-"], input=manifest, capture_output=True, text=True)
            if done.returncode == 0:
                return
            if time.time() > deadline:
                raise RuntimeError(f"{what} never admitted a pod: {done.stderr.strip()}")
            time.sleep(1)


def install_koord(cluster, koord, wide=False, image=None, serve_flags=()):
    """manifests/install.yaml as `koord manifests` renders it, with these `--serve-flag`s; `wide`:
    rendered with --narrow-calls=off; `image`: running another image (the baseline build of
    `BENCH_KOORD_BEFORE`)."""
    flags = ["--narrow-calls=off"] if wide else []
    flags += [f"--serve-flag={f}" for f in serve_flags]
    rendered = subprocess.run([koord, "manifests", *flags], check=True,
                              capture_output=True, text=True).stdout
    if image:
        shipped = re.search(r"image: (ghcr.io/koord-webhook/koord-webhook:\S+)", rendered).group(1)
        rendered = rendered.replace(shipped, image)
    cluster.kubectl("apply", "--server-side", "-f", "-", stdin=rendered)
    cluster.kubectl("-n", "koordinator-system", "rollout", "status", "deployment/koord-webhook",
                    "--timeout=180s")
    cluster.wait_for_admission("koord-webhook")


def wait_narrowed(cluster, log):
    """Until the leader has written matchConditions on both pod entries (--narrow-hold after it
    synced, 120 s by default)."""
    started, deadline = time.time(), time.time() + 400
    while True:
        narrowed = 0
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            out = cluster.kubectl("get", kind, "-o", "json", check=False)
            for c in json.loads(out or '{"items": []}')["items"]:
                narrowed += sum(1 for w in c.get("webhooks", [])
                                if w["name"] in ("mpod-create.koordinator.sh", "vpod.koordinator.sh")
                                and w.get("matchConditions"))
        if narrowed == 2:
            log(f"apiserver: pod entries narrowed {time.time() - started:.0f} s after the install")
            return
        if time.time() > deadline:
            raise RuntimeError("the leader never narrowed the pod entries")
        time.sleep(2)


def written_pod_entries(cluster):
    """The pod entries as the leader wrote them (with their matchConditions), by configuration kind."""
    entries = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        out = json.loads(cluster.kubectl("get", kind.lower() + "s", "-o", "json"))
        entries[kind] = [w for c in out["items"] for w in c.get("webhooks", [])
                         if w.get("clientConfig", {}).get("service", {}).get("path") in POD_PATHS]
    return entries


def conditions_only(written):
    """Configurations with the written pod entries, calling a Service that does not exist: every
    pod the conditions send fails open (Ignore); the plain pods of the load are never sent."""
    docs = []
    for kind, webhooks in written.items():
        for w in webhooks:
            w["failurePolicy"] = "Ignore"
            w["clientConfig"] = {"service": {"name": "nowhere", "namespace": "default", "port": 443,
                                             "path": w["clientConfig"]["service"]["path"]}}
        docs.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                     "metadata": {"name": f"conditions-only-{kind.lower()}"}, "webhooks": webhooks})
    return docs


def uninstall_koord(cluster, koord):
    """As users uninstall it: `koord-webhook uninstall` returns once no replica runs."""
    cluster.run(koord, "uninstall")


def koord_pod_entries():
    """manifests/install.yaml's pod entries, as they are configured there."""
    docs = [d for d in yaml.safe_load_all(open(os.path.join(ROOT, "manifests", "install.yaml"))) if d]
    configurations = [d for d in docs if d["kind"].endswith("WebhookConfiguration")]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    entries = {c["kind"]: [w for w in c["webhooks"] if w["clientConfig"]["service"]["path"] in POD_PATHS]
               for c in configurations}
    return entries, deployment["spec"]["template"]["spec"]["containers"][0].get("resources")


def peer_image():
    """bench/go-peer, static, in an image of its own (scripts/image --binary: FROM scratch)."""
    binary = os.path.join(OUT, "image", "go-peer")
    os.makedirs(os.path.dirname(binary), exist_ok=True)
    subprocess.run(["go", "build", "-o", binary, "."], cwd=os.path.join(ROOT, "bench", "go-peer"),
                   env=dict(os.environ, CGO_ENABLED="0"), check=True)
    archive = os.path.join(OUT, "go-peer.oci.tar")
    subprocess.run([os.path.join(ROOT, "scripts", "image"), "--binary", binary, "--name", PEER_IMAGE,
                    "--output", archive], check=True, stdout=subprocess.DEVNULL)
    return archive


def install_peer(cluster, tmp, floor=False, patch=False):
    service = f"go-peer.{PEER_NAMESPACE}.svc"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", f"/CN={service}", "-addext", f"subjectAltName=DNS:{service}",
                    "-keyout", f"{tmp}/tls.key", "-out", f"{tmp}/tls.crt"], check=True, capture_output=True)
    cert, key = (open(f"{tmp}/tls.{k}", "rb").read() for k in ("crt", "key"))
    b64 = lambda data: base64.b64encode(data).decode()
    entries, resources = koord_pod_entries()
    labels = {"app": "go-peer"}
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PEER_NAMESPACE}},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
         "metadata": {"name": "go-peer-tls", "namespace": PEER_NAMESPACE},
         "data": {"tls.crt": b64(cert), "tls.key": b64(key)}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "go-peer", "namespace": PEER_NAMESPACE},
         "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"containers": [{
                 "name": "go-peer", "image": PEER_IMAGE, "imagePullPolicy": "Never",
                 "args": ["--port", "9443", "--host", "0.0.0.0", "--cert-dir", "/certs"]
                 + (["--floor"] if floor else []) + (["--floor-patch"] if patch else []),
                 # No probe on 9443: every connection there is the API server's (counted per run).
                 "ports": [{"containerPort": 9443}], "resources": resources or {},
                 "volumeMounts": [{"name": "tls", "mountPath": "/certs", "readOnly": True}]}],
                 "volumes": [{"name": "tls", "secret": {"secretName": "go-peer-tls"}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "go-peer", "namespace": PEER_NAMESPACE},
         "spec": {"selector": labels, "ports": [{"port": 443, "targetPort": 9443}]}},
    ]
    for kind, webhooks in entries.items():
        for w in webhooks:
            w["clientConfig"] = {"caBundle": b64(cert), "service": {
                "name": "go-peer", "namespace": PEER_NAMESPACE, "port": 443,
                "path": w["clientConfig"]["service"]["path"]}}
        docs.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                     "metadata": {"name": f"go-peer-{kind.lower()}"}, "webhooks": webhooks})
    # The Pods first: with the entries in place (failurePolicy Fail), the peer's own Pods would have
    # to be admitted by the peer, which is not running yet.
    configurations = [d for d in docs if d["kind"].endswith("WebhookConfiguration")]
    cluster.apply([d for d in docs if d not in configurations])
    cluster.kubectl("-n", PEER_NAMESPACE, "rollout", "status", "deployment/go-peer", "--timeout=180s")
    cluster.apply(configurations)
    cluster.wait_for_admission("go-peer")


def uninstall_peer(cluster):
    """The peer's configurations, then its Pods (gone before the next case is measured)."""
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        cluster.kubectl("delete", kind.lower(), f"go-peer-{kind.lower()}", "--ignore-not-found")
    cluster.kubectl("-n", PEER_NAMESPACE, "delete", "deployment", "go-peer", "--ignore-not-found",
                    "--wait=true")
    cluster.kubectl("-n", PEER_NAMESPACE, "wait", "--for=delete", "pod", "-l", "app=go-peer",
                    "--timeout=120s", check=False)


def entry_names():
    """The pod webhooks whose calls are counted: the manifests', and the labelled parts the leader
    registers with `--qos-split=on` (the default)."""
    entries, _ = koord_pod_entries()
    return {w["name"] for webhooks in entries.values() for w in webhooks} | {
        "mpod-create-qos.koordinator.sh", "vpod-qos.koordinator.sh"}


# The Koordinator workload's profile: pods labelled app=spark become BE batch pods (as the Go peer's
# built-in profile does).
PROFILE = [
    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "koord-batch"},
     "value": 5500},
    {"apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
     "metadata": {"name": "bench-spark"},
     "spec": {"selector": {"matchLabels": {"app": "spark"}}, "qosClass": "BE",
              "priorityClassName": "koord-batch", "schedulerName": "koord-scheduler"}},
]


def run_name(workload, dry_run, rate):
    """A run's name in the results: `dry-run 50`, `create max`, `koordinator dry-run 200`."""
    name = f"{'dry-run' if dry_run else 'create'} {rate or 'max'}"
    return name if workload == "plain" else f"{workload} {name}"


# (workload, dry run, rate): plain pods everywhere, Koordinator pods dry-run at two rates.
# `BENCH_RUNS=dry-run-50,koordinator-dry-run-50` keeps only the runs named.
RUNS = [run for run in [("plain", d, r) for d in (True, False) for r in RATES]
        + [("koordinator", True, r) for r in (50, 200)] if run[0] in WORKLOADS
        and (not os.environ.get("BENCH_RUNS")
             or run_name(*run).replace(" ", "-") in os.environ["BENCH_RUNS"].split(","))]


def wanted(case):
    return CASES is None or case.replace(" ", "-") in CASES.replace(" ", "-").split(",")


def load(cluster, oha, dry_run, rate, duration, workload="plain"):
    """One oha run of pod creates; the figures the client sees."""
    body = os.path.join(OUT, f"apiserver-pod-{workload}.json")
    with open(body, "w") as f:
        json.dump(pod_body("spark" if workload == "koordinator" else "bench"), f)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods" + ("?dryRun=All" if dry_run else "")
    argv = [oha, "--no-tui", "--output-format", "json", "-z", f"{duration}s", "--http2",
            "-c", "4", "-p", "16", "-m", "POST", "-T", "application/json", "-D", body, *cluster.tls]
    if rate:
        argv += ["-q", str(rate), "--latency-correction"]
    result = json.loads(cluster.run(*argv, f"{API}{path}"))
    summary, pct = result["summary"], result["latencyPercentiles"]
    codes = result.get("statusCodeDistribution", {})
    created = codes.get("201", 0)
    return {
        "rps": summary["requestsPerSec"], "requests": created,
        "p50_ms": (pct.get("p50") or 0) * 1000, "p99_ms": (pct.get("p99") or 0) * 1000,
        "p999_ms": (pct.get("p99.9") or 0) * 1000,
        # Requests still in flight when the run's time is up are not failures.
        "errors": sum(n for error, n in result.get("errorDistribution", {}).items()
                      if "deadline" not in error)
        + sum(n for code, n in codes.items() if code != "201"),
    }


def one_run(cluster, oha, workload, dry_run, rate, duration, namespace, names, profile=None):
    """One load run and what it cost: the client's figures, the API server's CPU and webhook calls,
    the new TCP connections the API server opened (its network namespace's `ActiveOpens`: webhook
    connections and anything else it dialled), the webhook Pods' CPU; with `profile`, the API
    server's CPU profile of the run saved there."""
    cpu, webhook = cluster.apiserver_cpu(), namespace and cluster.pod_stats(namespace)
    calls, opens = cluster.webhook_metrics(names), cluster.tcp_active_opens()
    # A case whose webhook runs in Pods (it has a namespace): its connections are counted.
    service = namespace is not None
    known = cluster.webhook_connections() if service else set()
    pprof = None
    if profile:
        seconds = max(duration - 2, 1)
        pprof = threading.Thread(target=cluster.run, args=(
            "curl", "-fsS", *cluster.tls, "-o", profile, f"{API}/debug/pprof/profile?seconds={seconds}"))
        pprof.start()
    figures = load(cluster, oha, dry_run, rate, duration, workload)
    if pprof:
        pprof.join()
    calls = [after - before for after, before in zip(cluster.webhook_metrics(names), calls)]
    opens = cluster.tcp_active_opens() - opens
    dialled = len(cluster.webhook_connections() - known) if service else None
    cpu = cluster.apiserver_cpu() - cpu
    per_1000 = 1e6 / max(figures["requests"], 1)
    figures.update(apiserver_cpu_ms_per_1000=cpu * per_1000, webhook_calls=int(calls[0]),
                   first_bucket_share=calls[1] / calls[0] if calls[0] else None,
                   rejections=int(calls[2]),
                   new_connections_per_1000_calls=opens * 1000 / calls[0] if calls[0] else None,
                   webhook_connections_per_1000_calls=dialled * 1000 / calls[0]
                   if calls[0] and dialled is not None else None)
    if namespace:
        # The kubelet samples every few seconds: the CPU rate between its two samples,
        # over the run's length.
        after = cluster.pod_stats(namespace)
        cores = (after[0] - webhook[0]) / (after[1] - webhook[1]) if after[1] > webhook[1] else 0
        figures.update(webhook_cpu_ms_per_1000=cores * duration * per_1000,
                       webhook_working_set_mib=after[2])
    if not dry_run:
        # One DELETE for all of them; grace 0: their node does not exist to confirm.
        cluster.api("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?gracePeriodSeconds=0")
    return figures


def median_of(runs):
    """Each figure's median over the rounds (single 10 s runs move by tens of percent)."""
    out = {}
    for key in runs[0]:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        out[key] = statistics.median(values) if values else runs[0][key]
    return out


def idle(cluster, seconds):
    """The API server's CPU while nothing is sent, ms per second: its background and whatever the
    case's webhook asks of it on its own (leases, reads, watches)."""
    cpu = cluster.apiserver_cpu()
    time.sleep(seconds)
    return (cluster.apiserver_cpu() - cpu) * 1000 / seconds


def measure_round(cluster, oha, case, k, namespace, names, duration):
    """One round of a case: its idle figure and one run of each workload and rate."""
    # A short warm-up: connections, the API server's webhook clients, the webhook's caches.
    load(cluster, oha, True, 50, 2)
    figures = {}
    if IDLE_SECONDS:
        figures["idle"] = {"apiserver_cpu_ms_per_s": idle(cluster, IDLE_SECONDS)}
    for workload, dry_run, rate in RUNS:
        if case == "floor patched" and workload != "koordinator":
            continue  # it would give plain pods the Koordinator pod's patch
        endpoint = run_name(workload, dry_run, rate)
        profile = None
        if PPROF:
            os.makedirs(PPROF, exist_ok=True)
            profile = os.path.join(PPROF, f"{case}-{endpoint}-{k}.pprof".replace(" ", "-"))
        figures[endpoint] = one_run(cluster, oha, workload, dry_run, rate, duration, namespace, names,
                                    profile)
    return figures


def record_case(record, case, rounds):
    """Each figure's median over the case's rounds; the API server's CPU of every round as well."""
    for endpoint in rounds[0]:
        runs = [r[endpoint] for r in rounds]
        if endpoint == "idle":
            record("apiserver", case, "idle", median_of(runs), seconds=IDLE_SECONDS, rounds=len(runs),
                   each=[r["apiserver_cpu_ms_per_s"] for r in runs])
            continue
        workload, dry_run, rate = next(run for run in RUNS if run_name(*run) == endpoint)
        record("apiserver", case, endpoint, median_of(runs), rate=rate, dry_run=dry_run,
               workload=workload, rounds=len(runs),
               each=[round(r["apiserver_cpu_ms_per_1000"]) for r in runs])


class Case:
    """A case of the phase: how it is installed and removed, and whose Pods it runs."""

    def __init__(self, name, namespace=None, up=lambda: None, down=lambda: None):
        self.name, self.namespace, self.up, self.down = name, namespace, up, down


def run(log, record, oha, koord, duration):
    if os.geteuid() != 0:
        raise SystemExit("the apiserver phase needs root (it starts a one-node cluster)")
    peer = peer_image()
    with tempfile.TemporaryDirectory(prefix="koord-bench-cluster-", dir=OUT) as d:
        cluster = Cluster(d)
        log("apiserver: starting a one-node cluster")
        cluster.up()
        try:
            if BEFORE:
                # First: an archive of another build may carry the same name as this one's, which
                # `scripts/image --load` then points back at this build.
                subprocess.run([CLUSTER, "load", d, BEFORE, BEFORE_IMAGE], check=True)
            subprocess.run([os.path.join(ROOT, "scripts", "image"), "--load", d], check=True,
                           stdout=subprocess.DEVNULL)
            subprocess.run([CLUSTER, "load", d, peer, PEER_IMAGE], check=True)
            cluster.kubectl("create", "namespace", NAMESPACE)
            # Koordinator's CRDs and the workload's profile, before any webhook is there.
            cluster.kubectl("apply", "--server-side", "-f", "-",
                            stdin=open(os.path.join(ROOT, "crds", "crds.yaml")).read())
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                            "crd/clustercolocationprofiles.config.koordinator.sh")
            cluster.apply(PROFILE)
            names = entry_names()
            # Installed with a short --narrow-hold: the hold only decides when the leader narrows
            # the pod entries after the install (120 s by default), not what they cost once narrowed.
            hold = "narrow-hold=10s"

            def koord_up(serve_flags=(), image=None, wide=False):
                def up():
                    install_koord(cluster, koord, wide=wide, image=image,
                                  serve_flags=[hold, *serve_flags])
                    if not wide:
                        wait_narrowed(cluster, log)
                return up

            written = {}

            def conditions_up(expression=None):
                def up():
                    if not written:
                        log("apiserver: koord-webhook installed once, to read the entries its leader writes")
                        koord_up()()
                        written.update(written_pod_entries(cluster))
                        uninstall_koord(cluster, koord)
                    entries = json.loads(json.dumps(written))
                    if expression:
                        for webhooks in entries.values():
                            for w in webhooks:
                                w["matchConditions"] = [{"name": "never", "expression": expression}]
                    cluster.apply(conditions_only(entries))
                return up

            def conditions_down():
                for kind in written:
                    cluster.kubectl("delete", kind.lower(), f"conditions-only-{kind.lower()}",
                                    "--ignore-not-found")

            koord_down = lambda: uninstall_koord(cluster, koord)
            peer_down = lambda: uninstall_peer(cluster)
            cases = [Case("none")]
            if BEFORE:
                cases.append(Case("koord-webhook before", "koordinator-system",
                                  koord_up(image=BEFORE_IMAGE), koord_down))
            cases += [
                Case("koord-webhook", "koordinator-system", koord_up(), koord_down),
                Case("koord-webhook wide", "koordinator-system", koord_up(wide=True),
                     koord_down),
                Case("koord-webhook split-off", "koordinator-system", koord_up(["qos-split=off"]),
                     koord_down),
                Case("conditions only", None, conditions_up(), conditions_down),
                Case("condition false", None, conditions_up("false"), conditions_down),
                Case("go-peer", PEER_NAMESPACE, lambda: install_peer(cluster, d), peer_down),
                Case("floor", PEER_NAMESPACE, lambda: install_peer(cluster, d, floor=True), peer_down),
                Case("floor patched", PEER_NAMESPACE, lambda: install_peer(cluster, d, patch=True),
                     peer_down),
            ]
            cases = [c for c in cases if wanted(c.name)]
            # The rounds visit the cases in turn, in reverse order every other round: the API
            # server's cost drifts over a sitting (measured: a case run after the others cheaper
            # than no webhook at all), and one case's rounds back to back would carry that drift
            # into the comparison.
            rounds = {c.name: [] for c in cases}
            for k in range(ROUNDS):
                for case in (cases if k % 2 == 0 else cases[::-1]):
                    log(f"apiserver: round {k + 1} of {ROUNDS}: {case.name}")
                    case.up()
                    rounds[case.name].append(
                        measure_round(cluster, oha, case.name, k, case.namespace, names, duration))
                    case.down()
            for case in cases:
                record_case(record, case.name, rounds[case.name])
        finally:
            cluster.down()
