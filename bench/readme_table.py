#!/usr/bin/env python3
"""README's H200 performance table from one mla_graph_bench JSON (scripts/device-check table's table.json).

    bench/readme_table.py bench/results/DATE-h200-cuda-sNN-table.json [--old README.md]
    bench/readme_table.py --configs     # the graph-bench configs of its rows (scripts/device-check table runs them)
    bench/readme_table.py TABLE.json --flashmla DIR   # A-G against FlashMLA timed on the same GPU (session 52)

Prints the Markdown table, every row from the one run: the attend kernel and plan the run names,
attend µs (median of the run's CUDA-graph replays), % of the measured copy bandwidth (cache bytes
once), TFLOP/s, the step's graph µs, and the issue's comparison computed from the same run: FlashMLA's
bf16 time (issue 5's column) against ours for A-G, a page-1/16 row against its page-64 row, the
uneven batch against its even twin. --old puts the figure README's table had for the row beside it.
--flashmla DIR takes FlashMLA's times for A-G from scripts/flashmla-bench's JSONs in DIR, or from a session's
combined JSON in bench/results (FlashMLA's own kernel timed on the GPU of the table's run, in the same device call)
instead of issue 5's column, which another H200 measured: the issue asks "faster than FlashMLA on the same GPU".

Why: the table mixed rows of several sessions (each marked), so a change that moved every kernel left
rows stale; one run rendered by one script keeps it true (session 41).
"""
import argparse
import json
import re
import sys

# (label, config as the graph bench prints it, FlashMLA bf16 µs from issue 5 or None, the row it is a
# page or uneven variant of (its label) or None)
ROWS = [
    ("B=1, ctx 8192", "1:8192:1:64:fp8", None, None),
    ("B=64, ctx 8192, page 64", "64:8192:1:64:fp8", None, None),
    ("B=64, ctx 8192, page 16", "64:8192:1:16:fp8", None, "B=64, ctx 8192, page 64"),
    ("B=64, ctx 8192, page 1", "64:8192:1:1:fp8", None, "B=64, ctx 8192, page 64"),
    ("A: B=64, ctx 4096", "64:4096:1:64:fp8", 83.0, None),
    ("A at page 1", "64:4096:1:1:fp8", None, "A: B=64, ctx 4096"),
    ("B: B=128, ctx 16384", "128:16384:1:64:fp8", 565.0, None),
    ("B at page 1", "128:16384:1:1:fp8", None, "B: B=128, ctx 16384"),
    ("C: B=128, ctx 4096, 16 heads", "128:4096:1:64:fp8:16", 149.0, None),
    ("C at page 1", "128:4096:1:1:fp8:16", None, "C: B=128, ctx 4096, 16 heads"),
    ("D: B=64, ctx 8192, 128 heads", "64:8192:1:64:fp8:128", 224.0, None),
    ("D at page 1", "64:8192:1:1:fp8:128", None, "D: B=64, ctx 8192, 128 heads"),
    ("E: B=128, ctx 32768, 128 heads", "128:32768:1:64:fp8:128", 1821.0, None),
    ("96 heads, B=64, ctx 8192", "64:8192:1:64:fp8:96", None, None),
    ("96 heads at page 1", "64:8192:1:1:fp8:96", None, "96 heads, B=64, ctx 8192"),
    ("F: B=64, ctx 8192, qlen 4", "64:8192:4:64:fp8", 158.0, None),
    ("F at page 1", "64:8192:4:1:fp8", None, "F: B=64, ctx 8192, qlen 4"),
    ("G: B=32, ctx 8192, qlen 8", "32:8192:8:64:fp8", 120.0, None),
    ("G at page 1", "32:8192:8:1:fp8", None, "G: B=32, ctx 8192, qlen 8"),
    ("B=64, ctx 8192, qlen 2", "64:8192:2:64:fp8", None, None),
    ("qlen 2 at page 1", "64:8192:2:1:fp8", None, "B=64, ctx 8192, qlen 2"),
    ("one request, ctx 131072", "1:131072:1:64:fp8", None, None),
    ("128K at page 1", "1:131072:1:1:fp8", None, "one request, ctx 131072"),
    ("B=64, ctx 16384 (the uneven batch's even twin)", "64:16384:1:64:fp8", None, None),
    ("B=64, uneven ctx from [1, 32768]", "64:u32768:1:64:fp8", None, "B=64, ctx 16384 (the uneven batch's even twin)"),
    ("uneven at page 1", "64:u32768:1:1:fp8", None, "B=64, uneven ctx from [1, 32768]"),
    ("uneven F (qlen 4) at page 1", "64:u32768:4:1:fp8", None, None),
    ("D, bf16 query and cache", "64:8192:1:64:bf16:128", 224.0, None),
    ("F, bf16 query and cache", "64:8192:4:64:bf16", 158.0, None),
    ("G, bf16 query and cache", "32:8192:8:64:bf16", 120.0, None),
    ("B=64, ctx 8192, bf16 query and cache", "64:8192:1:64:bf16", None, None),
    ("the same, 16 heads", "64:8192:1:64:bf16:16", None, None),
    ("B=64, ctx 8192, bf16 query over the fp8 cache", "64:8192:1:64:bf16q", None, None),
    ("D with a bf16 query over the fp8 cache", "64:8192:1:64:bf16q:128", None, None),
    ("F with a bf16 query over the fp8 cache", "64:8192:4:64:bf16q", None, None),
    ("G with a bf16 query over the fp8 cache", "32:8192:8:64:bf16q", None, None),
    ("96 heads with a bf16 query over the fp8 cache", "64:8192:1:64:bf16q:96", None, None),
]


def config_of(r):
    """The graph bench's config string of a JSON result (B:CTX:Q:PAGE:KV[:HEADS])."""
    kv = r["kv_dtype"]
    ctx = ("u" if r.get("uneven") else "") + str(r["context"])
    s = f'{r["batch"]}:{ctx}:{r["qlen"]}:{r["page_size"]}:{kv}'
    if r["heads"] != 12:
        s += f':{r["heads"]}'
    return s


def flashmla_measured(where):
    """FlashMLA's median µs by (batch, heads, context, qlen) from scripts/flashmla-bench's JSONs: the files in a folder,
    or a session's combined JSON (bench/results' "...-flashmla-*.json": its "flashmla" object, by file name); its
    kernel's, not a probe's, and only those whose check passed; the last of a shape wins, in name order."""
    import glob
    import os
    if os.path.isdir(where):
        runs = [(f, json.load(open(f))) for f in sorted(glob.glob(os.path.join(where, "flashmla-*.json")))]
    else:
        runs = sorted(json.load(open(where))["flashmla"].items())
    out = {}
    for _, r in runs:
        if r.get("probe") or not r.get("check_ok"):
            continue
        out[(r["batch"], r["heads"], r["context"], r["qlen"])] = r["median_us"]
    return out


def old_figures(readme):
    """The attend µs README's H200 table had, by row label (its " (sNN)"-like note dropped): the first
    table whose header starts "| config | kernel | attend µs" (the H100 tables come after it)."""
    old, inside = {}, False
    for line in open(readme):
        if line.startswith("| config | kernel | attend µs"):
            inside = True
            continue
        if inside and not line.startswith("|"):
            break
        m = re.match(r"\| ([^|]+?) \| [^|]* \| ([0-9.]+) \|", line) if inside else None
        if m:
            old[re.sub(r" \((s\d+|ab run|s\d+ call \d+|s26 call 1)\)$", "", m.group(1).strip())] = m.group(2)
    return old


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="?")
    ap.add_argument("--old", help="README.md: its figures beside the new ones")
    ap.add_argument("--configs", action="store_true", help="print the rows' configs, one line, and stop")
    ap.add_argument("--flashmla", help="scripts/flashmla-bench's JSONs from the same GPU (a folder, or a session's "
                    "combined JSON with a 'flashmla' object): A-G against them")
    a = ap.parse_args()
    if a.configs:
        print(" ".join(cfg for _, cfg, _, _ in ROWS))
        return
    if not a.json:
        ap.error("a table JSON is needed (or --configs)")
    d = json.load(open(a.json))
    # (the JSON does not mark a config run with forced splits, e.g. full's 1:8192:1:64:fp8:12:43 after
    # 1:8192:1:64:fp8: the first of a config is the planner's)
    by_cfg = {}
    for r in d["results"]:
        by_cfg.setdefault(config_of(r), r)
    old = old_figures(a.old) if a.old else {}
    measured = flashmla_measured(a.flashmla) if a.flashmla else None
    us = {}
    print(f'{d["device"]}, {d["git_revision"][:7]}; copy {d["copy_gbps"]:.0f} GB/s, bf16 matmul '
          f'{d["matmul_tflops"]:.0f} TFLOP/s, {d["iters"]} replays', file=sys.stderr)
    last = "FlashMLA on this GPU" if measured is not None else "issue 5"
    print(f"| config | kernel | attend µs | % of copy | TFLOP/s | step µs (graph) | before | {last} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, cfg, flashmla, base in ROWS:
        r = by_cfg.get(cfg)
        if r is None:
            print(f"(no {cfg} in {a.json})", file=sys.stderr)
            continue
        t = r["attend_graph_us"]
        us[label] = t
        note = ""
        if flashmla and measured is not None:
            flashmla = measured.get((r["batch"], r["heads"], r["context"], r["qlen"]))
            if flashmla is None:
                print(f"(no FlashMLA JSON for {cfg} in {a.flashmla})", file=sys.stderr)
        if flashmla:
            fm = f"{flashmla:.1f}" if measured is not None else f"{flashmla:g}"  # (the figures as it gives them)
            note = f"{fm} ({flashmla / t:.2f}x ours)" if t < flashmla else f"{fm} ({t / flashmla:.3f}x slower)"
        if base in us:
            note = f"{t / us[base]:.3f}x {'its even twin' if 'twin' in base else 'page 64' if 'page 1' in label or 'page 16' in label else base}"
        pct = f'{r["attend_pct_copy"]:.1f}%'
        if r["kv_dtype"] == "bf16" and r["heads"] >= 96 or r["qlen"] >= 4 and r["kv_dtype"] == "bf16":
            pct += f' ({100 * r["attend_tflops"] / d["matmul_tflops"]:.1f}% of matmul)'
        print(f'| {label} | {r.get("attend_kernel", "")} | {t:.1f} | {pct} | {r["attend_tflops"]:.0f} | '
              f'{r["step_graph_us"]:.1f} | {old.get(label, "")} | {note} |')


if __name__ == "__main__":
    main()
