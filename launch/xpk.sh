#!/usr/bin/env bash
# Train as an xpk workload on a GKE cluster: TPU slices (--tpu-type) or GPU nodes (--device-type).
#
# Steps, in order (each printed by --dry-run exactly as it would run):
#   1. TPU only: the compile check, here, before the workload is queued:
#        python -m oapl_jax.apps.compile_check --config CONFIG --topology TOPOLOGY [overrides]
#      (it compiles for TPU topologies; there is none for GPUs, so a GPU run goes without);
#   2. the commit to ship: `git archive` into a clean directory (xpk copies --script-dir into the image; the
#      repo itself would bring .venv and runs/ along);
#   3. `xpk workload create`: xpk builds the image from --base-docker-image plus that directory, and runs the
#      same command in every pod: launch/bootstrap.sh (venv inside the container), the --stage copies (weights
#      and data where the config reads them), then python -m oapl_jax.main.
#      Each pod is one worker; its log is the pod's log (`kubectl logs`, Cloud Logging).
#      jax.distributed: TPU pods are found by jax itself (GKE TPU environment); xpk's GPU pods get
#      JAX_COORDINATOR_ADDRESS/JAX_COORDINATOR_PORT from xpk, and the command maps xpk's NNODES and NODE_RANK
#      to JAX_NUM_PROCESSES and JAX_PROCESS_ID for oapl_jax/distributed.py. Several TPU slices: xpk sets the
#      MEGASCALE_* variables; the config gets --config.mesh.trainer_dcn=(NUM_SLICES,1,1).
# The last line printed (dry run or not) is the teardown, never run here: `xpk workload delete` of the workload.
#
# Environment: xpk (pip install xpk), gcloud and kubectl authenticated for the cluster's project, docker (xpk
# builds and pushes the image); for the TPU compile check, PYTHON with this repo installed with its [tpu] extra.
# Flags (paths are relative to the repo root):
#   --cluster NAME, --workload NAME, --project PROJECT, --zone ZONE   Required.
#   --tpu-type TYPE          TPU slice per worker group: v5p-64, v5litepod-256, v6e-256, ...   } one of
#   --device-type TYPE       GPU machine: h100-80gb-8, h100-mega-80gb-8, a100-40gb-8, ...       } the two
#   --num-slices N           TPU slices over DCN. Default 1.
#   --num-nodes N            GPU nodes. Default 1.
#   --config CONFIG, --workdir DIR (gs://... every pod can reach)   Required.
#   --base-docker-image IMG  image the repo is added to. Default python:3.11.
#   --docker-image IMG       a ready image with the repo installed (its python3 runs oapl_jax); no bootstrap.
#   --topology T             for the TPU compile check. Default TYPE (one slice), NxTYPE (N slices).
#   --dcn SPEC               --config.mesh.trainer_dcn value for several slices. Default (N,1,1).
#   --env KEY=VALUE          set in every pod (xpk --env; repeatable).
#   --stage SRC=DEST         put weights or data at DEST in every pod before training (repeatable); SRC is
#                            gs://BUCKET/PATH (gcloud storage rsync: the image needs gcloud, e.g.
#                            --base-docker-image google/cloud-sdk:slim), hf:ORG/NAME[@REV] (oapl-prepare model),
#                            data:NAME (oapl-prepare data) or an absolute path the pods mount (linked).
#                            DEST is where the config reads it, e.g. ~/models/Qwen3-0.6B.
#   --python PY              local interpreter for the compile check. Default python3.
#   --commit SHA             what to ship. Default HEAD.
#   --dry-run                print the commands it would run, one per line; run nothing.
#   -h, --help               this text.
#   -- OVERRIDES...          config overrides for the compile check and the training.
# Examples:
#   launch/xpk.sh --cluster tpu-cluster --workload oapl-math --project my-proj --zone us-east5 \
#     --tpu-type v5p-64 --config configs/math.py --workdir gs://my-bucket/runs/math --dry-run
#   launch/xpk.sh --cluster gpu-cluster --workload oapl-math --project my-proj --zone us-central1 \
#     --device-type h100-80gb-8 --num-nodes 2 --config configs/math.py --workdir gs://b/r --dry-run
set -euo pipefail
# shellcheck source=launch/steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER="" WORKLOAD="" PROJECT="" ZONE="" TPU_TYPE="" DEVICE_TYPE="" NUM_SLICES=1 NUM_NODES=1
CONFIG="" WORKDIR="" BASE_IMAGE=python:3.11 IMAGE="" TOPOLOGY="" DCN="" PYTHON=python3 COMMIT="" DRY_RUN=0
ENV_VARS=() OVERRIDES=() STAGES=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --cluster) CLUSTER=$2; shift 2 ;;
    --workload) WORKLOAD=$2; shift 2 ;;
    --project) PROJECT=$2; shift 2 ;;
    --zone) ZONE=$2; shift 2 ;;
    --tpu-type) TPU_TYPE=$2; shift 2 ;;
    --device-type) DEVICE_TYPE=$2; shift 2 ;;
    --num-slices) NUM_SLICES=$2; shift 2 ;;
    --num-nodes) NUM_NODES=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --workdir) WORKDIR=$2; shift 2 ;;
    --base-docker-image) BASE_IMAGE=$2; shift 2 ;;
    --docker-image) IMAGE=$2; shift 2 ;;
    --topology) TOPOLOGY=$2; shift 2 ;;
    --dcn) DCN=$2; shift 2 ;;
    --env) ENV_VARS+=("$2"); shift 2 ;;
    --stage) STAGES+=("$2"); shift 2 ;;
    -h|--help) usage ;;
    --python) PYTHON=$2; shift 2 ;;
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
for required in CLUSTER WORKLOAD PROJECT ZONE CONFIG WORKDIR; do
  [[ -n ${!required} ]] || die "--$(tr '[:upper:]' '[:lower:]' <<< "$required") is required"
done
check_stages "${STAGES[@]}"
[[ -n $TPU_TYPE || -n $DEVICE_TYPE ]] || die "give --tpu-type (TPU) or --device-type (GPU)"
[[ -z $TPU_TYPE || -z $DEVICE_TYPE ]] || die "--tpu-type and --device-type exclude each other"
[[ $NUM_SLICES =~ ^[1-9][0-9]*$ && $NUM_NODES =~ ^[1-9][0-9]*$ ]] || die "--num-slices/--num-nodes: positive integers"
if [[ -n $TPU_TYPE && $NUM_SLICES -gt 1 ]]; then
  OVERRIDES=("--config.mesh.trainer_dcn=${DCN:-($NUM_SLICES,1,1)}" "${OVERRIDES[@]}")
  TOPOLOGY=${TOPOLOGY:-${NUM_SLICES}x$TPU_TYPE}
fi
TOPOLOGY=${TOPOLOGY:-$TPU_TYPE}
[[ -n $COMMIT ]] || COMMIT=$(repo_commit "$REPO")
SCRIPT_DIR="${TMPDIR:-/tmp}/oapl_jax-$COMMIT"

# The command every pod runs, from the image's copy of the repo.
if [[ -n $TPU_TYPE ]]; then
  EXTRAS=tpu
  POD_SETUP=""
else
  EXTRAS=gpu
  # shellcheck disable=SC2016  # $NNODES and $NODE_RANK are xpk's, expanded in the pod
  POD_SETUP='export JAX_NUM_PROCESSES=$NNODES JAX_PROCESS_ID=$NODE_RANK && '
fi
if [[ -n $IMAGE ]]; then POD_PYTHON=python3; else
  POD_SETUP+="bash launch/bootstrap.sh --extras $EXTRAS --commit $COMMIT && "
  # shellcheck disable=SC2088  # a literal ~, expanded in the pod: bootstrap.sh's default venv
  POD_PYTHON="~/.cache/oapl_jax/venv/bin/python"
fi
for spec in "${STAGES[@]}"; do POD_SETUP+="$(stage_line "$spec" "$POD_PYTHON") && "; done
POD_COMMAND="$POD_SETUP$POD_PYTHON $(words -m oapl_jax.main --config "$CONFIG" --workdir "$WORKDIR" "${OVERRIDES[@]}")"

# 1. Compile check (TPU), locally.
step "$(words cd "$REPO")"
if [[ -n $TPU_TYPE ]]; then
  step "$(words "$PYTHON" -m oapl_jax.apps.compile_check --config "$CONFIG" --topology "$TOPOLOGY" "${OVERRIDES[@]}")"
else
  note "no compile check: oapl_jax.apps.compile_check compiles for TPU topologies, and --device-type $DEVICE_TYPE is a GPU"
fi
# 2. The commit to ship, as a clean directory.
step "$(words rm -rf "$SCRIPT_DIR") && $(words mkdir -p "$SCRIPT_DIR") && $(words git archive "$COMMIT") | $(words \
  tar -x -C "$SCRIPT_DIR")"
# 3. The workload.
teardown "$(words xpk workload delete --workload "$WORKLOAD" --cluster "$CLUSTER" --project "$PROJECT" --zone "$ZONE")"
CREATE=(xpk workload create --cluster "$CLUSTER" --workload "$WORKLOAD" --project "$PROJECT" --zone "$ZONE")
if [[ -n $TPU_TYPE ]]; then CREATE+=(--tpu-type "$TPU_TYPE" --num-slices "$NUM_SLICES"); else
  CREATE+=(--device-type "$DEVICE_TYPE" --num-nodes "$NUM_NODES"); fi
if [[ -n $IMAGE ]]; then CREATE+=(--docker-image "$IMAGE"); else
  CREATE+=(--base-docker-image "$BASE_IMAGE" --script-dir "$SCRIPT_DIR"); fi
for env_var in "${ENV_VARS[@]}"; do CREATE+=(--env "$env_var"); done
CREATE+=(--command "$POD_COMMAND")
step "$(words "${CREATE[@]}")"
