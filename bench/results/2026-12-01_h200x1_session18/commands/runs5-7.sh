# Runs 5-7: one device call each, `run` with command = the line below (no stages file), output tee'd to $OUT.
# run 5
export PYTHONPATH=$PWD; timeout 200 python bench/probe_ws.py --shapes 1024x8192x28672,8192x4096x7168,4096x8192x28672 --configs 128x256x64x3x8 --epilogues none,gelu --variants plain,subtile,flatten,subtile_flatten | tee $OUT/probe_subtile.log
# run 6
export PYTHONPATH=$PWD; timeout 150 python bench/probe_ws.py --shapes 8192x4096x7168,1024x8192x28672 --configs 128x256x64x3x8,128x256x64x4x8 --epilogues none,gelu --variants plain,subtile,flatten,subtile_flatten | tee $OUT/probe_subtile2.log
# run 7: three rounds
export PYTHONPATH=$PWD; for i in 1 2 3; do timeout 60 python bench/probe_ws.py --shapes 8192x4096x7168,1024x8192x28672,8192x4096x3584 --configs 128x256x64x3x8,128x256x64x4x8 --epilogues none,gelu --variants plain,flatten,subtile_flatten | sed "s/^/r$i /"; done | tee $OUT/probe_subtile3.log
