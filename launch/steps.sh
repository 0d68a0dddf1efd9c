#!/usr/bin/env bash
# The helpers every launch script sources (tpu_vm.sh, xpk.sh, slurm.sh): not a launcher itself.
#
# Each action of a launch script is one shell line, printed under --dry-run, else run with eval, so the dry run
# shows exactly what runs. A script sets DRY_RUN=0|1 before its first step.
#
# Helpers:
#   die MESSAGE             the error on stderr, exit 2.
#   quote WORD, words ARG...   a word, or a command line, quoted as the shell reads it back.
#   step LINE               print LINE (dry run) or run it; note TEXT: a comment line in the plan.
#   step_bg LINE, wait_bg   step in the background; wait_bg waits for them all and fails if any failed.
#   teardown LINE           the command that frees what the plan rents (a TPU, a workload, a job): never run,
#                           printed as the last line when the script exits, dry run or not.
#   repo_commit REPO        the commit shipped (HEAD); warns about uncommitted changes.
#   host_path PATH, stage_line SPEC PYTHON, check_stages SPEC...   --stage SRC=DEST as one shell line.
#   usage                   the calling script's header comment, for its -h/--help.
# Use:
#   source "$(dirname "${BASH_SOURCE[0]}")/steps.sh"    # in a launch script
#   launch/steps.sh --help                             # this text

# die MESSAGE: the error on stderr, exit 2.
die() { echo "error: $*" >&2; exit 2; }

# quote WORD: WORD as one shell word: bare when plain, else in '' or "" (whichever needs no escapes).
quote() {
  local word=$1
  if [[ $word =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$word"
  elif [[ $word != *\'* ]]; then
    printf "'%s'" "$word"
  elif [[ $word != *[\"\$\`\\!]* ]]; then
    printf '"%s"' "$word"
  else
    printf "'%s'" "${word//\'/\'\\\'\'}"
  fi
}

# words ARG...: the arguments as one command line.
words() {
  local line="" arg
  for arg in "$@"; do line+="${line:+ }$(quote "$arg")"; done
  printf '%s' "$line"
}

# step LINE: print LINE (dry run) or run it in this shell.
step() {
  if [[ $DRY_RUN == 1 ]]; then printf '%s\n' "$1"; else echo "+ $1" >&2; eval "$1"; fi
}

# note TEXT: a comment line in the plan (stdout in a dry run, stderr otherwise).
note() { if [[ $DRY_RUN == 1 ]]; then echo "# $*"; else echo "# $*" >&2; fi; }

# step_bg LINE: like step, in the background; wait_bg waits for all of them and fails if any failed.
BACKGROUND_PIDS=()
BACKGROUND_LINES=()
step_bg() {
  if [[ $DRY_RUN == 1 ]]; then printf '%s &\n' "$1"; return; fi
  echo "+ $1 &" >&2
  eval "$1 &"
  BACKGROUND_PIDS+=("$!")
  BACKGROUND_LINES+=("$1")
}
wait_bg() {
  if [[ $DRY_RUN == 1 ]]; then echo "wait"; return; fi
  local i failed=0
  for i in "${!BACKGROUND_PIDS[@]}"; do
    if ! wait "${BACKGROUND_PIDS[$i]}"; then echo "failed: ${BACKGROUND_LINES[$i]}" >&2; failed=1; fi
  done
  BACKGROUND_PIDS=()
  BACKGROUND_LINES=()
  return "$failed"
}

# repo_commit REPO: the commit that will be shipped (HEAD); warns when the work tree has changes.
repo_commit() {
  local commit
  commit=$(git -C "$1" rev-parse HEAD) || die "$1 is not a git checkout; pass --commit"
  if [[ -n $(git -C "$1" status --porcelain --untracked-files=no) ]]; then
    echo "warning: uncommitted changes in $1 are not shipped; the hosts get commit $commit" >&2
  fi
  printf '%s' "$commit"
}

# usage: the script's header comment (its manual: line 2 to the first line that is not a comment), for -h/--help;
# exits 0.
usage() {
  sed -n '2,/^\([^#]\|$\)/p' "$0" | sed -n '/^#SBATCH/d; /^#/p' | sed 's/^# \{0,1\}//'
  exit 0
}

# teardown LINE: LINE (the command that frees what the plan rents) as a comment, when the script exits; call it
# just before the step that rents, so a run that stopped before renting says nothing.
teardown() {
  TEARDOWN_LINE=$1
  trap 'note "teardown (when done; this script never runs it): $TEARDOWN_LINE"' EXIT
}

# host_path PATH: PATH for a command line run on another host: a leading ~/ stays bare (that host's home).
host_path() {
  # shellcheck disable=SC2088  # a literal ~, expanded by the shell on that host
  if [[ $1 == "~/"* ]]; then printf '~/%s' "$(quote "${1#\~/}")"; else quote "$1"; fi
}

# stage_line SPEC PYTHON: one shell line that puts what a run reads (weights, data) at DEST on the host running
# it, for SPEC = SRC=DEST. DEST is where the config looks (configs/gsm8k.py reads ~/models/Qwen3-0.6B and
# ~/data/gsm8k); a leading ~/ is that host's home. SRC is one of:
#   gs://BUCKET/PATH   copied with `gcloud storage rsync --recursive` (what is already there is skipped);
#   hf:ORG/NAME[@REV]  a checkpoint fetched and verified by `PYTHON -m oapl_jax.apps.prepare model`;
#   data:NAME          a dataset written by `PYTHON -m oapl_jax.apps.prepare data NAME` (gsm8k, math, ...);
#   /ABSOLUTE/PATH     on a filesystem every host mounts: checked and linked at DEST, not copied.
stage_line() {
  local spec=$1 python=$2 src dest
  [[ $spec == *=* ]] || die "--stage wants SRC=DEST (e.g. gs://bucket/models/Qwen3-0.6B=~/models/Qwen3-0.6B), got '$spec'"
  src=${spec%=*} dest=${spec##*=}
  [[ -n $src && -n $dest ]] || die "--stage wants SRC=DEST, got '$spec'"
  local to
  to=$(host_path "$dest")
  # shellcheck disable=SC2016  # the linked case's $(dirname ...) runs on that host
  case $src in
    gs://*) printf 'mkdir -p %s && gcloud storage rsync --recursive %s %s' "$to" "$(quote "$src")" "$to" ;;
    hf:*)
      local repo=${src#hf:} revision=()
      if [[ $repo == *@* ]]; then revision=(--revision "${repo##*@}"); repo=${repo%@*}; fi
      printf '%s %s' "$python" "$(words -m oapl_jax.apps.prepare model "$repo" "${revision[@]}")"
      printf ' --out %s' "$to" ;;
    data:*) printf '%s %s --out %s' "$python" "$(words -m oapl_jax.apps.prepare data "${src#data:}")" "$to" ;;
    /*) printf 'test -e %s && mkdir -p "$(dirname %s)" && ln -sfn %s %s' "$(quote "$src")" "$to" "$(quote "$src")" \
          "$to" ;;
    *) die "--stage source '$src' must be gs://..., hf:ORG/NAME[@REV], data:NAME or an absolute path" ;;
  esac
}

# check_stages SPEC...: refuse a bad --stage before any step runs.
check_stages() {
  local spec
  for spec in "$@"; do stage_line "$spec" python >/dev/null; done
}

# Run, not sourced: -h/--help prints the header above; anything else is refused.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  case ${1:-} in
    -h|--help) usage ;;
    *) die "launch/steps.sh holds the launch scripts' helpers and is sourced by them; --help lists the helpers" ;;
  esac
fi
