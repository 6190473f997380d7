"""The Python module (python/mla_decode.cpp) against numpy float64 on fresh random inputs.

Run by ctest (label python) with PYTHONPATH at the built module; each test builds its own small
kimi-k3-shaped layer (hidden 512, q LoRA rank 128, 12 heads). The CUDA test needs torch with a GPU
and skips with a message elsewhere.
"""
import os
import unittest

import numpy as np

import mla_decode as mla


def e4m3_table():
    """float64 value of each of the 256 fp8 e4m3 codes (NaN at 0x7F and 0xFF)."""
    b = np.arange(256)
    sign = np.where(b >> 7, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 7
    val = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
    val = sign * val
    val[(e == 15) & (m == 7)] = np.nan
    return val


E4M3 = e4m3_table()
_FINITE = np.flatnonzero(~np.isnan(E4M3))
_ORDER = _FINITE[np.argsort(E4M3[_FINITE])]


def to_e4m3(x):
    """The nearest finite e4m3 code of each value (saturating at +-448)."""
    values = E4M3[_ORDER]
    i = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lower_closer = np.abs(x - values[i - 1]) <= np.abs(values[i] - x)
    return _ORDER[np.where(lower_closer, i - 1, i)].astype(np.uint8)


def bf16_to_f64(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def f32_to_bf16(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def small_config():
    cfg = mla.LayerConfig.preset("kimi-k3")
    cfg.hidden, cfg.q_lora_rank = 512, 128
    return cfg


class Step:
    """A batch over a shuffled paged cache: history rows random, every other row NaN."""

    def __init__(self, rng, cfg, contexts, qlen, page_size, kv="fp8", sigma=1.0):
        self.qlen, self.page_size, B = qlen, page_size, len(contexts)
        self.seq_lens = np.array([c + qlen for c in contexts], np.int32)
        pages = [(int(n) + page_size - 1) // page_size for n in self.seq_lens]
        total = sum(pages) + 2  # two pages no request owns
        order = rng.permutation(total).astype(np.int32)
        self.kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        self.kv_indices = order[: self.kv_indptr[-1]].copy()
        shape = (total, page_size, cfg.row_dim)
        if kv == "fp8":  # stored values ~ N(0, sigma), NaN where no request has a row
            self.cache = np.full(shape, 0x7F, np.uint8)
            fill = lambda n: to_e4m3(rng.standard_normal(n) * sigma)
        else:
            self.cache = np.full(shape, 0x7FC0, np.uint16)  # NaN
            fill = lambda n: f32_to_bf16(rng.standard_normal(n) * 0.5)
        self.slot_mapping = np.empty(B * qlen, np.int64)
        for b in range(B):
            ids = self.kv_indices[self.kv_indptr[b] : self.kv_indptr[b + 1]]
            for pos in range(int(self.seq_lens[b])):
                page, off = ids[pos // page_size], pos % page_size
                if pos < contexts[b]:
                    self.cache[page, off] = fill(cfg.row_dim)
                else:
                    self.slot_mapping[b * qlen + pos - contexts[b]] = page * page_size + off
        self.tokens = B * qlen

    def meta(self):
        return dict(seq_lens=self.seq_lens, kv_indptr=self.kv_indptr, kv_indices=self.kv_indices, qlen=self.qlen)

    def rows(self, b, decode):
        """Request b's visible rows in position order, float64."""
        ids = self.kv_indices[self.kv_indptr[b] : self.kv_indptr[b + 1]]
        n = int(self.seq_lens[b])
        pos = np.arange(n)
        return decode(self.cache[ids[pos // self.page_size], pos % self.page_size])


def attend_reference(step, q, scale, v_scale, decode_q, decode_k):
    """o [S, G, L] and lse [S, G] in float64: token i of request b sees positions < len - Q + i + 1."""
    S, G, _ = q.shape
    L = 512
    o, lse = np.zeros((S, G, L)), np.zeros((S, G))
    for b in range(len(step.seq_lens)):
        rows = step.rows(b, decode_k)
        for i in range(step.qlen):
            s = b * step.qlen + i
            visible = int(step.seq_lens[b]) - step.qlen + i + 1
            k = rows[:visible]
            scores = decode_q(q[s]) @ k.T * scale  # [G, visible]
            m = scores.max(axis=1, keepdims=True)
            p = np.exp(scores - m)
            o[s] = (p @ k[:, :L]) / p.sum(axis=1, keepdims=True) * v_scale
            lse[s] = (m[:, 0] + np.log(p.sum(axis=1)))
    return o, lse


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


class CpuLayer(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        self.cfg = small_config()
        self.weights = mla.prepare_weights(self.cfg, mla.random_checkpoint_weights(self.cfg, seed=3))
        self.layer = mla.Layer(self.cfg, self.weights, backend="cpu", max_tokens=16, num_threads=2)

    def test_attend_matches_float64_on_strided_padded_query(self):
        scale = self.cfg.sm_scale * self.weights.q_scale * self.weights.k_scale
        # stored values whose scaled scores spread by ~2 (softmax neither flat nor one-hot)
        sigma = (2.0 / (scale * np.sqrt(self.cfg.row_dim))) ** 0.5
        for page_size in (1, 16, 64):
            with self.subTest(page_size=page_size):
                step = Step(self.rng, self.cfg, contexts=[37, 0, 130], qlen=2, page_size=page_size, sigma=sigma)
                G = self.layer.query_heads
                q_pad = to_e4m3(self.rng.standard_normal((step.tokens, G + 4, self.cfg.row_dim)) * sigma)
                q = q_pad[:, :G]  # a strided view: the head stride is G + 4 rows
                o = np.full((step.tokens, G, 512), np.nan, np.float32)  # poisoned
                lse = np.full((step.tokens, G), np.nan, np.float32)
                # rows of this step's tokens are written by pre; attend reads them: fill them here
                for slot in step.slot_mapping:
                    step.cache.reshape(-1, self.cfg.row_dim)[slot] = to_e4m3(
                        self.rng.standard_normal(self.cfg.row_dim) * sigma)
                self.layer.attend(q, step.cache, o=o, lse=lse, **step.meta())
                o_ref, lse_ref = attend_reference(step, q, scale, self.weights.k_scale, lambda x: E4M3[x],
                                                  lambda x: E4M3[x])
                self.assertLess(rel_l2(o, o_ref), 1e-4)
                self.assertLess(float(np.abs(lse - lse_ref).max()), 1e-3)

    def test_step_equals_its_stages_and_writes_only_its_rows(self):
        step = Step(self.rng, self.cfg, contexts=[200, 5, 0, 77], qlen=1, page_size=16)
        hidden = f32_to_bf16(self.rng.standard_normal((step.tokens, self.cfg.hidden)))
        before = step.cache.copy()
        out = np.full((step.tokens, self.cfg.heads * self.cfg.v_head_dim), 0x7FC0, np.uint16)
        self.layer.step(hidden, slot_mapping=step.slot_mapping, cache=step.cache, out=out, **step.meta())
        # the attend kernel it ran: on the CPU its instruction set's
        self.assertIn(self.layer.last_attend_kernel, ("cpu avx512-bf16", "cpu avx512", "cpu avx2"))
        written = np.zeros(step.cache.reshape(-1, self.cfg.row_dim).shape[0], bool)
        written[step.slot_mapping] = True
        flat_before, flat_after = before.reshape(written.size, -1), step.cache.reshape(written.size, -1)
        self.assertTrue(np.array_equal(flat_before[~written], flat_after[~written]), "rows outside slot_mapping")
        self.assertFalse(np.array_equal(flat_before[written], flat_after[written]), "the step's rows")
        # the same through the three stages, on the cache as it was
        step.cache[...] = before
        G = self.layer.query_heads
        q = np.empty((step.tokens, G, self.cfg.row_dim), np.uint8)
        gate = np.empty((step.tokens, self.cfg.gate_dim), np.uint16)
        o = np.empty((step.tokens, G, 512), np.float32)
        lse = np.empty((step.tokens, G), np.float32)
        out2 = np.empty_like(out)
        self.layer.pre(hidden, slot_mapping=step.slot_mapping, cache=step.cache, q=q, gate=gate, **step.meta())
        self.layer.attend(q, step.cache, o=o, lse=lse, **step.meta())
        meta = step.meta()
        self.layer.post(o, lse, gate, meta["seq_lens"], meta["kv_indptr"], meta["kv_indices"], out2, qlen=step.qlen)
        a, b = bf16_to_f64(out), bf16_to_f64(out2)
        self.assertTrue(np.isfinite(a).all())
        self.assertLess(rel_l2(a, b), 1e-2)

    def test_layers_sharing_a_workspace_step_as_their_own(self):
        ws = mla.Workspace()
        self.assertEqual(ws.bytes, 0)
        small = mla.Layer(self.cfg, self.weights, backend="cpu", max_tokens=4, num_threads=2, workspace=ws)
        large = mla.Layer(self.cfg, self.weights, backend="cpu", max_tokens=16, num_threads=2, workspace=ws)
        self.assertGreater(ws.bytes, 0)
        self.assertEqual(ws.device, "cpu")
        step = Step(self.rng, self.cfg, contexts=[120, 9, 0], qlen=1, page_size=16)
        hidden = f32_to_bf16(self.rng.standard_normal((step.tokens, self.cfg.hidden)))
        before = step.cache.copy()
        outs = []
        for layer in (self.layer, small, large, small):
            step.cache[...] = before
            out = np.full((step.tokens, self.cfg.heads * self.cfg.v_head_dim), 0x7FC0, np.uint16)
            layer.step(hidden, slot_mapping=step.slot_mapping, cache=step.cache, out=out, **step.meta())
            outs.append(out)
        for out in outs[1:]:
            self.assertTrue(np.array_equal(out, outs[0]))

    def test_bad_input_is_rejected_naming_the_argument_and_the_cache_stays(self):
        step = Step(self.rng, self.cfg, contexts=[10, 20], qlen=1, page_size=16)
        hidden = f32_to_bf16(self.rng.standard_normal((step.tokens, self.cfg.hidden)))
        out = np.empty((step.tokens, self.cfg.heads * self.cfg.v_head_dim), np.uint16)
        before = step.cache.copy()
        with self.assertRaisesRegex(mla.Error, "hidden"):  # f32 where bf16 goes
            self.layer.step(hidden.astype(np.float32), slot_mapping=step.slot_mapping, cache=step.cache, out=out,
                            **step.meta())
        bad = step.slot_mapping.copy()
        bad[1] = step.cache.shape[0] * step.page_size  # one past the last row
        with self.assertRaisesRegex(mla.Error, "slot_mapping"):
            self.layer.step(hidden, slot_mapping=bad, cache=step.cache, out=out, **step.meta())
        with self.assertRaisesRegex(mla.Error, "seq_lens"):  # i64 where i32 goes
            meta = step.meta()
            meta["seq_lens"] = meta["seq_lens"].astype(np.int64)
            self.layer.step(hidden, slot_mapping=step.slot_mapping, cache=step.cache, out=out, **meta)
        with self.assertRaisesRegex(mla.Error, "out"):  # read-only output
            ro = out.copy()
            ro.flags.writeable = False
            self.layer.step(hidden, slot_mapping=step.slot_mapping, cache=step.cache, out=ro, **step.meta())
        self.assertTrue(np.array_equal(before, step.cache), "a rejected step changed the cache")

    def test_config_and_page_table(self):
        self.assertIn("deepseek-v3", mla.LayerConfig.preset_names())
        cfg = mla.LayerConfig.preset("deepseek-v3")
        self.assertTrue(cfg.has_rope)
        self.assertEqual(cfg.row_dim, 576)
        indptr, indices = mla.page_table_from_block_table([4, 7, -1, 2, -1, -1], batch=2, max_pages=3,
                                                          local_seq_lens=[100, 3], page_size=64)
        self.assertEqual(indptr, [0, 2, 3])
        self.assertEqual(indices, [4, 7, 2])
        with self.assertRaises(mla.Error):
            mla.Layer(self.cfg, self.weights, backend="tpu")


class CudaLayer(unittest.TestCase):
    def test_step_on_torch_cuda_tensors_matches_cpu(self):
        try:
            import torch
        except ImportError:
            self.skipTest("no torch: the CUDA path takes __cuda_array_interface__ tensors")
        if not (mla.cuda_available() and torch.cuda.is_available()):
            self.skipTest("no GPU (or mla_decode built without CUDA)")
        rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        cfg = small_config()
        w = mla.prepare_weights(cfg, mla.random_checkpoint_weights(cfg, seed=5))
        step = Step(rng, cfg, contexts=[300, 1, 64], qlen=2, page_size=1)
        hidden = f32_to_bf16(rng.standard_normal((step.tokens, cfg.hidden)))
        outs = {}
        for backend in ("cpu", "cuda"):
            cache = step.cache.copy()
            out = np.empty((step.tokens, cfg.heads * cfg.v_head_dim), np.uint16)
            if backend == "cpu":
                layer = mla.Layer(cfg, w, backend="cpu", max_tokens=16)
                layer.step(hidden, slot_mapping=step.slot_mapping, cache=cache, out=out, **step.meta())
            else:  # torch.bfloat16 tensors as they are (DLPack), the rest as plain integer tensors
                dev = lambda a: torch.from_numpy(a).cuda()
                bf16 = lambda a: torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
                d_out, d_cache = bf16(out), dev(cache)
                meta = {k: (dev(v) if isinstance(v, np.ndarray) else v) for k, v in step.meta().items()}
                stream = torch.cuda.current_stream().cuda_stream
                layer = mla.Layer(cfg, w, backend="cuda", max_tokens=16, cuda_stream=stream)
                layer.step(bf16(hidden), slot_mapping=dev(step.slot_mapping), cache=d_cache, out=d_out,
                           seq_lens_host=step.seq_lens.tolist(), **meta)
                torch.cuda.synchronize()
                out = d_out.view(torch.int16).cpu().numpy().view(np.uint16)
                # a CUDA kernel family and its plan, e.g. "wgmma, flat plan of 264 key-CTAs"
                self.assertRegex(layer.last_attend_kernel, r"^(mma|wgmma|rows)[a-z0-9_]*, ")
            outs[backend] = bf16_to_f64(out)
        self.assertTrue(np.isfinite(outs["cuda"]).all())
        self.assertLess(rel_l2(outs["cuda"], outs["cpu"]), 2e-2)


class Readme(unittest.TestCase):
    def test_the_readme_python_example_runs_as_written(self):
        """README.md's Python API example, executed as it stands: it must run and fill `out`."""
        import re
        readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
        with open(readme) as f:
            text = f.read()
        block = re.search(r"```python\n(.*?)```", text[text.index("## The Python API"):], re.S)
        self.assertIsNotNone(block, "README.md has no Python example under 'The Python API'")
        ns = {}
        exec(compile(block.group(1), "README.md (Python API example)", "exec"), ns)
        out, cfg = ns["out"], ns["cfg"]
        self.assertEqual(out.shape, (2, cfg.heads * cfg.v_head_dim))
        self.assertFalse(np.any((out & 0x7F80) == 0x7F80), "the example's output has inf or NaN")


if __name__ == "__main__":
    unittest.main()
