"""The symm lowering's flag, status and report layout, and the band math every side computes alike.

A contract between the tile kernels (``codegen/``: they wait on and raise these words and write the
report), the runtime (``runtime/symm/``: it allocates the buffers, queues stream waits and writes on
them, releases them and reads the report) and the cost model (bands per chunk). Plain constants:
changing one changes the layout on every side at once, so none of them is a knob.

Flag buffer: int32 words, one buffer per rank and group, mapped by every peer. "Arrived" flags are
written by peers, the others locally. Flags are only ever raised to the current epoch (compare
``>=``), so nothing is reset between eager calls.
"""

from __future__ import annotations

from . import knobs

WS_MAX = 8  # ranks of one node: every per-rank array of the layout has this many entries
# mm_ar: at most this many row blocks (rounds; each costs ~3 host calls per peer and band), each with slots of its own
AR_MAX_ROUNDS = 4
MAX_BANDS = 8  # a chunk travels in at most this many bands, each with a flag of its own
SLOTS = AR_MAX_ROUNDS * WS_MAX * MAX_BANDS  # flags per (round, rank, band) array

# ----------------------------------------------------------------------------------- flag words
READY = 0  # [p]: rank p's buffers are free for this call (p wrote its epoch here)
AG_ARRIVED = 16  # [p * nbands + b]: band b of rank p's shard is in this rank's ag_mm receive buffer
RS_ARRIVED = AG_ARRIVED + WS_MAX * MAX_BANDS  # [(round * ws + p) * nbands + b]: rank p's partial arrived
GATHERED = RS_ARRIVED + SLOTS  # [(round * ws + p) * nbands + b]: rank p's reduced band arrived (mm_ar)
DONE = GATHERED + SLOTS  # [(round * ws + c) * nbands + b]: this rank finished that band of chunk c (local)
COUNTERS = DONE + SLOTS  # same index: tiles of that band finished so far (local)
CLAIM = COUNTERS + SLOTS  # a kernel timed out (local; the report itself is in pinned host memory)
TICKET = CLAIM + 1  # mm_rs/mm_ar tile tickets (local; 0 between calls)
# moe_experts (runtime/moe_symm.py): s / d are ranks, pos = (source - rank - 1) % ws a source position.
MOE_ARRIVED = TICKET + 1  # [s]: source s's dispatch rows are in this rank's dispatch slot s (s's copy engine)
MOE_RETURNED = MOE_ARRIVED + WS_MAX  # [d]: rank d's results for this rank's rows are in combine slot d (d's SMs/CE)
MOE_DONE = MOE_RETURNED + WS_MAX  # [pos]: the producer finished every tile of that source (local)
MOE_COUNTERS = MOE_DONE + WS_MAX  # [pos]: its tiles finished so far (local; 0 between calls)
MOE_PUSHED = MOE_COUNTERS + WS_MAX  # [pos]: communication CTAs done copying that segment (local; 0 between calls)
# [s]: the row count of x on source s, i.e. the stride of its slots, written by s after this rank's READY and
# before its dispatch rows; gate_up_kernel compares it with this rank's own (moe_experts on symm needs the same
# on every rank). A value, not a flag: one word for eager and captured calls alike (outside the graph block).
MOE_CAP = MOE_PUSHED + WS_MAX
# cta_pipeline_mlp (codegen/cta.py): two blocks of words, one for eager calls (epochs from the host's
# counter) and one for calls inside captured CUDA graphs (epochs counted on the device), so that each
# block's flags only ever see one increasing sequence. Offsets inside a block:
CTA_CHUNK_WORDS = 4096
CTA_ROW_WORDS = 1024
CTA_ARRIVED = 0  # [(g * tp + p) * nch + j]: stage-0 rank p's block (g, j) is in this rank's buffer
CTA_COUNTERS = CTA_ARRIVED + CTA_CHUNK_WORDS  # [g * nch + j]: tiles of block (g, j) stored (stage 0, local)
CTA_DONE = CTA_COUNTERS + CTA_CHUNK_WORDS // 2  # [g * nch + j]: block (g, j) staged (stage 0, local)
CTA_Y_DONE = CTA_DONE + CTA_CHUNK_WORDS // 2  # [t * tiles_m + m]: stage-1 rank t's row block m is here
# [m]: tiles of row block m done (stage 1, local), then [tiles_m + tile]: split-K runs of a tile done (stage 1,
# local); stage 0: [tile], its split-K runs, then (the next kernel) [t * tiles_m + m], its tail tiles for rank t.
# Every kernel leaves the words it counts on at 0, so kernels one after another share them.
CTA_Y_COUNTERS = CTA_Y_DONE + CTA_ROW_WORDS
CTA_TAIL_ARRIVED = CTA_Y_COUNTERS + CTA_ROW_WORDS  # [p * tiles_m + m]: stage-0 rank p's tail of row block m is here
CTA_EPOCH = CTA_TAIL_ARRIVED + CTA_ROW_WORDS  # the epoch the kernels read (local)
CTA_READY = CTA_EPOCH + 1  # [p]: graph block: rank p started this call (peers write)
CTA_BLOCK_WORDS = CTA_READY + WS_MAX
CTA_BLOCKS = MOE_CAP + WS_MAX  # the eager block, then the graph block


def cta_block(graph: bool) -> int:
    """First word of the cta_pipeline_mlp block for eager calls or captured ones."""
    return CTA_BLOCKS + (CTA_BLOCK_WORDS if graph else 0)


# Calls captured into CUDA graphs (ag_mm, mm_rs, mm_ar, moe_experts): a copy of the words READY ..
# MOE_PUSHED at GRAPH_BLOCK. A stream memory operation's value is baked into the graph, so there flags *toggle*
# instead of counting epochs: every raise writes 1, every wait is for >= 1, and the consumer resets
# each flag to 0 once consumed, in stream order before it next tells the raiser to go on (READY:
# the push stream, right after waiting for it; arrival and done flags: the compute stream, after
# the call's streams joined). Each word then sees 0, 1, 0, 1, ... with one raiser and one resetter
# per call, and a replay needs no value from the host (``GroupState.begin(graph=True)``).
GRAPH_BLOCK = CTA_BLOCKS + 2 * CTA_BLOCK_WORDS
GRAPH_WORDS = MOE_PUSHED + WS_MAX
# The words a captured call's end resets: arrivals and done flags (AG_ARRIVED .. DONE, MOE_ARRIVED ..
# MOE_DONE), and between them COUNTERS, CLAIM and TICKET, which are 0 between calls anyway (one
# kernel for the whole range)
GRAPH_RESET = (AG_ARRIVED, MOE_COUNTERS)
# A rank whose watchdog fires releases its own waits, so its kernels and pushes run on and send its
# peers garbage under flags that look valid. Before that it lowers PEER_OK in every peer (1 from setup,
# 0 once a peer gave up) and marks itself in their GAVE_UP words; every call's end waits for PEER_OK
# >= 1 on the compute stream, so a peer that consumed such garbage stalls there instead of going on,
# and its own watchdog turns that into an exception (its release raises PEER_OK to RELEASED). GAVE_UP
# lies past the words a release raises: it says which peer gave up.
PEER_OK = GRAPH_BLOCK + GRAPH_WORDS
GAVE_UP = PEER_OK + 1  # [p]: rank p gave up a call (written by p)
FLAG_WORDS = GAVE_UP + WS_MAX
RELEASED = 0x7FFFFFFF  # what an overdue call's flags are set to: >= every epoch (stream waits, kernels)
# What a release raises to RELEASED: every word below GAVE_UP but the tile tickets (eager and graph
# block), which are not flags but tile numbers: a kernel drawing from RELEASED gets a negative tile
# and addresses outside its operands (an illegal address after a release, seen on one H200:
# bench/results/gpu_tests_h200x1_2026-12-01/mm_ar_hang).
RELEASE_SPANS = ((0, TICKET), (TICKET + 1, GRAPH_BLOCK + TICKET), (GRAPH_BLOCK + TICKET + 1, GAVE_UP))

# ---------------------------------------------------------------------------------- status words
# Pinned host memory mapped into the device, one buffer per group: words 0 .. REPORT_WORDS - 1 are a
# kernel's report (below), then what the compute stream and the watchdog write.
REPORT_WORDS = 8  # [kind, op, rank, flag index, value seen, value expected, bands per chunk, (unused)]
STARTED, FINISHED = 8, 9  # epochs of the last eager call the compute stream reached / completed (watchdog)
GRAPH_STARTED, GRAPH_FINISHED = 10, 11  # captured calls: counted up by a kernel at each replay (watchdog)
STATUS_GAVE_UP = 16  # status words 16..23: a copy of GAVE_UP, made by the watchdog when it fires
STATUS_WORDS = STATUS_GAVE_UP + WS_MAX

# Report word 0: what the report is (0: none).
STATUS_TIMEOUT = 1  # a wait gave up: [1, op, rank, flag index, value read, epoch awaited, bands per chunk]
STATUS_MISMATCH = 2  # a peer's value differs from this rank's: [2, op, rank, which value, the peer's, this rank's]
# Report word 1: the op whose kernel wrote it.
OP_AG_MM = 1
OP_MM_RS = 2
OP_MM_AR = 3
OP_AR_ONESHOT = 4
OP_MOE = 5
OP_CTA_STAGE1 = 6
OP_CTA_COLLECT = 7
OP_CTA_STAGE0 = 8
OP_CTA_TAIL = 9  # stage 1's epilogue waiting for a stage-0 rank's tail (partial products)
OP_NAMES = {OP_AG_MM: "ag_mm", OP_MM_RS: "mm_rs", OP_MM_AR: "mm_ar", OP_AR_ONESHOT: "mm_ar (one-shot)",
            OP_MOE: "moe_experts", OP_CTA_STAGE1: "cta_pipeline_mlp (stage 1)",
            OP_CTA_COLLECT: "cta_pipeline_mlp (collect)", OP_CTA_STAGE0: "cta_pipeline_mlp (stage 0)",
            OP_CTA_TAIL: "cta_pipeline_mlp (stage 1, tail)"}
# Report word 3 (the flag index) of waits that are not on the op's own arrival array: base + index.
MOE_DONE_FLAG_BASE = 100  # moe_experts: + pos, the local wait for source pos's tiles
MOE_RETURN_FLAG_BASE = 200  # moe_experts: + d, the wait for rank d's results
MOE_CAP_FLAG_BASE = 300  # moe_experts (a mismatch): + s, rank s's row count differs
READY_FLAG_BASE = 1000  # + p: the wait for rank p's READY
GATHER_FLAG_BASE = 2000  # mm_ar: + i, a copy tile's wait for gathered band i


# ----------------------------------------------------------------------------------------- bands
def band_rows(rows: int) -> int:
    """Rows per band of a chunk of ``rows`` rows: depends only on ``rows`` (and the knob), so every
    rank agrees, and a multiple of ``knobs.symm.BAND_ROWS_MIN`` (so of every block height); at most
    MAX_BANDS bands."""
    least = knobs.symm.BAND_ROWS_MIN
    per = max(least, -(-rows // MAX_BANDS))
    return -(-per // least) * least


def bands(rows: int) -> list[tuple[int, int]]:
    """(first row, row count) of each band of a chunk of ``rows`` rows (one empty band if rows == 0)."""
    step = band_rows(rows)
    return [(lo, min(step, rows - lo)) for lo in range(0, rows, step)] or [(0, 0)]
