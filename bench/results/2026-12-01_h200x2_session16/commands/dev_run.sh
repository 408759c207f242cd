#!/usr/bin/env bash
# device session script: stages "name cap cmd..." from the file $1; logs + results in one tarball under $OUT
set -u
export PYTHONPATH="$PWD" NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
FINAL="${OUT:-$PWD/device_out}"; mkdir -p "$FINAL"
W=/tmp/devwork; rm -rf $W; mkdir -p $W/logs $W/results $W/traces
T0=$SECONDS
DEADLINE=${DEADLINE:-560}
run() { local name=$1 cap=$2; shift 2
  local left=$((DEADLINE - (SECONDS - T0))); [ $left -lt $cap ] && cap=$left
  if [ $cap -lt 15 ]; then echo "=== $name NOT STARTED"; return; fi
  echo "=== [t=$((SECONDS-T0))] $name (cap $cap): $*"
  timeout -k 5 $cap "$@" > "$W/logs/$name.log" 2>&1; local rc=$?
  echo "=== [t=$((SECONDS-T0))] $name rc=$rc"; tail -n ${TAILN:-6} "$W/logs/$name.log" | cut -c1-400
}
RES=$W/results; TRACES=$W/traces
source "$1"
for f in $TRACES/*.json; do [ -e "$f" ] && gzip -q "$f"; done
tar czf "$FINAL/run.tgz" -C $W logs results traces
ls -la "$FINAL"
