#!/usr/bin/env bash
# `make demo`'s two commands (the 3-minute warm start, then 6 RLTF-SD steps of
# expansion_demo.yaml), then its run record committed under results/demo/: the numbers README
# quotes for the demo come from here. Outputs (weights) stay in outputs/, out of git.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
WARM=outputs/demo_warm
test -f $WARM/config.json || $PY pipelines/warmstart.py --config pipelines/configs/expansion_demo.yaml \
    --out $WARM --revision-demos 120 --epochs 1 --lr 3e-5 \
    'task.params.rule=[concat,swap,repeat,offset,double]' model.path=smollm2
$PY pipelines/run.py --config pipelines/configs/expansion_demo.yaml | tee outputs/demo.log
dest=results/demo/$(date -u +%Y-%m-%d)-$(git rev-parse --short HEAD)
mkdir -p "$dest"
cp outputs/demo/metrics.jsonl outputs/demo/summary.json "$dest/"
tail -4 outputs/demo.log > "$dest/last_lines.txt"
grep -c "" "$dest/metrics.jsonl" >/dev/null
git add -f "$dest" && git commit -q -m "results/demo: a make demo run's record ($dest)" -- "$dest"
echo "committed $dest"
