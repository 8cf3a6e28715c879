# Two ranks of torch.distributed (nccl backend on ferry's libnccl.so.2) sharing one GPU, in FSDP's
# pattern: all_gather_into_tensor and reduce_scatter_tensor of 96 MiB a rank (past what one of
# ferry's stream kernels takes), each followed at once by .cpu() (a copy into pageable memory,
# which waits inside the driver for the stream). Where ferry's thread moved such calls' data with
# CUDA calls, it could wait for that lock for ever. Checks every result; prints how many of 12
# rounds ended and how many elements were wrong.
import os, faulthandler
faulthandler.dump_traceback_later(100)
import torch
import torch.distributed as dist
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
dist.init_process_group("nccl", device_id=dev)
n = 24 << 20  # float32 elements a rank: 96 MiB
ended, wrong = 0, 0
for i in range(12):
    mine = torch.arange(n, device=dev, dtype=torch.float32) % 1000 + 1000 * rank + i
    gathered = torch.empty(world * n, device=dev, dtype=torch.float32)
    dist.all_gather_into_tensor(gathered, mine)
    head = gathered[: 4096].cpu()  # at once, as a training loop's logging would
    for r in range(world):
        expect = torch.arange(n, device=dev, dtype=torch.float32) % 1000 + 1000 * r + i
        wrong += int((gathered[r * n:(r + 1) * n] != expect).sum().item())
    full = torch.arange(world * n, device=dev, dtype=torch.float32) % 7 + rank + i
    part = torch.empty(n, device=dev, dtype=torch.float32)
    dist.reduce_scatter_tensor(part, full)
    part[: 4096].cpu()
    expect = sum((torch.arange(world * n, device=dev, dtype=torch.float32) % 7 + r + i)
                 for r in range(world))[rank * n:(rank + 1) * n]
    wrong += int((part != expect).sum().item())
    ended += 1
print("rank %d: %d of 12 all_gather_into_tensor + reduce_scatter_tensor (96 MiB) + .cpu() "
      "ended, %d elements wrong" % (rank, ended, wrong), flush=True)
dist.destroy_process_group()
