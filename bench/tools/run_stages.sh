#!/usr/bin/env bash
# Run a file of stages on the device machine in one call, under one deadline; logs and results come
# back as one tarball (for runs of one's own choosing; bench/run_device.sh is the fixed full run).
#
#   DEADLINE=545 bash bench/tools/run_stages.sh STAGES_FILE      # e.g. bench/tools/plans/h200x4_1_tables.sh
#
# STAGES_FILE is sourced by bash; each line that runs something is
#   TAILN=<n> run <name> <cap seconds> <command...>
# which runs the command in the repository root under `timeout` (its cap, cut to what is left of DEADLINE,
# default 560 s; a stage with less than 15 s left is NOT STARTED), its stdout + stderr into logs/<name>.log, then
# prints the exit status and the log's last TAILN (default 6) lines. Commands can write under $RES (results) and
# $TRACES (profiler traces, gzipped at the end); $W is the working directory.
# Output: $OUT/run.tgz (logs/, results/, traces/); $OUT defaults to ./device_out.
# NVLink multicast stays off (the three variables below); PYTHONPATH is the repository (nothing installed).
set -u
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: DEADLINE=<s> bash bench/tools/run_stages.sh STAGES_FILE" >&2; exit 2; }
STAGES="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2  # the repository root: plans name paths from there
export PYTHONPATH="$PWD" NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
FINAL="${OUT:-$PWD/device_out}"
mkdir -p "$FINAL"
W="$(mktemp -d)"
mkdir -p "$W/logs" "$W/results" "$W/traces"
RES=$W/results
TRACES=$W/traces
T0=$SECONDS
DEADLINE=${DEADLINE:-560}

run() { # run NAME CAP CMD...
  local name=$1 cap=$2
  shift 2
  local left=$((DEADLINE - (SECONDS - T0)))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 15 ]; then
    echo "=== $name NOT STARTED"
    return 0
  fi
  echo "=== [t=$((SECONDS - T0))] $name (cap $cap): $*"
  timeout -k 5 "$cap" "$@" >"$W/logs/$name.log" 2>&1
  local rc=$?
  echo "=== [t=$((SECONDS - T0))] $name rc=$rc"
  tail -n "${TAILN:-6}" "$W/logs/$name.log" | cut -c1-400
}

# shellcheck disable=SC1090  # the stages file is the caller's
source "$STAGES"
for f in "$TRACES"/*.json; do [ -e "$f" ] && gzip -q "$f"; done
tar czf "$FINAL/run.tgz" -C "$W" logs results traces
rm -rf "$W"
ls -la "$FINAL"
