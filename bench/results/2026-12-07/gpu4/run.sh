#!/usr/bin/env bash
# One GPU, two PyTorch ranks sharing it, the stream calls' defaults of 36700d4 (kernels on a
# shared GPU); binaries from `bench/gpu_run.sh pack build`, carried as .devbin:
#   bash bench/results/2026-12-07/gpu4/run.sh
# cpu_after.py (64 all_reduce, each followed by .cpu()), then tests/nccl/torch_check.py check,
# each with the ranks' stacks where they have not ended in time.
set -u
g3=bench/results/2026-12-07/gpu3
mkdir -p "$OUT/cpu_after" "$OUT/check"
OUT=$OUT/cpu_after PROBE=cpu_after.py WAIT=45 LEVEL=warn bash $g3/probe.sh
OUT=$OUT/check LIMIT=240 WAIT=235 LEVEL=warn bash $g3/check_stacks.sh
