"""The `soak` phase (`bench/run soak`, not in CI): two replicas through real kube-apiservers for an
hour (--minutes) at a steady churn, with a fault every few minutes (--fault-every), watching for what
grows.

Set-up: the control plane of scripts/control-plane (kube-apiserver + etcd on loopback) and a second
kube-apiserver on the same etcd (an HA control plane: each API server keeps its own connection to
the webhook, so both replicas admit); the state of bench/scale.py's size S (--size), loaded before
any webhook exists; then what `koord-webhook manifests` installs in URL mode (CRDs, ServiceAccount
and its RBAC, both webhook configurations; no Deployment: the replicas are host processes). Each
replica runs as the installed ServiceAccount (its kubeconfig impersonates it), reaches the API
server through a TCP relay of its own (the `watch` fault cuts it), with leader election on and
`EnableQuotaAdmission`. The webhook configurations call 127.0.0.1:PORT, where a relay hands each
new connection to a ready replica, as a Service's endpoints do.

Churn (CHURN): dry-run pod creates, pods created and deleted a minute later (half in a quota), node
heartbeats, quota max changes, quotas created and deleted, colocation profile changes; every
create, change and delete that the webhooks admit is counted, and each failure kept with its time
and cause. Faults, in turn: an API-server restart, the leader replica SIGKILLed (a replacement
starts under a new name, as a Deployment's would), a forced CA rotation (webhook-ca deleted, as an
operator rotates away from a leaked key: docs/certificates.md, "A lost or broken CA"), the serving
Secret webhook-tls deleted, and one replica's API-server connections cut (its watches dropped).
A fault's window runs from its start to its recovery (both replicas ready, three rounds of probe
creates through both API servers admitted, and the fault's own condition) plus --grace seconds.

Every --sample-every seconds, per replica process: RSS, open fds, threads, metric series (the
non-comment lines of its /metrics), watch restarts; and the quota ledger ConfigMap's size, the
recent-admissions records' size (annotation koord-webhook/child-request-recent on every quota), the
second API server's RSS (the first is restarted by faults), and the requests the first API server
dispatched for each replica (each replica's identity carries a group of its own, which a FlowSchema
of its own matches: apiserver_flowcontrol_dispatched_requests_total{flow_schema="koord-soak-replica-N"},
summed across API-server restarts). Slopes are least squares per hour over the samples after --warmup minutes,
per process (a replica restarted by a fault starts a series of its own). Log lines are counted per
level from the replicas' logs (the text format of src/telemetry.rs).

Writes target/bench/soak/samples.jsonl (raw samples) and soak.json, prints a Markdown section and
puts it into --results between `<!-- soak -->` markers. --check exits 1 when a process's RSS grows
1 MiB/h or more or its fds, threads or metric series rise (FLAT_RISE; only series of --check-span
minutes are judged), a fault did not recover, a replica exited on its own, or an admission failed
outside the fault windows.
"""
import argparse
import collections
import http.client
import json
import os
import socket
import ssl
import subprocess
import threading
import time

import yaml

from scale import (CP, Heartbeats, Replica, SecondApiServer, Spreader, admissions,
                   free_port, rss, wait, write_results)
from scale_load import SIZES, Api, load, log, pod
from soak_report import (CHURN, FAULT_NAMES, FAULTS, POD_LIFE_S, ROOT, WORK,
                         log_levels, report)

NS = "koordinator-system"
SA = f"system:serviceaccount:{NS}:koord-webhook"
EQ = "/apis/scheduling.sigs.k8s.io/v1alpha1/namespaces/{}/elasticquotas"
PROFILE = "/apis/config.koordinator.sh/v1alpha1/clustercolocationprofiles"
STOP = threading.Event()


def now():
    return time.time()


class Admissions:
    """Every request the webhooks admit or refuse, sent as a client sends it: once (a 429, the quota
    ledger's "retry", is retried as a client would, for up to a minute). Failures keep their time
    and cause."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent, self.busy = collections.Counter(), collections.Counter()
        self.failures = []  # (time, kind, cause)

    def send(self, kind, api, method, path, body=None, content_type="application/json"):
        with self.lock:
            self.sent[kind] += 1
        started, busy, fresh = now(), 0, False
        while True:
            try:
                status, payload = api.call(method, path, body, content_type, tries=1)
            except Exception as e:  # noqa: BLE001 - the API server down is a cause like any other
                # A keep-alive connection the server had closed: once more on a new one, as Go's client does.
                if not fresh and isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                                                ssl.SSLEOFError)):
                    fresh = True
                    continue
                cause = f"no answer from the API server ({type(e).__name__}: {e})"
                break
            if status in (200, 201):
                return True
            if status == 429 and now() - started < 60:
                busy += 1
                with self.lock:
                    self.busy[kind] += 1
                time.sleep(min(0.1 * busy, 1.0))
                continue
            cause = f"{status} {message(payload)}"
            break
        with self.lock:
            self.failures.append((now(), kind, cause))
        return False


def message(payload):
    try:
        return json.loads(payload).get("message", "")[:400]
    except ValueError:
        return payload[:400].decode(errors="replace")


class Loop(threading.Thread):
    """Calls `step(i)` `rate` times a second until STOP; behind by more than a second (a request
    waiting on an API server that is down), it does not catch up in a burst."""

    def __init__(self, rate, step):
        super().__init__(daemon=True)
        self.rate, self.step = rate, step

    def run(self):
        i, due = 0, now()
        while not STOP.is_set():
            try:
                self.step(i)
            except Exception as e:  # noqa: BLE001
                log(f"churn step failed: {e}")
            i += 1
            due = max(due + 1 / self.rate, now() - 1)
            STOP.wait(max(0.0, due - now()))


def churn(apis, quotas, size, adm):
    """The churn threads (CHURN's rates), alternating between the API servers."""
    live = collections.deque()
    tree_of = lambda q: int(q.split("-")[1])

    def churn_pod(i, dry):
        p = pod((30_000_000 if dry else 40_000_000) + i, size, quotas)
        p["metadata"]["name"] = f"soak-{'dry' if dry else 'pod'}-{i:07d}"
        labels = p["metadata"]["labels"]
        if i // 2 % 2:  # half in a quota, through either API server (which alternates with i)
            labels["quota.scheduling.koordinator.sh/name"] = quotas[(i * 7) % len(quotas)]
        else:
            labels.pop("quota.scheduling.koordinator.sh/name", None)
        return p

    def dry_run(i):
        p = churn_pod(i, True)
        adm.send("dry-run pod create", apis[i % 2], "POST",
                 f"/api/v1/namespaces/{p['metadata']['namespace']}/pods?dryRun=All", p)

    def pods(i):
        p = churn_pod(i, False)
        path = f"/api/v1/namespaces/{p['metadata']['namespace']}/pods"
        if adm.send("pod create", apis[i % 2], "POST", path, p):
            live.append((now(), f"{path}/{p['metadata']['name']}"))
        while live and live[0][0] < now() - POD_LIFE_S:
            _, pod_path = live.popleft()
            if not adm.send("pod delete", apis[i % 2], "DELETE", pod_path + "?gracePeriodSeconds=0"):
                live.append((now(), pod_path))  # again a minute later
                break

    def quota_max(i):
        q = quotas[(i * 13) % len(quotas)]
        t, k = tree_of(q), int(q.split("-")[2])
        cpu = 40 + 8 * (i // len(quotas) % 2)  # every quota's max moves up, then back down
        ns = "ns-%04d" % ((t * size["children"] + k) % size["namespaces"])
        adm.send("quota change", apis[i % 2], "PATCH", f"{EQ.format(ns)}/{q}",
                 {"spec": {"max": {"cpu": str(cpu), "memory": f"{cpu * 2}Gi"}}}, "application/merge-patch+json")

    made = []

    def quota_create(i):
        t = i % size["trees"]
        ns = f"ns-{(i * 31) % size['namespaces']:04d}"
        if adm.send("quota create", apis[i % 2], "POST", EQ.format(ns), {
                "apiVersion": "scheduling.sigs.k8s.io/v1alpha1", "kind": "ElasticQuota",
                "metadata": {"name": f"soak-{i:06d}", "namespace": ns,
                             "labels": {"quota.scheduling.koordinator.sh/parent": f"parent-{t:03d}",
                                        "quota.scheduling.koordinator.sh/is-parent": "false"}},
                "spec": {"min": {"cpu": "1", "memory": "1Gi"}, "max": {"cpu": "4", "memory": "8Gi"}}}):
            made.append(f"{EQ.format(ns)}/soak-{i:06d}")
        if len(made) > 1 and adm.send("quota delete", apis[i % 2], "DELETE", made[0]):
            made.pop(0)

    def profile(i):
        adm.send("profile change", apis[i % 2], "PATCH", f"{PROFILE}/soak-colocation",
                 {"spec": {"labels": {"koordinator.sh/mutated": "true", "soak/generation": str(i)}}},
                 "application/merge-patch+json")

    threads = [Loop(CHURN["dry-run pod create"], dry_run), Loop(CHURN["pod create"], pods),
               Heartbeats(apis[1], size["nodes"], CHURN["node heartbeat"]), Loop(CHURN["quota change"], quota_max),
               Loop(CHURN["quota create"], quota_create), Loop(CHURN["profile change"], profile)]
    for t in threads:
        t.start()
    return threads


class Relay(threading.Thread):
    """A TCP relay from 127.0.0.1 to the API server for one replica (TLS passes through), whose open
    connections can be cut at once: the `watch` fault."""

    def __init__(self, upstream_port):
        super().__init__(daemon=True)
        self.upstream = upstream_port
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.open, self.lock, self.accepted = set(), threading.Lock(), 0

    def run(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                client.close()
                continue
            pair = (client, upstream)
            with self.lock:
                self.open.add(pair)
                self.accepted += 1
            for a, b in (pair, pair[::-1]):
                threading.Thread(target=self.pump, args=(pair, a, b), daemon=True).start()

    def pump(self, pair, src, dst):
        Spreader.pump(src, dst)
        with self.lock:
            self.open.discard(pair)

    def cut(self):
        with self.lock:
            pairs = list(self.open)
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        return len(pairs)


class ReadySpreader(Spreader):
    """The webhook's address: each new connection to the next replica that is ready (a Service's
    endpoints follow readiness; here within a second, `Cluster.watch_replicas`)."""

    def pick(self):
        for _ in self.replicas:
            i = super().pick()
            if getattr(self.replicas[i], "serving", False):
                return i
        return i


class Cluster:
    """The replicas, their relays and kubeconfigs, and what the faults do to them."""

    def __init__(self, koord, cp_dir, apis, port):
        self.koord, self.cp_dir, self.apis, self.port = koord, cp_dir, apis, port
        self.api = apis[0]
        api_port = int(open(os.path.join(cp_dir, "port")).read())
        self.relays = [Relay(api_port) for _ in range(2)]
        for r in self.relays:
            r.start()
        self.generation = [0, 0]
        self.processes = []  # (slot, pid, identity, started)
        self.events = []  # replicas that exited without a fault
        self.lock = threading.Lock()
        self.replicas = [self.start(i) for i in range(2)]
        self.spreader = ReadySpreader(port, self.replicas)
        self.spreader.start()
        threading.Thread(target=self.watch_replicas, daemon=True).start()

    def kubeconfig(self, slot):
        """The admin's kubeconfig through the slot's relay, impersonating the installed
        ServiceAccount (with the install's RBAC) plus a group that names the slot (its FlowSchema)."""
        config = yaml.safe_load(open(os.path.join(self.cp_dir, "kubeconfig")))
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.relays[slot].port}"
        config["users"][0]["user"].update({"as": SA, "as-groups": [
            "system:serviceaccounts", f"system:serviceaccounts:{NS}", f"koord-soak:replica-{slot}"]})
        path = os.path.join(WORK, f"replica-{slot}.kubeconfig")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    def start(self, slot):
        identity = f"replica-{slot}-{self.generation[slot]}"
        r = Replica(self.koord, self.kubeconfig(slot), slot, WORK, ["--identity", identity], self.port)
        r.identity = identity
        self.processes.append({"slot": slot, "pid": r.proc.pid, "identity": identity, "started": now()})
        return r

    def restart(self, slot, why):
        """SIGKILL the slot's replica (if alive) and start a replacement under a new name; its log
        is kept beside (replica-N.log is the newest)."""
        with self.lock:
            old = self.replicas[slot]
            old.serving, old.replaced = False, True
            old.proc.kill()
            old.proc.wait()
            old.log.close()
            os.rename(old.log.name, os.path.join(WORK, f"{old.identity}.log"))
            log(f"replica {old.identity} ({why}) replaced")
            self.generation[slot] += 1
            self.replicas[slot] = self.start(slot)

    def watch_replicas(self):
        """Every second: which replicas the webhook's address sends to, and a replica that exited
        on its own is recorded and replaced, as the kubelet would."""
        while not STOP.is_set():
            for slot, r in enumerate(list(self.replicas)):
                if r.proc.poll() is not None and not getattr(r, "replaced", False):
                    self.events.append({"t": now(), "identity": r.identity, "exit": r.proc.returncode})
                    self.restart(slot, f"exited on its own with {r.proc.returncode}")
                    continue
                r.serving = r.ready()
            time.sleep(1)

    def ready(self):
        return all(r.proc.poll() is None and r.ready() for r in self.replicas)

    def probes_pass(self, rounds=3):
        """`rounds` rounds of a dry-run pod create (in a quota) through each API server, each
        admitted."""
        for k in range(rounds):
            for api in self.apis:
                p = pod(50_000_000 + k, SIZES["S"], ["child-000-00"])
                p["metadata"]["labels"]["quota.scheduling.koordinator.sh/name"] = "child-000-00"
                try:
                    status, _ = api.call("POST", f"/api/v1/namespaces/{p['metadata']['namespace']}/pods?dryRun=All",
                                         p, tries=1)
                except Exception:  # noqa: BLE001
                    return False
                if status not in (200, 201):
                    return False
        return True

    def get(self, path):
        try:
            status, body = self.api.call("GET", path, tries=1)
        except Exception:  # noqa: BLE001
            return None
        return json.loads(body) if status == 200 else None

    def holder(self):
        lease = self.get(f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/koord-webhook") or {}
        return lease.get("spec", {}).get("holderIdentity")

    def stop(self):
        self.spreader.close()
        for r in self.replicas:
            r.stop()
        for relay in self.relays:
            relay.sock.close()


def fault(cluster, kind, n):
    """Makes fault `kind` happen; returns how it was made and the fault's own recovery condition."""
    c = cluster
    if kind == "apiserver":
        # As a node's service manager restarts it: SIGTERM, SIGKILL 10 s later (the script's default).
        t = now()
        subprocess.run([CP, "restart-apiserver", c.cp_dir], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return f"`scripts/control-plane restart-apiserver` (back in {now() - t:.0f} s)", lambda: True
    if kind == "leader":
        # One GET can fail (the first 60-minute run's leader faults read no holder once each and
        # killed slot 0, which happened to lead): ask for up to 10 s.
        holder, deadline = c.holder(), now() + 10
        while holder is None and now() < deadline:
            time.sleep(0.5)
            holder = c.holder()
        slot = next((i for i, r in enumerate(c.replicas) if r.identity == holder), 0)
        c.restart(slot, "leader, SIGKILL")
        new = c.replicas[slot].identity
        return (f"SIGKILL {holder}, {new} started",
                lambda: c.holder() in {r.identity for r in c.replicas})
    if kind == "rotation":
        before = (c.get(f"/api/v1/namespaces/{NS}/secrets/webhook-ca") or {}).get("metadata", {}).get("uid")
        c.api.call("DELETE", f"/api/v1/namespaces/{NS}/secrets/webhook-ca")

        def rotated():
            ca = (c.get(f"/api/v1/namespaces/{NS}/secrets/webhook-ca") or {}).get("metadata", {})
            return ca.get("uid") not in (None, before) and \
                ca.get("annotations", {}).get("koord-webhook/ca-rotation-phase") == "Stable"
        return "Secret webhook-ca deleted; recovered once the new CA's rotation is `Stable`", rotated
    if kind == "secret":
        before = (c.get(f"/api/v1/namespaces/{NS}/secrets/webhook-tls") or {}).get("metadata", {}).get("uid")
        c.api.call("DELETE", f"/api/v1/namespaces/{NS}/secrets/webhook-tls")
        return "Secret webhook-tls deleted", lambda: (c.get(f"/api/v1/namespaces/{NS}/secrets/webhook-tls") or {}).get(
            "metadata", {}).get("uid") not in (None, before)
    if kind == "watch":
        slot = n % 2
        relay = c.relays[slot]
        with relay.lock:
            accepted = relay.accepted
        cut = relay.cut()
        # Recovered once the replica has connected again. A watch whose connection ends at a clean
        # read boundary resumes without an error (kube's watcher starts it again from its last
        # resourceVersion, logging only "eof in poll"), so the watch-restart counter, what this
        # waited for until the first 60-minute run, need not move: that run's fault 10 was
        # reported "not recovered" while the replica had reconnected and admitted on.
        return (f"{cut} API-server connections of {c.replicas[slot].identity} cut",
                lambda: relay.accepted > accepted)
    raise ValueError(kind)


class Faults(threading.Thread):
    """One fault every `every` seconds from `t0` (never sooner than 30 s after the last one's
    recovery), in turn, each timed until it has recovered."""

    def __init__(self, cluster, kinds, t0, every, end, timeout=600):
        super().__init__(daemon=True)
        self.cluster, self.kinds, self.t0, self.every, self.end, self.timeout = cluster, kinds, t0, every, end, timeout
        self.done = []

    def run(self):
        due, n = self.t0 + self.every, 0
        while not STOP.is_set() and due < self.end - 60:
            if STOP.wait(max(0.0, due - now())):
                return
            kind = self.kinds[n % len(self.kinds)]
            start = now()
            log(f"fault {n + 1}: {FAULT_NAMES[kind]}")
            record = {"n": n + 1, "kind": kind, "start": start, "recovered": None}
            self.done.append(record)
            try:
                record["how"], condition = fault(self.cluster, kind, n // len(self.kinds))
                while now() - start < self.timeout and not STOP.is_set():
                    if condition() and self.cluster.ready() and self.cluster.probes_pass():
                        record["recovered"] = now()
                        break
                    time.sleep(0.5)
            except Exception as e:  # noqa: BLE001
                record["how"] = record.get("how", "") + f" (failed: {e})"
            took = f"{record['recovered'] - start:.1f} s" if record["recovered"] else "not recovered"
            log(f"fault {n + 1}: {record['how']}; recovered after {took}")
            n += 1
            due = max(self.t0 + (n + 1) * self.every, (record["recovered"] or now()) + 30)


def metric_sum(text, name, label=""):
    """The sum of metric `name`'s samples (those whose labels contain `label`)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class Sampler(threading.Thread):
    """Every `every` seconds, one JSON line per replica process and one for the cluster."""

    def __init__(self, cluster, every, path, second_pid):
        super().__init__(daemon=True)
        self.cluster, self.every, self.out, self.second_pid = cluster, every, open(path, "w"), second_pid
        self.samples, self.last_raw, self.requests = [], [None, None], [0.0, 0.0]

    def run(self):
        while True:
            self.sample()
            if STOP.wait(self.every):
                self.sample()
                return

    def requests_by_slot(self):
        """The API server's dispatched requests per replica FlowSchema, summed across its restarts
        (a counter that went down started again from zero)."""
        try:
            status, body = self.cluster.api.call("GET", "/metrics", tries=1)
        except Exception:  # noqa: BLE001
            return None
        if status != 200:
            return None
        text = body.decode(errors="replace")
        for slot in range(2):
            raw = metric_sum(text, "apiserver_flowcontrol_dispatched_requests_total",
                             f'flow_schema="koord-soak-replica-{slot}"')
            last = self.last_raw[slot]
            self.requests[slot] += raw if last is None or raw < last else raw - last
            self.last_raw[slot] = raw
        return list(self.requests)

    def sample(self):
        c, t = self.cluster, now()
        rows = []
        for slot, r in enumerate(list(c.replicas)):
            pid = r.proc.pid
            try:
                status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status") if ":" in line)
                fds = len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                continue  # killed by a fault meanwhile
            text = r.metric_text()
            rows.append({"t": t, "slot": slot, "pid": pid, "identity": r.identity,
                         "rss": int(status["VmRSS"].split()[0]) * 1024, "fds": fds,
                         "threads": int(status["Threads"]), "ready": r.ready(),
                         "series": sum(1 for x in text.splitlines() if x and not x.startswith("#")) if text else None,
                         "admitted": admissions(text) if text else None,
                         "leader": metric_sum(text, "koord_webhook_leader") if text else None,
                         "watch_restarts": metric_sum(text, "koord_webhook_watch_restarts_total") if text else None})
        ledger = c.get(f"/api/v1/namespaces/{NS}/configmaps/koord-webhook-quota-ledger")
        quotas = c.get("/apis/scheduling.sigs.k8s.io/v1alpha1/elasticquotas")
        records = [((q["metadata"].get("annotations") or {}).get("koord-webhook/child-request-recent") or "")
                   for q in (quotas or {}).get("items", [])]
        try:
            api_rss = rss(self.second_pid)
        except OSError:
            api_rss = None
        rows.append({"t": t, "cluster": True,
                     "ledger_bytes": sum(len(v) for v in (ledger.get("data") or {}).values()) if ledger else None,
                     "record_bytes": sum(len(r) for r in records) if quotas else None,
                     "record_entries": sum(len(json.loads(r)) for r in records if r) if quotas else None,
                     "apiserver_rss": api_rss, "requests": self.requests_by_slot()})
        for row in rows:
            self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        self.samples += rows


def install(koord, kubeconfig, api, port):
    """What `koord-webhook manifests` installs in URL mode, without the Deployment (no
    controller-manager runs; the replicas are host processes) and its PodDisruptionBudget and
    ResourceQuota. The configurations must exist before the replicas start: RBAC cannot grant a
    create limited to resource names, so the installed ServiceAccount may only patch them. Plus a
    FlowSchema per replica, whose dispatch counter is that replica's requests."""
    text = subprocess.run([koord, "manifests", "--webhook-host", "127.0.0.1", "--port", str(port),
                           "--feature-gates", "EnableQuotaAdmission=true"], check=True, capture_output=True).stdout
    docs = [d for d in yaml.safe_load_all(text) if d and d["kind"] not in
            ("Deployment", "PodDisruptionBudget", "ResourceQuota")]
    subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-"],
                   input=yaml.safe_dump_all(docs).encode(), check=True, stdout=subprocess.DEVNULL)
    for slot in range(2):
        api.create("/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": f"koord-soak-replica-{slot}"},
            # The priority level the installed ServiceAccount's requests get anyway (service-accounts).
            "spec": {"priorityLevelConfiguration": {"name": "workload-low"}, "matchingPrecedence": 500,
                     "distinguisherMethod": {"type": "ByUser"},
                     "rules": [{"subjects": [{"kind": "Group", "group": {"name": f"koord-soak:replica-{slot}"}}],
                                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                   "clusterScope": True, "namespaces": ["*"]}],
                                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}})


def profile_setup(api):
    """A colocation profile (changed by the churn) that turns the churn's web pods in dev
    namespaces into BE batch pods."""
    api.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "koord-batch"},
        "value": 5500})
    api.create(PROFILE, {
        "apiVersion": "config.koordinator.sh/v1alpha1", "kind": "ClusterColocationProfile",
        "metadata": {"name": "soak-colocation"},
        "spec": {"namespaceSelector": {"matchLabels": {"env": "dev"}}, "selector": {"matchLabels": {"tier": "web"}},
                 "qosClass": "BE", "priorityClassName": "koord-batch", "schedulerName": "koord-scheduler",
                 "labels": {"koordinator.sh/mutated": "true"}}})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--fault-every", type=float, default=5, metavar="MIN")
    ap.add_argument("--faults-for", type=float, metavar="MIN",
                    help="faults only in the first MIN minutes (default: all along): the quiet rest shows the "
                         "processes the faults started, past their warm-up")
    ap.add_argument("--faults", default=",".join(FAULTS), help="the faults, in turn (default: all)")
    ap.add_argument("--warmup", type=float, default=10, metavar="MIN", help="slopes leave out the first MIN minutes")
    ap.add_argument("--sample-every", type=float, default=30, metavar="S")
    ap.add_argument("--grace", type=float, default=10, metavar="S",
                    help="a fault's window extends this past its recovery")
    ap.add_argument("--size", default="S", choices=SIZES)
    ap.add_argument("--koord", default=os.environ.get("KOORD") or os.path.join(
        ROOT, "target", "x86_64-unknown-linux-musl", "release", "koord-webhook"), metavar="PATH")
    ap.add_argument("--results", metavar="FILE", help="put the section into FILE, replacing its soak section")
    ap.add_argument("--check", action="store_true", help="exit 1 on growth, a non-flat series or a failure outside "
                                                         "the fault windows")
    ap.add_argument("--check-span", type=float, default=20, metavar="MIN",
                    help="--check judges the series of processes sampled this long after the warm-up")
    ap.add_argument("--keep", action="store_true", help="leave the control plane running")
    args = ap.parse_args()
    kinds = args.faults.split(",")
    assert all(k in FAULTS for k in kinds), f"faults are {FAULTS}"
    koord, size = os.path.abspath(args.koord), SIZES[args.size]
    cp_dir = os.path.join(WORK, "cp")
    os.makedirs(WORK, exist_ok=True)
    for name in os.listdir(WORK):
        if name.endswith(".log") and name.startswith("replica-"):
            os.remove(os.path.join(WORK, name))
    subprocess.run([CP, "down", cp_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([CP, "up", cp_dir], check=True, stdout=subprocess.DEVNULL)
    kubeconfig = os.path.join(cp_dir, "kubeconfig")
    server = [l.split()[-1] for l in open(kubeconfig) if "server:" in l][0]
    api = Api(cp_dir, server)
    second = cluster = None
    threads = []
    try:
        crds = subprocess.run([koord, "crds"], check=True, capture_output=True).stdout
        subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "apply", "--server-side", "-f", "-"], input=crds,
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "wait", "--for=condition=Established",
                        "--timeout=60s", "crd", "--all"], check=True, stdout=subprocess.DEVNULL)
        quotas = load(api, size)
        profile_setup(api)
        log("a second kube-apiserver on the same etcd")
        second = SecondApiServer(cp_dir, WORK)
        apis = [api, second.api]
        port = free_port()
        install(koord, kubeconfig, api, port)
        log(f"starting two replicas ({koord})")
        cluster = Cluster(koord, cp_dir, apis, port)
        wait(cluster.ready, 600, "both replicas ready")
        wait(cluster.probes_pass, 120, "admissions through both API servers")
        adm = Admissions()
        t0 = now()
        end = t0 + args.minutes * 60
        sampler = Sampler(cluster, args.sample_every, os.path.join(WORK, "samples.jsonl"), second.proc.pid)
        faults = Faults(cluster, kinds, t0, args.fault_every * 60,
                        min(end, t0 + 60 + args.faults_for * 60) if args.faults_for else end)
        threads = [sampler, faults] + churn(apis, quotas, size, adm)
        for t in (sampler, faults):
            t.start()
        log(f"soaking for {args.minutes:g} minutes, a fault every {args.fault_every:g}")
        while now() < end:
            time.sleep(min(60.0, max(0.0, end - now())))
            log(f"minute {(now() - t0) / 60:.0f}: {sum(adm.sent.values()):,} sent, {len(adm.failures)} failed")
        faults.join(faults.timeout)  # the last fault's recovery, under the churn
        STOP.set()
        for t in threads:
            if isinstance(t, Heartbeats):
                t.stop.set()
            t.join(120)
        end = now()
    finally:
        STOP.set()
        if cluster:
            cluster.stop()
        if second:
            second.stop()
        if not args.keep:
            subprocess.run([CP, "down", cp_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    windows = [(f["start"], (f["recovered"] or f["start"] + faults.timeout) + args.grace) for f in faults.done]
    levels = log_levels(windows, t0, end)
    text, failures = report(args, koord, t0, end, adm, cluster, faults.done, sampler.samples, levels, windows)
    with open(os.path.join(WORK, "soak.json"), "w") as f:
        json.dump({"t0": t0, "end": end, "faults": faults.done, "events": cluster.events,
                   "processes": cluster.processes, "sent": adm.sent, "busy": adm.busy,
                   "failures": adm.failures, "levels": {k: {n: dict(c) for n, c in v.items()}
                                                        for k, v in levels.items()}}, f, indent=1)
    print(text)
    if args.results:
        write_results(args.results, "soak", text, by="`bench/run soak` (bench/soak.py)")
    if args.check:
        for f in failures:
            print(f"soak check failed: {f}")
        raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
