#!/usr/bin/env python3
"""Where a CTA's time goes around its segments in the fp8 many-rows kernel, from MLA_ROWS_TIMELINE's CSV (session 55).

    bench/rows_cta_timeline.py FILE.csv [--mhz 1980]

FILE is what `MLA_ROWS_TIMELINE=FILE mla_graph_bench --iters 5 64:8192:4:64:fp8` leaves (the last eager launch's
stamps: src/cuda/attend_rows_kernel.cuh, kStamps): a line a segment of a CTA, its phases in SM cycles from the CTA's
start. Prints the median, min and max over segments (or switches) of

  prologue          serve entered to the query stored and the consumers' barrier passed
  first tile wait   that barrier to warpgroup 0's wait for the segment's first tile passed
  a tile            the first tile landed to the last pair's p.v retired, over the segment's tiles (the stream)
  epilogue          the last p.v retired to o and lse stored, then its parts (session 56):
    wg 1 later      warpgroup 1's thread 0 past its last p.v, after warpgroup 0's
    to row sums     thread 0 past the row sums' second barrier (every consumer warp in the epilogue)
    to final state  thread 0 past the third barrier (the rows' final state in shared memory)
    stores          thread 0's o and lse stores issued
  end to entry      a segment's end to the next one's entry (serve_segments' walk: the next keys)
  switch in all     a segment's last p.v retired to the next one's first tile landed

and each CTA's span (its start to its last segment's end) by the number of segments it served. Where FILE.pairs.csv is
beside it (session 63, s67a: each consumer warpgroup's first 16 pairs of the CTA's first segment), also, by warpgroup,
the median of each pair's parts (pairs 1 on: pair 0 takes the first rescale):

  q.k               its first groups issued (and the previous p.v retired) to its last group summed
  weights, P^T      to P^T of both tiles written
  barrier, vote     to past the pair's barrier (both warpgroups' P^T; the lazy rescale's vote)
  p.v issue         to p.v's MMAs issued (its last step in flight)
  to next q.k       to the next pair's first q.k groups issued and this p.v retired
  pair              the whole pair

Why: under the flat plan (uneven batches, or MLA_ROWS_FILL=full) a key-CTA serves several requests one after another,
and the even shapes D, F, G ran 8-18% slower so than on fixed splits (session 55's call 4) though this kernel's
producer sends the next segment's tiles ahead: these stamps say which part of a switch costs it.
"""
import argparse
import csv
import os
import statistics
import sys


def row(name, values, mhz):
    if not values:
        return
    med = statistics.median(values)
    print(f"  {name:<18} {med:9.0f} {min(values):9.0f} {max(values):9.0f} {med / mhz:10.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--mhz", type=float, default=1980.0, help="SM clock for the µs column (the run's, from its JSON)")
    a = ap.parse_args()
    ctas = {}
    for r in csv.DictReader(open(a.csv)):
        ctas.setdefault(int(r["cta"]), []).append({k: int(v) for k, v in r.items()})
    if not ctas:
        sys.exit(f"{a.csv}: no stamped segments")
    names = ["prologue", "first tile wait", "a tile", "epilogue", "  wg 1 later", "  to row sums", "  to final state",
             "  stores", "end to entry", "switch in all"]
    parts = {name: [] for name in names}
    spans = {}
    for segs in ctas.values():
        segs.sort(key=lambda s: s["segment"])
        spans.setdefault(len(segs), []).append(segs[-1]["end"])
        for i, s in enumerate(segs):
            if min(s["entry"], s["prologue"], s["first_landed"], s["last_pv"], s["end"]) < 0:
                continue
            parts["prologue"].append(s["prologue"] - s["entry"])
            parts["first tile wait"].append(s["first_landed"] - s["prologue"])
            if s["tiles"] > 0:
                parts["a tile"].append((s["last_pv"] - s["first_landed"]) / s["tiles"])
            parts["epilogue"].append(s["end"] - s["last_pv"])
            if min(s.get("last_pv1", -1), s.get("sums", -1), s.get("final", -1)) >= 0:  # (since session 56)
                parts["  wg 1 later"].append(s["last_pv1"] - s["last_pv"])
                parts["  to row sums"].append(s["sums"] - s["last_pv"])
                parts["  to final state"].append(s["final"] - s["sums"])
                parts["  stores"].append(s["end"] - s["final"])
            if i + 1 < len(segs) and segs[i + 1]["entry"] >= 0:
                parts["end to entry"].append(segs[i + 1]["entry"] - s["end"])
                parts["switch in all"].append(segs[i + 1]["first_landed"] - s["last_pv"])
    rows = next(iter(ctas.values()))[0]["rows"]
    print(f"{a.csv}: {len(ctas)} CTAs of {rows} rows; cycles (median, min, max), and the median in µs at "
          f"{a.mhz:.0f} MHz")
    print(f"  {'interval':<18} {'median':>9} {'min':>9} {'max':>9} {'median µs':>10}")
    for name, v in parts.items():
        row(name, v, a.mhz)
    for n, v in sorted(spans.items()):
        print(f"  CTAs of {n} segment(s): {len(v)}, span median {statistics.median(v) / a.mhz:.1f} µs, min "
              f"{min(v) / a.mhz:.1f}, max {max(v) / a.mhz:.1f}")
    pairs_csv = a.csv + ".pairs.csv"
    if os.path.exists(pairs_csv):
        pair_parts(pairs_csv, a.mhz)


def pair_parts(path, mhz):
    rows = list(csv.DictReader(open(path)))
    runs = {}  # (cta, wg) -> pairs in order
    for r in rows:
        runs.setdefault((int(r["cta"]), int(r["wg"])), []).append({k: int(v) for k, v in r.items()})
    # (RowsPairStamp's order; pt_free since session 66: the masks, the growth check and the wait for the other
    # warpgroup's previous p.v, split off the weights)
    events = [e for e in ["qk_issued", "qk_done", "pt_free", "p_written", "voted", "pv_issued"]
              if not rows or e in rows[0]]
    labels = {"qk_done": "q.k", "pt_free": "masks, P^T free", "p_written": "weights, P^T", "voted": "barrier, vote",
              "pv_issued": "p.v issue"}
    if "pt_free" not in events:
        labels["p_written"] = "masks, weights, P^T"
    names = [(labels[events[i + 1]], events[i], events[i + 1]) for i in range(len(events) - 1)]
    for wg in sorted({w for _, w in runs}):
        parts = {name: [] for name, _, _ in names}
        parts["to next q.k"], parts["pair"] = [], []
        for (cta, w), ps in runs.items():
            if w != wg:
                continue
            ps.sort(key=lambda p: p["pair"])
            for i, p in enumerate(ps):
                if p["pair"] == 0 or min(p[k] for k in events) < 0:  # (-1: not stamped)
                    continue
                for name, start, end in names:
                    parts[name].append(p[end] - p[start])
                if i + 1 < len(ps) and ps[i + 1]["qk_issued"] >= 0:
                    parts["to next q.k"].append(ps[i + 1]["qk_issued"] - p["pv_issued"])
                    parts["pair"].append(ps[i + 1]["qk_issued"] - p["qk_issued"])
        print(f"{path}: warpgroup {wg}, pairs 1 on of each CTA's first segment ({len(parts['pair'])} whole pairs)")
        print(f"  {'interval':<18} {'median':>9} {'min':>9} {'max':>9} {'median µs':>10}")
        for name, v in parts.items():
            row(name, v, mhz)
        if rows and "next_landed" in rows[0]:
            next_landed(runs, wg, events)


def next_landed(runs, wg, events):
    """next_landed (session 67): the first stamp from q.k's end on at which the next pair's first q.k tile had landed
    (polled there without waiting; -1: not by p.v's issue). Pairs 1 on with a next pair in the stamps (as the parts
    above: pair 0's next tiles went out in the prologue), by that stamp."""
    points = [e for e in events if e != "qk_issued"]
    count = {e: 0 for e in points}
    count["later"] = 0
    total = 0
    for (cta, w), ps in runs.items():
        if w != wg:
            continue
        for i, p in enumerate(ps):
            if p["pair"] == 0 or i + 1 >= len(ps) or min(p[k] for k in events) < 0:
                continue
            total += 1
            t = p["next_landed"]  # (polled just after a stamp: counted at the last stamp at or before it)
            seen = [e for e in points if 0 <= p[e] <= t] if t >= 0 else []
            count[seen[-1] if seen else "later"] += 1
    if total:
        shares = ", ".join(f"{e} {100 * n / total:.0f}%" for e, n in count.items())
        print(f"  next pair's first tile seen landed at: {shares} ({total} pairs)")


if __name__ == "__main__":
    main()
