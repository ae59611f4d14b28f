"""Load for the dashboard picture: pod creates (dry-run) through the API server at a rate that
rises and falls, a fifth denied by /validate-pod, and reviews whose pod does not decode sent
straight to the webhook (errors); /metrics scraped every 2 s into a JSON-lines file (time, exposition text)."""
import argparse, json, math, ssl, threading, time, urllib.request, yaml

p = argparse.ArgumentParser()
p.add_argument("--kubeconfig"); p.add_argument("--webhook"); p.add_argument("--metrics")
p.add_argument("--seconds", type=float); p.add_argument("--out")
a = p.parse_args()
cfg = yaml.safe_load(open(a.kubeconfig))
server = cfg["clusters"][0]["cluster"]["server"]
user = cfg["users"][0]["user"]
api_ctx = ssl.create_default_context(cafile=cfg["clusters"][0]["cluster"]["certificate-authority"])
api_ctx.load_cert_chain(user["client-certificate"], user["client-key"])
insecure = ssl.create_default_context(); insecure.check_hostname = False; insecure.verify_mode = ssl.CERT_NONE
stop = time.time() + a.seconds
start = time.time()

def pod(i, denied):
    ann = {"scheduling.koordinator.sh/reserve-pod": "true"} if denied else {}
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": "load", "annotations": ann},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}}).encode()

def creates(worker):
    i = worker
    while time.time() < stop:
        t = time.time() - start
        rate = 12 + 10 * math.sin(t / 40)  # per worker per second
        req = urllib.request.Request(f"{server}/api/v1/namespaces/load/pods?dryRun=All",
                                     data=pod(i, i % 5 == 0), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, context=api_ctx, timeout=10).read()
        except Exception:
            pass
        i += 4
        time.sleep(1 / rate)

# An AdmissionReview whose pod does not decode: answered with a denial and counted as an error.
BAD = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
    "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
    "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
    "namespace": "load", "name": "bad", "userInfo": {"username": "load"},
    "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"}, "spec": "not a pod spec"}}}).encode()

def malformed():
    while time.time() < stop:
        req = urllib.request.Request(f"{a.webhook}/validate-pod?timeout=10s", data=BAD,
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, context=insecure, timeout=5).read()
        except Exception:
            pass
        time.sleep(0.5 + 0.5 * (time.time() - start > a.seconds / 2))

threads = [threading.Thread(target=creates, args=(w,)) for w in range(4)] + [threading.Thread(target=malformed)]
for t in threads: t.start()
with open(a.out, "w") as out:
    while time.time() < stop:
        text = urllib.request.urlopen(a.metrics, timeout=5).read().decode()
        out.write(json.dumps({"t": time.time(), "text": text}) + "\n"); out.flush()
        time.sleep(2)
for t in threads: t.join()
