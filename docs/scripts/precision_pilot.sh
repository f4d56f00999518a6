#!/usr/bin/env bash
# The pilot that chose the default precision on a CPU with native bf16 (docs/results.md,
# "Pilot: the default precision"): grpo_single on the 256-sample protocol, seeds 90 and 91,
# at matched float32 and at matched bf16 with fp32 LM heads. Resumable; every finished run
# is committed at once.
set -euo pipefail
cd "$(dirname "$0")/../.."
docs/scripts/warm_conv.sh
for seed in 90 91; do
  for variant in fp32 bf16; do
    if [ "$variant" = fp32 ]; then
      extra=(model.dtype=float32 trainer.bf16=false model.head_dtype=float32)
    else
      extra=(model.dtype=bfloat16 trainer.bf16=true model.head_dtype=float32)
    fi
    .venv/bin/python pipelines/compare.py --config pipelines/configs/expansion.yaml \
        --presets grpo_single --seeds 1 --first-seed "$seed" --name precision_pilot \
        --variant "$variant" --git-commit trainer.lr=1e-5 run.steps=8 "${extra[@]}"
  done
done
