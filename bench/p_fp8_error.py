#!/usr/bin/env python3
# How much of o's accuracy survives P rounded to fp8 for an fp8 p.v (QGMMA), against the f16 P the
# wgmma attend uses today (docs/attention.md, "fp8 P for p.v"). numpy only; runs in a second.
import numpy as np

def round_e4m3(x):
    # e4m3fn: 3 mantissa bits, exponent bias 7, min normal 2^-6, subnormal step 2^-9, max 448.
    a = np.abs(x)
    e = np.floor(np.log2(np.maximum(a, 1e-30)))
    e = np.maximum(e, -6)                     # subnormals share the 2^-6 binade's step
    step = 2.0 ** (e - 3)
    r = np.round(a / step) * step             # numpy rounds half to even
    return np.sign(x) * np.minimum(r, 448.0)

def round_e5m2(x):
    a = np.abs(x)
    e = np.maximum(np.floor(np.log2(np.maximum(a, 1e-30))), -14)
    step = 2.0 ** (e - 2)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 57344.0)

def round_f16(x):
    return x.astype(np.float16).astype(np.float64)

rng = np.random.default_rng(1)
print("keys  score_std  lazy | rel L2 of o:  f16 P     e4m3 P    e4m3 hi+lo  e4m3 hi+e5m2 lo")
for n in (512, 8192):
    for sd in (1.0, 3.0, 8.0):
        for lazy in (False, True):
            errs = {k: [] for k in ("f16", "e4m3", "hilo", "hi5")}
            for trial in range(20):
                s = rng.normal(0, sd, n) * np.log2(np.e)          # log2 units
                v = round_e4m3(rng.normal(0, 1, (n, 64)))          # fp8 cache values
                m = s.max() - (rng.uniform(0, 8) if lazy else 0)   # lazy rescale: max up to 2^8 above
                p = np.exp2(s - m)
                d = p.sum()
                exact = p @ v / d
                for k, q in (("f16", round_f16(p)), ("e4m3", round_e4m3(p)),
                             ("hilo", round_e4m3(p) + round_e4m3(p - round_e4m3(p))),
                             ("hi5", round_e4m3(p) + round_e5m2(p - round_e4m3(p)))):
                    o = q @ v / d
                    errs[k].append(np.linalg.norm(o - exact) / np.linalg.norm(exact))
            print(f"{n:5d}  {sd:6.1f}  {str(lazy):5s} |  " + "  ".join(f"{np.max(errs[k]):.2e}" for k in ("f16", "e4m3", "hilo", "hi5")))

print("\nP scaled by 2^8 before rounding (maxima exact, P <= 1 -> <= 256), hi + lo in one accumulator:")
print("keys  score_std | e4m3 P    e4m3 hi+lo")
for n in (512, 8192):
    for sd in (1.0, 3.0, 8.0):
        e1, e2 = [], []
        for trial in range(20):
            s = rng.normal(0, sd, n) * np.log2(np.e)
            v = round_e4m3(rng.normal(0, 1, (n, 64)))
            p = np.exp2(s - s.max()) * 256.0
            d = p.sum(); exact = p @ v / d
            hi = round_e4m3(p); lo = round_e4m3(p - hi)
            e1.append(np.linalg.norm(hi @ v / d - exact) / np.linalg.norm(exact))
            e2.append(np.linalg.norm((hi + lo) @ v / d - exact) / np.linalg.norm(exact))
        print(f"{n:5d}  {sd:6.1f}    | {max(e1):.2e}  {max(e2):.2e}")
