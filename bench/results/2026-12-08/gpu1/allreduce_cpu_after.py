# Three ranks of torch.distributed (nccl backend on ferry's libnccl.so.2) sharing one GPU, in DDP's
# pattern past what one of ferry's stream kernels takes among three (24 MiB): all_reduce and
# reduce of 64 MiB a rank, each followed at once by .cpu() (a copy into pageable memory, which
# waits inside the driver for the stream). Where ferry's thread moved such calls' data with CUDA
# calls, it could wait for that lock for ever. Checks every result; prints how many of 12 rounds
# ended and how many elements were wrong.
import os, faulthandler
faulthandler.dump_traceback_later(100)
import torch
import torch.distributed as dist
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
dist.init_process_group("nccl", device_id=dev)
n = 16 << 20  # float32 elements a rank: 64 MiB
ended, wrong = 0, 0
for i in range(12):
    # Small integers: every order of operands gives the same sum.
    grads = torch.arange(n, device=dev, dtype=torch.float32) % 1000 + 1000 * rank + i
    dist.all_reduce(grads)
    grads[:4096].cpu()  # at once, as a training loop's logging would
    expect = sum(torch.arange(n, device=dev, dtype=torch.float32) % 1000 + 1000 * r + i
                 for r in range(world))
    wrong += int((grads != expect).sum().item())
    root = i % world
    loss = torch.arange(n, device=dev, dtype=torch.float32) % 7 + rank + i
    dist.reduce(loss, dst=root)
    loss[:4096].cpu()
    if rank == root:
        expect = sum(torch.arange(n, device=dev, dtype=torch.float32) % 7 + r + i
                     for r in range(world))
        wrong += int((loss != expect).sum().item())
    ended += 1
print("rank %d: %d of 12 all_reduce + reduce (64 MiB) + .cpu() ended, %d elements wrong"
      % (rank, ended, wrong), flush=True)
dist.destroy_process_group()
