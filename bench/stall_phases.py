#!/usr/bin/env python3
"""Stall samples of an attend kernel by phase, from `ncu --page source --csv --print-source sass`
(scripts/device-check profile-rows writes rows_source.csv).

    python3 bench/stall_phases.py rows_source.csv [--top 30]

Phases are cut at landmarks in address order: the tile wait (SYNCS.PHASECHK and its retry loop),
q.k (from the first QGMMA's WARPGROUP.ARRIVE to the instruction before the first FSEL after the
last QGMMA), softmax (to the WARPGROUP.ARRIVE before the first HGMMA), p.v (to the last HGMMA's
WARPGROUP.DEPBAR and the waits right after it), and the rest (prologue, epilogue, TMA issue paths
inside those spans are counted where they sit). Prints samples a phase with its top stall reasons,
then the instructions with the most samples. For the bf16 many-rows kernel (no QGMMA) only the tile waits
are a phase (MLA_PROFILE_KERNEL=attend_rows_bf16)."""
import csv, sys, collections

def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index('--top') + 1]) if '--top' in sys.argv else 30
    rows = list(csv.reader(open(path)))
    hdr_i = next(i for i, r in enumerate(rows) if r and r[0] == 'Address')
    hdr = rows[hdr_i]
    data = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
    col = {h: i for i, h in enumerate(hdr)}
    stall_cols = [h for h in hdr if h.startswith('stall_') and '(Not Issued)' not in h]
    num = lambda r, h: float(r[col[h]] or 0)
    src = [r[col['Source']] for r in data]
    op = [s.split()[0] if not s.startswith('@') else s.split()[1] for s in src]
    n = len(data)
    first = lambda pred, start=0: next((i for i in range(start, n) if pred(i)), None)
    q0 = first(lambda i: op[i].startswith('QGMMA'))
    phase = ['other'] * n
    if q0 is None:
        # The bf16 many-rows kernel (HGMMA only, its two warpgroups' rounds interleaved in the code): no phase
        # landmarks; its mbarrier waits still count as tile waits below, the rest as other.
        print('(no QGMMA: not the fp8 many-rows kernel, so only the tile waits are cut out as a phase)')
    else:
        # p.v's MMAs: HGMMA, or QGMMA of another shape than q.k's (an fp8 p.v: s65a's profile, session 63)
        qk_shape = op[q0].split('.')[1]
        is_pv = lambda i: op[i].startswith('HGMMA') or (op[i].startswith('QGMMA') and op[i].split('.')[1] != qk_shape)
        q1 = max(i for i in range(n) if op[i].startswith('QGMMA') and not is_pv(i))
        h0 = first(is_pv)
        h1 = max(i for i in range(n) if is_pv(i))
        qs = max(i for i in range(q0) if op[i].startswith('WARPGROUP.ARRIVE') or i == 0)
        w0 = max((i for i in range(qs) if op[i].startswith('SYNCS.PHASECHK')), default=qs)
        sm0 = first(lambda i: op[i].startswith('FSEL'), q1) or q1 + 1
        pv0 = max(i for i in range(h0) if op[i].startswith('WARPGROUP.ARRIVE'))
        pv1 = first(lambda i: not op[i].startswith('WARPGROUP.DEPBAR'), h1 + 2) or h1 + 1
        for i in range(n):
            if w0 - 4 <= i < qs: phase[i] = 'tile wait'
            elif qs <= i < sm0: phase[i] = 'q.k'
            elif sm0 <= i < pv0: phase[i] = 'softmax'
            elif pv0 <= i < pv1: phase[i] = 'p.v'
    # the tile wait's retry loop sits out of line: SYNCS.PHASECHK anywhere counts as tile wait; in the bf16
    # kernel also the branch just after it (the try-wait's `@!P0 BRA`, where the waiting warps' samples land;
    # the fp8 kernel's phases stay cut as sessions 17-44 read them)
    for i in range(n):
        if op[i].startswith('SYNCS.PHASECHK'):
            phase[i] = 'tile wait'
            nxt = first(lambda k: op[k] == 'BRA', i + 1) if q0 is None else None
            if nxt is not None and nxt <= i + 6: phase[nxt] = 'tile wait'
    total = sum(num(r, 'Warp Stall Sampling (All Samples)') for r in data)
    by = collections.defaultdict(lambda: collections.Counter())
    for i, r in enumerate(data):
        by[phase[i]]['samples'] += num(r, 'Warp Stall Sampling (All Samples)')
        by[phase[i]]['instructions'] += num(r, 'Instructions Executed')
        for h in stall_cols: by[phase[i]][h] += num(r, h)
        # samples with no reason in the CSV's columns (on Hopper: warps waiting on their wgmma)
        by[phase[i]]['stall_unlisted'] += max(0.0, num(r, 'Warp Stall Sampling (All Samples)') - sum(num(r, h) for h in stall_cols))
    print(f'{path}: {n} SASS instructions, {total:.0f} stall samples')
    for ph in ['tile wait', 'q.k', 'softmax', 'p.v', 'other']:
        c = by[ph]
        reasons = sorted(((c[h], h[6:]) for h in stall_cols + ['stall_unlisted']), reverse=True)[:5]
        print(f'{ph:10s} {100 * c["samples"] / total:5.1f}% of samples, {c["instructions"]:12.0f} warp instructions | ' +
              ', '.join(f'{k} {100 * v / max(c["samples"], 1):.0f}%' for v, k in reasons))
    print(f'\ntop {top} instructions by samples (index, phase, share, top reasons):')
    order = sorted(range(n), key=lambda i: -num(data[i], 'Warp Stall Sampling (All Samples)'))[:top]
    for i in order:
        s = num(data[i], 'Warp Stall Sampling (All Samples)')
        listed = [(num(data[i], h), h[6:]) for h in stall_cols]
        listed.append((max(0.0, s - sum(v for v, _ in listed)), 'unlisted'))
        reasons = sorted(listed, reverse=True)[:3]
        print(f'{i:5d} {phase[i]:9s} {100 * s / total:5.1f}%  {src[i][:60]:60s} ' +
              ', '.join(f'{k} {100 * v / max(s, 1):.0f}%' for v, k in reasons if v))

main()
