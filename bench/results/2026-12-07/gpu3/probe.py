# Two ranks of torch.distributed (nccl backend on ferry's libnccl.so.2) sharing one GPU: one
# all_reduce per size and op, each synchronised and printed, to find where a check stops.
import os, sys, faulthandler
faulthandler.dump_traceback_later(50)
import torch
import torch.distributed as dist
rank = int(os.environ["RANK"])
dev = torch.device("cuda", 0)
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=dev)
ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
       "max": dist.ReduceOp.MAX}
chosen = [ops[o] for o in os.environ.get("OPS", "sum avg").split()]
for dtype in [torch.float32, torch.int64]:
    for n in [1, 1000, 65536, 1 << 20]:
        for op in chosen:
            x = torch.full((n,), float(rank + 1), dtype=dtype, device=dev)
            dist.all_reduce(x, op=op)
            torch.cuda.synchronize()
            print("rank %d %s %d %s: %s" % (rank, dtype, n, op, x[0].item()), flush=True)
dist.destroy_process_group()
