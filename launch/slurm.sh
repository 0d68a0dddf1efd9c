#!/usr/bin/env bash
# Submit a training run to a SLURM GPU cluster with launch/slurm.sbatch (one task per node, all its GPUs).
#
# Prints (--dry-run) or runs the sbatch command; with --dry-run it also prints, under a comment line, the
# commands the batch script will run inside the allocation (its own --dry-run): the bootstrap, then one srun
# with the same training command on every node and one log file per task.
# The last line printed (dry run or not) is the teardown, never run here: `scancel` of your jobs named --job-name
# (give each run its own name to cancel only it; sbatch prints the job's id too).
#
# Environment: a SLURM login node (sbatch), this repo on a filesystem the compute nodes mount.
# Flags (paths are relative to the repo root):
#   --nodes N            nodes. Default 2.
#   --gpus-per-node G    GPUs per node. Default 8.
#   --partition P, --account A, --time T (default 24:00:00), --job-name J (default oapl)
#   --sbatch-arg ARG     any other sbatch option, e.g. --sbatch-arg=--qos=high (repeatable).
#   --config CONFIG      experiment config, e.g. configs/math.py. Required.
#   --workdir DIR        run directory on the shared filesystem (or gs://). Required.
#   --log-dir DIR        sbatch output and per-task logs. Default runs/slurm.
#   --venv-dir DIR       the shared venv. Default ~/.cache/oapl_jax/venv.
#   --stage SRC=DEST     put weights or data at DEST (on the shared filesystem) before training, once, on the
#                        batch host (repeatable); SRC is gs://BUCKET/PATH (gcloud storage rsync),
#                        hf:ORG/NAME[@REV] (oapl-prepare model), data:NAME (oapl-prepare data) or an absolute path
#                        (linked). DEST is where the config reads it, e.g. ~/models/Qwen3-0.6B.
#   --dry-run            print the commands, one per line; run nothing.
#   -h, --help           this text.
#   -- OVERRIDES...      config overrides, e.g. --config.loop.num_syncs=2
# Example (2 nodes x 8 H100):
#   launch/slurm.sh --nodes 2 --gpus-per-node 8 --partition h100 --config configs/math.py \
#     --workdir /shared/runs/math --dry-run
set -euo pipefail
# shellcheck source=launch/steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NODES=2 GPUS_PER_NODE=8 PARTITION="" ACCOUNT="" TIME=24:00:00 JOB_NAME=oapl CONFIG="" WORKDIR=""
LOG_DIR=runs/slurm VENV_DIR="" DRY_RUN=0
SBATCH_ARGS=() OVERRIDES=() STAGES=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --nodes) NODES=$2; shift 2 ;;
    --gpus-per-node) GPUS_PER_NODE=$2; shift 2 ;;
    --partition) PARTITION=$2; shift 2 ;;
    --account) ACCOUNT=$2; shift 2 ;;
    --time) TIME=$2; shift 2 ;;
    --job-name) JOB_NAME=$2; shift 2 ;;
    --sbatch-arg=*) SBATCH_ARGS+=("${1#--sbatch-arg=}"); shift ;;
    --sbatch-arg) SBATCH_ARGS+=("$2"); shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --log-dir) LOG_DIR=$2; shift 2 ;;
    --venv-dir) VENV_DIR=$2; shift 2 ;;
    --stage) STAGES+=("$2"); shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage ;;
    --) shift
      for override in "$@"; do  # --dry-run is honoured even after --
        if [[ $override == --dry-run ]]; then DRY_RUN=1; else OVERRIDES+=("$override"); fi
      done
      break ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
done
check_stages "${STAGES[@]}"
[[ -n $CONFIG && -n $WORKDIR ]] || die "--config and --workdir are required"
[[ $NODES =~ ^[1-9][0-9]*$ && $GPUS_PER_NODE =~ ^[1-9][0-9]*$ ]] || die "--nodes/--gpus-per-node: positive integers"
[[ $LOG_DIR == /* ]] || LOG_DIR="$REPO/$LOG_DIR"

SBATCH=(sbatch --job-name="$JOB_NAME" --nodes="$NODES" --ntasks-per-node=1 --gpus-per-node="$GPUS_PER_NODE"
  --time="$TIME" --output="$LOG_DIR/%x-%j.out")
[[ -z $PARTITION ]] || SBATCH+=(--partition="$PARTITION")
[[ -z $ACCOUNT ]] || SBATCH+=(--account="$ACCOUNT")
SBATCH+=("${SBATCH_ARGS[@]}")
SCRIPT_ARGS=(--repo "$REPO" --config "$CONFIG" --workdir "$WORKDIR" --log-dir "$LOG_DIR")
[[ -z $VENV_DIR ]] || SCRIPT_ARGS+=(--venv-dir "$VENV_DIR")
for spec in "${STAGES[@]}"; do SCRIPT_ARGS+=(--stage "$spec"); done
[[ ${#OVERRIDES[@]} == 0 ]] || OVERRIDES=(-- "${OVERRIDES[@]}")

step "$(words cd "$REPO")"
step "$(words mkdir -p "$LOG_DIR")"
teardown "$(words scancel --user="${USER:-$(id -un)}" --name="$JOB_NAME")"
step "$(words "${SBATCH[@]}" launch/slurm.sbatch "${SCRIPT_ARGS[@]}" "${OVERRIDES[@]}")"
if [[ $DRY_RUN == 1 ]]; then
  note "inside the allocation, launch/slurm.sbatch runs:"
  bash "$REPO/launch/slurm.sbatch" "${SCRIPT_ARGS[@]}" --dry-run "${OVERRIDES[@]}"
fi
