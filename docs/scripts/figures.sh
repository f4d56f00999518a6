#!/bin/sh
# The figures of docs/results.md: for each committed comparison NAME, the curves.png that
# `pipelines/report.py results/NAME` draws from the run folders' metrics.jsonl and
# summary.json (held-out greedy first try against first-turn samples seen, mean over seeds
# with a band of one standard error), copied to docs/figures/NAME.png.
#
#     docs/scripts/figures.sh [NAME ...]      # default: every comparison below
#
# report.py also rewrites runs.jsonl and writes table.md, runs.md and paired.md beside the
# runs, so it runs on a scratch copy: the committed run folders are not touched.
set -eu
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
ALL="expansion efficiency efficiency_corrected precision_pilot default_signal binac binac_rebuilt binac_learnable binac_signal"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p docs/figures
for name in ${*:-$ALL}; do
    case $name in
        binac*) base=fixed_critic ;;
        *) base=grpo_single ;;
    esac
    cp -r "results/$name" "$tmp/"
    PYTHONPATH=. "$PY" pipelines/report.py "$tmp/$name" --baseline "$base" > /dev/null
    cp "$tmp/$name/curves.png" "docs/figures/$name.png"
    echo "docs/figures/$name.png"
done
