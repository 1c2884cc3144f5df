#!/usr/bin/env bash
# The drills reproduction on CPU: role-wise GRPO modes x seeds on tau2-retail-drills, then the
# report with paired bootstrap CIs. Every run resumes where it stopped (rerun this script).
#   scripts/drills_reproduction.sh                 # all runs below
#   RUNS="shared:0 shared:1" scripts/drills_reproduction.sh
set -euo pipefail
cd "$(dirname "$0")/.."
E=${E:-.venv/bin/envace-lite}
OUT=${OUT:-runs/drills}
RUNS=${RUNS:-"shared:0 shared:1 shared:2 per_role:0 act_only:0 act_only_real:0"}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} HF_HUB_OFFLINE=1
for r in $RUNS; do
  mode=${r%%:*}; seed=${r##*:}
  dir=$OUT/${mode}_s${seed}
  # each seed has its own warm start (SFT); the modes of one seed share it
  ws=$OUT/warmstart_s${seed}
  if [ ! -f "$ws/checkpoint/config.json" ]; then
    $E warmstart --profile drills --seed "$seed" --run-dir "$ws" --no-measure
  fi
  $E experiment --profile drills --seed "$seed" --mode "$mode" --out "$dir" \
     --warmstart "$ws" --heldout-every "${HELDOUT_EVERY:-8}"
done
$E drills report $(for r in $RUNS; do echo --run "$OUT/${r%%:*}_s${r##*:}"; done) --out "$OUT/report"
