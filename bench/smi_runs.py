#!/usr/bin/env python3
"""Each graph-bench run's GPU clocks, power and temperature, from nvidia-smi's log beside it.

    python3 bench/smi_runs.py smi_TAG.csv smi_TAG_runs.txt

smi_TAG.csv: `nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,
clocks_throttle_reasons.active --format=csv,noheader,nounits -lms 50` (what `scripts/device-check`'s
ab_run writes under MLA_DC_SMI=1); smi_TAG_runs.txt: a line a run, "NAME/ROUND T0 T1" in seconds
since the epoch (`date +%s.%N` before and after the run). Prints, a run a line: the samples inside
its span, the SM clock's minimum, median and maximum (MHz), the memory clock's median, the power's
mean and maximum (W), the hottest temperature (C) and the throttle reasons seen (the bitwise or of the
samples' masks, hex; 0x0 none, 0x1 idle, 0x4 the power cap, 0x20 / 0x40 / 0x80 thermal ones).

Why: session 42 saw one build's E take 1659-1675 us in one call and 1840-1869 in the next on the same
H200; whether the faster runs had higher sustained clocks (power or thermal throttling) is the first
question (docs/attention-log.md's earlier queue, item 0). nvidia-smi's timestamp is local time, read here in the
same local time as the spans' epoch seconds.
"""
import datetime
import statistics
import sys


def parse_log(path):
    """[(epoch seconds, sm MHz, mem MHz, watts, celsius, throttle mask)]; lines that do not parse are skipped."""
    rows = []
    for line in open(path):
        f = [x.strip() for x in line.split(",")]
        if len(f) < 6:
            continue
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(f[1]), float(f[2]), float(f[3]), float(f[4]), int(f[5], 16)))
        except ValueError:
            continue
    return rows


def summarize(rows, runs):
    """A line a run: its samples' clocks, power, temperature and throttle reasons."""
    out = ["%-28s %7s %20s %8s %16s %6s %9s" % ("run", "samples", "sm MHz min/med/max", "mem MHz",
                                                "W mean/max", "max C", "throttle")]
    for name, t0, t1 in runs:
        inside = [r for r in rows if t0 <= r[0] <= t1]
        if not inside:
            out.append("%-28s %7d  (no samples in its span)" % (name, 0))
            continue
        sm = [r[1] for r in inside]
        watts = [r[3] for r in inside]
        mask = 0
        for r in inside:
            mask |= r[5]
        out.append("%-28s %7d %20s %8.0f %16s %6.0f %9s" % (
            name, len(inside), "%.0f/%.0f/%.0f" % (min(sm), statistics.median(sm), max(sm)),
            statistics.median(r[2] for r in inside), "%.0f/%.0f" % (statistics.fmean(watts), max(watts)),
            max(r[4] for r in inside), hex(mask)))
    return out


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    rows = parse_log(argv[1])
    runs = []
    for line in open(argv[2]):
        f = line.split()
        if len(f) == 3:
            runs.append((f[0], float(f[1]), float(f[2])))
    print("\n".join(summarize(rows, runs)))


if __name__ == "__main__":
    main(sys.argv)
