"""The kernel benchmark's set-up of one case (``bench_kernels.py``): its tensors, float32 reference and baseline,
and ``run(cfg)``, which launches the kernel (or runs the op's cuBLAS form) in one config."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bench.suites.kernel_cases import CTA_H, MOE, Case
from bench.tools import common

# CTA stage 0's stream-K bench variants: the knobs each runs under (the run's own knobs otherwise)
STAGE0_STREAM_K_FORMS = {
    "stream_k": dict(STAGE0_STREAM_K=True, STAGE0_SPLIT_FIXUP=True, STAGE0_FIXUP_CALL_ROWS=(1, 1 << 30)),
    "stream_k_tail": dict(STAGE0_STREAM_K_TAIL=True),
}


def mm_ar_configs(dt: torch.dtype, M: int, ws: int) -> tuple[int, int, list, list]:
    """(rounds, rows per chunk and round, the op's candidates, bench-only variants) of ``mm_ar``'s rounds kernel as
    the op tunes it on the copy-engine transport (``runtime/symm/mm_ar``): TMA variants where
    ``knobs.symm.AR_TMA`` is on and BM divides the rows; ``mm_rs``'s variants, its Gluon forms where BM divides the
    rows (they store by TMA whatever ``AR_TMA`` says)."""
    from overlap_backend.codegen import configs
    from overlap_backend.runtime.symm.mm_ar import _mm_ar_rounds_layout, ar_candidates
    from overlap_backend.spec import knobs

    rounds, rows = _mm_ar_rounds_layout(M, ws)
    op = ar_candidates(dt, rows, knobs.symm.AR_TMA, variants=False)
    tma_rows = rows if knobs.symm.AR_TMA != "off" else None
    var = [c for c in configs.variant_candidates(dt, "mm_rs", tma_store_rows=tma_rows) if c[6] not in configs.GLUON_STORES]
    var += [c for c in configs.variant_candidates(dt, "mm_rs", tma_store_rows=rows) if c[6] in configs.GLUON_STORES]
    return rounds, rows, op, var


class AloneGroup:
    """The ``GroupState`` the collective GEMMs' cuBLAS forms (``runtime/symm``) see here: rank 0 of ``ws`` on
    this one device, every flag already raised (the forms' stream waits pass at once), pushes dropped (no
    communication); the flag writes and waits are the real stream memory operations, on local words; the copy
    stream is a stream of its own that the call's end joins, as the op's. A call as the op makes it under its
    private CUDA graphs (``graph``: the captured protocol's banding and flag block) on a GPU."""

    EPOCH = 1
    rank = 0
    fast = False

    def __init__(self, ws: int, dev):
        from overlap_backend.spec import symm_layout

        self.ws, self.device = ws, dev
        self.graph = dev.type == "cuda"
        self.base = symm_layout.GRAPH_BLOCK if self.graph else 0
        self.flags = torch.full((symm_layout.FLAG_WORDS,), 1 << 30, dtype=torch.int32, device=dev)
        self.data = torch.empty(0, dtype=torch.uint8, device=dev)
        self.copy_stream = torch.cuda.Stream(dev) if self.graph else None

    def compute(self):
        return torch.cuda.current_stream(self.device)

    def begin(self, compute, what: str = "", graph: bool = False) -> int:
        return self.EPOCH

    def end(self, compute) -> None:
        if self.copy_stream is not None:
            compute.wait_stream(self.copy_stream)

    def flag_addr(self, index: int, rank: int | None = None) -> int:
        return self.flags.data_ptr() + 4 * index

    def stream_wait(self, word: int, value: int, stream, nbands: int = 1) -> None:
        from overlap_backend.runtime import cuda as _cuda

        _cuda.wait_value32(self.flag_addr(word), value, stream)

    def push_stream_to(self, peer: int):
        return self.compute()

    def push(self, *args, **kwargs) -> None:
        pass

    def ensure_data(self, nbytes: int, op: str = "") -> None:
        if self.data.numel() < nbytes:
            self.data = torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def data_view(self, dtype, shape, offset_bytes: int = 0):
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        return self.data[offset_bytes:offset_bytes + n].view(dtype).view(*shape)

    def data_addr(self, rank: int, offset_bytes: int) -> int:
        return self.data.data_ptr() + offset_bytes


class Bench:
    """A case's tensors, references and baseline; ``run(cfg)`` launches the kernel in one config."""

    def __init__(self, case: Case, dev, num_sms: int, reps: int, dtype=torch.bfloat16):
        self.case, self.dev, self.num_sms, self.reps = case, dev, num_sms, reps
        self.dt = dtype  # (float32: the CPU interpreter's test, tests/bench/test_bench_kernels.py)
        self.fresh_outputs: list[tuple[int, ...]] = []  # (see check)
        # mm_rs / mm_ar: the baseline followed by the sum a reduce-scatter does, over this rank's chunk (label, fn)
        self.with_sum = None
        # ag_mm with an epilogue: run_apart(cfg) runs the kernel plain, then the epilogue as the op's torch step
        # (spec.epilogue.apply_all), the path the op takes where fusing measured slower; apart_error() checks it
        self.run_apart = None
        getattr(self, "_setup_" + case.kernel)()

    # ---- helpers
    def _rand(self, *shape, scale=1.0):
        return (torch.randn(*shape, device=self.dev) * scale).to(self.dt)

    def _status(self):
        return (torch.zeros(1, dtype=torch.int32, device=self.dev), torch.zeros(8, dtype=torch.int32, device=self.dev))

    def _gemm_operands(self):
        c = self.case
        self.a = self._rand(c.M, c.K)
        self.b = self._rand(c.K, c.N, scale=c.K ** -0.5)
        self.ref = self.a.float() @ self.b.float()

    # ---- ag_mm consumer
    def _setup_ag_mm(self):
        from overlap_backend.codegen import ag_mm, configs
        from overlap_backend.codegen import epilogue as gen
        from overlap_backend.spec import symm_layout

        c = self.case
        self._gemm_operands()
        rows = c.M // c.ws
        self.shard, self.buf = self.a[:rows].contiguous(), self.a.view(c.ws, rows, c.K)
        self.band = symm_layout.band_rows(rows)
        self.flags = torch.zeros(c.ws * -(-rows // self.band), dtype=torch.int32, device=self.dev)
        self.status = self._status()
        self.out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        self.bias = self._rand(c.N) if c.fused else None
        self.gen = gen.build(c.epilogue, self.dt) if c.fused else None
        self.want = F.gelu(self.ref + self.bias.float()) if c.fused else self.ref
        self.outputs = [self.out]
        a, b, bias = self.a, self.b, self.bias
        if c.fused:
            self.baseline = ("cuBLAS addmm + torch F.gelu (Inductor pointwise proxy)", lambda: F.gelu(torch.addmm(bias, a, b)))
        else:
            self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        tma_rows = ag_mm.tma_store_rows(rows, c.ws)  # (decode sizes: the whole gathered input's)
        self.op_cands = configs.candidates(self.dt, tma_store_rows=tma_rows, variants=False, kernel="ag_mm")
        self.variant_cands = configs.variant_candidates(self.dt, "ag_mm", tma_store_rows=tma_rows)
        ptrs = gen.pointers(self.gen, ()) if self.gen is not None else ()

        def run(cfg):
            ag_mm.launch(self.shard, self.buf, self.b, self.bias, self.out, self.flags, 0, self.status, 10**9, 0, c.ws,
                         rows, self.band, cfg, self.num_sms, epilogue=self.gen, ep_ptrs=ptrs)

        self.run = run
        self.error = lambda: common.rel_err(self.out.float(), self.want)
        if c.fused:
            from overlap_backend.spec import epilogue as spec

            plain = torch.empty_like(self.out)
            self.apart_out = None

            def run_apart(cfg):
                ag_mm.launch(self.shard, self.buf, self.b, self.bias, plain, self.flags, 0, self.status, 10**9, 0, c.ws,
                             rows, self.band, cfg, self.num_sms)
                self.apart_out = spec.apply_all([c.epilogue], [plain], ())[0]

            def apart_error(cfg):
                plain.fill_(float("nan"))
                self.apart_out = None
                run_apart(cfg)
                common.synchronize(self.dev)
                return common.rel_err(self.apart_out.float(), self.want)

            self.run_apart, self.apart_error = run_apart, apart_error

    # ---- mm_rs producer (and its mm_ar rounds form)
    def _rs_buffers(self, rows, rounds):
        from overlap_backend.spec import symm_layout

        c = self.case
        self.band = symm_layout.band_rows(rows)
        nb = -(-rows // self.band)
        self.flags = [torch.zeros(rounds * c.ws * nb, dtype=torch.int32, device=self.dev) for _ in range(3)]
        self.ticket = torch.zeros(1, dtype=torch.int32, device=self.dev)
        self.status = self._status()
        self.recv = self._rand(rounds * c.ws * rows, c.N)  # the peers' partials of this rank's chunks
        self.stage = torch.empty(rounds * c.ws * rows, c.N, device=self.dev, dtype=self.dt)

    def _mm_rs_problem(self, rows):
        """Rank 0's reduce-scatter of its [M, K] @ [K, N] (its own chunk: rows [0, rows)): the peers' partials
        of it in ``self.recv`` slots 1.., the reference, the baseline, the fused residual and epilogue."""
        from overlap_backend.codegen import epilogue as gen

        c = self.case
        self._gemm_operands()
        self._rs_buffers(rows, 1)
        self.out = torch.empty(rows, c.N, device=self.dev, dtype=self.dt)
        own = self.ref[:rows] + sum(self.recv[p * rows:(p + 1) * rows].float() for p in range(1, c.ws))
        self.residual = self._rand(rows, c.N) if c.fused else None
        self.want = own.to(self.dt).float() + self.residual.float() if c.fused else own
        self.gen = gen.build(c.epilogue, self.dt) if c.fused else None
        a, b, res = self.a, self.b, self.residual
        if c.fused:
            summed = torch.empty(rows, c.N, device=self.dev, dtype=self.dt)
            self.baseline = ("cuBLAS torch.mm + torch.add (Inductor pointwise proxy)",
                             lambda: torch.add(torch.mm(a, b)[:rows], res, out=summed))
        else:
            self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self._sum_after_baseline(self.recv[:c.ws * rows].view(c.ws, rows, c.N), 0)

    def _sum_after_baseline(self, parts, dim: int):
        """``with_sum``: the baseline, then ``torch.sum`` of ``parts`` (the ws partials of this rank's chunk, along
        ``dim``): what the unfused GEMM and reduce-scatter compute, the sum of the partials done by the collective."""
        shape = parts.shape[:dim] + parts.shape[dim + 1:]
        summed = self.summed = torch.empty(shape, device=self.dev, dtype=self.dt)
        self.sum_of = (parts, dim)  # (the tests' reference)
        base = self.baseline[1]

        def fn():
            base()
            torch.sum(parts, dim, out=summed)

        self.with_sum = (self.baseline[0] + " + torch.sum of this rank's ws partials", fn)

    def _setup_mm_rs(self):
        from overlap_backend.codegen import configs, mm_rs
        from overlap_backend.codegen import epilogue as gen

        c = self.case
        rows = c.M // c.ws
        self._mm_rs_problem(rows)
        ptrs = gen.pointers(self.gen, [self.residual]) if c.fused else ()
        self.outputs = [self.out, self.stage]
        self.op_cands = configs.candidates(self.dt, None, tma_store_rows=rows, variants=False, kernel="mm_rs")
        self.variant_cands = configs.variant_candidates(self.dt, "mm_rs", tma_store_rows=rows)

        def run(cfg):
            mm_rs.launch(self.a, self.b, None, self.stage, self.recv, None, self.out, *self.flags, self.ticket, 0,
                         self.status, 10**9, 0, c.ws, rows, rows, 1, 0, 0, False, self.band, cfg, self.num_sms,
                         epilogue=self.gen, ep_ptrs=ptrs)

        self.run = run

        def error():
            err = common.rel_err(self.out.float(), self.want)
            if c.ws > 1:  # what this rank ships: its partials of the peers' chunks
                err = max(err, common.rel_err(self.stage[rows:].float(), self.ref[rows:]))
            return err

        self.error = error

    def _setup_mm_ar(self):
        from overlap_backend.codegen import mm_rs

        c = self.case
        self._gemm_operands()
        rounds, rows, self.op_cands, self.variant_cands = mm_ar_configs(self.dt, c.M, c.ws)
        self._rs_buffers(rows, rounds)
        self.gather = torch.empty(rounds * c.ws * rows, c.N, device=self.dev, dtype=self.dt)
        self.out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        self.outputs = [self.out, self.gather, self.stage]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self._sum_after_baseline(self.recv.view(rounds, c.ws, rows, c.N), 1)

        def run(cfg):
            mm_rs.launch(self.a, self.b, None, self.stage, self.recv, self.gather, self.out, *self.flags, self.ticket,
                         0, self.status, 10**9, 0, c.ws, rows, rows, rounds, c.ws * rows, 0, False, self.band, cfg,
                         self.num_sms)

        self.run = run
        own = [(t * c.ws * rows, min(rows, c.M - t * c.ws * rows)) for t in range(rounds)]

        def error():
            errs = []
            for t, (lo, n) in enumerate(own):
                if n <= 0:
                    continue
                want = self.ref[lo:lo + n] + sum(self.recv[(t * c.ws + p) * rows:(t * c.ws + p) * rows + n].float()
                                                 for p in range(1, c.ws))
                errs.append(common.rel_err(self.out[lo:lo + n].float(), want))
                errs.append(common.rel_err(self.gather[t * c.ws * rows:t * c.ws * rows + n].float(), want))
            return max(errs)

        self.error = error

    # ---- the collective GEMMs' cuBLAS forms (runtime/symm: the op's own code on an AloneGroup)
    def _setup_ag_mm_cublas(self):
        from overlap_backend.runtime.symm import ag_mm as symm_ag_mm

        c = self.case
        self._gemm_operands()
        rows = c.M // c.ws
        shard, buf = self.a[:rows].contiguous(), self.a.view(c.ws, rows, c.K)
        out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        st = AloneGroup(c.ws, self.dev)
        self.want, self.outputs = self.ref, [out]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self.op_cands, self.variant_cands = [None], []
        # whole chunks (one flag per peer: the cuBLAS path's push), the call's compute on the current stream
        self.run = lambda cfg: symm_ag_mm.ag_mm_cublas(st, shard, buf, [b], [None], [out], 1, rows, st.EPOCH, st.base,
                                                       1, st.compute())
        self.error = lambda: common.rel_err(out.float(), self.want)

    def _setup_mm_rs_cublas(self):
        from overlap_backend.runtime.symm import mm_rs as symm_mm_rs

        c = self.case
        rows = c.M // c.ws
        self._mm_rs_problem(rows)
        st = AloneGroup(c.ws, self.dev)
        self.outputs = []
        self.fresh_outputs = [(rows, c.N)]  # the reduced chunk the form returns
        self.op_cands, self.variant_cands = [None], []
        got = {}
        args = [self.residual] if c.fused else []

        def run(cfg):
            got["out"] = symm_mm_rs.mm_rs_cublas(st, self.a, self.b, None, self.recv[:c.ws * rows], 1, rows, False,
                                                 st.graph, self.gen, args)

        self.run = run
        self.error = lambda: common.rel_err(got["out"].float(), self.want)

    def _setup_mm_ar_cublas(self):
        from overlap_backend.runtime.symm import mm_ar as symm_mm_ar

        c = self.case
        self._gemm_operands()
        st = AloneGroup(c.ws, self.dev)
        rounds = symm_mm_ar.ar_cublas_rounds(c.M, c.K, c.N, c.ws)
        rows = -(-c.M // (rounds * c.ws))
        st.ensure_data(2 * rounds * c.ws * rows * c.N * self.a.element_size())
        recv = st.data_view(self.dt, (rounds, c.ws, rows, c.N))
        recv.copy_(self._rand(rounds, c.ws, rows, c.N))  # the peers' partials of this rank's chunks (slots 1..)
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self._sum_after_baseline(recv, 1)
        self.op_cands, self.variant_cands = [None], []
        self.outputs = []
        self.fresh_outputs = [(c.M, c.N)] * (2 if rounds * c.ws * rows == c.M else 1)  # out (and stage, same size)
        got = {}

        def run(cfg):
            got["out"] = symm_mm_ar.mm_ar_cublas(st, a, b, None, False, st.graph)

        self.run = run

        def error():  # this rank's reduced chunk of every round (the peers' come from the gather region)
            errs = []
            for t in range(rounds):
                lo = t * c.ws * rows
                n = max(0, min(rows, c.M - lo))
                if n:
                    want = self.ref[lo:lo + n] + recv[t, 1:, :n].float().sum(0)
                    errs.append(common.rel_err(got["out"][lo:lo + n].float(), want))
            return max(errs)

        self.error = error

    # ---- one-shot all-reduce sum
    def _setup_oneshot(self):
        from overlap_backend.codegen import reduce

        c = self.case
        self.recv = self._rand(c.ws, c.M, c.N)
        own = self.recv[0]
        self.flags = torch.zeros(c.ws, dtype=torch.int32, device=self.dev)
        self.status = self._status()
        self.out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        self.want = self.recv.float().sum(0)
        self.outputs = [self.out]
        summed = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        self.baseline = ("torch.sum over the ws partials", lambda: torch.sum(self.recv, 0, out=summed))
        self.op_cands, self.variant_cands = [None], []

        def run(cfg):
            reduce.launch(own, self.recv, self.out, self.flags, 0, self.status, 10**9, 0, c.ws, False)

        self.run = run
        self.error = lambda: common.rel_err(self.out.float(), self.want)

    # ---- CTA stage kernels
    def _cta_plan(self, M, fp, ns):
        from overlap_backend.runtime import cta_plan

        tp = self.case.ws // 2
        cfg0, cfg1 = cta_plan.block_configs(self.dt, False, M, ns, self.num_sms)
        kchunk, nch = cta_plan.k_chunks(fp, cfg0[1], cfg1[2], -(-(-(-M // cfg0[0])) // cfg0[3]), tp)
        return cfg0, cfg1, kchunk, nch

    def _chunk_major(self, tp, fp, kchunk, nch, mp):
        """Stage 1's input as the stage-0 ranks ship it: [tp * nch, mp, kchunk] blocks of ``self.a``'s columns."""
        blocks = torch.zeros(tp * nch, mp, kchunk, device=self.dev, dtype=self.dt)
        for p in range(tp):
            for j in range(nch):
                lo, w = p * fp + j * kchunk, min(kchunk, fp - j * kchunk)
                blocks[p * nch + j, :self.case.M, :w] = self.a[:, lo:lo + w]
        return blocks

    def _setup_cta_stage0(self):
        from overlap_backend.codegen import cta
        from overlap_backend.runtime import cta_plan
        from overlap_backend.spec import knobs

        c = self.case
        self._gemm_operands()
        cfg0, _, kchunk, nch = self._cta_plan(c.M, c.N, CTA_H // (c.ws // 2))
        mp = cta.padded_rows(c.M, cfg0[0])
        self.stage = torch.empty(nch * mp * kchunk, device=self.dev, dtype=self.dt)
        self.counters = torch.zeros(4096, dtype=torch.int32, device=self.dev)
        self.done = torch.zeros(4096, dtype=torch.int32, device=self.dev)
        self.epoch = torch.ones(1, dtype=torch.int32, device=self.dev)
        tables = torch.zeros(8, dtype=torch.int64, device=self.dev)
        self.want = F.gelu(self.ref, approximate="tanh")
        self.outputs = [self.stage]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm + torch F.gelu tanh (Inductor pointwise proxy)",
                         lambda: F.gelu(torch.mm(a, b), approximate="tanh"))
        # the op's config and split-K runs (cta_plan, no tuning), pointer and TMA stores of the staged tiles, then
        # bench-only variants (narrower tiles: more of them where few rows leave SMs idle)
        def split(cfg):
            return cta_plan.split_runs(-(-c.M // cfg[0]) * -(-c.N // cfg[1]), -(-c.K // cfg[2]), self.num_sms,
                                       knobs.cta.STAGE0_SPLIT_K)

        self.op_cands = [(*cfg0, False, split(cfg0)), (*cfg0, True, split(cfg0))]
        narrow = [(cfg0[0], bn, cfg0[2], cfg0[3], stages, warps) for bn, stages, warps in ((128, 4, 8), (64, 4, 4))
                  if bn < cfg0[1]]
        runs = split(cfg0)  # variants: no split, half the runs (a shorter sum, longer runs), narrower tiles
        self.variant_cands = [(*cfg0, True, r) for r in sorted({1, runs // 2} - {0, runs})]
        self.variant_cands += [(*cfg, True, split(cfg)) for cfg in narrow]
        if runs == 1:  # the warp-specialized Gluon forms (codegen/cta_ws.py: no split-K), on the plan's row blocks
            from overlap_backend.codegen import cta_ws, gluon_ring

            self.variant_cands += [(*cta_ws.config(form, cfg0), form, 1) for form in cta_ws.FORMS
                                   if gluon_ring.block_rows_refusal(form, cfg0[0]) is None]
        # the stream-K forms on the op's config (the op takes them by knob, not as a measured variant): a split call's
        # runs as every SM's share of the tiles' K-steps, or an unsplit call's last, partial round of tiles so
        if runs > 1:
            self.variant_cands.append((*cfg0, True, runs, "stream_k"))
        elif -(-c.M // cfg0[0]) * -(-c.N // cfg0[1]) % self.num_sms:
            self.variant_cands.append((*cfg0, True, 1, "stream_k_tail"))

        def knobs_of(cfg):
            return knobs.cta.patch(**STAGE0_STREAM_K_FORMS.get(cfg[8] if len(cfg) > 8 else None, {}))

        def partials(cfg):
            with knobs_of(cfg):
                return cta.stage0_partials_numel(c.M, c.K, c.N, cfg, cfg[7], self.num_sms, tail=True)

        self.partials = torch.empty(max(1, max(partials(cfg) for cfg in self.op_cands + self.variant_cands)),
                                    device=self.dev)
        self.split_counters = torch.zeros(4096, dtype=torch.int32, device=self.dev)

        def run(cfg):
            form = cfg[6] if isinstance(cfg[6], str) else None  # a Gluon form: on the plan's config
            with knobs_of(cfg):
                cta.launch_stage0(a, b, None, None, None, self.stage, tables, tables, self.counters, self.done,
                                  self.epoch, 0, kchunk, nch, 0, 1, 1, cta.ACT_GELU_TANH, cfg0 if form else cfg[:6],
                                  self.num_sms, tma_store=bool(cfg[6]), split_k=cfg[7], split_partials=self.partials,
                                  split_counters=self.split_counters, form=form, stream_k_tail=True)

        self.run = run
        self.error = lambda: common.rel_err(
            self.stage.view(nch, mp, kchunk)[:, :c.M].permute(1, 0, 2).reshape(c.M, nch * kchunk)[:, :c.N].float(),
            self.want)

    def _setup_cta_stage1(self):
        from overlap_backend.codegen import cta
        from overlap_backend.runtime import cta_plan
        from overlap_backend.spec import knobs

        c = self.case
        tp = c.ws // 2
        fp = c.K // tp
        self._gemm_operands()
        _, cfg1, kchunk, nch = self._cta_plan(c.M, fp, c.N)
        mp = cta.padded_rows(c.M, cfg1[0])
        self.blocks = self._chunk_major(tp, fp, kchunk, nch, mp).view(tp * nch * mp, kchunk)
        self.out = torch.empty(c.M, c.N, device=self.dev, dtype=self.dt)
        tiles_m = -(-c.M // cfg1[0])
        self.flags = torch.zeros(4096, dtype=torch.int32, device=self.dev)
        self.counters = torch.zeros(max(tiles_m, 1), dtype=torch.int32, device=self.dev)
        self.epoch = torch.zeros(1, dtype=torch.int32, device=self.dev)
        tables = torch.zeros(8, dtype=torch.int64, device=self.dev)
        self.status = self._status()
        self.want = self.ref
        self.outputs = [self.out]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        # the op's config and split-K runs (cta_plan), then bench-only variants
        def split(cfg):
            return cta_plan.split_runs(tiles_m * -(-c.N // cfg[1]), tp * nch, self.num_sms, knobs.cta.STAGE1_SPLIT_K)

        narrow = (cfg1[0], 128, cfg1[2], cfg1[3], 4, 8)
        wide = (cfg1[0], *knobs.cta.STAGE1_CONFIG[1:3], cfg1[3], *knobs.cta.STAGE1_CONFIG[4:])
        self.op_cands = [(*cfg1, split(cfg1))]
        runs = split(cfg1)  # variants: no split, half the runs (a shorter sum, longer runs), the other tile width
        self.variant_cands = [(*cfg1, r) for r in sorted({1, runs // 2} - {0, runs})]
        self.variant_cands += [cand for cand in [(*narrow, split(narrow)), (*wide, split(wide))]
                               if cand not in self.op_cands]
        self.partials = torch.empty(max(cta.split_partials_numel(c.M, c.N, cfg, cfg[6])
                                        for cfg in self.op_cands + self.variant_cands), device=self.dev)
        self.split_counters = torch.zeros(4096, dtype=torch.int32, device=self.dev)

        def run(cfg):
            cta.launch_stage1(self.blocks, b, None, self.out, tables, tables, 0, self.flags, self.counters, self.epoch,
                              self.status, 10**9, 0, 1, c.M, fp, 0, kchunk, nch, 0, tp, cfg[:6], self.num_sms,
                              split_k=cfg[6], split_partials=self.partials, split_counters=self.split_counters)

        self.run = run
        self.error = lambda: common.rel_err(self.out.float(), self.want)

    # ---- the CTA stages' cuBLAS forms (rank 0 of its stage; flags are no-ops: every block is there)
    def _cublas_plan(self, M, fp, ns):
        """The stage's ``cta_plan.ChunkPlan`` as the Triton stage's case splits it: no stage-1 share, no tails
        (both stages' configs have the same row blocks and groups, ``cta_plan.block_configs``)."""
        from overlap_backend.runtime import cta_plan

        cfg0, cfg1, kchunk, nch = self._cta_plan(M, fp, ns)
        tiles_m = -(-M // cfg0[0])
        groups = -(-tiles_m // cfg0[3])
        return cta_plan.ChunkPlan(cfg0, cfg1, self.case.ws // 2, tiles_m, groups, (0, 0, 0), 0, fp, 0, groups - 1,
                                  kchunk, nch, 0)

    def _setup_cta_stage0_cublas(self):
        from overlap_backend.codegen import cta
        from overlap_backend.runtime import cta_cublas

        c = self.case
        self._gemm_operands()
        plan = self._cublas_plan(c.M, c.N, CTA_H // (c.ws // 2))
        mp = cta.padded_rows(c.M, plan.cfg0[0])
        blocks = torch.empty(plan.nch, mp, plan.kchunk, device=self.dev, dtype=self.dt)
        self.want = F.gelu(self.ref, approximate="tanh")
        self.outputs = [blocks]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm + torch F.gelu tanh (Inductor pointwise proxy)",
                         lambda: F.gelu(torch.mm(a, b), approximate="tanh"))
        self.op_cands, self.variant_cands = [None], []
        self.run = lambda cfg: cta_cublas.stage0(a, (b, None, None, None), blocks, None, plan, c.N, "gelu", "tanh",
                                                 lambda g, j: None)
        self.error = lambda: common.rel_err(
            blocks[:, :c.M].permute(1, 0, 2).reshape(c.M, plan.nch * plan.kchunk)[:, :c.N].float(), self.want)

    def _setup_cta_stage1_cublas(self):
        from overlap_backend.codegen import cta
        from overlap_backend.runtime import cta_cublas

        c = self.case
        tp = c.ws // 2
        fp = c.K // tp
        self._gemm_operands()
        plan = self._cublas_plan(c.M, fp, c.N)
        blocks = self._chunk_major(tp, fp, plan.kchunk, plan.nch, cta.padded_rows(c.M, plan.cfg1[0]))
        out = torch.empty(c.M, tp * c.N, device=self.dev, dtype=self.dt)  # rank 0 of its stage: columns [0, N)
        self.want = self.ref
        self.outputs = [out]
        a, b = self.a, self.b
        self.baseline = ("cuBLAS torch.mm", lambda: torch.mm(a, b))
        self.op_cands, self.variant_cands = [None], []

        def skip(*_):
            return None

        self.run = lambda cfg: cta_cublas.stage1(blocks, b, None, out, plan, fp, 0, None, False, skip, skip, skip)
        self.error = lambda: common.rel_err(out[:, :c.N].float(), self.want)

    # ---- MoE grouped GEMMs
    def _moe_rank(self):
        from overlap_backend.codegen import moe_gemm
        from overlap_backend.runtime import moe_symm

        c = self.case
        h, f, experts, k, tokens = MOE[c.moe]
        ws, e_local, dev = c.ws, experts // c.ws, self.dev
        local = []
        for src in range(ws):  # every source's rows for rank 0's experts (bench_moe's balanced routing)
            gen_ = torch.Generator().manual_seed(1234 + src)
            dest = torch.rand(tokens, experts, generator=gen_).topk(k, dim=1).indices.view(-1).sort().values
            local.append(dest[dest < e_local])
        recv = [len(v) for v in local]
        e_recv = torch.cat(local).to(dev)
        self.rows_sorted = torch.sort(e_recv, stable=True).indices
        self.offsets = torch.cumsum(torch.bincount(e_recv, minlength=e_local), 0).to(torch.int32)
        self.r = self._rand(sum(recv), h)
        self.w_gate = self._rand(e_local, h, f, scale=h ** -0.5)
        self.w_up = self._rand(e_local, h, f, scale=h ** -0.5)
        self.w_down = self._rand(e_local, f, h, scale=f ** -0.5)
        cap = max(recv)
        self.disp = torch.zeros(ws * cap, h, device=dev, dtype=self.dt)
        off = 0
        for s, n in enumerate(recv):
            self.disp[s * cap:s * cap + n] = self.r[off:off + n]
            off += n
        self.recv_off = [0] + torch.tensor(recv).cumsum(0).tolist()  # (and on the device, as the op has them)
        self.recv_off_d = recv_off = torch.tensor(self.recv_off, dtype=torch.int32, device=dev)
        self.mflags = torch.zeros(64, dtype=torch.int32, device=dev)
        self.status = self._status()
        m = self.rows_sorted.shape[0]
        self.act = torch.empty(m, f, device=dev, dtype=self.dt)
        self.own = torch.empty(max(recv[0], 1), h, device=dev, dtype=self.dt)
        self.stage = torch.empty(sum(recv), h, device=dev, dtype=self.dt)
        em = moe_symm.expert_major(m, ws, e_local)
        self.gate_cands = moe_gemm.candidates(self.dt, "gate_up")
        self.down_cands = moe_gemm.candidates(self.dt, "down")
        bms = sorted({cfg[0] for cfg in self.gate_cands + self.down_cands})
        self.plan = moe_symm.plan(self.rows_sorted, self.offsets, recv_off, 0, ws, e_local, bms, em)
        self.one = [(0, ws * e_local, 0, ws)]
        self.start = None if em else (ws - 1) * e_local  # the runtime's walk: own groups first
        self.cap, self.recv_rows = cap, recv
        xg = self.r.index_select(0, self.rows_sorted)
        self.xg = xg
        # float32 reference per expert, in received-row order
        ref = torch.empty(sum(recv), h, device=dev)
        lo = 0
        for e, hi in enumerate(self.offsets.tolist()):
            x = xg[lo:hi].float()
            y = (F.silu(x @ self.w_gate[e].float()) * (x @ self.w_up[e].float())).to(self.dt).float() @ self.w_down[e].float()
            ref[self.rows_sorted[lo:hi]] = y
            lo = hi
        self.want = ref

    def _moe_run(self, cfg_gate, cfg_down, part):
        from overlap_backend.codegen import moe_gemm

        c = self.case
        for ph in self.one:
            if part in ("both", "gate_up"):
                moe_gemm.launch_gate_up(self.disp, self.w_gate, self.w_up, self.act, self.plan, self.mflags, self.mflags,
                                        0, self.status, 10**10, 0, c.ws, self.cap, cfg_gate, self.num_sms, phase=ph,
                                        start_group=self.start)
            if part in ("both", "down"):
                moe_gemm.launch_down(self.act, self.w_down, self.own, self.stage, self.plan, self.mflags[16:],
                                     self.mflags[32:], 0, 0, c.ws, 0, cfg_down, self.num_sms, phase=ph)

    def _moe_error(self, cfg_gate, cfg_down):
        for t in (self.own, self.stage, self.act):
            t.fill_(float("nan"))
        self._moe_run(cfg_gate, cfg_down, "both")
        common.synchronize(self.dev)
        got = self.stage.float()
        n0 = self.recv_rows[0]
        got[:n0] = self.own[:n0].float()
        return common.rel_err(got, self.want)

    def _setup_moe_gate_up(self):
        self._moe_rank()
        xg, offs, wg, wu = self.xg, self.offsets, self.w_gate, self.w_up
        self.baseline = ("torch._grouped_mm x2 + torch F.silu * up (pointwise proxy)",
                         lambda: F.silu(torch._grouped_mm(xg, wg, offs=offs)) * torch._grouped_mm(xg, wu, offs=offs))
        self.op_cands, self.variant_cands = list(self.gate_cands), []
        self.outputs = []
        self.run = lambda cfg: self._moe_run(cfg, self.down_cands[0], "gate_up")
        self.error_of = lambda cfg: self._moe_error(cfg, self.down_cands[0])

    def _setup_moe_down(self):
        from overlap_backend.codegen import configs

        self._moe_rank()
        offs, wd = self.offsets, self.w_down
        act = self._rand(self.xg.shape[0], wd.shape[1])
        self.baseline = ("torch._grouped_mm", lambda: torch._grouped_mm(act, wd, offs=offs))
        # variants: each candidate with the other store kind (TMA stores of full consecutive tiles, or pointers), and
        # the warp-specialized Gluon forms (knobs.codegen.VARIANTS_16BIT; their TMA stores, like the kernel's, take
        # full consecutive tiles whatever the rows: no row multiple to fit)
        self.op_cands = list(self.down_cands)
        self.variant_cands = [c[:6] + (not c[6],) for c in self.down_cands] + [
            c for c in configs.variant_candidates(self.dt, "moe_down", tma_store_rows=configs.ANY_ROWS)
            if c not in self.down_cands]
        self.outputs = []
        self.run = lambda cfg: self._moe_run(self.gate_cands[0], cfg, "down")
        self.error_of = lambda cfg: self._moe_error(self.gate_cands[0], cfg)

    def _setup_moe_grouped_mm(self):
        from overlap_backend.runtime import moe_grouped, moe_symm

        self._moe_rank()
        c = self.case
        ws, e_local = c.ws, self.w_gate.shape[0]
        recv_off = self.recv_off
        per_source = not moe_symm.expert_major(self.rows_sorted.shape[0], ws, e_local)  # (the phased schedule)
        gpl = moe_grouped.plan(self.rows_sorted, self.offsets, self.recv_off_d, 0, ws, e_local, recv_off[-1], self.cap,
                               per_source)
        gate_up = moe_grouped.gate_up_weights(self.w_gate, self.w_up)
        segments = [(i, lo, hi) for i, _, lo, hi in moe_grouped.schedule(ws, recv_off, per_source, 0) if hi > lo]
        stage, disp, wd = self.stage, self.disp, self.w_down
        xg, offs, wg, wu = self.xg, self.offsets, self.w_gate, self.w_up
        self.baseline = ("torch._grouped_mm x3 + torch F.silu * up (rows already sorted)",
                         lambda: torch._grouped_mm(F.silu(torch._grouped_mm(xg, wg, offs=offs))
                                                   * torch._grouped_mm(xg, wu, offs=offs), wd, offs=offs))
        self.op_cands, self.variant_cands = [None], []
        self.outputs = [stage]

        def run(cfg):
            for i, lo, hi in segments:
                stage.index_copy_(0, gpl["seg"][lo:hi], moe_grouped.experts(gpl, i, lo, hi, disp, gate_up, wd))

        self.run = run
        self.error = lambda: common.rel_err(stage.float(), self.want)

    # ---- measurement
    def check(self, cfg) -> float:
        """Poison the outputs, run once, compare with the float32 reference (relative error)."""
        if hasattr(self, "error_of"):
            return self.error_of(cfg)
        for t in self.outputs:
            t.fill_(float("nan"))
        # A form that returns a new tensor: NaN blocks of its allocations' sizes, freed just before the call, so that
        # the caching allocator hands them to it (a row it leaves unwritten then reads NaN, not an earlier result).
        poison = [torch.full(shape, float("nan"), device=self.dev, dtype=self.dt) for shape in self.fresh_outputs]
        del poison
        self.run(cfg)
        common.synchronize(self.dev)
        return self.error()

    def time(self, fn) -> "common.QueuedTime":
        return common.queued_ms(fn, n=self.reps, warm=5)

    def time_paired(self, fn) -> "common.PairedTime":
        """``fn`` call by call against the baseline (``common.paired_queued_ms``)."""
        return common.paired_queued_ms(fn, self.baseline[1], n=self.reps, warm=5)

    def back_to_back_ms(self, fn) -> float:
        """Event timing of calls enqueued as they run: the host's launch time shows where it exceeds the GPU's."""
        return common.events_ms(fn, n=self.reps, warm=2)
