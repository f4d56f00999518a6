#!/usr/bin/env bash
# The pre-registered Bi-NAC comparisons where the critic has room to learn (docs/results.md,
# "Pre-registered: Bi-NAC where the critic has room to learn" and "...: room and a signal"):
# the actor warm start, a mixed critic warm start, the room check that gates everything after
# it, then grpo_single, fixed_critic, binac_no_bilevel and binac on seeds 0, 1, 2.
#
#   docs/scripts/binac_learnable.sh                  # the first: share 0.4, no signal gate
#   NAME=binac_signal SHARE=0.7 TRIES=3 MIN_ROOM=0.3 MIN_DIFFERING=0.5 docs/scripts/binac_learnable.sh
#
# With TRIES > 1 the critic warm start is calibrated: a share whose room check finds too little
# signal is followed by one 0.1 higher (a critic that states the rule more often), one with too
# little room by one 0.1 lower; the first share that passes both gates is used, and every try's
# record is committed. No share passing after TRIES, or one failing both gates: no run is made.
# SEEDS (default "0 1 2") names the seeds to run.
#
# Seed by seed: all four runs of a seed are made before the next seed starts, each committed
# as it finishes; rerunning the script resumes where it stopped (warm starts and room checks
# already made are reused). A warm start rebuilt on another kind of CPU has other weights: its
# room check is then made afresh (one file per weights pair), and a seed is paired only among
# runs of one pair (docs/scripts/binac_table.py).
set -euo pipefail
shopt -s inherit_errexit  # a failing warm start or room check inside $(try_share) stops the script
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
CFG=pipelines/configs/expansion.yaml
WARM=outputs/exp/warm_conv_ex
NAME=${NAME:-binac_learnable}
OUT=results/$NAME
SHARE=${SHARE:-0.4}
TRIES=${TRIES:-1}
GATES=(--min-room "${MIN_ROOM:-0}" --min-differing "${MIN_DIFFERING:-0}")
COMMON=(trainer.lr=1e-5 trainer.micro_batch_size=4 trainer.zero_stage=0 engine.kv_cache_gib=0.5
        run.steps=12 run.eval_every=6 binac.temperature=1.0
        binac.schedule=overlap binac.actor_steps=1 binac.reference_every=4)
LEARNED=(binac.critiques_per_attempt=4)  # fixed_critic keeps its preset's one critique per attempt
docs/scripts/warm_conv.sh
mkdir -p $OUT

# the critic warm start at one share and its room check; prints the check's verdict
# (pass, no_room, no_signal or neither)
try_share() {
  local critic=outputs/exp/${NAME}_critic_$1 pair
  if [ ! -f $critic/warmstart.json ]; then  # written last: a warm start killed before it is made again
    $PY pipelines/warmstart.py --critic --config $CFG --out $critic --critic-demos 300 --informative-share $1 \
        --epochs 2 --lr 2e-5 binac.critic_model=smollm2 binac.temperature=1.0 binac.critiques_per_attempt=4 >&2
  fi
  pair="$(sha256sum $WARM/model.safetensors | cut -c1-12)_$(sha256sum $critic/model.safetensors | cut -c1-12)"
  cp $critic/warmstart.json $OUT/critic_warmstart_$pair.json
  if [ ! -f $OUT/room_$pair.json ]; then
    # exits 3 on no room or too little signal: the verdict is read from the file below
    $PY docs/scripts/binac_room.py --config $CFG --critic $critic --out $OUT/room_$pair.json --problems 128 \
        "${GATES[@]}" "${COMMON[@]}" "${LEARNED[@]}" >&2 || [ $? -eq 3 ]
  fi
  if ! git ls-files --error-unmatch $OUT/room_$pair.json > /dev/null 2>&1; then
    git add -f $OUT/room_$pair.json $OUT/critic_warmstart_$pair.json >&2
    git commit -q -m "results/$NAME: room check on warm starts $pair (informative share $1)" -- \
        $OUT/room_$pair.json $OUT/critic_warmstart_$pair.json >&2
  fi
  # a check made under other gates is not reused: its verdict answers another question
  $PY - "$OUT/room_$pair.json" "${MIN_ROOM:-0}" "${MIN_DIFFERING:-0}" <<'PY'
import json, sys
r, room, differing = json.load(open(sys.argv[1])), float(sys.argv[2]), float(sys.argv[3])
if (r.get("min_room", 0.0), r.get("min_differing", 0.0)) != (room, differing):
    sys.exit(f"{sys.argv[1]} was checked with --min-room {r.get('min_room', 0.0)} --min-differing "
             f"{r.get('min_differing', 0.0)}, not {room} and {differing}: move it aside to check again")
signal = r.get("has_signal", True)
print("pass" if r["has_room"] and signal else "no_signal" if r["has_room"] else "no_room" if signal else "neither")
PY
}

share=$SHARE CRITIC=
for _ in $(seq "$TRIES"); do
  verdict=$(try_share "$share")
  echo "[binac] informative share $share: $verdict" >&2
  if [ "$verdict" = pass ]; then CRITIC=outputs/exp/${NAME}_critic_$share; break; fi
  [ "$verdict" = neither ] && break  # neither more nor less informative targets can mend both
  share=$($PY -c "print(round($share + (0.1 if '$verdict' == 'no_signal' else -0.1), 1))")
done
if [ -z "$CRITIC" ]; then
  echo "[binac] no critic warm start passed the room check (records in $OUT/room_*.json): no run is made" >&2
  exit 3
fi
for seed in ${SEEDS:-0 1 2}; do
  $PY pipelines/compare.py --config $CFG --presets grpo_single,fixed_critic --first-seed $seed --seeds 1 \
      --name $NAME --baseline fixed_critic --git-commit "${COMMON[@]}" binac.critic_model=$CRITIC
  $PY pipelines/compare.py --config $CFG --presets binac_no_bilevel,binac --first-seed $seed --seeds 1 \
      --name $NAME --baseline fixed_critic --git-commit "${COMMON[@]}" "${LEARNED[@]}" binac.critic_model=$CRITIC
done
$PY docs/scripts/binac_table.py $OUT
