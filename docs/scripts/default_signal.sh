#!/usr/bin/env bash
# The pre-registered headline without a handicapped baseline (docs/results.md, "Pre-registered:
# the 256-sample test at matched precision"): rltf_sd against grpo_single, 8 steps, seeds
# 100-119, at matched float32 and at matched bf16 with fp32 LM heads on both sides, each arm's
# precision passed explicitly so that it is the same on every CPU kind. Seed by seed; every
# finished run is committed at once; rerunning this script resumes where it stopped. On a CPU
# without native bf16 (bf16 generation ~4x slower) the bf16 arm runs on seeds 100-109 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
docs/scripts/warm_conv.sh  # the capability-expansion actor warm start (built in a fresh checkout)
native_bf16=$(grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo 1 || echo 0)
for seed in $(seq 100 119); do
  for variant in fp32 bf16; do
    if [ "$variant" = bf16 ] && [ "$native_bf16" = 0 ] && [ "$seed" -ge 110 ]; then continue; fi
    if [ "$variant" = fp32 ]; then
      extra=(model.dtype=float32 trainer.bf16=false model.head_dtype=float32)
    else
      extra=(model.dtype=bfloat16 trainer.bf16=true model.head_dtype=float32)
    fi
    .venv/bin/python pipelines/compare.py --config pipelines/configs/expansion.yaml \
        --presets grpo_single,rltf_sd --seeds 1 --first-seed "$seed" --name default_signal \
        --variant "$variant" --git-commit trainer.lr=1e-5 run.steps=8 "${extra[@]}"
  done
done
