#!/usr/bin/env bash
# The registered discovery regime (docs/registrations/binac_controls.md, second in order): a
# critic whose warm start never writes the rule, only vague critiques and the verifier's verdict
# (informative share 0). The room check on the calibration split comes first and gates the runs
# (room only: no signal gate, since how often RL finds a helpful critique is the question); then
# fixed_critic and binac on seeds 0, 1, 2, each committed as it finishes; then each trained
# critic's own room check on the calibration split (its fix rate with the warm-start actor, and
# how often it states the rule). Rerunning the script resumes where it stopped.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
CFG=pipelines/configs/expansion.yaml
NAME=binac_discovery
OUT=results/$NAME
WARM=outputs/exp/warm_conv_ex
CRITIC=outputs/exp/${NAME}_critic_0.0
PRECISION=(model.dtype=bfloat16 trainer.bf16=false model.head_dtype=null)  # as the controls
COMMON=(trainer.lr=1e-5 trainer.micro_batch_size=4 trainer.zero_stage=0 engine.kv_cache_gib=0.5
        run.steps=12 run.eval_every=6 binac.schedule=overlap binac.actor_steps=1 binac.reference_every=4
        binac.temperature=1.0 binac.critic_model=$CRITIC "${PRECISION[@]}")
LEARNED=(binac.critiques_per_attempt=4)

commit() {
  local msg=$1; shift
  git add -f "$@"
  git commit -q -m "$msg" -- "$@"
}

docs/scripts/warm_conv.sh
if [ ! -f $CRITIC/warmstart.json ]; then  # every target a vague critique and the verdict line
  $PY pipelines/warmstart.py --critic --config $CFG --out $CRITIC --critic-demos 300 --informative-share 0.0 \
      --epochs 2 --lr 2e-5 binac.critic_model=smollm2 binac.temperature=1.0 binac.critiques_per_attempt=4
fi
pair="$(sha256sum $WARM/model.safetensors | cut -c1-12)_$(sha256sum $CRITIC/model.safetensors | cut -c1-12)"
mkdir -p $OUT
if [ ! -f $OUT/room_$pair.json ]; then
  $PY docs/scripts/binac_room.py --config $CFG --critic $CRITIC --out $OUT/room_$pair.json --problems 128 \
      --min-room 0.3 "${COMMON[@]}" "${LEARNED[@]}" || [ $? -eq 3 ]
  cp $CRITIC/warmstart.json $OUT/critic_warmstart_$pair.json
  commit "results/$NAME: room check on the calibration split, warm starts $pair (informative share 0)" \
      $OUT/room_$pair.json $OUT/critic_warmstart_$pair.json
fi
if [ "$($PY -c "import json; print(json.load(open('$OUT/room_$pair.json'))['has_room'])")" != True ]; then
  echo "[discovery] no room (records in $OUT/room_$pair.json): no run is made" >&2
  exit 3
fi
for seed in 0 1 2; do
  $PY pipelines/compare.py --config $CFG --presets fixed_critic --first-seed "$seed" --seeds 1 --name $NAME \
      --baseline fixed_critic --git-commit "${COMMON[@]}"
  $PY pipelines/compare.py --config $CFG --presets binac --first-seed "$seed" --seeds 1 --name $NAME \
      --baseline fixed_critic --git-commit "${COMMON[@]}" "${LEARNED[@]}"
  trained=$OUT/runs/binac_s$seed/checkpoints/step_12/critic
  if [ -f $trained/model.safetensors ] && [ ! -f $OUT/room_trained_s$seed.json ]; then
    $PY docs/scripts/binac_room.py --config $CFG --critic $trained --out $OUT/room_trained_s$seed.json \
        --problems 128 "${COMMON[@]}" "${LEARNED[@]}" || [ $? -eq 3 ]
    commit "results/$NAME: the trained critic of seed $seed on the calibration split" $OUT/room_trained_s$seed.json
  fi
done
$PY docs/scripts/binac_controls_table.py $OUT --discovery
