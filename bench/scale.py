"""The `scale` phase (`bench/run scale`): koord-webhook at the size Koordinator's clusters run, through
a real kube-apiserver (scripts/control-plane, loopback), with objects created the way clients create
them (the API server adds managedFields; quotas, Reservations and namespaces carry kubectl's
last-applied annotation and Koordinator's own).

Sizes (KOORD_SCALE or --size): S (about 12,000 objects, CI's small form: `--check 1.25` fails the run
when a replica's peak through a restart is over 1.25 x its steady RSS, a replica is not ready again
within 60 s of the API server, or koord-webhook refused a create), L1 = 5,000 nodes /
75,000 pods / 10,000 quotas (100 trees) / 1,000 Reservations / 2,000 namespaces, L0 = L1 with 150,000
pods.

The state is loaded once; then each build named by --koord NAME=PATH runs in turn on that same state
(before/after in one sitting): two replicas (host processes in URL mode, leader election on,
`EnableQuotaAdmission` on), and per replica:
- steady RSS once both are ready and the watches have settled, under the admission load below;
- through each of --restarts kube-apiserver restarts (every watch of both replicas relists at once),
  under a load of 20 dry-run pod creates/s through the API server (half in quotas): the peak RSS
  (VmHWM, reset before each restart), the RSS after, the seconds until the replica is ready again
  after the API server is, and every create the API server refused because of the webhook;
- the recount pass and admission latency are in the replicas' own metrics, read after.
The API server's RSS is recorded with and without the replicas. Node heartbeats (status patches) run
throughout at a steady rate, as kubelets send them.

Writes target/bench/scale-SIZE.json and prints a Markdown table (bench/run scale puts it into
bench/RESULTS.md). Everything is on 127.0.0.1.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "target", "bench")
CP = os.path.join(ROOT, "scripts", "control-plane")
# A restart as the figures have always measured it: kube-apiserver ends its open watches itself (a
# minute) and loads its watch caches from the whole state (minutes at L1).
RESTART_ENV = dict(os.environ, KOORD_CP_STOP_GRACE="120", KOORD_CP_RESTART_TIMEOUT="600")

from scale_load import SIZES, Api, load, log, node_status, pod, quota, reset_child_requests  # noqa: E402

MIB = 1024 * 1024


# Set while review latency is measured: the empty state it is compared with has no heartbeats.
HEARTBEATS_PAUSED = threading.Event()


class Heartbeats(threading.Thread):
    """Node status patches at a steady rate (a kubelet's every 10 s would be 500/s at 5,000 nodes:
    bounded here to what this machine serves beside everything else)."""

    def __init__(self, api, nodes, rate):
        super().__init__(daemon=True)
        self.api, self.nodes, self.rate, self.stop = api, nodes, rate, threading.Event()

    def run(self):
        i = 0
        while not self.stop.wait(1.0 / self.rate):
            if HEARTBEATS_PAUSED.is_set():
                continue
            n = i % self.nodes
            try:
                self.api.call("PATCH", f"/api/v1/nodes/node-{n:05d}/status", node_status(n, time.time()),
                              "application/merge-patch+json", tries=1)
            except Exception:
                pass
            i += 1


class DryRuns(threading.Thread):
    """20 dry-run pod creates per second through the API server, half in a quota; counts every
    refusal koord-webhook caused (denied, or the API server failed to call it) apart from the API
    server being down."""

    def __init__(self, api, quotas, size, rate=20):
        super().__init__(daemon=True)
        self.api, self.quotas, self.size, self.rate = api, quotas, size, rate
        self.stop = threading.Event()
        self.sent = self.ok = self.api_down = 0
        self.refused = []

    def run(self):
        i = 0
        while not self.stop.wait(1.0 / self.rate):
            p = pod(10_000_000 + i, self.size, self.quotas)
            del p["metadata"]["name"]
            p["metadata"]["generateName"] = "dry-"
            if i % 2:
                p["metadata"]["labels"]["quota.scheduling.koordinator.sh/name"] = self.quotas[i % len(self.quotas)]
            else:
                p["metadata"]["labels"].pop("quota.scheduling.koordinator.sh/name", None)
            ns = p["metadata"]["namespace"]
            i += 1
            self.sent += 1
            try:
                status, body = self.api.call("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", p, tries=1)
            except Exception:
                self.api_down += 1
                continue
            text = body.decode(errors="replace")
            if status in (200, 201):
                self.ok += 1
            elif "admission webhook" in text or "failed calling webhook" in text:
                self.refused.append(f"{time.strftime('%H:%M:%S')} {status} {text[:300]}")
            else:
                self.api_down += 1


def rss(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak(pid):
    """Makes VmHWM start again from the current RSS (Linux: clear_refs 5)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def get(url, timeout=2):
    ctx = ssl._create_unverified_context()
    try:
        host, rest = url.split("//")[1].split("/", 1)
        h, p = host.split(":")
        conn = (http.client.HTTPSConnection(h, int(p), context=ctx, timeout=timeout) if url.startswith("https")
                else http.client.HTTPConnection(h, int(p), timeout=timeout))
        conn.request("GET", "/" + rest)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    except OSError:
        return 0, ""


def image_env():
    """The image's ENV lines (Dockerfile): a replica runs as it would in the image."""
    env = {}
    for line in open(os.path.join(ROOT, "Dockerfile")):
        if line.startswith("ENV "):
            key, _, value = line[4:].strip().partition("=")
            env[key] = value
    return env


class Replica:
    """One replica as a host process. Replica i serves on 127.0.0.(i+2):`port`; the webhook
    configurations name 127.0.0.1:`port`, where a `Spreader` hands the API server's connections to
    both (as a Service would)."""

    def __init__(self, koord, kubeconfig, index, workdir, extra, port, bare=False):
        env = dict(os.environ, **({} if bare else image_env()), KUBECONFIG=kubeconfig, POD_NAME=f"replica-{index}",
                   KOORD_WEBHOOK_MEMORY_LIMIT=str(256 * MIB))
        path = os.path.join(workdir, f"replica-{index}.log")
        self.addr, self.port = f"127.0.0.{index + 2}", port
        # A free port found by binding and closing can be taken by another process before the
        # replica binds it: start again on new ports when it exits at once.
        for _ in range(5):
            self.metrics, self.health = free_port(), free_port()
            self.log = open(path, "w")
            self.proc = subprocess.Popen(
                [koord, "serve", "--port", str(self.port), "--bind-address", self.addr,
                 "--metrics-bind-address", f"127.0.0.1:{self.metrics}",
                 "--health-bind-address", f"127.0.0.1:{self.health}", "--webhook-host", "127.0.0.1",
                 "--feature-gates", "EnableQuotaAdmission=true", "--drain-delay", "0s", *extra],
                env=env, stdout=self.log, stderr=self.log)
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                return
            self.log.close()
            if "cannot listen" not in open(path).read():
                break
        raise RuntimeError(f"replica {index} exited at start (see {path})")

    def running(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"replica exited with {self.proc.returncode} (see {self.log.name})")
        return True

    def ready(self):
        return get(f"https://{self.addr}:{self.port}/readyz")[0] == 200

    def metric_text(self):
        return get(f"http://127.0.0.1:{self.metrics}/metrics")[1]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Spreader(threading.Thread):
    """A TCP relay on 127.0.0.1:`port` that hands each new connection to the next replica in turn,
    as kube-proxy spreads a Service's connections (TLS passes through: both replicas serve the
    certificate issued for 127.0.0.1)."""

    def __init__(self, port, replicas):
        super().__init__(daemon=True)
        self.replicas, self.next = replicas, 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(256)
        self.connections = [0] * len(replicas)

    def run(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            i = self.pick()
            r = self.replicas[i]
            try:
                upstream = socket.create_connection((r.addr, r.port), timeout=5)
            except OSError:
                client.close()
                continue
            self.connections[i] += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pump, args=(a, b), daemon=True).start()

    def pick(self):
        """The replica the next connection goes to: each in turn."""
        i = self.next % len(self.replicas)
        self.next += 1
        return i

    @staticmethod
    def pump(src, dst):
        try:
            src.settimeout(None)
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


class SecondApiServer:
    """A second kube-apiserver on the same etcd, as an HA control plane runs several: each API server
    keeps its own HTTP/2 connection to the webhook, so with two of them the `Spreader` gives one to
    each replica and both replicas admit (and write the same quota) at once."""

    def __init__(self, cp_dir, workdir):
        script = open(os.path.join(cp_dir, "apiserver.sh")).read()
        self.port = free_port()
        script = re.sub(r'--secure-port "\d+"', f'--secure-port "{self.port}"', script)
        script = script.replace(f'--cert-dir "{cp_dir}/cert-dir"', f'--cert-dir "{cp_dir}/cert-dir-2"')
        self.log = open(os.path.join(workdir, "apiserver-2.log"), "w")
        self.proc = subprocess.Popen(["bash", "-c", script], stdout=self.log, stderr=self.log)
        self.api = Api(cp_dir, f"https://127.0.0.1:{self.port}")
        wait(lambda: self.proc.poll() is None and apiserver_ready(self.api), 600, "the second API server ready")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def quota_creates(apis, size, tag, count, clients=32):
    """`count` new child quotas spread over every tree, created by `clients` threads through the
    webhook, half through each API server (a 429 from its ledger is retried, as a client would);
    then deleted. Creates/s, the latency per create including its retries, and every answer that
    was not a create."""
    eq = lambda ns: f"/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/elasticquotas"
    jobs = [(t, k) for k in range(count // size["trees"] + 1) for t in range(size["trees"])][:count]

    def body(t, k):
        return {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                "metadata": {"name": f"new-{tag}-{t:03d}-{k:03d}",
                             "namespace": f"ns-{(t * 31 + k) % size['namespaces']:04d}",
                             "labels": {"quota.scheduling.koordinator.sh/parent": f"parent-{t:03d}",
                                        "quota.scheduling.koordinator.sh/is-parent": "false"}},
                "spec": {"min": {"cpu": "1", "memory": "1Gi"}, "max": {"cpu": "4", "memory": "8Gi"}}}

    def create(job):
        b = body(*job)
        api = apis[(job[0] + job[1]) % len(apis)]
        started, busy = time.time(), 0
        while time.time() - started < 120:
            status, payload = api.call("POST", eq(b["metadata"]["namespace"]), b, tries=1)
            if status in (200, 201):
                return "created", time.time() - started, busy
            if status == 429:
                busy += 1
                time.sleep(min(0.05 * busy, 1.0))
                continue
            return f"{status} {payload[:200]!r}", time.time() - started, busy
        return "gave up after 120 s", time.time() - started, busy

    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(create, jobs))
    took = time.time() - start
    created = [a for a in answers if a[0] == "created"]
    latencies = sorted(a[1] for a in created) or [float("nan")]
    failures = [a[0] for a in answers if a[0] != "created"]

    def delete(job):
        b = body(*job)
        apis[0].call("DELETE", f"{eq(b['metadata']['namespace'])}/{b['metadata']['name']}")

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(delete, jobs))
    return {"sent": count, "created": len(created), "per_s": len(created) / took,
            "p50_s": latencies[len(latencies) // 2], "p99_s": latencies[int(len(latencies) * 0.99)],
            "busy_answers": sum(a[2] for a in answers), "failures": len(failures), "examples": failures[:5]}


def pod_burst(apis, tag, count=1000, rate=200, clients=32):
    """`count` pod creates at `rate`/s into one quota (under parent-000), alternately through each
    API server, with EnableQuotaAdmission: each admission charges the quota's child-request, so
    both replicas write the same object. Counts every refusal, and those that name a write
    conflict."""
    api = apis[0]
    ns = "ns-0000"
    eq = f"/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{ns}/elasticquotas"
    name = f"burst-{tag}"
    api.create(eq, {"apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                    "metadata": {"name": name, "namespace": ns,
                                 "labels": {"quota.scheduling.koordinator.sh/parent": "parent-000",
                                            "quota.scheduling.koordinator.sh/is-parent": "false"}},
                    "spec": {"min": {"cpu": "0", "memory": "0"}, "max": {"cpu": "1000", "memory": "2000Gi"}}})
    time.sleep(2)  # the replicas' watches deliver the quota

    def create(i):
        due = start + i / rate
        time.sleep(max(0.0, due - time.time()))
        p = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{name}-{i:05d}", "namespace": ns,
            "labels": {"quota.scheduling.koordinator.sh/name": name, "burst": name}},
            "spec": {"containers": [{"name": "main", "image": "registry.example.com/app:v1", "resources": {
                "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}}}]}}
        status, payload = apis[i % len(apis)].call("POST", f"/api/v1/namespaces/{ns}/pods", p, tries=1)
        return status, payload.decode(errors="replace")

    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(create, range(count)))
    took = time.time() - start
    refused = [t for s, t in answers if s not in (200, 201)]
    conflicts = [t for t in refused if "conflict" in t.lower() or "modified" in t.lower()]
    api.call("DELETE", f"/api/v1/namespaces/{ns}/pods?labelSelector=burst%3D{name}&gracePeriodSeconds=0")
    api.call("DELETE", f"{eq}/{name}")
    return {"sent": count, "admitted": count - len(refused), "per_s": count / took, "refused": len(refused),
            "conflicts": len(conflicts), "examples": refused[:5]}


def review_body(kind, tree=0):
    """An AdmissionReview as the API server sends it: a plain pod CREATE for /validate-pod, a dry-run
    child quota CREATE under parent-`tree` for /validate-elastic-quota (checked against the tree,
    never written)."""
    if kind == "pod":
        obj = pod(20_000_000, SIZES["S"], ["none"])
        obj["metadata"]["labels"].pop("quota.scheduling.koordinator.sh/name", None)
        resource, group, version, k = "pods", "", "v1", "Pod"
    else:
        obj = quota(tree, 0, SIZES["L1"])
        obj["metadata"]["name"] = "latency-probe"
        resource, group, version, k = "elasticquotas", "scheduling.sigs.k8s.io", "v1alpha1", "ElasticQuota"
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "00000000-0000-0000-0000-000000000001", "operation": "CREATE", "dryRun": True,
        "kind": {"group": group, "version": version, "kind": k},
        "resource": {"group": group, "version": version, "resource": resource},
        "namespace": obj["metadata"]["namespace"], "name": obj["metadata"]["name"],
        "userInfo": {"username": "bench"}, "object": obj}}).encode()


def review_latency(replica, n=2000):
    """p50/p99 (ms) of `n` reviews each to /validate-pod and /validate-elastic-quota, sent one at a
    time over one keep-alive connection to `replica` (after 200 unmeasured)."""
    ctx = ssl._create_unverified_context()
    out = {}
    for name, path, kind in (("validate-pod", "/validate-pod", "pod"),
                             ("validate-elastic-quota", "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota",
                              "quota")):
        body = review_body(kind)
        conn = http.client.HTTPSConnection(replica.addr, replica.port, context=ctx, timeout=10)
        times = []
        for i in range(n + 200):
            t = time.perf_counter()
            conn.request("POST", path + "?timeout=10s", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            if i >= 200:
                times.append((time.perf_counter() - t) * 1000)
            if r.status != 200:
                raise RuntimeError(f"{path}: HTTP {r.status}")
        conn.close()
        times.sort()
        out[name] = {"p50_ms": times[len(times) // 2], "p99_ms": times[int(len(times) * 0.99)]}
    return out


def empty_latency(koord, kubeconfig, workdir):
    """Review latency of a replica on the empty state (before loading): the baseline the loaded
    state's latency is compared with."""
    replica = Replica(koord, kubeconfig, 0, workdir, [], free_port())
    try:
        wait(lambda: replica.running() and replica.ready(), 120, "the replica ready on the empty state")
        return review_latency(replica)
    finally:
        replica.stop()
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "delete", kind, "--all"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def admissions(metrics):
    """Reviews a replica answered, from its metrics."""
    total = 0
    for line in metrics.splitlines():
        if line.startswith("koord_webhook_admission_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def recount_figures(replicas):
    """The leader's last child-request recount from its metrics (seconds): the pass, its own work
    and its hold of the pod index."""
    out = {}
    for r in replicas:
        for line in r.metric_text().splitlines():
            m = re.match(r'koord_webhook_child_request_recount_last_seconds\{part="(\w+)"\} (\S+)', line)
            if m:
                out[m.group(1)] = max(out.get(m.group(1), 0.0), float(m.group(2)))
    return out


def wait(cond, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


def pid_of_apiserver(cp_dir):
    """scripts/control-plane keeps etcd's pid on the first line of DIR/pids, kube-apiserver's on the
    second."""
    with open(os.path.join(cp_dir, "pids")) as f:
        return int(f.read().split()[1])


def apiserver_ready(api):
    try:
        return api.call("GET", "/readyz", tries=1)[0] == 200
    except Exception:
        return False


def measure(name, koord, api, cp_dir, kubeconfig, size, quotas, restarts, workdir, writes, bare=False):
    reset_child_requests(api, size)
    log(f"{name}: starting two replicas ({koord}{', without the image ENV' if bare else ''})")
    port = free_port()
    replicas = [Replica(koord, kubeconfig, i, workdir, [], port, bare) for i in range(2)]
    spreader = Spreader(port, replicas)
    spreader.start()
    result = {"build": name, "replicas": []}
    try:
        started = time.time()
        wait(lambda: all(r.running() and r.ready() for r in replicas), 600, "both replicas ready")
        result["ready_s"] = time.time() - started
        # The leader's first child-request recount corrects every quota whose loaded child-request
        # is not what its pods charge (9,900 writes at L1): a one-time burst of writes and watch
        # events that, inside the samples, moved the leader's steady RSS by up to 40 MiB and the
        # review p99 5-9x. Measure once it is over (its log line), 120 s at most.
        recounted = time.time()
        wait(lambda: any("child-request recounted" in open(r.log.name).read() for r in replicas)
             or time.time() - recounted > 120, 130, "the first recount")
        result["first_recount_s"] = time.time() - recounted
        result["recount_first"] = recount_figures(replicas)
        # Review latency at this state, before the admission load starts and with the node
        # heartbeats paused (the empty state has neither).
        HEARTBEATS_PAUSED.set()
        time.sleep(5)
        try:
            result["latency"] = review_latency(replicas[1])
        finally:
            HEARTBEATS_PAUSED.clear()
        log(f"{name}: review latency at this state: {result['latency']}")
        # The admission load runs from here on, so the steady figure holds what serving it costs
        # (connections, buffers, quota evaluation) and the peaks differ from it by the relists.
        dry = DryRuns(api, quotas, size)
        dry.start()
        time.sleep(20)  # the leader's first recount and narrowing pass, watches settled
        # Steady: the median of samples over 40 s (the leader's recount passes every 30 s).
        cpu0 = [cpu_seconds(r.proc.pid) for r in replicas]
        t0 = time.time()
        samples = [[] for _ in replicas]
        for _ in range(20):
            for j, r in enumerate(replicas):
                samples[j].append(rss(r.proc.pid))
            time.sleep(2)
        steady = [sorted(x)[len(x) // 2] for x in samples]
        result["steady_max"] = [max(x) for x in samples]
        idle_cpu = [(cpu_seconds(r.proc.pid) - c) / (time.time() - t0) for r, c in zip(replicas, cpu0)]
        result["apiserver_rss_with"] = rss(pid_of_apiserver(cp_dir))
        result["recount_steady"] = recount_figures(replicas)
        runs = []
        for k in range(restarts):
            for r in replicas:
                reset_peak(r.proc.pid)
            log(f"{name}: restarting kube-apiserver ({k + 1}/{restarts})")
            down = time.time()
            subprocess.run([CP, "restart-apiserver", cp_dir], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=RESTART_ENV)
            wait(lambda: apiserver_ready(api), 300, "the API server ready")
            up = time.time()
            ready_at = [None, None]
            unready_seen = [False, False]
            while time.time() - up < 60:
                for j, r in enumerate(replicas):
                    ok = r.ready()
                    unready_seen[j] |= not ok
                    if ok and ready_at[j] is None:
                        ready_at[j] = time.time() - up
                time.sleep(0.5)
            runs.append({"api_down_s": up - down,
                         "peak": [rss(r.proc.pid, "VmHWM") for r in replicas],
                         "after": [rss(r.proc.pid) for r in replicas],
                         "ready_after_s": ready_at, "unready_seen": unready_seen})
            log(f"{name}: restart {k + 1}: peak {[p // MIB for p in runs[-1]['peak']]} MiB, "
                f"after {[a // MIB for a in runs[-1]['after']]} MiB")
        dry.stop.set()
        dry.join()
        if writes:
            tag = re.sub(r"[^a-z0-9]", "", name.lower())[:20] or "build"
            log(f"{name}: a second API server, so that both replicas admit")
            second = SecondApiServer(cp_dir, workdir)
            try:
                apis = [api, second.api]
                log(f"{name}: {writes} quota creates across {size['trees']} trees, 32 clients")
                result["quota_creates"] = quota_creates(apis, size, tag, writes)
                log(f"{name}: quota creates: {result['quota_creates']}")
                log(f"{name}: 1,000 pods at 200/s into one quota")
                result["pod_burst"] = pod_burst(apis, tag)
                log(f"{name}: pod burst: {result['pod_burst']}")
            finally:
                second.stop()
            result["connections"] = spreader.connections
            result["admitted_by"] = [admissions(r.metric_text()) for r in replicas]
        result.update(steady=steady, idle_cpu=idle_cpu, restarts=runs,
                      load={"sent": dry.sent, "ok": dry.ok, "api_down": dry.api_down,
                            "refused": len(dry.refused), "refusals": dry.refused[:20]},
                      metrics=[r.metric_text() for r in replicas])
    finally:
        spreader.close()
        for r in replicas:
            r.stop()
    time.sleep(5)
    result["apiserver_rss_without"] = rss(pid_of_apiserver(cp_dir))
    log(f"{name}: koord-webhook audit over the whole state")
    result["audit"] = audit_state(koord, kubeconfig, workdir)
    log(f"{name}: audit: {result['audit']}")
    return result


def audit_state(koord, kubeconfig, workdir):
    """`koord-webhook audit` as a user runs it against this state (every stored object, page by
    page): its time, its peak RSS, its exit code and what it checked and found. The peak is its own
    VmHWM, read every 20 ms until it exits: the kernel's `ru_maxrss` of a child also counts the
    forked copy of this (large) Python process before the exec (a first figure of 240 MiB at S was
    that; the binary itself peaked at 94 MiB)."""
    started = time.time()
    out_path, err_path = os.path.join(workdir, "audit.json"), os.path.join(workdir, "audit.err")
    peak = 0
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([koord, "audit", "--kubeconfig", kubeconfig, "-o", "json"],
                                stdout=out, stderr=err, env=dict(os.environ, **image_env()))
        while proc.poll() is None:
            try:
                peak = max(peak, rss(proc.pid, "VmHWM"))
            except (OSError, ValueError, IndexError):
                pass
            time.sleep(0.02)
    try:
        report = json.load(open(out_path))
    except ValueError:
        report = {}
    return {"exit": proc.returncode, "seconds": time.time() - started,
            "peak_rss": peak, "checked": report.get("checked", {}),
            "found": report.get("objectsFound"),
            "error": None if report else open(err_path).read()[-500:]}


def measure_manager(path, crds, api, cp_dir, kubeconfig, restarts, workdir):
    """The anchor: Koordinator v1.8.0's koord-manager with its webhook on (WebhookFramework), one
    replica as a host process on the same state: its informers hold what its controllers and its
    webhook read. Its steady RSS once its caches have listed, and its peak through the same API
    server restarts (no admission load: its webhook has no configuration pointing at it here)."""
    for f in sorted(os.listdir(crds)):
        subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts",
                        "-f", os.path.join(crds, f)], check=True, stdout=subprocess.DEVNULL)
    # Its webhook controller waits for its own configurations (it fills their caBundle from its
    # template) and exits after 20 s without them.
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f",
                    os.path.join(ROOT, "koordinator", "manifests", "webhook-configurations.yaml")],
                   check=True, stdout=subprocess.DEVNULL)
    certs = os.path.join(workdir, "manager-certs")
    os.makedirs(certs, exist_ok=True)
    env = dict(os.environ, KUBECONFIG=kubeconfig, POD_NAMESPACE="koordinator-system",
               WEBHOOK_PORT=str(free_port()), WEBHOOK_CERT_DIR=certs, WEBHOOK_HOST="127.0.0.1")
    log_file = open(os.path.join(workdir, "koord-manager.log"), "w")
    proc = subprocess.Popen([path, f"--kubeconfig={kubeconfig}", "--enable-leader-election=false",
                             f"--metrics-addr=127.0.0.1:{free_port()}",
                             f"--health-probe-addr=127.0.0.1:{free_port()}", "--enable-pprof=false",
                             "--feature-gates=WebhookFramework=true"],
                            env=env, stdout=log_file, stderr=log_file)
    result = {"build": "koord-manager v1.8.0", "replicas": []}
    try:
        log("koord-manager: started; letting its informers list (90 s)")
        time.sleep(90)
        if proc.poll() is not None:
            raise RuntimeError(f"koord-manager exited with {proc.returncode} (see {log_file.name})")
        samples = []
        for _ in range(20):
            samples.append(rss(proc.pid))
            time.sleep(2)
        result["steady"] = [sorted(samples)[len(samples) // 2]]
        result["steady_max"] = [max(samples)]
        runs = []
        for k in range(restarts):
            reset_peak(proc.pid)
            log(f"koord-manager: restarting kube-apiserver ({k + 1}/{restarts})")
            down = time.time()
            subprocess.run([CP, "restart-apiserver", cp_dir], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=RESTART_ENV)
            up = time.time()
            time.sleep(60)
            runs.append({"api_down_s": up - down, "peak": [rss(proc.pid, "VmHWM")], "after": [rss(proc.pid)],
                         "ready_after_s": [None], "unready_seen": [None]})
            log(f"koord-manager: restart {k + 1}: peak {runs[-1]['peak'][0] // MIB} MiB")
        result.update(restarts=runs, load={"sent": 0, "ok": 0, "api_down": 0, "refused": 0, "refusals": []})
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log_file.close()
    return result


def table(size_name, size, results):
    lines = [f"### Scale {size_name}: {size['nodes']:,} nodes, {size['pods']:,} pods, "
             f"{size['trees'] * (size['children'] + 1):,} quotas, {size['reservations']:,} Reservations, "
             f"{size['namespaces']:,} namespaces",
             "",
             "| build | steady RSS / replica | peak through restart (x steady) | after restart | ready again | "
             "dry-run creates refused / sent |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        if "steady" not in r:
            lines.append(f"| {r['build']} | failed: {r.get('error', '?')} | | | | |")
            continue
        steady = max(r["steady"])
        peaks = [max(x["peak"]) for x in r["restarts"]]
        afters = [max(x["after"]) for x in r["restarts"]]
        # The slowest replica of each restart; one never seen ready again within 60 s says so.
        readies = ["not ready" if None in x["ready_after_s"] else f"{max(x['ready_after_s']):.1f}"
                   for x in r["restarts"]]
        lines.append(
            f"| {r['build']} | {' / '.join(f'{s / MIB:.0f}' for s in r['steady'])} MiB | "
            f"{', '.join(f'{p / MIB:.0f} ({p / steady:.2f}x)' for p in peaks)} MiB | "
            f"{', '.join(f'{a / MIB:.0f}' for a in afters)} MiB | "
            f"{', '.join(readies)} s | {r['load']['refused']} / {r['load']['sent']} |")
    timed = [r for r in results if r.get("latency")]
    if timed:
        lines += ["", "| build | endpoint | p50 / p99 at this state | p50 / p99 empty | p99 ratio |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for r in timed:
            for endpoint, at in r["latency"].items():
                empty = (r.get("latency_empty") or {}).get(endpoint)
                ratio = f"{at['p99_ms'] / empty['p99_ms']:.2f}x" if empty else "-"
                shown = f"{empty['p50_ms']:.2f} / {empty['p99_ms']:.2f} ms" if empty else "-"
                lines.append(f"| {r['build']} | {endpoint} | {at['p50_ms']:.2f} / {at['p99_ms']:.2f} ms | "
                             f"{shown} | {ratio} |")
    recounted = [r for r in results if r.get("recount_first")]
    if recounted:
        lines += ["", "| build | leader's recount | pass | its own work | pod index held |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for r in recounted:
            for when in ("first", "steady"):
                f = r.get(f"recount_{when}") or {}
                ms = lambda k: f"{f[k] * 1000:.0f} ms" if k in f else "-"
                lines.append(f"| {r['build']} | {when} | {ms('pass')} | {ms('compute')} | {ms('pod_index_lock')} |")
    written = [r for r in results if "quota_creates" in r]
    if written:
        lines += ["", "| build | quota creates/s (32 clients, every tree) | p50 / p99 per create | 429s answered | "
                      "other refusals | 1,000-pod burst into one quota: admitted | refused (of them: write conflicts) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in written:
            q, b = r["quota_creates"], r["pod_burst"]
            lines.append(f"| {r['build']} | {q['per_s']:.0f} | {q['p50_s'] * 1000:.0f} / {q['p99_s'] * 1000:.0f} ms | "
                         f"{q['busy_answers']} | {q['failures']} | {b['admitted']} | {b['refused']} ({b['conflicts']}) |")
    audited = [r for r in results if r.get("audit")]
    if audited:
        lines += ["", "| build | `koord-webhook audit` over the state | peak RSS (x a replica's steady) | "
                      "objects checked | found | exit |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in audited:
            a = r["audit"]
            steady = max(r.get("steady") or [0])
            times = f" ({a['peak_rss'] / steady:.2f}x)" if steady else ""
            checked = ", ".join(f"{n:,} {k}" for k, n in sorted(a["checked"].items())) or "-"
            lines.append(f"| {r['build']} | {a['seconds']:.1f} s | {a['peak_rss'] / MIB:.0f} MiB{times} | "
                         f"{checked} | {a['found']} | {a['exit']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default=os.environ.get("KOORD_SCALE", "S"), choices=SIZES)
    ap.add_argument("--koord", action="append", default=[], help="NAME=PATH of a build to measure")
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="leave the control plane running, with its state")
    ap.add_argument("--manager", metavar="PATH", help="koord-manager v1.8.0, measured as the anchor")
    ap.add_argument("--manager-crds", metavar="DIR", help="Koordinator's CRDs (koordinator/build components)")
    ap.add_argument("--results", metavar="FILE", help="put the table into FILE (bench/RESULTS.md), replacing "
                                                       "the one of the same size")
    ap.add_argument("--check", type=float, metavar="RATIO",
                    help="exit 1 unless every peak <= RATIO x steady, every replica ready again, 0 refused")
    ap.add_argument("--bare", action="append", default=[], metavar="NAME",
                    help="run build NAME without the Dockerfile's ENV lines (a build from before they were there)")
    ap.add_argument("--quota-creates", type=int, metavar="N",
                    help="after the restarts, N quota creates through the webhook and a 1,000-pod burst into one "
                         "quota (default: 500 at S, 2,000 at L1/L0; 0 skips both)")
    ap.add_argument("--reuse", action="store_true",
                    help="measure on the state a run with --keep left (the same state for several builds)")
    args = ap.parse_args()
    size = SIZES[args.size]
    workdir = os.path.join(OUT, f"scale-{args.size}")
    cp_dir = os.path.join(workdir, "cp")
    os.makedirs(workdir, exist_ok=True)
    if not args.reuse:
        subprocess.run([CP, "down", cp_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([CP, "up", cp_dir], check=True, stdout=subprocess.DEVNULL)
    kubeconfig = os.path.join(cp_dir, "kubeconfig")
    server = [l.split()[-1] for l in open(kubeconfig) if "server:" in l][0]
    api = Api(cp_dir, server)
    results = []
    empty_api, load_s = None, None
    empty_latencies = {}
    try:
        if args.reuse:
            quotas = [f"child-{t:03d}-{c:02d}" for t in range(size["trees"]) for c in range(size["children"])]
        else:
            crds = subprocess.run([os.environ.get("KOORD", args.koord[0].split("=", 1)[1]), "crds"], check=True,
                                  capture_output=True).stdout
            subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "--server-side", "-f", "-"], input=crds,
                           check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "wait", "--for=condition=Established",
                            "--timeout=60s", "crd", "--all"], check=True, stdout=subprocess.DEVNULL)
            api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": "koordinator-system"}})
            empty_api = rss(pid_of_apiserver(cp_dir))
            for spec in args.koord:
                name, path = spec.split("=", 1)
                empty_latencies[name] = empty_latency(path, kubeconfig, workdir)
                log(f"{name}: review latency on the empty state: {empty_latencies[name]}")
            t = time.time()
            quotas = load(api, size)
            load_s = time.time() - t
        beats = Heartbeats(api, size["nodes"], rate=50)
        beats.start()
        time.sleep(10)
        for spec in args.koord:
            name, path = spec.split("=", 1)
            try:
                writes = args.quota_creates if args.quota_creates is not None else (500 if args.size == "S" else 2000)
                results.append(measure(name, path, api, cp_dir, kubeconfig, size, quotas, args.restarts, workdir,
                                       writes, bare=name in args.bare))
            except Exception as e:  # noqa: BLE001 - one build failing still reports the others
                log(f"{name}: failed: {e}")
                results.append({"build": name, "error": str(e)})
            # Each build creates its own webhook configurations; the next one starts from none.
            for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
                subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "delete", kind, "--all"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if args.manager:
            try:
                results.append(measure_manager(args.manager, args.manager_crds, api, cp_dir, kubeconfig,
                                               args.restarts, workdir))
            except Exception as e:  # noqa: BLE001
                log(f"koord-manager: failed: {e}")
                results.append({"build": "koord-manager v1.8.0", "error": str(e)})
        beats.stop.set()
    finally:
        if not args.keep:
            subprocess.run([CP, "down", cp_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for r in results:
        r["latency_empty"] = empty_latencies.get(r["build"])
    report = {"size": args.size, "objects": size, "load_s": load_s, "apiserver_rss_empty": empty_api,
              "results": [{k: v for k, v in r.items() if k != "metrics"} for r in results]}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"scale-{args.size}.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(workdir, "metrics.json"), "w") as f:
        json.dump([r.get("metrics") for r in results], f)
    text = table(args.size, size, results)
    print(text)
    if args.results:
        write_results(args.results, f"scale {args.size}", text)
    if args.check is not None:
        failures = check(results, args.check, size)
        for f in failures:
            print(f"scale check failed: {f}")
        checks = sum(len(r.get("restarts", [])) * 2 + 1 + ("audit" in r) for r in results) or 1
        print(f"scale: {checks - len(failures)} passed, {len(failures)} failed")
        raise SystemExit(1 if failures else 0)


def write_results(path, marker, text, by="`bench/run scale` (bench/scale.py)"):
    """Replaces the section between `<!-- marker -->` and `<!-- /marker -->` of the results file
    (a scale size's, `scale S`; the soak's), or appends it."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    body = open(path).read() if os.path.exists(path) else ""
    section = f"{start}\n{text}\n\nMeasured {time.strftime('%Y-%m-%d')} by {by}.\n{end}"
    if start in body and end in body:
        body = body[:body.index(start)] + section + body[body.index(end) + len(end):]
    else:
        body = body.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(body)


def check(results, ratio, size):
    """Each replica's peak through each restart against its own steady RSS, readiness after, and
    the refused creates."""
    failures = []
    for r in results:
        if "steady" not in r:
            failures.append(f"{r['build']}: {r.get('error')}")
            continue
        for k, run in enumerate(r["restarts"]):
            for j, (peak, steady) in enumerate(zip(run["peak"], r["steady"])):
                if peak > ratio * steady:
                    failures.append(f"{r['build']} replica {j} restart {k + 1}: peak {peak / MIB:.1f} MiB is "
                                    f"{peak / steady:.2f}x its steady {steady / MIB:.1f} MiB (> {ratio}x)")
            if None in run["ready_after_s"]:
                failures.append(f"{r['build']} restart {k + 1}: a replica not ready within 60 s: "
                                f"{run['ready_after_s']}")
        # The quota holds the whole burst: any refusal is a failure, a write conflict or not (a
        # quota write refused by our own quota webhook once refused all 1,000 unnoticed).
        if r.get("pod_burst", {}).get("refused"):
            failures.append(f"{r['build']}: {r['pod_burst']['refused']} burst pods refused "
                            f"({r['pod_burst']['conflicts']} for a write conflict): "
                            f"{r['pod_burst']['examples'][:2]}")
        if r.get("quota_creates", {}).get("failures"):
            failures.append(f"{r['build']}: {r['quota_creates']['failures']} quota creates refused: "
                            f"{r['quota_creates']['examples'][:2]}")
        a = r.get("audit")
        if a and (a["exit"] not in (0, 1) or a["checked"].get("Pod", 0) < size["pods"]
                  or a["checked"].get("Node", 0) < size["nodes"]):
            failures.append(f"{r['build']}: audit exit {a['exit']}, checked {a['checked']}: {a['error']}")
        if r["load"]["refused"]:
            failures.append(f"{r['build']}: {r['load']['refused']} creates refused by the webhook: "
                            f"{r['load']['refusals'][:3]}")
    return failures


if __name__ == "__main__":
    main()
