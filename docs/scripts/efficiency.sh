#!/usr/bin/env bash
# The pre-registered sample-efficiency experiment (docs/results.md, "Pre-registered: first-try
# accuracy after 256 samples"), exactly as registered: rltf_sd against grpo_single, 8 steps,
# seeds 5-9, from the capability-expansion warm start. Every finished run is committed at
# once; rerunning this script resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
docs/scripts/warm_conv.sh  # the registered warm start (built in a fresh checkout)
.venv/bin/python pipelines/compare.py --config pipelines/configs/expansion.yaml \
    --presets grpo_single,rltf_sd --seeds 5 --first-seed 5 --name efficiency --git-commit \
    trainer.lr=1e-5 run.steps=8
