"""What the soak (bench/soak.py) reports and judges: the churn it asks for, its faults' names, the
limits `--check` applies, the slopes, the log lines per level, and the Markdown section."""
import collections
import datetime
import os
import re
import subprocess
import time

from scale import MIB
from scale_load import SIZES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "target", "bench", "soak")
# Per second. Each pod created is deleted POD_LIFE_S later, each quota created at the next create.
# Heartbeats: each of S's 1,000 nodes every 100 s (status patches; the node entries are `Ignore`,
# so they are not counted as admissions).
CHURN = {"dry-run pod create": 5, "pod create": 2, "node heartbeat": 10, "quota change": 0.5,
         "quota create": 0.1, "profile change": 1 / 60}
FOLLOWS = {"pod delete": "pod create", "quota delete": "quota create"}
POD_LIFE_S = 60
FAULTS = ["apiserver", "leader", "rotation", "secret", "watch"]
FAULT_NAMES = {"apiserver": "API-server restart", "leader": "leader replica killed",
               "rotation": "forced CA rotation", "secret": "serving Secret deleted", "watch": "watches dropped"}
# "Flat": the fitted rise across the window stays under these. A few connections open at a sample
# and metric series of a label value seen for the first time (a fault's first watch restart of a
# kind) stay under them; a leak of one fd or thread per fault, or of a series per request, does not.
FLAT_RISE = {"fds": 4, "threads": 2, "series": 20}
RSS_LIMIT_PER_H = MIB
# A process's first minutes after it starts or changes role are left out of its series: its cache
# filling, then the allocator and the pod index reaching their working set under the churn (in the
# 2026-11-29 runs a replacement follower rose ~4 MiB over 15-20 minutes to the plateau the long-lived
# replicas held from the start; a new leader stepped ~2.5 MiB over ~10 minutes: the leader's tasks).
# --check judges only series at least --check-span minutes long (over a few minutes a slope is
# mostly noise).
SETTLE_S = 10 * 60


def slope(points):
    """Least-squares slope per hour of (time s, value) points; None under 3 points."""
    if len(points) < 3:
        return None
    xs = [t / 3600 for t, _ in points]
    ys = [v for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None


LINE = re.compile(r"^(\S+)\s+(ERROR|WARN|INFO|DEBUG|TRACE)\s+(.*)$")


def log_levels(windows, t0, end):
    """Per slot: lines per level over every process's log until `end` (the replicas' own shutdown
    is not counted), and the ERROR and WARN messages (digits and quoted values folded) with how many
    fell outside the fault windows after `t0`."""
    out = {}
    for name in sorted(os.listdir(WORK)):
        m = re.match(r"replica-(\d)(?:-\d+)?\.log$", name)
        if not m:
            continue
        slot = out.setdefault(int(m.group(1)), {"levels": collections.Counter(), "messages": collections.Counter(),
                                                "outside": collections.Counter()})
        for line in open(os.path.join(WORK, name), errors="replace"):
            m2 = LINE.match(line.rstrip("\n"))
            if not m2:
                slot["levels"]["other"] += 1
                continue
            stamp, level, rest = m2.groups()
            t = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
            if t > end:
                continue
            slot["levels"][level] += 1
            if level in ("ERROR", "WARN"):
                key = f"{level} " + re.sub(r"\d{2,}", "N", re.sub(r'"[^"]*"', '"…"', rest))[:160]
                slot["messages"][key] += 1
                if t >= t0 and not any(a <= t <= b for a, b in windows):
                    slot["outside"][key] += 1
    return out


def fitted(points):
    """(first, last, slope per hour, span in hours, mean) of (seconds, value) points, or None."""
    k = slope(points)
    if k is None:
        return None
    return (points[0][1], points[-1][1], k, (points[-1][0] - points[0][0]) / 3600,
            sum(v for _, v in points) / len(points))


def process_table(args, t0, processes, samples):
    """The table of each replica process's series (RSS, fds, threads, metric series, API-server
    requests), each from SETTLE_S after the process started and after its last change of role, and
    what --check fails on in them."""
    minutes = lambda t: f"{(t - t0) / 60:.1f}"
    failures = []
    lines = ["", "| replica process | window (min) | RSS (first → last, slope) | fds | threads | metric series | "
                  "API-server requests/min |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    rows = [s for s in samples if "slot" in s]
    cl = [s for s in samples if "cluster" in s]
    for p in processes:
        all_mine = [s for s in rows if s["pid"] == p["pid"]]
        roles = [b["t"] for a, b in zip(all_mine, all_mine[1:]) if a.get("leader") != b.get("leader")]
        since = max(t0 + args.warmup * 60, p["started"] + SETTLE_S if p["started"] > t0 else 0,
                    roles[-1] + SETTLE_S if roles else 0)
        mine = [s for s in all_mine if s["t"] >= since]
        role = {1: "leader", 0: "follower"}.get(mine[-1].get("leader") if mine else None, "?")
        if len(mine) < 3:
            continue
        judged = (mine[-1]["t"] - mine[0]["t"]) / 60 >= args.check_span
        cells = []
        for key, unit, scale in (("rss", " MiB", MIB), ("fds", "", 1), ("threads", "", 1), ("series", "", 1)):
            f = fitted([(s["t"] - t0, s[key] / scale) for s in mine if s[key] is not None])
            if f is None:
                cells.append("-")
                continue
            first, last, k, span_h, mean = f
            digits = 1 if key == "rss" else 0
            cells.append(f"{first:.{digits}f} → {last:.{digits}f}{unit}, {k:+.2f}{unit}/h")
            if judged and key == "rss" and k * MIB >= RSS_LIMIT_PER_H:
                failures.append(f"{p['identity']}: RSS grows {k:.2f} MiB/h")
            elif judged and key != "rss" and k * span_h >= FLAT_RISE[key]:
                failures.append(f"{p['identity']}: {key} not flat ({k:+.2f}/h over {span_h * 60:.0f} min, "
                                f"mean {mean:.0f})")
        # Requests a minute between consecutive cluster samples within the process's window.
        counts = [(s["t"], s["requests"][p["slot"]]) for s in cl
                  if s["requests"] and mine[0]["t"] <= s["t"] <= mine[-1]["t"]]
        f = fitted([((a[0] + b[0]) / 2 - t0, (b[1] - a[1]) / (b[0] - a[0]) * 60) for a, b in zip(counts, counts[1:])])
        cells.append(f"{f[4]:.0f}, {f[2]:+.1f}/h" if f else "-")
        lines.append(f"| {p['identity']} (pid {p['pid']}, {role}, {len(roles)} role changes)"
                     f"{'' if judged else ', too short to judge'} | "
                     f"{minutes(mine[0]['t'])}–{minutes(mine[-1]['t'])} | " + " | ".join(cells) + " |")

    return lines, failures


def report(args, koord, t0, end, adm, cluster, faults, samples, levels, windows):
    """The Markdown section, and what --check fails on."""
    inside = lambda t: any(a <= t <= b for a, b in windows)
    minutes = lambda t: f"{(t - t0) / 60:.1f}"
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    built = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(koord)))
    shown = os.path.relpath(koord, ROOT) if koord.startswith(ROOT + os.sep) else koord
    size = SIZES[args.size]
    failures = []
    lines = [f"## Soak ({time.strftime('%Y-%m-%d')}): {(end - t0) / 60:.0f} minutes, two replicas, a fault every "
             f"{args.fault_every:g} minutes" + (f" for the first {args.faults_for:g}" if getattr(args, "faults_for", None)
                                       else ""), "",
             f"Commit {git('rev-parse', '--short', 'HEAD')}{dirty}, binary `{shown}` (built "
             f"{built}). State {args.size} ({size['nodes']:,} nodes, {size['pods']:,} pods, "
             f"{size['trees'] * (size['children'] + 1):,} quotas, {size['reservations']:,} Reservations, "
             f"{size['namespaces']:,} namespaces) through two kube-apiservers on one etcd, the churn alternating "
             f"between them; two replicas (leader election, `EnableQuotaAdmission`) as the installed "
             f"ServiceAccount, each reaching the first API server through a relay of its own. Samples every "
             f"{args.sample_every:g} s; slopes per hour by least squares over the samples after the first "
             f"{args.warmup:g} minutes, per process (a replica replaced by a fault starts a series of its own), "
             f"each from {SETTLE_S // 60} minutes after the process started and after its last change of role "
             f"(leader or follower, `koord_webhook_leader`); `--check` judges series of {args.check_span:g} "
             f"minutes or more. API-server requests: `apiserver_flowcontrol_dispatched_requests_total` of a "
             f"FlowSchema matching the replica's own group, summed across API-server restarts.", "",
             "| churn | rate asked | sent | failed | of them outside fault windows | 429 answered (retried) |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for kind in sorted(adm.sent):
        failed = [f for f in adm.failures if f[1] == kind]
        rate = (f"{CHURN[kind]:g}/s" if CHURN.get(kind, 0) >= 1 else f"{CHURN[kind] * 60:g}/min" if kind in CHURN
                else f"as {FOLLOWS[kind]}s")
        lines.append(f"| {kind} | {rate} | {adm.sent[kind]:,} | {len(failed)} | "
                     f"{sum(not inside(f[0]) for f in failed)} | {adm.busy[kind]} |")
    lines.append(f"| node heartbeat (`Ignore`: not counted) | {CHURN['node heartbeat']:g}/s | | | | |")

    table, judged_failures = process_table(args, t0, cluster.processes, samples)
    lines += table
    failures += judged_failures

    lines += ["", "| cluster | first → last | slope |", "| --- | ---: | ---: |"]
    for key, what, scale, unit in (("ledger_bytes", "quota ledger ConfigMap (data)", 1, " B"),
                                   ("record_bytes", "recent-admissions records, every quota", 1, " B"),
                                   ("record_entries", "recent-admissions records, every quota (entries)", 1, ""),
                                   ("apiserver_rss", "the second kube-apiserver's RSS (never restarted)", MIB, " MiB")):
        f = fitted([(s["t"] - t0, s[key] / scale) for s in cl
                    if s["t"] >= t0 + args.warmup * 60 and s[key] is not None])
        lines.append(f"| {what} | {f[0]:,.0f} → {f[1]:,.0f}{unit} | {f[2]:+,.1f}{unit}/h |" if f
                     else f"| {what} | - | - |")

    lines += ["", "| # | at (min) | fault | how | recovered after | failed admissions in its window |",
              "| ---: | ---: | --- | --- | ---: | ---: |"]
    for f, (a, b) in zip(faults, windows):
        took = f"{f['recovered'] - f['start']:.1f} s" if f["recovered"] else "**not recovered**"
        if not f["recovered"]:
            failures.append(f"fault {f['n']} ({FAULT_NAMES[f['kind']]}) not recovered")
        lines.append(f"| {f['n']} | {minutes(f['start'])} | {FAULT_NAMES[f['kind']]} | {f.get('how', '')} | {took} | "
                     f"{sum(a <= x[0] <= b for x in adm.failures)} |")
    for e in cluster.events:
        lines += ["", f"Replica {e['identity']} exited on its own (code {e['exit']}) at minute {minutes(e['t'])} and "
                      f"was replaced."]
        failures.append(f"{e['identity']} exited on its own ({e['exit']})")

    outside = [f for f in adm.failures if not inside(f[0])]
    lines += ["", f"Failed admissions: {len(adm.failures)} of {sum(adm.sent.values()):,} requests, {len(outside)} "
                  f"outside the fault windows (a fault's window: its start to its recovery + {args.grace:g} s; "
                  f"recovered: the fault's own condition, both replicas ready, three rounds of dry-run creates "
                  f"admitted through both API servers)."]
    by_cause = collections.Counter()
    for t, kind, cause in adm.failures:
        n = next((f["n"] for f, (a, b) in zip(faults, windows) if a <= t <= b), None)
        by_cause[(f"fault {n}" if n else "**outside**", kind, re.sub(r"\d{5,}", "N", cause)[:300])] += 1
    if by_cause:
        lines += ["", "| when | request | cause | count |", "| --- | --- | --- | ---: |"]
        for (when, kind, cause), count in sorted(by_cause.items()):
            lines.append(f"| {when} | {kind} | {cause.replace('|', '/')} | {count} |")
    failures += [f"minute {minutes(t)}: {kind} failed outside a fault window: {cause[:200]}"
                 for t, kind, cause in outside]

    lines += ["", "| replica | ERROR | WARN | INFO | DEBUG | other lines | ERROR/WARN outside fault windows |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    messages, outside_msgs = collections.Counter(), collections.Counter()
    for slot, l in sorted(levels.items()):
        counts = " | ".join(str(l["levels"][k]) for k in ("ERROR", "WARN", "INFO", "DEBUG", "other"))
        lines.append(f"| replica-{slot} (every process) | {counts} | {sum(l['outside'].values())} |")
        messages.update(l["messages"])
        outside_msgs.update(l["outside"])
    if messages:
        lines += ["", "| ERROR / WARN line (digits folded; both replicas) | lines | outside fault windows |",
                  "| --- | ---: | ---: |"]
        for msg, count in messages.most_common(15):
            lines.append(f"| `{msg.replace('|', '/').replace('`', '')}` | {count} | {outside_msgs[msg]} |")
    return "\n".join(lines), failures
