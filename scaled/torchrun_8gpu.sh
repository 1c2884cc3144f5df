#!/usr/bin/env bash
# Plain torchrun example: the same train() as the notebooks, on one node, no accelerate launcher.
# DeepSpeed is switched on through the environment variables that `accelerate launch` would set
# (transformers' TrainingArguments reads ACCELERATE_USE_DEEPSPEED and the config file path).
#
#   bash scaled/torchrun_8gpu.sh --dry-run                    # print config, entry point, world
#   bash scaled/torchrun_8gpu.sh                              # ZeRO-3, 8 GPUs, reference run
#   NPROC=2 DS_CONFIG= PROFILE=smoke OVERRIDES= bash scaled/torchrun_8gpu.sh   # CPU, DDP (gloo)
#
# Environment: NPROC (8), PROFILE (scaled), OVERRIDES (space-separated files; default the
# reference run), DS_CONFIG (scaled/accelerate/zero3.json; empty for plain DDP), RUN_DIR (a new
# runs/train/... dir), EXTRA (more `envace-lite train` arguments, e.g. "--set grpo.steps=2").
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) echo "unknown argument: $arg (only --dry-run)" >&2; exit 2 ;;
  esac
done

NPROC=${NPROC:-8}
PROFILE=${PROFILE:-scaled}
OVERRIDES=${OVERRIDES-scaled/overrides/reference.yaml}
DS_CONFIG=${DS_CONFIG-scaled/accelerate/zero3.json}
RUN_DIR=${RUN_DIR:-runs/train/${PROFILE}__torchrun__$(date +%Y%m%d-%H%M%S)}
EXTRA=${EXTRA:-}

args=(train --profile "$PROFILE" --run-dir "$RUN_DIR")
for f in $OVERRIDES; do args+=(--overrides "$f"); done
# shellcheck disable=SC2206
args+=($EXTRA)

env_vars=(OMP_WAIT_POLICY=PASSIVE)
if [[ -n "$DS_CONFIG" ]]; then
  env_vars+=(ACCELERATE_USE_DEEPSPEED=true "ACCELERATE_DEEPSPEED_CONFIG_FILE=$DS_CONFIG"
             ACCELERATE_DEEPSPEED_ZERO3_INIT=true)
fi
cmd=(torchrun --standalone --nnodes 1 --nproc_per_node "$NPROC" -m envace_lite.cli.main "${args[@]}")

if [[ $DRY_RUN == 1 ]]; then
  echo "entry point: envace_lite.pipelines.train.train (via python -m envace_lite.cli.main train)"
  echo "world size: $NPROC"
  echo "env: ${env_vars[*]}"
  echo "command: ${cmd[*]}"
  echo "resolved config:"
  # what every rank's `envace-lite train` builds (cli.options.resolve_config, as `train` calls it)
  python - "${args[@]}" <<'PY'
import json, sys
from envace_lite.cli.options import resolve_config
argv, files, sets = sys.argv[1:], [], []
for flag, value in zip(argv, argv[1:]):
    if flag == "--overrides":
        files.append(value)
    elif flag == "--set":
        sets.append(value)
flags = {"--seed": "run.seed", "--mode": "grpo.mode", "--steps": "grpo.steps"}
given = {key: argv[argv.index(flag) + 1] for flag, key in flags.items() if flag in argv}
extra = {"run.seed": int(given.pop("run.seed", 0))}
final = {k: int(v) if k == "grpo.steps" else v for k, v in given.items()}
profile = argv[argv.index("--profile") + 1]
print(json.dumps(resolve_config(profile, files, sets, extra=extra, final=final).to_dict(), indent=1))
PY
  exit 0
fi
exec env "${env_vars[@]}" "${cmd[@]}"
