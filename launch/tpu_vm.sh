#!/usr/bin/env bash
# Train on a Cloud TPU slice (or several, over DCN) of TPU VMs, from your workstation.
#
# Steps, in order (each printed by --dry-run exactly as it would run):
#   1. the compile check, here, before any TPU is rented:
#        python -m oapl_jax.apps.compile_check --config CONFIG --topology TOPOLOGY [overrides]
#   2. the commit to ship: `git archive HEAD` to a tarball;
#   3. the TPUs: reuse the queued resource NAME if it exists, else create it (`queued-resources create`, one
#      node per slice: NAME for one slice, NAME-0 .. NAME-{N-1} for N slices) and wait until it is ACTIVE;
#      with --tpu-vm, `tpu-vm create` instead (one slice only);
#   4. on every worker of every slice (`gcloud compute tpus tpu-vm ssh NODE --worker=all`): unpack the commit
#      into ~/oapl_jax/<sha> and run launch/bootstrap.sh (idempotent, cached venv in ~/.cache/oapl_jax/venv);
#   5. --stage: weights and data put where the config reads them, on every worker;
#   6. the same training command on every worker of every slice; gcloud writes each worker's output to
#      LOG_DIR/<node>/<worker>.log (--output-directory). jax.distributed finds the coordinator itself on TPU
#      VMs (oapl_jax/distributed.py). For several slices the queued resource provides the MEGASCALE_*
#      settings (coordinator, slice id, slice count) in the VMs' tpu-env metadata, so nothing is exported here;
#      the config gets the DCN mesh as --config.mesh.trainer_dcn=(NUM_SLICES,1,1), data parallel across slices.
# The last line printed (dry run or not) is the teardown, never run here: the command that deletes the queued
# resource and its TPUs (`queued-resources delete --force`), or with --tpu-vm the TPU VM (`tpu-vm delete`).
#
# Environment: gcloud, authenticated, with the TPU API enabled; `ssh-add ~/.ssh/google_compute_engine` done
# (gcloud needs the agent for --worker=all); git; for the compile check, PYTHON with this repo installed with
# its [tpu] extra (libtpu compiles for TPU topologies on any host, a CPU laptop included).
# Flags (paths are relative to the repo root):
#   --name NAME              queued resource (and TPU node) name. Required.
#   --accelerator-type TYPE  per slice: v5p-64, v5litepod-256 (v5e), v6e-256, v4-32, ... Required.
#   --num-slices N           slices over DCN (a queued resource with --node-count N). Default 1.
#   --zone ZONE, --project PROJECT   Required.
#   --runtime-version V      TPU software version. Default by family: v5p v2-alpha-tpuv5, v5litepod
#                            v2-alpha-tpuv5-lite, v6e v2-alpha-tpuv6e, v4 tpu-ubuntu2204-base.
#   --spot | --reserved      capacity for the new TPUs. Default on demand.
#   --tpu-vm                 create with `tpu-vm create` instead of a queued resource (one slice only).
#   --config CONFIG          experiment config, e.g. configs/math.py. Required.
#   --workdir DIR            run directory every host can reach, e.g. gs://bucket/runs/math. Required.
#   --topology T             for the compile check. Default TYPE (one slice), NxTYPE (N slices).
#   --dcn SPEC               --config.mesh.trainer_dcn value for several slices. Default (N,1,1).
#   --env KEY=VALUE          exported to the training processes on every worker (repeatable).
#   --stage SRC=DEST         put weights or data at DEST on every worker before training (repeatable); SRC is
#                            gs://BUCKET/PATH (gcloud storage rsync), hf:ORG/NAME[@REV] (oapl-prepare model),
#                            data:NAME (oapl-prepare data) or an absolute path every worker mounts (linked).
#                            DEST is where the config reads it, e.g. ~/models/Qwen3-0.6B (that worker's home).
#   --python PY              local interpreter for the compile check. Default python3.
#   --log-dir DIR            local per-worker logs. Default runs/launch/NAME.
#   --commit SHA             what to ship. Default HEAD.
#   --dry-run                print the commands it would run, one per line; run nothing.
#   -h, --help               this text.
#   -- OVERRIDES...          config overrides for the compile check and the training, e.g. --config.loop.num_syncs=2
# Example:
#   launch/tpu_vm.sh --name oapl-v5p --accelerator-type v5p-64 --zone us-east5-a --project my-proj \
#     --config configs/math.py --workdir gs://my-bucket/runs/math --dry-run \
#     --stage gs://my-bucket/models/Qwen3-4B-Thinking-2507=~/models/Qwen3-4B-Thinking-2507 \
#     --stage gs://my-bucket/data=~/data
set -euo pipefail
# shellcheck source=launch/steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NAME="" ACCELERATOR="" NUM_SLICES=1 ZONE="" PROJECT="" RUNTIME_VERSION="" CAPACITY="" USE_TPU_VM=0
CONFIG="" WORKDIR="" TOPOLOGY="" DCN="" PYTHON=python3 LOG_DIR="" COMMIT="" DRY_RUN=0
ENV_VARS=() OVERRIDES=() STAGES=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --name) NAME=$2; shift 2 ;;
    --accelerator-type) ACCELERATOR=$2; shift 2 ;;
    --num-slices) NUM_SLICES=$2; shift 2 ;;
    --zone) ZONE=$2; shift 2 ;;
    --project) PROJECT=$2; shift 2 ;;
    --runtime-version) RUNTIME_VERSION=$2; shift 2 ;;
    --spot|--reserved) CAPACITY=$1; shift ;;
    --tpu-vm) USE_TPU_VM=1; shift ;;
    --config) CONFIG=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --topology) TOPOLOGY=$2; shift 2 ;;
    --dcn) DCN=$2; shift 2 ;;
    --env) ENV_VARS+=("$2"); shift 2 ;;
    --stage) STAGES+=("$2"); shift 2 ;;
    -h|--help) usage ;;
    --python) PYTHON=$2; shift 2 ;;
    --log-dir) LOG_DIR=$2; shift 2 ;;
    --commit) COMMIT=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift
      for override in "$@"; do  # --dry-run is honoured even after --
        if [[ $override == --dry-run ]]; then DRY_RUN=1; else OVERRIDES+=("$override"); fi
      done
      break ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
done
for required in NAME ACCELERATOR ZONE PROJECT CONFIG WORKDIR; do
  [[ -n ${!required} ]] || die "--$(tr '[:upper:]_' '[:lower:]-' <<< "$required" | sed 's/accelerator/accelerator-type/') is required"
done
check_stages "${STAGES[@]}"
[[ $NUM_SLICES =~ ^[1-9][0-9]*$ ]] || die "--num-slices must be a positive integer, got '$NUM_SLICES'"
[[ $USE_TPU_VM == 0 || $NUM_SLICES == 1 ]] || die "several slices need a queued resource; drop --tpu-vm"
if [[ -z $RUNTIME_VERSION ]]; then
  case $ACCELERATOR in
    v5p-*) RUNTIME_VERSION=v2-alpha-tpuv5 ;;
    v5litepod-*) RUNTIME_VERSION=v2-alpha-tpuv5-lite ;;
    v6e-*) RUNTIME_VERSION=v2-alpha-tpuv6e ;;
    v4-*) RUNTIME_VERSION=tpu-ubuntu2204-base ;;
    *) die "no default TPU software version for '$ACCELERATOR'; pass --runtime-version" ;;
  esac
fi
if [[ $NUM_SLICES == 1 ]]; then
  NODES=("$NAME")
  TOPOLOGY=${TOPOLOGY:-$ACCELERATOR}
else
  NODES=()
  for ((slice = 0; slice < NUM_SLICES; slice++)); do NODES+=("$NAME-$slice"); done
  TOPOLOGY=${TOPOLOGY:-${NUM_SLICES}x$ACCELERATOR}
  OVERRIDES=("--config.mesh.trainer_dcn=${DCN:-($NUM_SLICES,1,1)}" "${OVERRIDES[@]}")
fi
LOG_DIR=${LOG_DIR:-runs/launch/$NAME}
[[ -n $COMMIT ]] || COMMIT=$(repo_commit "$REPO")
TARBALL="${TMPDIR:-/tmp}/oapl_jax-$COMMIT.tar.gz"
REMOTE_REPO="oapl_jax/$COMMIT"  # relative to the worker's home, where gcloud ssh starts
# shellcheck disable=SC2088  # a literal ~, expanded by the worker's shell
REMOTE_PYTHON="~/.cache/oapl_jax/venv/bin/python"  # bootstrap.sh's default venv
WHERE=(--zone="$ZONE" --project="$PROJECT")

# 1. Compile check, locally.
step "$(words cd "$REPO")"
step "$(words "$PYTHON" -m oapl_jax.apps.compile_check --config "$CONFIG" --topology "$TOPOLOGY" "${OVERRIDES[@]}")"
# 2. The commit to ship.
step "$(words git archive --format=tar.gz -o "$TARBALL" "$COMMIT")"
# 3. The TPUs: reuse or create.
if [[ $USE_TPU_VM == 1 ]]; then
  teardown "$(words gcloud compute tpus tpu-vm delete "$NAME" "${WHERE[@]}" --quiet)"
  step "$(words gcloud compute tpus tpu-vm describe "$NAME" "${WHERE[@]}") >/dev/null 2>&1 || $(words \
    gcloud compute tpus tpu-vm create "$NAME" "${WHERE[@]}" --accelerator-type="$ACCELERATOR" \
    --version="$RUNTIME_VERSION" ${CAPACITY:+"$CAPACITY"})"
else
  if [[ $NUM_SLICES == 1 ]]; then NODE_FLAGS=(--node-id="$NAME"); else
    NODE_FLAGS=(--node-count="$NUM_SLICES" --node-prefix="$NAME"); fi
  teardown "$(words gcloud compute tpus queued-resources delete "$NAME" "${WHERE[@]}" --force --quiet)"
  step "$(words gcloud compute tpus queued-resources describe "$NAME" "${WHERE[@]}") >/dev/null 2>&1 || $(words \
    gcloud compute tpus queued-resources create "$NAME" "${WHERE[@]}" --accelerator-type="$ACCELERATOR" \
    --runtime-version="$RUNTIME_VERSION" "${NODE_FLAGS[@]}" ${CAPACITY:+"$CAPACITY"})"
  step "until [ \"\$($(words gcloud compute tpus queued-resources describe "$NAME" "${WHERE[@]}" \
    --format 'value(state.state)'))\" = ACTIVE ]; do sleep 30; done"
fi
# 4. Ship the commit and bootstrap every worker of every slice.
for node in "${NODES[@]}"; do
  step "$(words gcloud compute tpus tpu-vm scp "$TARBALL" "$node:/tmp/" --worker=all "${WHERE[@]}")"
done
BOOTSTRAP="mkdir -p $REMOTE_REPO && tar -xzf /tmp/$(basename "$TARBALL") -C $REMOTE_REPO"
BOOTSTRAP+=" && bash $REMOTE_REPO/launch/bootstrap.sh --extras tpu --commit $COMMIT"
for node in "${NODES[@]}"; do
  step_bg "$(words gcloud compute tpus tpu-vm ssh "$node" "${WHERE[@]}" --worker=all --command "$BOOTSTRAP")"
done
wait_bg
# 5. Weights and data on every worker of every slice (--stage), from the worker's copy of the repo.
if [[ ${#STAGES[@]} -gt 0 ]]; then
  STAGE="cd $REMOTE_REPO"
  for spec in "${STAGES[@]}"; do STAGE+=" && $(stage_line "$spec" "$REMOTE_PYTHON")"; done
  for node in "${NODES[@]}"; do
    step_bg "$(words gcloud compute tpus tpu-vm ssh "$node" "${WHERE[@]}" --worker=all --command "$STAGE")"
  done
  wait_bg
fi
# 6. The same training command on every worker; per-worker logs under LOG_DIR/<node>/<worker>.log.
TRAIN="cd $REMOTE_REPO && "
[[ ${#ENV_VARS[@]} == 0 ]] || TRAIN+="$(words env "${ENV_VARS[@]}") "
TRAIN+="$REMOTE_PYTHON $(words -m oapl_jax.main --config "$CONFIG" --workdir "$WORKDIR" "${OVERRIDES[@]}")"
step "$(words mkdir -p "${NODES[@]/#/$LOG_DIR/}")"
for node in "${NODES[@]}"; do
  step_bg "$(words gcloud compute tpus tpu-vm ssh "$node" "${WHERE[@]}" --worker=all \
    --output-directory="$LOG_DIR/$node" --command "$TRAIN")"
done
wait_bg
