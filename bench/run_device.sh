#!/usr/bin/env bash
# The one script to run on the GPU machine (2 or 4 GPUs), from anywhere inside the repo copy:
#
#   bash bench/run_device.sh          # GPU tests (ws 2 and 4), then the benchmark at ws=2 and ws=4
#   bash bench/run_device.sh quick    # smoke run: ws=2 tests only, benchmark with --quick
#
# Nothing is installed: PYTHONPATH points at the repo. NVLink multicast stays off (the three
# variables below). Every stage runs under `timeout`, so the whole script ends within 8.5 minutes;
# a failing stage does not stop the next ones, but the exit status is 1 if any stage failed.
#
# Writes to $OUT (default ./device_out), 4 files:
#   run_device.log        everything this script printed
#   gpu_tests.log         the pytest run
#   bench_summary.md      every benchmark table (<suite>_ws<N>.md concatenated, ws=2 first)
#   bench_results.tar.gz  the <suite>_ws<N>.md/.json files themselves: tar -xzf ... -C bench/results
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
MODE="${1:-full}"
case "$MODE" in
  full | quick) ;;
  *) echo "usage: bash bench/run_device.sh [quick]" >&2; exit 2 ;;
esac

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || PY=python
OUT="${OUT:-$PWD/device_out}"
mkdir -p "$OUT"
RESULTS="$(mktemp -d)/results"
mkdir -p "$RESULTS"

# Stage limits in seconds (each also gets 5 s to die after SIGTERM): 30 + 210 + 90 + 2*100 + 5*5 = 555 s.
LIMIT_INFO=30
LIMIT_TESTS=210
LIMIT_BENCH=100
LIMIT_DEMO=90

FAILED=()
SKIPPED=()
T0=$SECONDS

stage() { # stage NAME LIMIT CMD... : run CMD under timeout, record a failure, never abort
  local name=$1 limit=$2
  shift 2
  echo
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


main() {
  echo "run_device.sh $MODE: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), repo $PWD, git $(git rev-parse --short HEAD 2>/dev/null || echo n/a)"
  nvidia-smi -L || true
  nvidia-smi topo -m || true
  stage versions "$LIMIT_INFO" "$PY" -m bench.common

  local ngpu
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ -z "$ngpu" ] || [ "$ngpu" -eq 0 ] && ngpu=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  echo "GPUs seen: $ngpu"
  [ "$ngpu" -eq 0 ] && FAILED+=("no GPU visible")

  local select=()
  [ "$MODE" = quick ] && select=(-k ws2)
  stage gpu_tests "$LIMIT_TESTS" bash -c 'set -o pipefail; "$0" -m pytest -x -q -rA -p no:cacheprovider -m gpu tests/test_gpu.py "${@}" 2>&1 | tee "$OUT_LOG"' \
    "$PY" "${select[@]}"

  # The main job on every GPU (NCCL), Inductor on, default GPU sizes.
  [ "$ngpu" -ge 2 ] && stage demo "$LIMIT_DEMO" "$PY" -m overlap_backend.demo --steps 10

  local quick=()
  [ "$MODE" = quick ] && quick=(--quick)
  for n in 2 4; do
    if [ "$ngpu" -lt "$n" ]; then
      echo "=== bench_ws$n: skipped, $ngpu GPU(s)"
      SKIPPED+=("bench_ws$n")
      continue
    fi
    local devs
    devs=$(seq -s, 0 $((n - 1)))
    stage "bench_ws$n" "$LIMIT_BENCH" env CUDA_VISIBLE_DEVICES="$devs" \
      "$PY" -m torch.distributed.run --standalone --nproc-per-node="$n" \
      bench/bench_collective_gemm.py --suite ag_mm,mm_rs,mm_ar --out-dir "$RESULTS" "${quick[@]}"
  done

  if compgen -G "$RESULTS/*.md" >/dev/null; then
    for n in 2 4; do
      for s in ag_mm mm_rs mm_ar; do
        [ -f "$RESULTS/${s}_ws$n.md" ] && { cat "$RESULTS/${s}_ws$n.md"; echo; }
      done
    done >"$OUT/bench_summary.md"
    tar -czf "$OUT/bench_results.tar.gz" -C "$RESULTS" .
    echo "bench results: $(cd "$RESULTS" && ls | tr '\n' ' ')"
  else
    echo "no benchmark results were written"
  fi

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
exit "${PIPESTATUS[0]}"
