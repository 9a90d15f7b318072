#!/usr/bin/env python3
"""The cycle a replicated reply waits, in parts, from a primary's epoch log (`tardi instance
--epoch-log`, kept by `KEEP_SCRATCH=1 bench/replication.sh redis` as SCRATCH/epochs-*.jsonl).

A client's request is answered in the open epoch; the reply is held until the epoch ends, is
paused and checkpointed, and its checkpoint is acknowledged by the backups; the client then
sends its next request. Per epoch that ended on output (medians over the last three quarters
of the log, skipping the warm-up), times in µs:

  resume->release   from the resume that opened the epoch to the release of the epoch before
                    it (the encoding, the publishing, the backups' acknowledgement)
  release->first    from that release to the first answer queued (the clients' and the
                    service's wake-ups)
  first->last       the answers coming in (the service's own speed)
  end               the epoch's length (resume to stop: `interval_us`)
  pause             the pause that ends it
  answered          the share of epochs whose answers all came in (packets >= the release's):
                    the others ended at the minimum epoch length
  publish, decide   the `decided` records: resume to checkpoint handed to the senders, and
                    from there to the last acknowledgement

Usage: bench/cycle_parts.py EPOCH_LOG.jsonl...   (asserts nothing; prints a table)"""
import json
import sys


def pct(v, p=0.5):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else None


def report(path):
    eps = [json.loads(line) for line in open(path) if line.strip()]
    eps = eps[len(eps) // 4:]
    out = [e for e in eps if e.get("ended_by") == "Output" and e.get("answers")]
    if not out:
        print(f"| {path} | no epoch ended on output with answers recorded |")
        return
    a = [e["answers"] for e in out]
    rel = [x["release_us"] for x in a if x["release_us"] is not None]
    first = [x["first_output_us"] - x["release_us"] for x in a
             if x["release_us"] is not None and x["first_output_us"] is not None
             and x["first_output_us"] >= x["release_us"]]
    spread = [x["last_output_us"] - x["first_output_us"] for x in a
              if x["first_output_us"] is not None and x["last_output_us"] is not None]
    answered = sum(1 for x in a if x["release_packets"] and x["packets"] >= x["release_packets"])
    dec = [e["decided"] for e in eps if e.get("decided")]
    cols = [
        ("epochs", len(out)),
        ("resume->release", pct(rel)),
        ("release->first", pct(first)),
        ("first->last", pct(spread)),
        ("end", pct([e["interval_us"] for e in out])),
        ("pause", pct([e["pause_us"] for e in out])),
        ("packets", pct([x["packets"] for x in a])),
        ("answered", f"{100 * answered / len(out):.0f}%"),
        ("publish", pct([d["publish_us"] for d in dec])),
        ("decide", pct([d["decide_us"] for d in dec])),
    ]
    if not report.header:
        print("| log | " + " | ".join(c[0] for c in cols) + " |")
        print("|---|" + "---:|" * len(cols))
        report.header = True
    print(f"| {path} | " + " | ".join(str(c[1]) for c in cols) + " |")


report.header = False

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for f in sys.argv[1:]:
        report(f)
