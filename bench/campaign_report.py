#!/usr/bin/env python3
"""Tables for docs/RELIABILITY.md from fault-campaign results (bench/campaign.sh writes
bench/out/campaign-STAMP/results.json). With several files, trials are pooled per fault.

Usage: bench/campaign_report.py RESULTS.json...
"""
import json
import sys


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]


def main(paths):
    trials, faults = [], []
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        print(f"- `{p}`: commit {r['commit']}, started {r['started_utc']} UTC, finished "
              f"{r['finished_utc']} UTC ({r['elapsed_s'] / 60:.0f} min), seed {r['seed']}, "
              f"{r['clients']} clients, lab rebuilds {r['lab_rebuilds']}, finished: {r['finished']}")
        trials += r["trials"]
        faults += [f for f in r["summary"] if f not in faults]
    order = ["primary", "backup", "leader", "partition"]
    faults.sort(key=lambda f: order.index(f) if f in order else len(order))
    print()
    print("| fault | trials | recovered | lost writes | linearizability violations | not checked "
          "| connections kept | gap p50 ms | p90 | p99 | max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in faults:
        ts = [t for t in trials if t["fault"] == f and t.get("started")]
        rec = [t for t in ts if t["recovered"]]
        gaps = [t["gap_ms"] for t in rec]
        lost = sum(t.get("lost_writes", 0) for t in ts)
        checked = [t for t in ts if t.get("checked")]
        viol = sum(1 for t in checked if not t["linearizable"])
        # Clients that never had to open a second connection (older results lack the count).
        kept = [(t["clients"] - t["clients_reconnected"], t["clients"])
                for t in ts if "clients_reconnected" in t]
        kept = f"{sum(k for k, _ in kept)}/{sum(n for _, n in kept)}" if kept else "—"
        print(f"| {f} | {len(ts)} | {len(rec)} | {lost} | {viol} | {len(ts) - len(checked)} "
              f"| {kept} | {pct(gaps, .5):.0f} | {pct(gaps, .9):.0f} | {pct(gaps, .99):.0f} "
              f"| {max(gaps, default=float('nan')):.0f} |")
    print()
    print("| fault | client operations (acknowledged / outcome unknown / error reply) | recovered after, p50 / max ms "
          "| victim back and steady after, p50 / max ms | gap starts after the fault, p50 ms "
          "| view changes | other |")
    print("|---|---|---|---|---:|---|---|")
    for f in faults:
        ts = [t for t in trials if t["fault"] == f and t.get("started")]
        ok = sum(t["ops_ok"] for t in ts)
        unk = sum(t["ops_unknown"] for t in ts)
        err = sum(t["ops_failed"] for t in ts)
        ra = [t["recovered_after_fault_ms"] for t in ts if t["recovered"]]
        back = [t["restored_after_fault_ms"] for t in ts if t["recovered"] and t["lab_ok_after"]]
        start = [t["gap_started_after_fault_ms"] for t in ts if t["recovered"]]
        changed = sum(1 for t in ts if t["view_after"] is not None and t["view_after"] != t["view_before"])
        other = ""
        if f == "partition":
            dep = sum(1 for t in ts if t.get("old_primary_deposed") is True)
            other = f"old primary's sandbox gone after the heal: {dep} of {len(ts)}"
        if f == "leader":
            other = f"trials whose service view changed (false failovers): {changed}"
        print(f"| {f} | {ok} / {unk} / {err} | {pct(ra, .5):.0f} / {max(ra, default=float('nan')):.0f} "
              f"| {pct(back, .5):.0f} / {max(back, default=float('nan')):.0f} | {pct(start, .5):.0f} "
              f"| {changed} of {len(ts)} | {other} |")
    slow = sorted((t for t in trials if t.get("recovered")), key=lambda t: -t["gap_ms"])[:5]
    print()
    print("Longest gaps:")
    for t in slow:
        views = "; ".join(
            f"view {h['view']} ({h['reason']}) proposed {h['proposed_ms'] - t['fault_unix_ms']} ms, "
            f"active {h['activated_ms'] - t['fault_unix_ms'] if h['activated_ms'] else '-'} ms after the fault"
            for h in t.get("views_since_fault", []))
        print(f"- {t['fault']} #{t['trial']}: gap {t['gap_ms']:.0f} ms from {t['gap_started_after_fault_ms']:.0f} ms "
              f"after the fault; recovered after {t['recovered_after_fault_ms']:.0f} ms"
              + (f"; {views}" if views else ""))
    notes = [(t["fault"], t["trial"], n) for t in trials for n in t.get("notes", [])]
    if notes:
        print()
        for f, n, note in notes:
            print(f"- {f} #{n}: {note[:300]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
