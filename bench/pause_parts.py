#!/usr/bin/env python3
"""Median (p99 for the pause) of the pause and each of its parts, per case, from the per-epoch
JSON lines of bench/epochs.sh (bench/out/epochs-STAMP.jsonl) or from `tardi profile --out DIR`'s
epochs.json. Usage: bench/pause_parts.py [--json] FILE...
With --json, one JSON object per case instead of a table: pause_p50_us, pause_p99_us,
epochs_per_s (from time_us, when the epochs carry it), dirty_p50, the median of each part, and
the epochs' interval and encoding (interval_p50_us, encode_p50_us, encode_page_p50_us: the
encoding's time over the pages it encoded, among epochs of at least 500 pages; lengthened_share:
the share of epochs whose encoding ended past their interval, lengthening the next,
encode_overran_share)."""
import json, sys

PARTS = ["quiesce_us", "take_us", "precheck_us", "hot_us", "cow_us", "scan_us", "copy_us", "layout_us", "meta_checks_us",
         "meta_threads_us", "meta_process_us", "meta_fds_us", "meta_pending_us", "walk_us",
         "resume_us"]

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else 0

def report(case, eps):
    if not eps:
        return
    g = lambda k: [e.get(k, 0) for e in eps]
    pause = g("pause_us")
    known = [e["quiesce_us"] + e["scan_us"] + e["copy_us"] + sum(e.get(k, 0) for k in PARTS[7:])
             for e in eps]
    other = [p - k for p, k in zip(pause, known)]
    cols = [("epochs", len(eps)), ("dirty", pct(g("dirty_pages"), .5)),
            ("pause p50", pct(pause, .5)), ("p90", pct(pause, .9)), ("p99", pct(pause, .99)),
            ("pause cpu p50", pct(g("pause_cpu_us"), .5))]
    cols += [(k[:-3], pct(g(k), .5)) for k in PARTS] + [("unaccounted", pct(other, .5))]
    print(f"## {case}")
    print("| " + " | ".join(c for c, _ in cols) + " |")
    print("|" + "---:|" * len(cols))
    print("| " + " | ".join(str(int(v)) for _, v in cols) + " |")

def summary(eps):
    g = lambda k: [e.get(k, 0) or 0 for e in eps]
    out = {"epochs": len(eps), "pause_p50_us": pct(g("pause_us"), .5), "pause_p99_us": pct(g("pause_us"), .99),
           "pause_cpu_p50_us": pct(g("pause_cpu_us"), .5),
           "dirty_p50": pct(g("dirty_pages"), .5)}
    t = [e["time_us"] for e in eps if "time_us" in e]
    out["epochs_per_s"] = (len(t) - 1) / ((max(t) - min(t)) / 1e6) if len(t) > 1 and max(t) > min(t) else 0
    out.update({k[:-3] + "_p50_us": pct(g(k), .5) for k in PARTS})
    out["interval_p50_us"] = pct(g("interval_us"), .5)
    out["encode_p50_us"] = pct(g("encode_us"), .5)
    pages = lambda e: (e.get("dirty_pages", 0) or 0) + (e.get("fresh_pages", 0) or 0)
    out["encode_page_p50_us"] = round(pct([e["encode_us"] / pages(e) for e in eps
                                           if pages(e) >= 500 and "encode_us" in e], .5), 3)
    n = max(len(eps), 1)
    out["lengthened_share"] = sum(1 for e in eps if e.get("encode_late_us", 0)) / n
    out["encode_overran_share"] = sum(1 for e in eps if e.get("encode_overran")) / n
    return out

as_json = sys.argv[1:2] == ["--json"]
for path in sys.argv[1 + as_json:]:
    text = open(path).read().strip()
    cases = {}
    if text.startswith("["):
        for e in json.loads(text):
            if not e.get("summary"):
                cases.setdefault(path, []).append(e)
    else:
        for line in text.splitlines():
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if "stats" in o and "case" in o:
                cases.setdefault(o["case"], []).append(o["stats"])
    for c, eps in cases.items():
        if as_json:
            print(json.dumps(summary(eps)))
        else:
            report(c, eps)
