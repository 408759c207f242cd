import os, sys, time, threading, torch, torch.distributed as dist
sys.path.insert(0, os.getcwd())
os.environ["OVERLAP_TIMEOUT_S"] = "12"
import overlap_backend  # noqa
from overlap_backend.runtime import symm, cta_symm
from overlap_backend.runtime import cuda as _cuda
dist.init_process_group("nccl")
r = dist.get_rank(); torch.cuda.set_device(r); dev = torch.device("cuda", r)
g = dist.group.WORLD

def dump(tag):
    st = symm.state(g.group_name, dev)
    s = torch.cuda.Stream(device=dev)
    host = torch.empty(symm.FLAG_WORDS, dtype=torch.int32).pin_memory()
    _cuda.memcpy_async(host.data_ptr(), st.flags.local, 4 * symm.FLAG_WORDS, s)
    s.synchronize()
    f_ = host.tolist()
    B = symm.cta_block(False)
    out = [f"rank {r} {tag} epoch(host) {st.epoch}"]
    for n, o, k in (("ARRIVED", symm.CTA_ARRIVED, 64), ("COUNTERS", symm.CTA_COUNTERS, 32), ("DONE", symm.CTA_DONE, 32),
                    ("Y_DONE", symm.CTA_Y_DONE, 16), ("Y_COUNTERS", symm.CTA_Y_COUNTERS, 16), ("TAIL", symm.CTA_TAIL_ARRIVED, 16),
                    ("EPOCH", symm.CTA_EPOCH, 1)):
        out.append(f"  {n}: {[(i, v) for i, v in enumerate(f_[B + o: B + o + k]) if v]}")
    out.append(f"  READY {f_[0:2]} PEER_OK {f_[symm.PEER_OK]} status {list(st.status)[:8]}")
    print("\n".join(out), flush=True)

for M, act, F in [(64, "swiglu", 2048), (300, "gelu", 2048)]:
    H, N, ws = 512, 512, 2
    f = F // ws
    torch.manual_seed(0)
    x = torch.randn(M, H, device=dev).bfloat16(); dist.broadcast(x, 0)
    w1 = (torch.randn(H, f, device=dev) * H**-0.5).bfloat16(); w2 = (torch.randn(f, N, device=dev) * F**-0.5).bfloat16()
    w3 = (torch.randn(H, f, device=dev) * H**-0.5).bfloat16() if act == "swiglu" else None
    y = torch.ops.overlap.cta_pipeline_mlp(x, w1, None, w3, None, w2, None, act, "none", 2, g.group_name, "symm")
    if act == "gelu":
        t = threading.Timer(4.0, dump, args=("after 4 s",)); t.start()
    try:
        torch.cuda.synchronize(); symm.check_status(); print(f"rank {r} {act} M={M} OK", flush=True)
    except Exception as e:
        print(f"rank {r} {act} M={M} ERR {str(e)[:150]}", flush=True)
        break
time.sleep(6)
