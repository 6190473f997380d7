#!/usr/bin/env python3
"""Where a tile's time goes in the bf16 many-rows kernel, from MLA_ROWS_BF16_TIMELINE's CSV (s52a).

    bench/rows_timeline.py FILE.csv [--mhz 1980] [--skip 2]

FILE is what `MLA_ROWS_BF16_TIMELINE=FILE mla_graph_bench --iters 5 64:8192:1:64:bf16:128` leaves (the last eager
launch's stamps: src/cuda/attend_rows_bf16.cu, kStamps): a line a tile, its events in SM cycles from the CTA's first
stamp. Prints, over every CTA's tiles past the first and before the last `--skip` (the steady state), the median and
the 10th / 90th percentiles of each interval in cycles (and µs at --mhz):

  period            the owner's q.k(t + 2) start minus q.k(t)'s, halved: a tile's share of the round
  load latency      the owner's part issued (tile t - 2's p.v retired) to q.k(t)'s first slab wait passed: the
                    latency a load shows where q.k waited for it (an upper bound where q.k came later)
  first slab wait   q.k(t) called to its first slab wait passed: what the owner waited for memory
  q.k issue         first slab passed to every slab waited for and q.k issued (s53b's round, the default since
                    session 53: through the other's publication and p.v, issued between q.k's two halves)
  to q.k done       q.k issued to the wait after which q.k(t) and the other's p.v(t - 1) have both retired
  softmax + pub.    q.k done to the publication barrier passed (mask, maxima, P, the barrier's wait)
  own p.v           published to the owner's p.v(t) retired (the tile's buffer part free)
  other's p.v wait  the other warpgroup's pv_other(t) barrier passed minus the owner's publication (both at one
                    bar.sync: ~0 unless a warpgroup was late)
  other part later  the other warpgroup's issue of its part of t minus the owner's (when the tile's second half of
                    its bytes left)
  late part to q.k  the later of t's two parts issued to q.k(t) issued: the whole tile's arrival as q.k saw it
  next part - done  the later part of t + 1 issued minus q.k(t) retired: ~+170 cycles in v18c's round (t + 1 leaves
                    only after q.k(t)), ~-780 in s53b's (it leaves at `wait<1>`, under the rest of q.k(t))
and the share of tiles whose t + 1 had both parts out before q.k(t) issued (two tiles' loads in flight at once).
Since session 55 a CTA's tiles are numbered across its segments (the flat plan's key-CTAs serve several requests
one after another) and each segment's start and end are stamped; where a CTA has more than one segment, a switch
from segment s to s + 1 (its first tile f) is reported as
  epilogue          the last tile's p.v retired (the later of its last two tiles') to segment s's end (o stored)
  end to start      segment s's end to s + 1's start (serve_segments' walk, the next serve's entry)
  start to q.k      s + 1's start to q.k(f)'s first slab wait passed (the query, the first loads' latency)
  switch in all     the last p.v retired to q.k(f) retired, against a period of two tiles
and each CTA's span (its first stamp to its last segment's end) with its segment count.

Why: the stall samples (sessions 46-51) say where warps waited, not how long a tile's load took or which step of the
round holds the next load back; these intervals do (docs/attention-log.md's earlier queue, items 3 (n) and (o)).
"""
import argparse
import csv
import statistics
import sys

EVENTS = ["issue_owner", "issue_other", "qk_start", "first_slab", "qk_issued", "qk_done", "published", "pv_done",
          "other_published"]
SEGMENT_EVENTS = ["segment_start", "segment_end"]  # (session 55; absent from older CSVs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--mhz", type=float, default=1980.0, help="SM clock for the µs column (the run's, from its JSON)")
    ap.add_argument("--skip", type=int, default=2, help="tiles left out at each end of a CTA's segment")
    a = ap.parse_args()
    ctas = {}
    for r in csv.DictReader(open(a.csv)):
        ctas.setdefault(int(r["cta"]), {})[int(r["tile"])] = {k: int(r.get(k) or -1) for k in EVENTS + SEGMENT_EVENTS}
    if not ctas:
        sys.exit(f"{a.csv}: no stamped tiles")
    intervals = {name: [] for name in ["period", "load latency", "first slab wait", "q.k issue", "to q.k done",
                                       "softmax + pub.", "own p.v", "other's p.v wait", "other part later",
                                       "late part to q.k", "next part - done"]}
    overlapped, counted = 0, 0

    def add(name, v):
        intervals[name].append(v)
    tiles_a_cta = []
    for tiles in ctas.values():
        n = max(tiles) + 1
        tiles_a_cta.append(n)
        # (the steady state of each segment: tiles near a later segment's start are left out too)
        starts = [t for t, e in tiles.items() if e["segment_start"] > 0 and t > 0]
        for t in range(a.skip, n - a.skip):
            e = tiles.get(t)
            if e is None or any(e[k] < 0 for k in EVENTS) or any(t - a.skip < f <= t + 2 + a.skip for f in starts):
                continue
            nxt = tiles.get(t + 2)
            if nxt and nxt["qk_start"] >= 0:
                add("period", (nxt["qk_start"] - e["qk_start"]) / 2)
            add("load latency", e["first_slab"] - e["issue_owner"])
            add("first slab wait", e["first_slab"] - e["qk_start"])
            add("q.k issue", e["qk_issued"] - e["first_slab"])
            add("to q.k done", e["qk_done"] - e["qk_issued"])
            add("softmax + pub.", e["published"] - e["qk_done"])
            add("own p.v", e["pv_done"] - e["published"])
            add("other's p.v wait", e["other_published"] - e["published"])
            add("other part later", e["issue_other"] - e["issue_owner"])
            add("late part to q.k", e["qk_issued"] - max(e["issue_owner"], e["issue_other"]))
            n1 = tiles.get(t + 1)
            if n1 and n1["issue_owner"] >= 0 and n1["issue_other"] >= 0:
                late_next = max(n1["issue_owner"], n1["issue_other"])
                add("next part - done", late_next - e["qk_done"])
                counted += 1
                overlapped += late_next < e["qk_issued"]
    print(f"{a.csv}: {len(ctas)} CTAs, {statistics.mean(tiles_a_cta):.1f} tiles a CTA; steady state (tiles "
          f"{a.skip} .. n - {a.skip + 1}); cycles, and µs at {a.mhz:.0f} MHz")
    print(f"  {'interval':<18} {'median':>8} {'p10':>8} {'p90':>8} {'median µs':>10}")
    for name, v in intervals.items():
        if not v:
            continue
        q = statistics.quantiles(v, n=10) if len(v) >= 10 else [min(v)] * 9
        med = statistics.median(v)
        print(f"  {name:<18} {med:8.0f} {q[0]:8.0f} {q[8]:8.0f} {med / a.mhz:10.3f}")
    if counted:
        print(f"  t + 1 wholly out before q.k(t) issued: {overlapped} of {counted} tiles ({100 * overlapped / counted:.0f}%)")
    segments(ctas, a.mhz)


def segments(ctas, mhz):
    """The segment switches and each CTA's span (the stamps of session 55 on)."""
    switch = {name: [] for name in ["epilogue", "end to start", "start to q.k", "switch in all"]}
    spans = {}
    for tiles in ctas.values():
        starts = sorted(t for t, e in tiles.items() if e["segment_start"] >= 0)
        ends = [e["segment_end"] for e in tiles.values() if e["segment_end"] >= 0]
        if not starts or not ends:
            continue
        spans.setdefault(len(starts), []).append(max(ends))
        for f in starts[1:]:
            last, prev, first = tiles.get(f - 1), tiles.get(f - 2), tiles[f]
            if last is None or last["segment_end"] < 0:
                continue
            pv = max(last["pv_done"], prev["pv_done"] if prev else -1)
            switch["epilogue"].append(last["segment_end"] - pv)
            switch["end to start"].append(first["segment_start"] - last["segment_end"])
            switch["start to q.k"].append(first["first_slab"] - first["segment_start"])
            switch["switch in all"].append(first["qk_done"] - pv)
    if not spans:
        return
    if any(switch.values()):
        print(f"  segment switches ({len(switch['epilogue'])}): cycles, median / min / max, and median µs")
        for name, v in switch.items():
            if v:
                med = statistics.median(v)
                print(f"  {name:<18} {med:8.0f} {min(v):8.0f} {max(v):8.0f} {med / mhz:10.3f}")
    for n, v in sorted(spans.items()):
        print(f"  CTAs of {n} segment(s): {len(v)}, span median {statistics.median(v) / mhz:.1f} µs, min "
              f"{min(v) / mhz:.1f}, max {max(v) / mhz:.1f}")


if __name__ == "__main__":
    main()
