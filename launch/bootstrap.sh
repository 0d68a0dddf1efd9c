#!/usr/bin/env bash
# Per-host, idempotent install of this repo into a cached virtual environment.
#
# Runs on each host (TPU VM worker, container) or once per shared filesystem (SLURM), from a copy of the
# repo: creates the venv if it is missing, installs the repo (editable) with the accelerator's extras, checks
# that the accelerator's runtime really got installed, and writes "<commit> <extras>" to <venv>/.oapl_jax_stamp.
# A second run with the same commit and extras does nothing.
#
# Environment: python3 >= 3.10 with the venv module; PyPI reachable (pip); git only if --commit is not given.
# Flags:
#   --extras NAME   tpu: .[tpu] (jax[tpu], libtpu); gpu: .[gpu] (jax[cuda12]); cpu: plain install. Default cpu.
#   --venv-dir DIR  the cached venv. Default $OAPL_VENV_DIR, else ~/.cache/oapl_jax/venv.
#   --commit SHA    the commit in the stamp. Default: `git rev-parse HEAD` of this repo copy.
#   --python PY     the interpreter that creates the venv. Default python3.
#   --dry-run       print the commands it would run, one per line; run nothing.
#   -h, --help      this text.
# Example (what launch/tpu_vm.sh runs on every TPU worker):
#   bash oapl_jax/<sha>/launch/bootstrap.sh --extras tpu --commit <sha>
set -euo pipefail
# shellcheck source=launch/steps.sh
source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
EXTRAS=cpu
VENV_DIR=${OAPL_VENV_DIR:-$HOME/.cache/oapl_jax/venv}
COMMIT=""
PYTHON=python3
DRY_RUN=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --extras) EXTRAS=$2; shift 2 ;;
    --venv-dir) VENV_DIR=$2; shift 2 ;;
    --commit) COMMIT=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage ;;
    *) die "unknown flag $1 (see the top of $0)" ;;
  esac
done
case $EXTRAS in
  tpu) REQUIREMENT="${REPO}[tpu]"; RUNTIME_PACKAGE=libtpu ;;
  gpu) REQUIREMENT="${REPO}[gpu]"; RUNTIME_PACKAGE=jax-cuda12-plugin ;;
  cpu) REQUIREMENT="$REPO"; RUNTIME_PACKAGE=jaxlib ;;
  *) die "--extras must be tpu, gpu or cpu, got '$EXTRAS'" ;;
esac
[[ -n $COMMIT ]] || COMMIT=$(repo_commit "$REPO")

STAMP="$VENV_DIR/.oapl_jax_stamp"
WANT="$COMMIT $EXTRAS"
if [[ -f $STAMP && $(cat "$STAMP") == "$WANT" ]]; then
  echo "bootstrap: $VENV_DIR already has $WANT; nothing to do" >&2
  exit 0
fi
VENV_PYTHON="$VENV_DIR/bin/python"
if [[ ! -x $VENV_PYTHON ]]; then
  step "$(words "$PYTHON" -m venv "$VENV_DIR")"
fi
step "$(words "$VENV_PYTHON" -m pip install --quiet --upgrade pip)"
step "$(words "$VENV_PYTHON" -m pip install --quiet -e "$REQUIREMENT")"
# pip only warns about an extra the project lacks; make sure the accelerator runtime is really there.
MISSING="error: $RUNTIME_PACKAGE is not installed after 'pip install -e $REQUIREMENT'; does pyproject.toml define that extra?"
step "$(words "$VENV_PYTHON" -c "import importlib.metadata as m; print('$RUNTIME_PACKAGE', m.version('$RUNTIME_PACKAGE'))") \
2>/dev/null || { $(words echo "$MISSING") >&2; exit 1; }"
step "$(words printf '%s\n' "$WANT") > $(quote "$STAMP")"
