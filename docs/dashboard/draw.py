"""Draws the panels of docs/grafana-dashboard.json from /metrics scrapes (docs/dashboard/load.py).

Each panel's query is computed here from the raw expositions, the way Prometheus would over the
scrape interval: rates from counter deltas, quantiles from histogram bucket deltas (linear inside a
bucket, as histogram_quantile), gauges as read. Titles, layout and units come from the dashboard
file; PANELS maps each panel id to the computation of its query (a panel without one is an error)."""
import json, math, re, sys
from collections import defaultdict
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

def parse(text):
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = LINE.match(line)
        if m:
            out.append((m.group(1), dict(LABEL.findall(m.group(3) or "")), float(m.group(4))))
    return out

scrapes = [json.loads(l) for l in open(sys.argv[1])]
dash = json.load(open(sys.argv[2]))
t0 = scrapes[0]["t"]
samples = [(s["t"], parse(s["text"])) for s in scrapes]
WINDOW = 5  # scrapes (10 s) per rate, as $__rate_interval would be at this scrape interval

def series(name, keys, filt=lambda l: True):
    """{label tuple: [(t, value)]} summed over the other labels."""
    out = defaultdict(list)
    for t, ss in samples:
        acc = defaultdict(float)
        for n, l, v in ss:
            if n == name and filt(l):
                acc[tuple(l.get(k, "") for k in keys)] += v
        for k, v in acc.items():
            out[k].append((t, v))
    return out

def rate(name, keys):
    out = {}
    for k, pts in series(name, keys).items():
        out[k] = [(pts[i][0], max(0.0, pts[i][1] - pts[i - WINDOW][1]) / (pts[i][0] - pts[i - WINDOW][0]))
                  for i in range(WINDOW, len(pts))]
    return out

def quantile(q, name, keys):
    buckets = series(name + "_bucket", keys + ["le"])
    by = defaultdict(dict)
    for k, pts in buckets.items():
        by[k[:-1]][float(k[-1])] = pts
    out = {}
    for k, les in by.items():
        bounds = sorted(les)
        n = min(len(les[b]) for b in bounds)
        line = []
        for i in range(WINDOW, n):
            counts = [les[b][i][1] - les[b][i - WINDOW][1] for b in bounds]
            total = counts[-1]
            if total <= 0:
                continue
            rank = q * total
            for j, b in enumerate(bounds):
                if counts[j] >= rank:
                    lo = bounds[j - 1] if j else 0.0
                    below = counts[j - 1] if j else 0.0
                    hi = b if not math.isinf(b) else lo
                    width = counts[j] - below
                    line.append((les[b][i][0], lo + (hi - lo) * ((rank - below) / width if width else 0)))
                    break
        out[k] = line
    return out

def gauge(name, keys, f=lambda t, v: v, agg=sum):
    out = defaultdict(list)
    for t, ss in samples:
        acc = defaultdict(list)
        for n, l, v in ss:
            if n == name:
                acc[tuple(l.get(k, "") for k in keys)].append(v)
        for k, vs in acc.items():
            out[k].append((t, f(t, agg(vs))))
    return out

def increase(name, keys):
    out = {}
    for k, pts in series(name, keys).items():
        out[k] = [(t, v - pts[0][1]) for t, v in pts]
    return out

def label(prefix, k):
    return (prefix + " " + " ".join(x for x in k if x)).strip()

A = "koord_webhook_admission_"
PANELS = {
    1: lambda: [(label("", k), v) for k, v in rate(A + "requests_total", ["webhook"]).items()],
    2: lambda: [(label("p50", k), v) for k, v in quantile(0.5, A + "request_duration_seconds", ["webhook"]).items()]
             + [(label("p99", k), v) for k, v in quantile(0.99, A + "request_duration_seconds", ["webhook"]).items()],
    3: lambda: [(label("", k), v) for k, v in rate(A + "denials_total", ["webhook", "code"]).items()],
    4: lambda: [(label("", k), v) for k, v in rate(A + "errors_total", ["webhook", "kind"]).items()],
    5: lambda: [(label("", k), v) for k, v in gauge("koord_webhook_certificate_expiration_timestamp_seconds",
                                                   ["certificate"], lambda t, v: v - t, min).items()],
    6: lambda: [(label("in sync:", k), v) for k, v in gauge("koord_webhook_ca_bundle_in_sync", ["configuration"], agg=min).items()]
             + [("leaders", v) for v in gauge("koord_webhook_leader", []).values()],
    7: lambda: [(label("", k), v) for k, v in increase("koord_webhook_certificate_rotations_total", ["certificate"]).items()],
    8: lambda: [("RSS", v) for v in gauge("process_resident_memory_bytes", []).values()],
}

UNIT = {"reqps": "req/s", "s": "seconds", "short": "", "bytes": "bytes", "d": "days"}
plt.style.use("dark_background")
panels = dash["panels"]
rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) // 8
fig, axes = plt.subplots(rows, 2, figsize=(16, 3.6 * rows), facecolor="#111217")
for p in panels:
    ax = axes[p["gridPos"]["y"] // 8][p["gridPos"]["x"] // 12]
    ax.set_facecolor("#181b1f")
    lines = PANELS[p["id"]]()
    unit = p["fieldConfig"]["defaults"].get("unit", "")
    scale = 1.0
    if unit == "s" and all(v < 0.5 for _, pts in lines for _, v in pts):
        unit, scale = "ms", 1000.0  # as Grafana's unit picks its scale
    for name, pts in sorted(lines, key=lambda x: x[0]):
        if pts:
            ax.plot([t - t0 for t, _ in pts], [v * scale for _, v in pts], label=name, linewidth=1.4)
    if p["fieldConfig"]["defaults"].get("custom", {}).get("scaleDistribution", {}).get("type") == "log":
        ax.set_yscale("log")
    ax.set_title(p["title"], loc="left", fontsize=11, color="#ccccdc")
    ax.set_ylabel(UNIT.get(unit, unit), fontsize=8)
    ax.set_xlabel("seconds into the run", fontsize=8)
    ax.grid(color="#2c3235", linewidth=0.6)
    ax.tick_params(labelsize=8)
    if lines:
        ax.legend(fontsize=7, loc="upper left", framealpha=0.3)
fig.suptitle("koord-webhook (docs/grafana-dashboard.json) - drawn from /metrics of a real run", color="#ccccdc")
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=80, facecolor=fig.get_facecolor())
