"""The runtime calls one overlap op makes, written out as Python (for the debug dump).

``render(op, args, rank, ws)`` takes the op's arguments as tensors (fake ones are fine: only
shapes, dtypes and devices are read) and returns a Python-readable listing of what the op's
lowering issues on this rank: buffers, copy-engine transfers, flag writes and waits, P2P ring
transfers, kernel launches, the epilogue. It follows the lowerings' own decisions (the ``symm``
fallback checks, ``symm_layout.bands``, ``ar_rounds``, the one-shot limit), so it says which path a call
takes; it is a description, not a trace (``PATHS`` in ``symm.lowering_helpers`` counts the real ones).
"""

from __future__ import annotations

import math

import torch

from ..spec import epilogue as _epilogue
from ..spec import knobs, symm_layout


def _t(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"Tensor({list(x.shape)}, {str(x.dtype).replace('torch.', '')})"
    return repr(x)


def _epilogue_lines(target: str, spec: str, n_args: int) -> list[str]:
    if not spec:
        return []
    return [f"{target} = epilogue.apply({spec!r}, {target}, epilogue_args, outs)  # torch ops (spec/epilogue.py)"]


def _ring_p2p(op: str, args: dict, rank: int, ws: int) -> list[str]:
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    lines = [f"# lowering 'p2p': ring over torch.distributed P2P, rank {rank} sends to {nxt}, receives from {prv}"]
    if op == "ag_mm":
        lines.append(f"chunks = torch.empty(({ws}, *shard.shape)); chunks[{rank}].copy_(shard)")
        for step in range(ws):
            c = (rank - step) % ws
            if step < ws - 1:
                lines.append(f"works = batch_isend_irecv([isend(chunks[{c}], peer={nxt}), irecv(chunks[{(c - 1) % ws}], "
                             f"peer={prv})])  # side stream on CUDA")
            for i in range(len(args["weights"])):
                lines.append(f"outs[{i}][rows_of_chunk({c})] = chunks[{c}] @ weights[{i}] + biases[{i}]  # bias if any")
            if step < ws - 1:
                lines.append("wait(works)")
        specs = _epilogue.split_outputs(args.get("epilogue", ""), len(args["weights"]))
        for i in sorted(range(len(specs)), key=lambda i: bool(_epilogue.out_refs(specs[i]))):
            lines += _epilogue_lines(f"outs[{i}]", specs[i], len(args.get("epilogue_args") or ()))
        return lines
    order = [(rank - s - 1) % ws for s in range(ws)]
    lines.append(f"acc = partial({order[0]})  # a @ b + bias on the rows of that chunk")
    for step in range(1, ws):
        c = order[step]
        lines.append(f"works = batch_isend_irecv([isend(acc, peer={nxt}), irecv(incoming, peer={prv})])")
        lines.append(f"mine = partial({c})  # overlaps the transfer")
        lines.append("wait(works)")
        lines.append(f"acc = reduce(mine, incoming, {args['reduce_op']!r})")
    if op == "mm_ar":
        lines.append("out = all_gather_into_tensor(acc)[:M]")
    else:
        lines.append("out = acc")
    lines += _epilogue_lines("out", args.get("epilogue", ""), len(args.get("epilogue_args") or ()))
    return lines


def _moe_p2p(args: dict, rank: int, ws: int) -> list[str]:
    """runtime/moe_p2p.py: shift steps posted at once, the experts of each source as its rows arrive,
    its results sent straight back, the own rows last."""
    lines = ["# lowering 'p2p': moe_experts by source: dispatch shift steps posted at once, each source's rows",
             "# computed as they arrive and sent straight back while the next source's rows compute",
             f"recv[recv_off[{rank}]:recv_off[{rank + 1}]].copy_(x[send_off[{rank}]:send_off[{rank + 1}]])  # own rows"]
    for i in range(1, ws):
        dst, src = (rank - i) % ws, (rank + i) % ws
        lines.append(f"dispatch[{src}] = batch_isend_irecv([isend(x[send_off[{dst}]:send_off[{dst + 1}]], peer={dst}), "
                     f"irecv(recv[recv_off[{src}]:recv_off[{src + 1}]], peer={src})])  # comm stream on CUDA")
    lines += ["order, counts = sort_by_source_and_expert(rows, ends)  # counts [ws, E]: one host read "
              "(a synchronisation on CUDA)"]
    for i in range(1, ws):
        src, dst = (rank + i) % ws, (rank - i) % ws
        lines += [f"wait(dispatch[{src}])",
                  f"y_recv[rows_of_source({src})] = swiglu_experts(recv[rows_of_source({src})], counts[{src}])  "
                  "# _grouped_mm (bf16 on CUDA) or one mm per expert",
                  f"combine += batch_isend_irecv([isend(y_recv[recv_off[{src}]:recv_off[{src + 1}]], peer={src}), "
                  f"irecv(out[send_off[{dst}]:send_off[{dst + 1}]], peer={dst})])"]
    lines += [f"y_recv[rows_of_source({rank})] = swiglu_experts(recv[rows_of_source({rank})], counts[{rank}])  "
              "# own rows last: the last combine overlaps them",
              f"out[send_off[{rank}]:send_off[{rank + 1}]].copy_(y_recv[recv_off[{rank}]:recv_off[{rank + 1}]])",
              "wait(combine)"]
    return lines


def _cta_p2p(args: dict, rank: int, ws: int) -> list[str]:
    """runtime/cta_p2p.py: micro-chunks of rows, each a fused ring reduce-scatter of the whole MLP
    then an all-gather that overlaps the next chunk."""
    from .cta_p2p import chunk_bounds

    x, stages = args["x"], args["stages"]
    m = x.shape[0]
    bounds = chunk_bounds(int(m), int(stages)) if isinstance(m, int) and isinstance(stages, int) else None
    lines = [f"# lowering 'p2p': cta_pipeline_mlp as a stage pipeline over P2P: {stages} micro-chunk(s) of the rows, "
             "each reduced by a ring reduce-scatter whose steps overlap the MLP of the next sub-chunk"]
    for i, (lo, hi) in enumerate(bounds or [("lo", "hi")]):
        if bounds is None:
            lines.append("for lo, hi in chunk_bounds(M, stages):  # M is symbolic here")
        order = [(rank - s - 1) % ws for s in range(ws)]
        lines.append(f"acc = mlp(sub_chunk(x[{lo}:{hi}], {order[0]}))  # act(x_c @ w1 (+ b1)) @ w2 (+ b2)")
        for c in order[1:]:
            lines += [f"works = batch_isend_irecv([isend(acc, peer={(rank + 1) % ws}), irecv(incoming, "
                      f"peer={(rank - 1) % ws})])",
                      f"mine = mlp(sub_chunk(x[{lo}:{hi}], {c}))  # overlaps the transfer",
                      "wait(works)", "acc = mine + incoming"]
        lines.append(f"gathered[{i}] = all_gather_async(acc)  # overlaps the next micro-chunk")
    lines.append("for i, (lo, hi) in enumerate(bounds): wait(gathered[i]); out[lo:hi].copy_(gathered[i][:hi - lo])")
    return lines


def _cta_symm(args: dict, rank: int, ws: int, captured: bool) -> list[str]:
    """runtime/cta_symm.py, following its plan (cta_plan.chunk_plan) and knobs."""
    from ..spec import knobs, symm_layout
    from . import cta_cublas, cta_plan, cta_symm

    x, w1, w2 = args["x"], args["w1"], args["w2"]
    act, approx, stages = args["activation"], args["approximate"], args["stages"]
    why = cta_symm.problem(x, w1, args["b1"], args["w3"], args["b3"], w2, args["b2"], act, approx, stages, ws)
    if why:
        return [f"# symm falls back to p2p: {why}"]
    tp = ws // 2
    stage, idx = divmod(rank, tp)
    (M, H), F, N = x.shape, w1.shape[1] * ws, w2.shape[1]
    if not isinstance(M, int):
        return ["# lowering 'symm': cta_pipeline_mlp; the row count is symbolic here, and the plan "
                "(cta_plan.chunk_plan) depends on it: no listing"]
    # the plan is made per call with the GPU's own SM count: this one's where the graph is compiled on CUDA,
    # else an H200's
    cuda = x.device.type == "cuda" and torch.cuda.is_available()
    num_sms = torch.cuda.get_device_properties(x.device).multi_processor_count if cuda else 132
    plan = cta_plan.chunk_plan(M, F, N, tp, act == "swiglu", x.dtype, num_sms, H=H)
    if plan.flag_words > symm_layout.CTA_CHUNK_WORDS // 2:
        return [f"# symm falls back to p2p: {M} rows need more chunk flags than {symm_layout.CTA_CHUNK_WORDS // 2}"]
    bm, group_m = plan.cfg0[0], plan.cfg0[3]
    fp = (F - plan.f1) // tp
    s0, s1 = cta_cublas.stage_gemms(ws, M, H, F, N, x.dtype)  # (auto: the ratios of this process's GPU, if any)
    staged = knobs.cta.TRANSPORT == "ce" or s0 == "cublas"
    lines = [
        f"# lowering 'symm': cta_pipeline_mlp ({act}), 2 stages x TP{tp}: this rank is stage {stage}, position {idx}",
        f"# plan (cta_plan.chunk_plan for {num_sms} SMs): {plan.groups} row group(s) of {bm * group_m} rows; each "
        f"stage-1 rank computes the last {plan.f1} of the {F} first-GEMM columns itself; each stage-0 rank makes {fp}, ships them in "
        f"{plan.nch} K-chunk(s) of {plan.kchunk}" + (f", the last row group's last {plan.tail} as a tail it "
                                                     "multiplies by W2 itself" if plan.tail else ""),
        "placed = place_weights(w1, b1, w3, b3, w2, b2)  # once per weight version (a collective): this stage's columns",
        "epoch = group.begin(compute)",
        "cuStreamWriteValue32(flag=flags.CTA_EPOCH, value=epoch, stream=compute)",
    ]
    writes_to = (range(tp, ws) if not staged else ()) if stage == 0 else [p for p in range(ws) if p != rank]
    lines += [f"cuStreamWaitValue32(flag=flags.READY[{p}], geq=epoch, stream=compute)" for p in writes_to]
    if stage == 0:
        store = "into its staging buffer" if staged else "straight into the stage-1 ranks' buffers"
        if s0 == "cublas":
            lines.append(f"cublas_stage0(x, placed.w1, position={idx}, stream=compute)  # runtime/cta_cublas.py: addmm + "
                         f"{act} per (row group, K-chunk) block into the staging buffer, then cuStreamWriteValue32 of "
                         "its CTA_DONE")
        else:
            split = f" ({plan.split0} split-K runs per tile)" if plan.split0 > 1 else ""
            lines.append(f"launch(stage0_kernel, x, placed.w1, position={idx}, stream=compute)  # GEMM 1 + {act} tiles"
                         f"{split} {store}; raises CTA_DONE of each (row group, K-chunk) block once its tiles are "
                         "counted")
        if staged:
            for g in range(plan.groups):
                shipped = plan.fship if g == plan.tail_group else fp
                for j in range(min(plan.nch, -(-shipped // plan.kchunk))):
                    lines.append(f"cuStreamWaitValue32(flag=flags.CTA_DONE[{g * plan.nch + j}], geq=epoch, "
                                 "stream=push_stream)")
                    for q in range(tp):
                        lines += [f"cuMemcpyAsync(dst=peer_buf({tp + q}).block(producer={idx}, chunk={j}, group={g}), "
                                  f"src=staging.block(chunk={j}, group={g}), stream=push_stream)",
                                  f"cuStreamWriteValue32(flag=peer_flags({tp + q}).CTA_ARRIVED[{(g * tp + idx) * plan.nch + j}], "
                                  "value=epoch, stream=push_stream)"]
        if plan.tail:
            if staged:
                lines += [f"cuStreamWaitValue32(flag=flags.READY[{p}], geq=epoch, stream=compute)" for p in range(tp, ws)]
            lines.append("launch(tail_kernel, tail_columns, placed.w2_tail, stream=compute)  # partial products into "
                         "the stage-1 ranks' buffers, CTA_TAIL_ARRIVED")
        lines.append("launch(collect_kernel, y, out, stream=compute)  # waits for CTA_Y_DONE of each row tile, copies "
                     "stage 1's result rows into out")
    else:
        if plan.f1:
            share = "cublas_share(" if s0 == "cublas" else "launch(stage0_kernel, "
            lines.append(f"{share}x, placed.w1_share, chunks={plan.nch1}, stream=compute)  # this rank's "
                         "share of GEMM 1, into its own K-chunks")
        if s1 == "cublas":
            lines.append("cublas_stage1(a, placed.w2, stream=compute)  # runtime/cta_cublas.py: per row group, "
                         "cuStreamWaitValue32 on each block's CTA_ARRIVED, addmm into the output rows in arrival "
                         "order; the tails; the rows to every rank by cuMemcpyAsync, their CTA_Y_DONE by signal_kernel")
        else:
            split = (f" in {plan.split1} runs per tile (split-K: the last run adds the partial sums)"
                     if plan.split1 > 1 else "")
            lines.append("launch(stage1_kernel, a, placed.w2, stream=compute)  # each CTA walks K in arrival order"
                         f"{split}, waiting per K-chunk on CTA_ARRIVED; stores its result tiles into every rank's "
                         "buffer, CTA_Y_DONE")
        if tp > 1:
            lines.append("launch(collect_kernel, y, out, stream=compute)  # the other stage-1 ranks' column blocks")
    lines.append("group.end(compute)  # compute waits for the push and copy streams, and for PEER_OK >= 1")
    return lines


def _moe_symm(args: dict, rank: int, ws: int, captured: bool) -> list[str]:
    """runtime/moe_symm.py, following its decisions (combine_transport, expert_major, gemm_schedule)."""
    from . import moe_symm

    x, rows, w_gate = args["x"], args["rows"], args["w_gate"]
    why = moe_symm.problem(x, w_gate, args["w_up"], args["w_down"], rows, args["saved"])
    if why:
        return [f"# symm falls back to p2p: {why}"]
    experts, h, f = w_gate.shape
    transport, sms, _ = moe_symm.combine_transport(args.get("comm_sms", -1), captured)
    m = rows.shape[0]
    major = moe_symm.expert_major(int(m), ws, experts) if isinstance(m, int) else None
    phases, start = moe_symm.gemm_schedule(ws, experts, bool(major))
    combine = {"ce-only": "the copy engine pushes the results and copies them out (no comm kernel)",
               "ce": f"the copy engine pushes the results, a comm kernel on {sms} SMs copies them out",
               "sm": f"a comm kernel on {sms} SMs pushes the results and copies them out"}[transport]
    if major is None:
        combine += "; the tile order (remote-first, or expert-major at decode sizes) is decided per call"
    lines = [
        f"# lowering 'symm': moe_experts, {experts} local experts, H {h}, F {f}; combine: {combine}",
        f"buf = symm_data_view({_t(x.dtype)}, (2, {ws}, cap, {h}))  # [dispatch, combine] slots, cap = x rows",
        "plan = moe_plan(rows, ends, recv_off)  # on the device: grouped rows sorted by (source position, expert),"
        " rank r+1's first, own last" + (" (expert-major: decode size)" if major else ""),
        "epoch = group.begin(compute)",
        *(f"cuStreamWriteValue32(flag=peer_flags({p}).READY[{rank}], value=epoch, stream=compute)"
          for p in range(ws) if p != rank),
    ]
    for j in range(1, ws):  # dispatch, to r-1 first
        d = (rank - j) % ws
        lines += [f"cuStreamWaitValue32(flag=flags.READY[{d}], geq=epoch, stream=push_stream)",
                  f"cuStreamWriteValue32(flag=peer_flags({d}).MOE_CAP[{rank}], value=cap, stream=push_stream)  "
                  "# this rank's rows of x: d's gate/up kernel checks them against its own",
                  f"cuMemcpyAsync(dst=peer_buf({d}).dispatch[{rank}], src=x[send_off[{d}]:send_off[{d + 1}]], "
                  "stream=push_stream)",
                  f"cuStreamWriteValue32(flag=peer_flags({d}).MOE_ARRIVED[{rank}], value=epoch, stream=push_stream)"]
    lines += [f"cuMemcpyAsync(dst=buf.dispatch[{rank}], src=x[send_off[{rank}]:send_off[{rank + 1}]], "
              "stream=copy_stream)  # own rows",
              f"cuStreamWriteValue32(flag=flags.MOE_ARRIVED[{rank}], value=epoch, stream=copy_stream)",
              "stage.zero_(); out[own_rows].zero_()  # copy stream: received rows no grouped row points at are 0"]
    if sms:
        lines.append(f"launch(comm_kernel, grid={sms}, push={transport == 'sm'}, pull=True, stream=comm_stream)  "
                     "# spins on MOE_DONE / MOE_RETURNED while the GEMMs run")
    grid = f"SMs - {sms}" if sms else "SMs"
    for k, (g0, g1, p0, p1) in enumerate(phases):
        sources = ", ".join(str((rank + 1 + p) % ws) for p in range(p0, p1))
        where = f", start_group={start}" if start is not None else ""
        lines.append(f"launch(gate_up_kernel, groups=range({g0}, {g1}){where}, grid={grid}, stream=compute)  # sources "
                     f"{sources}; each tile waits for MOE_ARRIVED of its source, then checks its MOE_CAP")
        if k == 0:
            lines.append("compute.wait(zeroed)  # the down kernel scatters into the zeroed rows")
        lines.append(f"launch(down_kernel, groups=range({g0}, {g1}), grid={grid}, stream=compute)  # raises MOE_DONE[pos] "
                     "when a source's last tile is stored")
    if transport != "sm":
        for pos in range(ws - 1):
            s = (rank + 1 + pos) % ws
            lines += [f"cuStreamWaitValue32(flag=flags.MOE_DONE[{pos}], geq=epoch, stream=push_stream)",
                      f"cuMemcpyAsync(dst=peer_buf({s}).combine[{rank}], src=stage[recv_off[{s}]:recv_off[{s + 1}]], "
                      "stream=push_stream)",
                      f"cuStreamWriteValue32(flag=peer_flags({s}).MOE_RETURNED[{rank}], value=epoch, stream=push_stream)"]
    if not sms:
        for j in range(1, ws):
            d = (rank - j) % ws
            lines += [f"cuStreamWaitValue32(flag=flags.MOE_RETURNED[{d}], geq=epoch, stream=copy_stream)",
                      f"cuMemcpyAsync(dst=out[send_off[{d}]:send_off[{d + 1}]], src=buf.combine[{d}], stream=copy_stream)"]
    else:
        lines.append("compute.wait_stream(comm_stream)")
    lines.append("group.end(compute)  # compute waits for the push and copy streams, and for PEER_OK >= 1")
    if knobs.symm.PUSH_STREAM_PER_PEER and ws > 2:
        lines.insert(1, "# (knobs.symm.PUSH_STREAM_PER_PEER: each peer's pushes go on a push stream of its own)")
    return lines


def _symm(op: str, args: dict, rank: int, ws: int, captured: bool = False) -> list[str] | None:
    """The symm path, or None when the call falls back to p2p (the reason is in the first line)."""
    from .symm import ag_mm as symm_ag_mm, mm_ar as symm_mm_ar, mm_rs as symm_mm_rs

    lines = []
    if op == "ag_mm":
        shard, weights = args["shard"], args["weights"]
        why = symm_ag_mm.ag_mm_problem(shard, weights, args["biases"], args["gather_dim"])
        if why:
            return [f"# symm falls back to p2p: {why}"]
        K = shard.shape[-1]
        rows = shard.numel() // K
        band_list = symm_layout.bands(rows)
        nb = len(band_list)
        es = shard.element_size()
        specs = _epilogue.split_outputs(args.get("epilogue", ""), len(weights)) or [""] * len(weights)
        lines += [
            f"# lowering 'symm': ag_mm, chunks of {rows} rows in {nb} band(s) of {symm_layout.band_rows(rows)} rows",
            f"buf = symm_data_view({_t(shard.dtype)}, ({ws}, {rows}, {K}))  # this rank's receive buffer (peers push here)",
            "epoch = group.begin(compute)",
            *(f"cuStreamWriteValue32(flag=peer_flags({p}).READY[{rank}], value=epoch, stream=compute)"
              for p in range(ws) if p != rank),
        ]
        for j in range(ws - 1):
            peer = (rank - 1 - j) % ws
            for b, (lo, n) in enumerate(band_list):
                if b == 0:  # group.push waits for a peer's READY before its first push of the call
                    lines.append(f"cuStreamWaitValue32(flag=flags.READY[{peer}], geq=epoch, stream=push_stream)")
                lines += [
                    f"cuMemcpyAsync(dst=peer_buf({peer})[{rank}][{lo}:{lo + n}], src=shard[{lo}:{lo + n}], "
                    f"nbytes={n * K * es}, stream=push_stream)",
                    f"cuStreamWriteValue32(flag=peer_flags({peer}).AG_ARRIVED[{rank * nb + b}], value=epoch, "
                    "stream=push_stream)",
                ]
        dim = args["gather_dim"] % shard.dim()
        run = math.prod(shard.shape[dim:-1])
        outer = rows // run if run else 0
        on_cublas = symm_ag_mm.ag_gemm(outer, run, K, sum(w.shape[1] for w in weights), any(specs), ws=ws,
                                       dtype=shard.dtype) == "cublas"
        if on_cublas:
            lines.append(f"# ag_mm on cuBLAS (knobs.symm.AG_MM_GEMM): chunk c of output i is "
                         f"outs[i].view({outer}, {ws}, {run}, N)[:, c], the own chunk first")
            for p in range(ws):
                c = (rank + p) % ws
                if p:
                    lines.append(f"cuStreamWaitValue32(flag=flags.AG_ARRIVED[{c * nb + nb - 1}], geq=epoch, "
                                 "stream=compute)")
                src = "shard" if not p else f"buf[{c}]"
                lines += [f"outs[{i}][{o}, {c}] = {src}[{o}] @ weights[{i}] + biases[{i}]  # cuBLAS"
                          for i in range(len(weights)) for o in range(outer)]
        for i in sorted(range(len(weights) * (not on_cublas)), key=lambda i: bool(_epilogue.out_refs(specs[i]))):
            ep = f"epilogue_{i}" if specs[i] else "identity"
            lines.append(
                f"launch(ag_mm_kernel, grid=num_sms, out=outs[{i}], b=weights[{i}], EPILOGUE={ep})  "
                f"# tiles: own shard, then chunks {[(rank + p) % ws for p in range(1, ws)]}, "
                f"each band after wait_flag(AG_ARRIVED[chunk * {nb} + band] >= epoch)")
        if args.get("return_gathered"):
            for p in range(1, ws):
                c = (rank + p) % ws
                lines += [f"cuStreamWaitValue32(flag=flags.AG_ARRIVED[{c * nb + nb - 1}], geq=epoch, stream=copy_stream)",
                          f"gathered[chunk({c})].copy_(buf[{c}])  # on copy_stream"]
        lines.append("group.end(compute)  # compute waits for the push and copy streams, and for PEER_OK >= 1")
        return lines
    a, b = args["a"], args["b"]
    why = symm_mm_rs.mm_problem(a, b, args["bias"], args["reduce_op"])
    if why is None and op == "mm_rs" and args["scatter_dim"] % len(args["out_shape"]) == len(args["out_shape"]) - 1:
        why = "scatter along the output's columns"
    if why:
        return [f"# symm falls back to p2p: {why}"]
    M, N = a.shape[0], b.shape[1]
    es = a.element_size()
    spec = args.get("epilogue", "")
    if op == "mm_ar" and M * N * es <= knobs.symm.ONESHOT_MAX_BYTES and symm_mm_ar.oneshot_sum(
            M, N, ws, bool(spec), dtype=a.dtype) == "torch":
        return lines + [
            "# lowering 'symm': mm_ar one-shot, summed by torch (knobs.symm.ONESHOT_SUM)",
            f"recv[{rank}] = a @ b + bias  # cuBLAS, into this rank's own slot",
            "epoch = group.begin(compute)",
            *(line for j in range(1, ws) for line in (
                f"cuStreamWaitValue32(flag=flags.READY[{(rank - j) % ws}], geq=epoch, stream=push_stream)",
                f"cuMemcpyAsync(dst=peer_buf({(rank - j) % ws})[{rank}], src=recv[{rank}], nbytes={M * N * es}, "
                "stream=push_stream)",
                f"cuStreamWriteValue32(flag=peer_flags({(rank - j) % ws}).RS_ARRIVED[{rank}], value=epoch, "
                "stream=push_stream)")),
            *(f"cuStreamWaitValue32(flag=flags.RS_ARRIVED[{(rank + p) % ws}], geq=epoch, stream=compute)"
              for p in range(1, ws)),
            f"out = torch.{'mean' if args['reduce_op'] == 'avg' else 'sum'}(recv, dim=0)  # float32 accumulate",
            "group.end(compute)",
        ]
    if op == "mm_ar" and M * N * es <= knobs.symm.ONESHOT_MAX_BYTES:
        lines += [
            "# lowering 'symm': mm_ar one-shot (partial <= ONESHOT_MAX_BYTES)",
            "partial = a @ b + bias  # cuBLAS (addmm when there is a bias)",
            "epoch = group.begin(compute)",
            *(line for j in range(1, ws) for line in (
                f"cuStreamWaitValue32(flag=flags.READY[{(rank - j) % ws}], geq=epoch, stream=push_stream)",
                f"cuMemcpyAsync(dst=peer_buf({(rank - j) % ws})[{rank}], src=partial, nbytes={M * N * es}, "
                "stream=push_stream)",
                f"cuStreamWriteValue32(flag=peer_flags({(rank - j) % ws}).RS_ARRIVED[{rank}], value=epoch, "
                "stream=push_stream)")),
            f"launch(oneshot_sum_kernel, out=out, EPILOGUE={'epilogue_0' if spec else 'identity'})  "
            "# waits RS_ARRIVED[p] >= epoch for every peer p, sums, epilogue, stores",
            "group.end(compute)",
        ]
        return lines
    if op == "mm_ar" and symm_mm_ar.ar_gemm(M, a.shape[1], ws, "ce" if captured else None, N=N,
                                            dtype=a.dtype) == "cublas":
        return lines + _mm_ar_cublas(args, rank, ws, M, a.shape[1], N, es)
    if op == "mm_rs":
        shape = list(args["out_shape"])
        dim = args["scatter_dim"] % len(shape)
        outer, run = math.prod(shape[:dim]), shape[dim] // ws * math.prod(shape[dim + 1 : -1])
        if symm_mm_rs.rs_gemm(outer, run, a.shape[1], "ce" if captured else None, N=N, ws=ws,
                              dtype=a.dtype) == "cublas":
            return lines + _mm_rs_cublas(args, rank, ws, outer, run, N, es, captured)
    rounds = symm_mm_ar.ar_rounds(M, ws) if op == "mm_ar" else 1
    if op == "mm_ar":
        rows = -(-M // (rounds * ws))
    else:
        shape = list(args["out_shape"])
        rows = math.prod(shape) // shape[-1] // ws
    band_list = symm_layout.bands(rows)
    nb = len(band_list)
    lines += [
        f"# lowering 'symm': {op}, {rounds} round(s) x {ws} chunks of {rows} rows, {nb} band(s) each, "
        f"transport {knobs.symm.TRANSPORT!r}",
        f"recv = symm_data_view({_t(a.dtype)}, ({rounds * ws * rows}, {N}))",
        f"stage = torch.empty(({rounds * ws * rows}, {N}))  # remote chunks' partials, pushed by the copy engine",
        "epoch = group.begin(compute)",
        f"launch(mm_rs_kernel, grid=num_sms, EPILOGUE={'epilogue_0' if spec and op == 'mm_rs' else 'identity'})  "
        f"# per round: chunks {[(rank + 1 + p) % ws for p in range(ws)]} (own last); remote tiles -> stage, "
        "count -> DONE flag; own tiles wait RS_ARRIVED of every peer, add, epilogue, store",
    ]
    ready_waited = set()
    for rnd in range(rounds):
        for pos in range(ws - 1):
            c = (rank + 1 + pos) % ws
            slot = rnd * ws + c
            for bi, (lo, n) in enumerate(band_list):
                dst = (rnd * ws + rank) * rows + lo
                src = slot * rows + lo
                lines.append(f"cuStreamWaitValue32(flag=flags.DONE[{slot * nb + bi}], geq=epoch, stream=push_stream)")
                if c not in ready_waited:
                    ready_waited.add(c)
                    lines.append(f"cuStreamWaitValue32(flag=flags.READY[{c}], geq=epoch, stream=push_stream)")
                lines += [
                    f"cuMemcpyAsync(dst=peer_recv({c})[{dst}:{dst + n}], src=stage[{src}:{src + n}], "
                    f"nbytes={n * N * es}, stream=push_stream)",
                    f"cuStreamWriteValue32(flag=peer_flags({c}).RS_ARRIVED[{(rnd * ws + rank) * nb + bi}], value=epoch, "
                    "stream=push_stream)",
                ]
        if op == "mm_ar":
            own = rnd * ws + rank
            copied = ("by the kernel's copy tiles (AR_KERNEL_COPY_OUT)" if knobs.symm.AR_KERNEL_COPY_OUT else
                      "on copy_stream")
            lines.append(f"# round {rnd}: reduced bands of slot {own} pushed to every peer (GATHERED flags), "
                         f"peers' reduced bands copied into out {copied} as their GATHERED flags rise")
    lines.append("group.end(compute)")
    if spec and op == "mm_ar":
        lines.append("launch(pointwise_kernel_0, x=out, out=out)  # the generated epilogue, after the all-gather")
    return lines


def _mm_rs_cublas(args: dict, rank: int, ws: int, outer: int, run: int, N: int, es: int,
                  captured: bool = False) -> list[str]:
    from .symm import mm_rs as symm_mm_rs

    bands = symm_mm_rs.rs_cublas_bands(outer, run, args["a"].shape[1], N, captured=captured)
    nb = len(bands)
    peers = [(rank + p) % ws for p in range(1, ws)]
    spec = args.get("epilogue", "")
    scale = "1/ws" if args["reduce_op"] == "avg" else "1"
    lines = [
        f"# lowering 'symm': mm_rs on cuBLAS (knobs.symm.MM_RS_GEMM), {ws} chunks of {outer} x {run} rows, "
        f"{nb} band(s) each; chunk c of a is a.view({outer}, {ws}, {run}, K)[:, c]",
        f"recv = symm_data_view({_t(args['a'].dtype)}, ({ws}, {outer}, {run}, {N}))",
        f"stage = torch.empty(({ws}, {outer}, {run}, {N}))  # remote chunks' partials, pushed by the copy engine",
        "epoch = group.begin(compute)",
    ]
    for c in [(rank + 1 + p) % ws for p in range(ws - 1)]:
        for i, band in enumerate(bands):
            lines += [f"stage[{c}, {o}, {j}:{j + n}] = a[{o}, {c}, {j}:{j + n}] @ b + bias  # cuBLAS (bias if any)"
                      for o, j, n in band]
            lines.append(f"cuStreamWriteValue32(flag=flags.DONE[{c * nb + i}], value=epoch, stream=compute)")
    for c in [(rank + 1 + p) % ws for p in range(ws - 1)]:
        lines.append(f"cuStreamWaitValue32(flag=flags.READY[{c}], geq=epoch, stream=push_stream)")
        for i, band in enumerate(bands):
            lo, n = symm_mm_rs.rs_band_span(band, run)
            lines += [
                f"cuStreamWaitValue32(flag=flags.DONE[{c * nb + i}], geq=epoch, stream=push_stream)",
                f"cuMemcpyAsync(dst=peer_recv({c})[{rank}].view(-1, {N})[{lo}:{lo + n}], src=stage[{c}].view(-1, {N})"
                f"[{lo}:{lo + n}], "
                f"nbytes={n * N * es}, stream=push_stream)",
                f"cuStreamWriteValue32(flag=peer_flags({c}).RS_ARRIVED[{rank * nb + i}], value=epoch, stream=push_stream)",
            ]
    own_first = nb == 1
    fused = ws == 2 and args["bias"] is None and not spec  # several bands: addmm reduces
    for i, band in enumerate(bands):
        if own_first:  # one band: the own partial overlaps the transfer of the peers'
            lines += [f"recv[{rank}, {o}, {j}:{j + n}] = a[{o}, {rank}, {j}:{j + n}] @ b + bias  # cuBLAS"
                      for o, j, n in band]
        lines += [f"cuStreamWaitValue32(flag=flags.RS_ARRIVED[{p * nb + i}], geq=epoch, stream=compute)" for p in peers]
        for o, j, n in band:
            if not own_first and fused:
                lines.append(f"out[{o}, {j}:{j + n}] = torch.addmm(recv[{peers[0]}, {o}, {j}:{j + n}], "
                             f"a[{o}, {rank}, {j}:{j + n}], b, beta={scale}, alpha={scale})  # cuBLAS")
                continue
            if not own_first:
                lines.append(f"recv[{rank}, {o}, {j}:{j + n}] = a[{o}, {rank}, {j}:{j + n}] @ b + bias  # cuBLAS")
            lines.append(f"launch(reduce_kernel_0, slots=recv[:, {o}, {j}:{j + n}], out=out[{o}, {j}:{j + n}], "
                         f"scale={scale})  # sum over ranks, then the generated epilogue"
                         if spec else
                         f"out[{o}, {j}:{j + n}] = recv[:, {o}, {j}:{j + n}].{'mean' if scale != '1' else 'sum'}(0)")
    lines.append("group.end(compute)  # compute waits for the push stream, and for PEER_OK >= 1")
    return lines


def _mm_ar_cublas(args: dict, rank: int, ws: int, M: int, K: int, N: int, es: int) -> list[str]:
    from .symm import mm_ar as symm_mm_ar

    rounds = symm_mm_ar.ar_cublas_rounds(M, K, N, ws)
    rows = -(-M // (rounds * ws))
    peers = [(rank + p) % ws for p in range(1, ws)]
    lines = [f"# lowering 'symm': mm_ar on cuBLAS (knobs.symm.MM_RS_GEMM), {rounds} round(s) x {ws} chunks of "
             f"{rows} rows; chunk c of round t: rows (t * {ws} + c) * {rows} on",
             f"recv, gather = symm_data_view(...), symm_data_view(...)  # ({rounds * ws * rows}, {N}) each",
             "epoch = group.begin(compute)"]
    for t in range(rounds):
        for c in [(rank + 1 + p) % ws for p in range(ws - 1)]:
            s = t * ws + c
            lines += [f"stage[chunk({s})] = a[chunk({s})] @ b + bias  # cuBLAS (bias if any)",
                      f"cuStreamWriteValue32(flag=flags.DONE[{s}], value=epoch, stream=compute)",
                      f"cuStreamWaitValue32(flag=flags.DONE[{s}], geq=epoch, stream=push_stream)",
                      f"cuMemcpyAsync(dst=peer_recv({c})[chunk({t * ws + rank})], src=stage[chunk({s})], "
                      f"nbytes={rows * N * es}, stream=push_stream)  # after READY[{c}] once",
                      f"cuStreamWriteValue32(flag=peer_flags({c}).RS_ARRIVED[{t * ws + rank}], value=epoch, "
                      "stream=push_stream)"]
        own = t * ws + rank
        # the own partial overlaps the peers' transfers
        lines.append(f"recv[chunk({own})] = a[chunk({own})] @ b + bias  # cuBLAS")
        lines += [f"cuStreamWaitValue32(flag=flags.RS_ARRIVED[{t * ws + p}], geq=epoch, stream=compute)" for p in peers]
        lines.append(f"out[chunk({own})] = recv[chunks_of_round({t})].sum(0)  # mean for avg")
        lines += [f"cuStreamWriteValue32(flag=flags.DONE[{own}], value=epoch, stream=compute)",
                  f"cuStreamWaitValue32(flag=flags.DONE[{own}], geq=epoch, stream=push_stream)"]
        for p in peers:
            lines += [f"cuMemcpyAsync(dst=peer_gather({p})[chunk({own})], src=out[chunk({own})], stream=push_stream)",
                      f"cuStreamWriteValue32(flag=peer_flags({p}).GATHERED[{own}], value=epoch, stream=push_stream)"]
        for q in peers:
            lines += [f"cuStreamWaitValue32(flag=flags.GATHERED[{t * ws + q}], geq=epoch, stream=copy_stream)",
                      f"cuMemcpyAsync(dst=out[chunk({t * ws + q})], src=gather[chunk({t * ws + q})], "
                      "stream=copy_stream)"]
    lines.append("group.end(compute)")
    if args.get("epilogue"):
        lines.append("launch(pointwise_kernel_0, x=out, out=out)  # the generated epilogue, after the all-gather")
    return lines


CAPTURED_NOTE = [
    "# Captured in a CUDA graph (mode='reduce-overhead'; knobs.symm.CAPTURE_ON_SYMM): the calls below run",
    "# with the toggling flag block instead: every flag word w is symm_layout.GRAPH_BLOCK + w, every raise writes 1",
    "# and every wait is for >= 1 (read `epoch` as 1), begin() consumes and resets the peers' READY on the",
    "# push stream, end() zeroes the arrival and done words (symm_layout.GRAPH_RESET); moe_experts combines by the",
    "# copy engine only (no comm kernel). A call whose group, buffer or block config no eager call set up",
    "# runs on p2p instead (docs/symm.md#limits).",
]


def render(op: str, args: dict, rank: int, ws: int, captured: bool = False) -> str:
    """The listing for one call of ``overlap::<op>`` with ``args`` (name -> value, schema names);
    ``captured``: the graph is replayed from a CUDA graph (a note on how the flags differ)."""
    lowering = args["lowering"]
    head = [f"# overlap::{op} on rank {rank} of {ws}, lowering {lowering!r}"]
    if captured and lowering == "symm" and op != "cta_pipeline_mlp":
        head += CAPTURED_NOTE
    head += [f"# {k} = {_t(v) if not isinstance(v, (list, tuple)) else '[' + ', '.join(map(_t, v)) + ']'}"
             for k, v in args.items()]
    p2p = {"moe_experts": _moe_p2p, "cta_pipeline_mlp": _cta_p2p}.get(op, lambda *a: _ring_p2p(op, *a))
    own = {"moe_experts": _moe_symm, "cta_pipeline_mlp": _cta_symm}.get(op)
    body = []
    if lowering == "symm":
        body = (own(args, rank, ws, captured) if own else _symm(op, args, rank, ws, captured)) or []
        if body and body[0].startswith("# symm falls back"):
            body += p2p(args, rank, ws)
    else:
        body = p2p(args, rank, ws)
    return "\n".join(head + [f"def {op}_calls():"] + ["    " + line for line in body]) + "\n"
