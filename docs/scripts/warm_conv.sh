#!/usr/bin/env bash
# The capability-expansion regime's actor warm start (docs/results.md), built when missing and
# checked against the recorded weights: SmolLM2-135M-Instruct after SFT on revision
# demonstrations of five conventions (never a first answer, never a held-out pair).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
WARM=outputs/exp/warm_conv_ex
if [ ! -f $WARM/config.json ]; then
  $PY pipelines/warmstart.py --config pipelines/configs/expansion.yaml --out $WARM --revision-demos 300 \
      --epochs 2 --lr 2e-5 'task.params.rule=[concat,swap,repeat,offset,double]' model.path=smollm2
fi
want=$($PY -c "import json; print(json.load(open('results/expansion/warmstart.json'))['model.safetensors sha256'])")
got=$(sha256sum $WARM/model.safetensors | cut -c1-64)
[ "$want" = "$got" ] || echo "[warm_conv] NOTE: this warm start's weights differ from the one the first runs used" \
    "(sha256 $got, recorded $want); each run's before-evaluation records its p0 and p1"
