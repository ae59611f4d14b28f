"""Issue 60's hostile shapes against a build of koord-webhook, under the chart's memory limit.

Each case starts a fresh `serve --state` with `--memory-limit 384Mi` (the chart's limit, passed as
the chart passes it) and the image's allocator settings (`MIMALLOC_PURGE_DELAY=0`, as the
Dockerfile sets), runs one attack, and reports the process's idle and peak RSS (VmHWM) and what the
attack got. Reported, never asserted: `python3 bench/hostile.py --koord PATH [--before PATH]`
prints a Markdown table per build (the image's build is target/x86_64-unknown-linux-musl/release).

The attacks:
- reservation-volumes: a 1 MiB /mutate-reservation review whose pod template has empty volumes
  (`{"name":""}`), 1, 2 and 8 at once; and of `{"":0}` volumes on a Reservation a profile with a
  patch selects (the attack review's shape);
- an SLO ConfigMap whose colocation-config is `[[0],...]`, and a pod of empty containers padded
  with empty strings through /mutate-pod (the attack review's shapes);
- h2-streams: one TLS connection asking for h2 by ALPN, opening 200,000 streams (HEADERS without
  END_STREAM; needs the `h2` package, installed from PyPI when missing);
- unread-denials: 90 forged /validate-pod UPDATEs whose new `koordinator.sh/priority` label is
  4 MiB, each on its own connection, none of whose answers is read;
- trickle: four loopback addresses each send 4 MiB of an 8 MiB body and then a byte every 1.5 s,
  while another address posts an ordinary review every 100 ms for 10 s (its answers counted);
- handshakes: eight loopback addresses each open 256 connections that send nothing, while another
  measures its own TLS handshakes (median of 20);
- large decodes beside: one address keeps eight 3 MiB pods of labels (the costliest decode per
  byte) in /mutate-pod at once for 10 s, while another opens a new connection and sends a small
  review every 250 ms: the time to its answer (handshake included), and any it did not get.
"""
import argparse
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time

import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 384 << 20
PORT = 19571
ONLY = []


def start(koord):
    """A fresh server under the chart's limit, with the image's allocator settings."""
    os.environ["MIMALLOC_PURGE_DELAY"] = "0"
    bench.KOORD = koord
    return bench.koord("hostile", PORT, os.path.join(ROOT, "bench", "state"),
                       "--memory-limit", str(LIMIT))


def tls_context(alpn=("http/1.1",)):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def connect(source="127.0.0.1", alpn=("http/1.1",)):
    raw = socket.create_connection(("127.0.0.1", PORT), timeout=30, source_address=(source, 0))
    return tls_context(alpn).wrap_socket(raw, server_hostname="localhost")


def request(path, body):
    return (f"POST {path}?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def status_of(sock):
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return "closed"
        data += chunk
    return data.split(b" ", 2)[1].decode()


def review(kind, resource, group, operation, obj, old=None):
    version = "v1alpha1" if group else "v1"
    request = {"uid": "u", "kind": {"group": group, "version": version, "kind": kind},
               "resource": {"group": group, "version": version, "resource": resource},
               "operation": operation, "userInfo": {"username": "bench"}, "object": obj,
               "oldObject": old}
    if obj.get("metadata", {}).get("namespace"):
        request["namespace"] = obj["metadata"]["namespace"]
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": request}, separators=(",", ":")).encode()


def reservation_volumes(size):
    volumes = [{"name": ""}] * (size // 12)
    obj = {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
           "metadata": {"name": "r", "labels": {"app": "a"}},
           "spec": {"template": {"spec": {"containers": [{"name": "c"}], "volumes": volumes}},
                    "owners": [{"object": {"name": "p"}}]}}
    return review("Reservation", "reservations", "scheduling.koordinator.sh", "CREATE", obj)


def reservation_kv_volumes(size):
    """A Reservation a profile of bench/state selects (`app: spark`), its template's volumes
    `{"":0}`: text no rule reads, made a JSON tree by the profile's patch and the differ."""
    volumes = [{"": 0}] * (size // 8)
    obj = {"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Reservation",
           "metadata": {"name": "r", "labels": {"app": "spark"}},
           "spec": {"template": {"spec": {"containers": [{"name": "c"}], "volumes": volumes}},
                    "owners": [{"object": {"name": "p"}}]}}
    return review("Reservation", "reservations", "scheduling.koordinator.sh", "CREATE", obj)


def slo_config_zeros(size):
    """A forged SLO ConfigMap whose colocation-config is `[[0],[0],...]`: one string to the
    review's estimate, millions of values to the check."""
    obj = {"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
           "data": {"colocation-config": "[" + ",".join(["[0]"] * (size // 4)) + "]"}}
    return review("ConfigMap", "configmaps", "", "CREATE", obj)


def pod_empty_containers(size):
    """A pod of empty containers, padded with empty strings where no rule reads (the estimate
    counts each 200 bytes): decoded, then copied by the mutating chain."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{}] * (size // 6), "padding": [""] * (size // 6)}}
    return review("Pod", "pods", "", "CREATE", pod)


def priority_update(size):
    def pod(priority):
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "default",
                             "labels": {"koordinator.sh/priority": priority}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}
    return review("Pod", "pods", "", "UPDATE", pod("x" * size), old=pod("1"))


def post_all(path, body, n):
    codes = []

    def one():
        try:
            s = connect()
            s.sendall(request(path, body))
            codes.append(status_of(s))
            s.close()
        except OSError as e:
            codes.append(type(e).__name__)
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return " ".join(sorted(set(f"{codes.count(c)}x{c}" for c in codes)))


def attack_reservation(server, n):
    return post_all("/mutate-reservation", reservation_volumes(1 << 20), n)


def attack_h2_streams(server):
    try:
        import h2.connection
        import h2.config
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "h2"], check=True)
        import h2.connection
        import h2.config
    try:
        s = connect(alpn=("h2",))
    except (ssl.SSLError, OSError) as e:
        return f"refused at the handshake ({type(e).__name__})"
    if s.selected_alpn_protocol() != "h2":
        return f"no h2 (ALPN {s.selected_alpn_protocol()})"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    sent = 0
    headers = [(":method", "POST"), (":path", "/validate-pod"), (":scheme", "https"), (":authority", "x")]
    try:
        for i in range(200_000):
            conn.send_headers(1 + 2 * i, headers)
            sent += 1
            if i % 1000 == 999:
                s.sendall(conn.data_to_send())
        s.sendall(conn.data_to_send())
        time.sleep(3)
    except Exception as e:  # the server may end the connection: what it did is the figure
        return f"{sent} streams opened, then {type(e).__name__}"
    return f"{sent} streams opened"


def attack_unread_denials(server):
    body = priority_update(4 << 20)
    held = []
    for _ in range(90):
        try:
            s = connect()
            s.sendall(request("/validate-pod", body))
            held.append(s)
        except OSError:
            pass
        time.sleep(0.05)
    time.sleep(3)
    # Whether the server still holds the connections after its write timeout.
    time.sleep(10)
    closed = 0
    for s in held:
        s.setblocking(False)
        try:
            s.recv(1)
        except ssl.SSLWantReadError:
            continue
        except OSError:
            closed += 1
    return f"{len(held)} sent; answers unread"


def attack_trickle(server):
    stop = threading.Event()
    body = priority_update(0)
    header = (f"POST /validate-pod HTTP/1.1\r\nHost: x\r\nContent-Length: {8 << 20}\r\n\r\n").encode()

    def trickler(source):
        socks = []
        for _ in range(4):
            try:
                s = connect(source)
                s.sendall(header + b" " * (4 << 20))
                socks.append(s)
            except OSError:
                pass
        while not stop.is_set():
            for s in socks:
                try:
                    s.send(b" ")
                except OSError:
                    pass
            time.sleep(1.5)
    threads = [threading.Thread(target=trickler, args=(f"127.0.0.{i}",)) for i in range(2, 6)]
    for t in threads:
        t.start()
    time.sleep(1)
    codes = []
    until = time.time() + 10
    while time.time() < until:
        try:
            s = connect("127.0.0.9")
            s.sendall(request("/validate-pod", body))
            codes.append(status_of(s))
            s.close()
        except OSError as e:
            codes.append(type(e).__name__)
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join()
    return f"another address: {codes.count('200')} of {len(codes)} answered 200, {codes.count('503')} refused 503"


def attack_handshakes(server):
    stop = threading.Event()
    opened = []

    def opener(source):
        while not stop.is_set():
            try:
                raw = socket.create_connection(("127.0.0.1", PORT), timeout=5, source_address=(source, 0))
                opened.append(raw)
            except OSError:
                time.sleep(0.01)
            if len(opened) > 8 * 256:
                time.sleep(0.05)
    threads = [threading.Thread(target=opener, args=(f"127.0.0.{i}",)) for i in range(10, 18)]
    for t in threads:
        t.start()
    time.sleep(1)
    times = []
    for _ in range(20):
        started = time.time()
        try:
            s = connect("127.0.0.1")
            times.append(time.time() - started)
            s.close()
        except OSError:
            times.append(float("inf"))
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join()
    for s in opened:
        s.close()
    return f"handshake median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"


def label_pod(size):
    labels = {f"k{i:07}": f"v{i:07}" for i in range(size // 24)}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "default", "labels": labels},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    return review("Pod", "pods", "", "CREATE", pod)


def attack_large_decodes_beside(server):
    stop = threading.Event()
    large = request("/mutate-pod", label_pod(3 << 20))
    small = request("/validate-pod", review("Pod", "pods", "", "CREATE", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}))

    def decoder():
        while not stop.is_set():
            try:
                s = connect("127.0.0.1")
                s.sendall(large)
                status_of(s)
                s.close()
            except OSError:
                time.sleep(0.05)
    threads = [threading.Thread(target=decoder) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(1)
    times, lost = [], 0
    for _ in range(40):
        started = time.time()
        try:
            s = connect("127.0.0.40")
            s.sendall(small)
            if status_of(s) == "200":
                times.append(time.time() - started)
            else:
                lost += 1
            s.close()
        except OSError:
            lost += 1
        time.sleep(0.25)
    stop.set()
    for t in threads:
        t.join()
    if not times:
        return "another address: none of 40 answered"
    return (f"another address, new connection + small review: median {statistics.median(times) * 1000:.0f} ms, "
            f"max {max(times) * 1000:.0f} ms, {lost} of 40 not answered")


def attack_half_heads(server, pipelined=False, addresses=8, head=127 << 10):
    """Each address opens as many connections as it is let (its cap, 256 by default), has one
    request answered on each, then sends most of a second request head and stops: kept-alive
    (after the answer) or pipelined (in the same write as the first request)."""
    first = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    half = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * head
    held, refused = [], [0]
    lock = threading.Lock()

    def opener(source):
        mine = []
        for _ in range(256):
            try:
                s = connect(source)
                if pipelined:
                    s.sendall(first + half)
                    status_of(s)
                else:
                    s.sendall(first)
                    status_of(s)
                    s.sendall(half)
                mine.append(s)
            except OSError:
                with lock:
                    refused[0] += 1
        with lock:
            held.extend(mine)
    threads = [threading.Thread(target=opener, args=(f"127.0.1.{i}",)) for i in range(1, addresses + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(2)
    # Whether another caller is still served meanwhile.
    try:
        s = connect("127.0.0.9")
        s.sendall(first)
        other = status_of(s)
        s.close()
    except OSError as e:
        other = type(e).__name__
    for s in held:
        s.close()
    return f"{len(held)} connections held a {head >> 10} KiB half head, {refused[0]} refused; another caller: {other}"


CASES = [
    ("reservation-volumes 1 MiB", lambda s: attack_reservation(s, 1)),
    ("reservation-volumes 1 MiB, 2 at once", lambda s: attack_reservation(s, 2)),
    ("reservation-volumes 1 MiB, 8 at once", lambda s: attack_reservation(s, 8)),
    ("reservation-volumes of {\"\":0} 2.7 MiB, a profile with a patch", lambda s: post_all("/mutate-reservation", reservation_kv_volumes(int(2.7 * (1 << 20))), 1)),
    ("SLO ConfigMap of [0] 7.9 MiB", lambda s: post_all("/validate-configmap", slo_config_zeros(int(7.9 * (1 << 20))), 1)),
    ("pod of empty containers 3.3 MiB, /mutate-pod", lambda s: post_all("/mutate-pod", pod_empty_containers(int(3.3 * (1 << 20))), 1)),
    ("h2-streams 200,000", attack_h2_streams),
    ("unread-denials 90 x 4 MiB", attack_unread_denials),
    ("trickle, 4 addresses", attack_trickle),
    ("handshakes, 8 addresses", attack_handshakes),
    ("large decodes beside, 8 x 3 MiB", attack_large_decodes_beside),
    ("half-heads kept-alive, 8 addresses x 256", attack_half_heads),
    ("half-heads pipelined, 8 addresses x 256", lambda s: attack_half_heads(s, pipelined=True)),
]


def run(label, koord):
    print(f"\n{label} ({koord}), --memory-limit 384Mi, MIMALLOC_PURGE_DELAY=0\n")
    print("| attack | idle MiB | peak MiB | peak / limit | outcome | replica alive |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for name, attack in CASES:
        if ONLY and not any(o in name for o in ONLY):
            continue
        server = start(koord)
        idle = server.rss()
        outcome = attack(server)
        peak = server.peak()
        alive = server.proc.poll() is None
        server.stop()
        print(f"| {name} | {idle:.1f} | {peak:.1f} | {peak * (1 << 20) / LIMIT:.2f} | {outcome} | {'yes' if alive else 'no'} |",
              flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--koord", required=True)
    parser.add_argument("--before")
    parser.add_argument("--only", action="append", default=[],
                        help="run only the attacks whose name contains this (repeatable)")
    args = parser.parse_args()
    ONLY.extend(args.only)
    bench.self_signed(bench.OUT, "bench")
    if args.before:
        run("before", args.before)
    run("after", args.koord)


if __name__ == "__main__":
    main()
