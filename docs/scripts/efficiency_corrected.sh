#!/usr/bin/env bash
# The pre-registered re-check of the 256-sample test with rollout correction (docs/results.md,
# "Pre-registered: the 256-sample test with rollout correction"): rltf_sd against grpo_single,
# 8 steps, seeds 10-14, with the default correction (variant tis: the engine's default dtype)
# and at matched float32 precision (variant fp32). Seed by seed; every finished run is
# committed at once; rerunning this script resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
docs/scripts/warm_conv.sh  # the capability-expansion actor warm start (built in a fresh checkout)
for seed in 10 11 12 13 14; do
  for variant in tis fp32; do
    extra=()
    [ "$variant" = fp32 ] && extra=(model.dtype=float32)
    .venv/bin/python pipelines/compare.py --config pipelines/configs/expansion.yaml \
        --presets grpo_single,rltf_sd --seeds 1 --first-seed "$seed" --name efficiency_corrected \
        --variant "$variant" --git-commit trainer.lr=1e-5 run.steps=8 "${extra[@]}"
  done
done
# RLTF-FM at the reference's weighting, in the tis arm (the grpo_single runs above are reused)
.venv/bin/python pipelines/compare.py --config pipelines/configs/expansion.yaml \
    --presets grpo_single,rltf_fm --seeds 5 --first-seed 10 --name efficiency_corrected \
    --variant tis --git-commit trainer.lr=1e-5 run.steps=8
