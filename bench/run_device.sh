#!/usr/bin/env bash
# The one script to run on the GPU machine (2, 4 or 8 GPUs), from anywhere inside the repo copy:
#
#   bash bench/run_device.sh          # GPU tests, then the benchmarks (2/4 GPUs: ws=4 then ws=2; 8 GPUs: ws=8)
#   bash bench/run_device.sh quick    # smoke run: ws=2 tests only, benchmarks with --quick
#   bash bench/run_device.sh bench    # the benchmarks only (no GPU tests)
#   bash bench/run_device.sh tests    # the GPU tests only (every tests/gpu/test_gpu*.py), the whole deadline for them
#   bash bench/run_device.sh smoke    # the GPU smoke set only (pytest -m gpu_smoke: every symm op once at 2 ranks,
#                                      eager and captured, the timeout and dead-peer paths; ~3-5 min on a fresh
#                                      machine); one GPU: the 2 ranks share it (OVERLAP_TEST_SHARED_GPU=1)
#   SMOKE_LOOP=20 bash bench/run_device.sh smoke   # the smoke set up to 20 times in a row (each run a new
#                                      pytest: fresh Inductor caches, warm Triton cache after the first); a
#                                      run is started only while the longest so far still fits the deadline;
#                                      prints the pass count of every test over the runs (logs gpu_smoke_<i>.log)
#   SMOKE_WORKERS=1 bash bench/run_device.sh smoke # its 3 tests one after another (default: 3 pytest-xdist
#                                      workers where pytest-xdist is installed, each test one spawned group)
#   RUN_SMOKE=0 bash bench/run_device.sh    # full/quick/tests modes run the smoke set first; this skips it
#   bash bench/run_device.sh help     # this text
#   TESTS_K="ws4 or names_op_rank" bash bench/run_device.sh   # a pytest -k selection of the GPU tests
#                                      (-k matches marker names too: "timeout" would select every test)
#                                      (default: the symm tests at the largest world size + timeout,
#                                      dead peer, captured symm, stream operations;
#                                      TESTS_K= runs them all)
#   OVERLAP_TEST_TIMEOUT_S=150 bash bench/run_device.sh tests   # caps every test's own timeout, so a hang
#                                      prints the stuck ranks' Python stacks before the stage limit kills it
#   OVERLAP_TEST_SHARED_GPU=1 TESTS_K="ws4 and symm-rstma" bash bench/run_device.sh tests   # one GPU: every
#                                      rank of a multi-rank GPU test on GPU 0 (gloo group; numerics, flags and
#                                      hangs at 2/4/8 ranks, not speed; a cold Triton cache makes the first
#                                      tests slow: 4 ranks compile at once)
#   TEST_FILES="tests/gpu/test_gpu_cta.py" BENCHES="cta" bash bench/run_device.sh   # a subset
#                                      (defaults: tests/gpu/test_gpu.py tests/gpu/test_gpu_cta.py, in `tests` mode
#                                      every tests/gpu/test_gpu*.py; BENCHES="collective block cta", with
#                                      8 GPUs "collective moe block cta")
#   BENCH_WS="8 4 2" bash bench/run_device.sh bench   # the world sizes to benchmark, in that order
#                                      (default: "4 2"; with 8 GPUs "8")
#
# On one 8-GPU node (e.g. 8×H200), everything at ws=8 with one command:
#
#   bash bench/run_device.sh          # GPU tests at ws=8 (symm + timeout), then the ws=8 benchmarks:
#                                     # collective (AG->GEMM, GEMM->RS, GEMM->AR at TP=8, traces), MoE at
#                                     # EP=8 (DeepSeek-like, 64 experts), TP block (end-to-end), CTA
#                                     # (2 stages × TP4 vs TP8; 4 stages × TP2 reported "not supported")
#
# The deadline (540 s) does not hold all of that at ws=8: what is cut is listed as NOT STARTED (or
# TIMED OUT). Within 10-minute windows, split it:
#   bash bench/run_device.sh tests                      # the GPU tests at ws=8 (narrow with TEST_FILES)
#   bash bench/run_device.sh bench                      # collective, MoE, block, CTA at ws=8
#   BENCHES="block cta" bash bench/run_device.sh bench  # what the previous command did not reach
#   BENCH_WS="4 2" bash bench/run_device.sh bench       # ws=4 and ws=2 on GPUs 0-3 / 0-1 of the same node
#   BENCHES="host" bash bench/run_device.sh bench     # host time per symm op call (bench/probes/probe_host.py), opt-in
#   BENCHES="graphs" bash bench/run_device.sh bench   # under CUDA graphs, opt-in: bench_models.py --mode
#                                      reduce-overhead (llama, serve), bench_epilogue.py --cudagraphs (TP block,
#                                      train), bench_moe.py --graphs (4 configs, balanced)
#   BENCHES="models" bash bench/run_device.sh bench   # the real-model benchmark (bench_models.py):
#                                      opt-in, not in the default list (a few minutes per world size;
#                                      cap LIMIT_MODELS, default 300 s; DEADLINE=900 leaves room for ws 4 and 2)
#
# Nothing is installed: PYTHONPATH points at the repo. NVLink multicast stays off (the three
# variables below). Every stage runs under `timeout`: its own cap, cut to what is left of a
# DEADLINE for the whole script (default 540 s), so the script ends within ~9 minutes; a stage with
# less than 20 s left is not started. A failing stage does not stop the next ones, but the exit
# status is 1 if any stage failed or was not started.
#
# Stages, in priority order: versions; GPU tests; per world size of BENCH_WS (2/4 GPUs: 4, then 2;
# 8 GPUs: 8): collective benchmark (at the largest world size -- 4, or 8 with 8 GPUs -- with profiler
# traces of the M=4096 rows), MoE benchmark (only in BENCHES by default with 8 GPUs), block benchmark
# (largest world size: traces), CTA-pipelining benchmark (bench_cta.py, traces of M=4096).
# RUN_DEMO=1 adds `python -m overlap_backend.examples.demo` after the tests (bench_block.py measures the
# same block at the same sizes, so it is off by default to fit the time). RUN_EPILOGUE=1 adds the
# epilogue benchmark at the end (on GPUs 0,1; EPILOGUE_WS=8 for all 8).
#
# Writes to $OUT (default ./device_out), 5 files:
#   run_device.log        everything this script printed
#   gpu_tests.log         the pytest run
#   bench_summary.md      every benchmark table (<suite>_ws<N>.md and block_ws<N>.md, ws=2 first)
#   bench_results.tar.gz  the .md/.json files themselves: tar -xzf ... -C bench/results/<run>
#   traces.tar.gz         torch.profiler traces (Chrome/Perfetto JSON) of ranks 0 and 1 at the largest ws
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
MODE="${1:-full}"
case "$MODE" in
  full | quick | bench | tests | smoke) ;;
  help | -h | --help)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' bench/run_device.sh
    exit 0 ;;
  *) echo "usage: bash bench/run_device.sh [quick|bench|tests|smoke|help]   (help: what each does, 2/4/8 GPUs)" >&2; exit 2 ;;
esac

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# every rank of a bench prints its Python stacks this often (bench/tools/common.py: stall_dump): a stage
# that stops printing then shows where its host waits (bench_moe did, unexplained, in 3 of 5 runs)
export BENCH_STALL_DUMP_S="${BENCH_STALL_DUMP_S:-120}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || PY=python
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d)"
RESULTS="$WORK/results"
TRACES="$WORK/traces"
mkdir -p "$RESULTS" "$TRACES"

# Whole-script deadline and per-stage caps in seconds (each stage also gets 5 s to die after SIGTERM).
# Typical (4×H200): versions ~8, tests ~150-200, collective bench ~40-90 per ws, block bench ~60 per ws.
# (8 GPUs: not measured yet; expect more, every rank compiles its kernels at start.)
DEADLINE="${DEADLINE:-540}"
RESERVE=15 # kept for packaging the results at the end
MIN_STAGE=20
LIMIT_INFO="${LIMIT_INFO:-30}"
LIMIT_SMOKE="${LIMIT_SMOKE:-320}"  # one run of the smoke set (a fresh machine: ~3-5 min, most of it compiling)
SMOKE_LOOP="${SMOKE_LOOP:-1}"
if [ "$MODE" = tests ]; then LIMIT_TESTS="${LIMIT_TESTS:-$DEADLINE}"; else LIMIT_TESTS="${LIMIT_TESTS:-210}"; fi
LIMIT_BENCH="${LIMIT_BENCH:-210}"  # with --graphs: every variant also captured and replayed
LIMIT_MOE="${LIMIT_MOE:-270}"
LIMIT_BLOCK="${LIMIT_BLOCK:-120}"
LIMIT_CTA="${LIMIT_CTA:-240}"
# BENCHES, BENCH_WS: defaults depend on the GPU count (main); TEST_FILES: on the mode.
DEFAULT_TEST_FILES="tests/gpu/test_gpu.py tests/gpu/test_gpu_cta.py"
[ "$MODE" = tests ] && DEFAULT_TEST_FILES="$(echo tests/gpu/test_gpu*.py)"
TEST_FILES="${TEST_FILES:-$DEFAULT_TEST_FILES}"
# The MoE stage (8 GPUs by default, else BENCHES="... moe"): DeepSeek-like at EP=N first (64 experts),
# then the 32-expert one, with transformers' fused expert weights too and the tensor-parallel experts' table;
# MOE_ARGS replaces these arguments of bench_moe.py.
MOE_ARGS="${MOE_ARGS:---configs deepseek-ep8,deepseek --routing balanced,skewed --comm-sms 8 --weights separate,fused_linear --tp-experts}"
EPILOGUE_WS="${EPILOGUE_WS:-2}"
LIMIT_MODELS="${LIMIT_MODELS:-300}"
LIMIT_DEMO="${LIMIT_DEMO:-90}"
TRACES_MAX_BYTES=$((15 * 1024 * 1024))

FAILED=()
SKIPPED=()
T0=$SECONDS

stage() { # stage NAME CAP CMD... : run CMD under timeout, record a failure, never abort
  local name=$1 cap=$2
  shift 2
  echo
  local left=$((DEADLINE - RESERVE - 5 - (SECONDS - T0)))
  local limit=$cap
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt "$MIN_STAGE" ]; then
    echo "=== [t=$((SECONDS - T0))s] $name: NOT STARTED, ${left}s left of the ${DEADLINE}s deadline"
    FAILED+=("$name (not started: no time left)")
    return 0
  fi
  local cmd="$*"
  [ ${#cmd} -gt 240 ] && cmd="${cmd:0:240}..."
  echo "=== [t=$((SECONDS - T0))s] $name (limit ${limit}s): ${cmd//$'\n'/ }"
  local t=$SECONDS
  timeout -k 5 "$limit" "$@"
  local rc=$?
  [ "$rc" -eq 124 ] && echo "=== $name: TIMED OUT after ${limit}s"
  echo "=== [t=$((SECONDS - T0))s] $name: exit status $rc after $((SECONDS - t))s"
  [ "$rc" -ne 0 ] && FAILED+=("$name (exit $rc)")
  return 0
}

benchmarks() { # benchmarks N : the benchmarks of BENCHES on GPUs 0..N-1
  local n=$1
  if [ "$NGPU" -lt "$n" ]; then
    echo "=== bench_ws$n, block_ws$n: skipped, $NGPU GPU(s)"
    SKIPPED+=("bench_ws$n" "block_ws$n")
    return 0
  fi
  local devs quick=() trace=() trace_block=() moe_args
  devs=$(seq -s, 0 $((n - 1)))
  [ "$MODE" = quick ] && quick=(--quick)
  if [ "$n" -eq "$TRACE_WS" ]; then # traces at the largest ws only (ranks 0 and 1), collective bench: M=4096 rows only
    trace=(--trace "$TRACES" --trace-m 4096)
    trace_block=(--trace "$TRACES")
  fi
  [[ " $BENCHES " == *" collective "* ]] && stage "bench_ws$n" "$LIMIT_BENCH" env CUDA_VISIBLE_DEVICES="$devs" \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
    bench/suites/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --lowerings p2p,symm --out-dir "$RESULTS" --graphs \
    "${quick[@]}" "${trace[@]}"
  # shellcheck disable=SC2206  # MOE_ARGS is a list of arguments
  moe_args=($MOE_ARGS)
  [[ " $BENCHES " == *" moe "* ]] && stage "moe_ws$n" "$LIMIT_MOE" env CUDA_VISIBLE_DEVICES="$devs" \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
    bench/suites/bench_moe.py --out "$RESULTS" "${moe_args[@]}" "${quick[@]}"
  [[ " $BENCHES " == *" block "* ]] && stage "block_ws$n" "$LIMIT_BLOCK" env CUDA_VISIBLE_DEVICES="$devs" \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
    bench/suites/bench_block.py --out-dir "$RESULTS" "${quick[@]}" "${trace_block[@]}"
  [[ " $BENCHES " == *" cta "* ]] && stage "cta_ws$n" "$LIMIT_CTA" env CUDA_VISIBLE_DEVICES="$devs" \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
    bench/suites/bench_cta.py --out-dir "$RESULTS" --graphs --trace "$TRACES" "${quick[@]}"
  [[ " $BENCHES " == *" host "* ]] && stage "host_ws$n" 90 env CUDA_VISIBLE_DEVICES="$devs" \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
    bench/probes/probe_host.py --out "$RESULTS/probe_host_ws$n.json"
  [[ " $BENCHES " == *" models "* ]] && stage "models_ws$n" "$LIMIT_MODELS" env CUDA_VISIBLE_DEVICES="$devs" \
    "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
    bench/suites/bench_models.py --out "$RESULTS" "${quick[@]}"
  if [[ " $BENCHES " == *" graphs "* ]]; then # everything under CUDA graphs (mode="reduce-overhead")
    stage "graphs_models_ws$n" "$LIMIT_MODELS" env CUDA_VISIBLE_DEVICES="$devs" \
      "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
      bench/suites/bench_models.py --out "$RESULTS" --mode reduce-overhead --sections llama,serve "${quick[@]}"
    stage "graphs_epilogue_ws$n" "${LIMIT_EPILOGUE:-150}" env CUDA_VISIBLE_DEVICES="$devs" \
      "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
      bench/suites/bench_epilogue.py --out-dir "$RESULTS" --block tp --mode train --cudagraphs "${quick[@]}"
    stage "graphs_moe_ws$n" "$LIMIT_MOE" env CUDA_VISIBLE_DEVICES="$devs" \
      "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
      bench/suites/bench_moe.py --out "$RESULTS" --configs deepseek,mixtral,deepseek-decode,mixtral-decode \
      --routing balanced --comm-sms "" --sweep "" --no-p2p --graphs "${quick[@]}"
  fi
  return 0
}

package() {
  if compgen -G "$RESULTS/*.md" >/dev/null; then
    for n in 2 4 8; do
      for s in ag_mm mm_rs mm_ar moe moe_graphs block cta models models_cudagraphs; do
        [ -f "$RESULTS/${s}_ws$n.md" ] && { cat "$RESULTS/${s}_ws$n.md"; echo; }
      done
      for f in "$RESULTS"/epilogue_*_ws$n.md; do
        [ -f "$f" ] && { cat "$f"; echo; }
      done
    done >"$OUT/bench_summary.md"
    tar -czf "$OUT/bench_results.tar.gz" -C "$RESULTS" .
    echo "bench results: $(cd "$RESULTS" && ls | tr '\n' ' ')"
  else
    echo "no benchmark results were written"
  fi
  if compgen -G "$TRACES/*.json" >/dev/null; then
    tar -czf "$OUT/traces.tar.gz" -C "$TRACES" .
    if [ "$(stat -c %s "$OUT/traces.tar.gz")" -gt "$TRACES_MAX_BYTES" ]; then
      echo "traces.tar.gz over $((TRACES_MAX_BYTES >> 20)) MiB: keeping the collective-benchmark traces only"
      (cd "$TRACES" && ls | grep -v '^block_' | tar -czf "$OUT/traces.tar.gz" -T -)
    fi
    if [ "$(stat -c %s "$OUT/traces.tar.gz")" -gt "$TRACES_MAX_BYTES" ]; then
      echo "traces.tar.gz still over $((TRACES_MAX_BYTES >> 20)) MiB: not kept"
      rm -f "$OUT/traces.tar.gz"
    else
      echo "traces: $(ls "$TRACES" | wc -l) files, traces.tar.gz $(($(stat -c %s "$OUT/traces.tar.gz") >> 10)) KiB"
    fi
  else
    echo "no profiler traces were written"
  fi
}

smoke() { # the smoke set, SMOKE_LOOP times while the deadline allows; a pass count per test
  local workers=() runs=0 passed=0 longest=0 i left t log
  if [ "${SMOKE_WORKERS:-3}" != 1 ] && "$PY" -c "import xdist" 2>/dev/null; then
    workers=(-n "${SMOKE_WORKERS:-3}")
  fi
  if [ "$NGPU" -lt 2 ] && [ -z "${OVERLAP_TEST_SHARED_GPU+set}" ]; then
    export OVERLAP_TEST_SHARED_GPU=1
    echo "one GPU: the smoke set's 2 ranks share it (OVERLAP_TEST_SHARED_GPU=1)"
  fi
  : >"$OUT/gpu_smoke_counts.txt"
  for ((i = 1; i <= SMOKE_LOOP; i++)); do
    left=$((DEADLINE - RESERVE - 5 - (SECONDS - T0)))
    if [ "$i" -gt 1 ] && [ "$left" -lt $((longest + 10)) ]; then
      echo "=== smoke loop: run $i not started, ${left}s left, the longest run took ${longest}s"
      break
    fi
    log="$OUT/gpu_smoke_$i.log"
    t=$SECONDS
    stage "gpu_smoke_$i" "$LIMIT_SMOKE" bash -c 'set -o pipefail; log=$1; shift; "$0" -m pytest -q -rA -p no:cacheprovider -m gpu_smoke "${@}" 2>&1 | tee "$log"' \
      "$PY" "$log" "${workers[@]}" tests/gpu
    t=$((SECONDS - t))
    [ "$t" -gt "$longest" ] && longest=$t
    runs=$((runs + 1))
    grep -qE "^[0-9]+ passed" "$log" && ! grep -qE "[0-9]+ (failed|error)" "$log" && passed=$((passed + 1))
    grep -E "^(PASSED|FAILED|ERROR|SKIPPED) " "$log" | awk '{print $1, $2}' >>"$OUT/gpu_smoke_counts.txt"
  done
  echo
  echo "=== smoke loop: $passed of $runs run(s) passed every test ($SMOKE_LOOP asked); per test, over the runs:"
  sort "$OUT/gpu_smoke_counts.txt" | uniq -c | awk '{printf "  %3d %-8s %s\n", $1, $2, $3}'
  [ "$runs" -lt "$SMOKE_LOOP" ] && FAILED+=("smoke loop ($runs of $SMOKE_LOOP runs started)")
  return 0
}

main() {
  echo "run_device.sh $MODE: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), repo $PWD, git $(git rev-parse --short HEAD 2>/dev/null || echo n/a), deadline ${DEADLINE}s"
  nvidia-smi -L || true
  nvidia-smi topo -m || true
  stage versions "$LIMIT_INFO" "$PY" -m bench.tools.common

  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ -z "$NGPU" ] || [ "$NGPU" -eq 0 ] && NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  echo "GPUs seen: $NGPU"
  [ "$NGPU" -eq 0 ] && FAILED+=("no GPU visible")

  # The largest world size here: GPU tests, traces and (8 GPUs) the benchmarks' world size.
  local ws_max=2
  [ "$NGPU" -ge 4 ] && ws_max=4
  [ "$NGPU" -ge 8 ] && ws_max=8
  TRACE_WS=4
  [ "$ws_max" -eq 8 ] && TRACE_WS=8
  # 2/4 GPUs: ws=4 first (the design's numbers are 4-GPU ones), then ws=2. 8 GPUs: ws=8 only by
  # default (the deadline does not reach further; BENCH_WS="8 4 2" runs ws=4 and ws=2 after it on
  # GPUs 0-3 / 0-1), and the MoE suite is in the default BENCHES.
  local bench_ws="4 2" benches="collective block cta"
  if [ "$ws_max" -eq 8 ]; then
    bench_ws="8"
    benches="collective moe block cta"
  fi
  BENCH_WS="${BENCH_WS:-$bench_ws}"
  BENCHES="${BENCHES:-$benches}"
  echo "largest world size $ws_max$([ "$MODE" != tests ] && [ "$MODE" != smoke ] && echo "; benchmarks at ws: $BENCH_WS; benchmarks: $BENCHES")"

  if [ "$MODE" = smoke ] || { [ "$MODE" != bench ] && [ "${RUN_SMOKE:-1}" != 0 ]; }; then
    smoke
  fi
  if [ "$MODE" != bench ] && [ "$MODE" != smoke ]; then
    # All GPU tests (3 lowerings x 3 world sizes) take longer than LIMIT_TESTS: by default the symm
    # ones at the largest world size here, plus the 2-GPU timeout, dead-peer (watchdog), captured-symm
    # and stream-operation tests (p2p's ran on 2026-11-29);
    # TESTS_K="" runs everything, TESTS_K="<expr>" any pytest -k selection.
    local select=(-k "ws$ws_max and symm or names_op_rank or dead_peer or captured_symm or fast_path")
    [ "$MODE" = quick ] && select=(-k "ws2 and symm and not compiled")
    if [ -n "${TESTS_K+set}" ]; then
      select=()
      [ -n "$TESTS_K" ] && select=(-k "$TESTS_K")
    fi
    # 8 GPUs: one line per test as it ends (-v), so that a run cut by its cap still shows what passed.
    local verbosity=-q
    [ "$ws_max" -eq 8 ] && verbosity=-v
    # shellcheck disable=SC2086  # TEST_FILES is a list of paths
    stage gpu_tests "$LIMIT_TESTS" bash -c 'set -o pipefail; "$0" -m pytest '"$verbosity"' -rA -p no:cacheprovider -m gpu "${@}" 2>&1 | tee "$OUT_LOG"' \
      "$PY" $TEST_FILES "${select[@]}"
  fi

  # The demo (every GPU, NCCL, Inductor on, default GPU sizes): opt-in, bench_block.py covers it.
  [ "${RUN_DEMO:-0}" = 1 ] && [ "$NGPU" -ge 2 ] && stage demo "$LIMIT_DEMO" "$PY" -m overlap_backend.examples.demo --steps 10

  # In BENCH_WS order: a late stage is the one cut by the deadline. `tests` and `smoke` modes: no benchmarks.
  if [ "$MODE" != tests ] && [ "$MODE" != smoke ]; then
    local n
    for n in $BENCH_WS; do
      benchmarks "$n"
    done
    # Epilogue fusion (docs/codegen.md): opt-in, fused vs unfused demo block on GPUs
    # 0..EPILOGUE_WS-1 (default 0,1).
    [ "${RUN_EPILOGUE:-0}" = 1 ] && [ "$NGPU" -ge "$EPILOGUE_WS" ] && stage "epilogue_ws$EPILOGUE_WS" \
      "${LIMIT_EPILOGUE:-150}" env CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((EPILOGUE_WS - 1)))" \
      "$PY" -m torch.distributed.run --standalone --nproc-per-node="$EPILOGUE_WS" \
      bench/suites/bench_epilogue.py --out-dir "$RESULTS"
  fi

  echo
  package

  echo
  echo "=== run_device.sh $MODE done in $((SECONDS - T0))s"
  [ ${#SKIPPED[@]} -gt 0 ] && echo "skipped: ${SKIPPED[*]}"
  if [ ${#FAILED[@]} -gt 0 ]; then
    echo "FAILED stages: ${FAILED[*]}"
    return 1
  fi
  echo "all stages passed"
  return 0
}

export OUT_LOG="$OUT/gpu_tests.log"
main 2>&1 | tee "$OUT/run_device.log"
status=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$status"
