#!/usr/bin/env bash
# ad-hoc device session script (not committed): stages "name cap pytest-args..." from $STAGES file
set -u
export PYTHONPATH="$PWD" NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
OUT="${OUT:-$PWD/device_out}"; mkdir -p "$OUT"
T0=$SECONDS
DEADLINE=${DEADLINE:-570}
run() { local name=$1 cap=$2; shift 2
  local left=$((DEADLINE - (SECONDS - T0))); [ $left -lt $cap ] && cap=$left
  if [ $cap -lt 15 ]; then echo "=== $name NOT STARTED"; return; fi
  echo "=== [t=$((SECONDS-T0))] $name (cap $cap): $*"
  timeout -k 5 $cap "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "=== [t=$((SECONDS-T0))] $name rc=$rc"; tail -n ${TAILN:-6} "$OUT/$name.log" | cut -c1-300
}
source "$1"
