"""(Ran as devrun/bench_rs_ab.py from the repository root.) bench_collective_gemm with symm_lowering.RS_OWN_FIRST set from $RS_OWN_FIRST (1/0): the A/B of
the fourteenth session's change (own partials before the waits), same machine, one after the other."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import bench_collective_gemm  # noqa: E402
from overlap_backend.runtime import symm_lowering  # noqa: E402

symm_lowering.RS_OWN_FIRST = os.environ["RS_OWN_FIRST"] == "1"
sys.exit(bench_collective_gemm.main(sys.argv[1:]))
