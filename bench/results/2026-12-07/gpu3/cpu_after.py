# Two ranks of torch.distributed (nccl backend on ferry's libnccl.so.2) sharing one GPU: each
# all_reduce followed at once by .cpu() (a copy into pageable memory, which waits inside the
# driver for the stream), as torch_check.py's loop, whose fourth call hung when ferry's thread
# ran the collective with CUDA calls. Prints how many of 64 ended.
import os, faulthandler
faulthandler.dump_traceback_later(50)
import torch
import torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
dist.init_process_group("nccl", device_id=dev)
ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
ended = 0
for i in range(64):
    n = [1, 1000, 65536][i % 3]
    x = (torch.rand(n) + rank).to(dev)
    dist.all_reduce(x, op=ops[i % 4])
    x.cpu()
    ended += 1
print("rank %d: %d of 64 all_reduce + .cpu() ended" % (rank, ended), flush=True)
dist.destroy_process_group()
