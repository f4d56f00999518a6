#!/usr/bin/env bash
# The pre-registered Bi-NAC comparison where the critic has room to learn (docs/results.md,
# "Pre-registered: Bi-NAC where the critic has room to learn"): the actor warm start, the
# mixed critic warm start, the room check that gates everything after it, then grpo_single,
# fixed_critic, binac_no_bilevel and binac on seeds 0, 1, 2 into results/binac_learnable/.
#
# Seed by seed: all four runs of a seed are made before the next seed starts, each committed
# as it finishes; rerunning the script resumes where it stopped. A warm start rebuilt on
# another kind of CPU has other weights: its room check is then made afresh (one file per
# weights pair), and a seed is paired only among runs of one pair (docs/scripts/binac_table.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
CFG=pipelines/configs/expansion.yaml
WARM=outputs/exp/warm_conv_ex
CRITIC=outputs/exp/critic_mixed
OUT=results/binac_learnable
COMMON=(trainer.lr=1e-5 trainer.micro_batch_size=4 trainer.zero_stage=0 engine.kv_cache_gib=0.5
        run.steps=12 run.eval_every=6 binac.critic_model=$CRITIC binac.temperature=1.0
        binac.schedule=overlap binac.actor_steps=1 binac.reference_every=4)
LEARNED=(binac.critiques_per_attempt=4)  # fixed_critic keeps its preset's one critique per attempt
docs/scripts/warm_conv.sh
if [ ! -f $CRITIC/config.json ]; then
  $PY pipelines/warmstart.py --critic --config $CFG --out $CRITIC --critic-demos 300 --informative-share 0.4 \
      --epochs 2 --lr 2e-5 binac.critic_model=smollm2 binac.temperature=1.0 binac.critiques_per_attempt=4
fi
mkdir -p $OUT
pair="$(sha256sum $WARM/model.safetensors | cut -c1-12)_$(sha256sum $CRITIC/model.safetensors | cut -c1-12)"
cp $CRITIC/warmstart.json $OUT/critic_warmstart_$pair.json
if [ ! -f $OUT/room_$pair.json ]; then
  # exits 3, and so stops this script, when the frozen critic leaves no room
  $PY docs/scripts/binac_room.py --config $CFG --critic $CRITIC --out $OUT/room_$pair.json --problems 128 \
      "${COMMON[@]}" "${LEARNED[@]}"
fi
if ! git ls-files --error-unmatch $OUT/room_$pair.json > /dev/null 2>&1; then
  git add -f $OUT/room_$pair.json $OUT/critic_warmstart_$pair.json
  git commit -q -m "results/binac_learnable: room check on warm starts $pair" -- $OUT/room_$pair.json \
      $OUT/critic_warmstart_$pair.json
fi
$PY -c "import json, sys; sys.exit(0 if json.load(open('$OUT/room_$pair.json'))['has_room'] else 3)" || {
  echo "[binac] the room check on these warm starts found no room ($OUT/room_$pair.json): no run is made" >&2
  exit 3; }
for seed in 0 1 2; do
  $PY pipelines/compare.py --config $CFG --presets grpo_single,fixed_critic --first-seed $seed --seeds 1 \
      --name binac_learnable --baseline fixed_critic --git-commit "${COMMON[@]}"
  $PY pipelines/compare.py --config $CFG --presets binac_no_bilevel,binac --first-seed $seed --seeds 1 \
      --name binac_learnable --baseline fixed_critic --git-commit "${COMMON[@]}" "${LEARNED[@]}"
done
$PY docs/scripts/binac_table.py $OUT
