#!/usr/bin/env bash
# The pre-registered capability-expansion experiment (docs/results.md), exactly as registered:
# the learning-rate pilot on single-turn GRPO, the rule that picks the learning rate, then the
# comparison. Every finished run is committed at once (--git-commit); rerunning this script
# resumes where it stopped (a finished run is never rerun, the pick is recomputed from the
# committed pilot files and comes out the same).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
CFG=pipelines/configs/expansion.yaml
docs/scripts/warm_conv.sh  # the registered warm start (built in a fresh checkout)
for lr in 1e-5 3e-5; do
  $PY pipelines/compare.py --config $CFG --presets grpo_single --seeds 1 --first-seed 100 \
      --name expansion_pilot_lr$lr --git-commit run.steps=16 trainer.lr=$lr
done
LR=$($PY - <<'PY'
import json
from pathlib import Path

def score(lr):
    run = Path(f"results/expansion_pilot_lr{lr}/runs/grpo_single_s100")
    after = json.loads((run / "summary.json").read_text())["after"]["greedy_accuracy"]
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = [m["first_turn_accuracy"] for m in steps[-8:]]
    return after, sum(last) / len(last)

# the higher held-out greedy accuracy after step 16; then the higher mean training first-turn
# accuracy over the last 8 steps; then 1e-5 (the order of this list breaks the last tie)
print(max(["1e-5", "3e-5"], key=score))
PY
)
echo "[expansion] learning rate from the GRPO pilot: $LR"
$PY pipelines/compare.py --config $CFG --presets grpo_single,rltf_sd,rltf_fm --seeds 5 \
    --name expansion --git-commit trainer.lr=$LR
