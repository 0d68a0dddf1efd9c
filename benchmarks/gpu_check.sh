#!/usr/bin/env bash
# A lease's GPU checks: the machine, the benchmarks (benchmarks/gpu_bench.py), then the model/attention/trainer/
# sampler tests, `make demo`'s config and configs/gsm8k.py:smoke side by side ("functional").
#
#   bash benchmarks/gpu_check.sh                        # every section, about 10 minutes: more than one call allows
#   bash benchmarks/gpu_check.sh tests decode_1p7b  # some of: tests decode_0p6b decode_1p7b train attention functional
#   DECODE_BATCHES="1 16" bash benchmarks/gpu_check.sh decode_0p6b decode_cmdbuf   # the decode with and without
#       the loop as one CUDA graph (COMMAND_BUFFERS: XLA's command-buffer kinds)
#
# Logs and a summary under $OUT (default /tmp/gpu_check). Seen on an H100 (2026-11-26): each decode batch size
# compiles in 24-33 s; the tests 204 s at -n 12 (compilation); demo 66 s, gsm8k smoke 74 s beside them.
# The GPU image has jax, flax, optax, orbax, transformers and torch but not ml_collections, clu or
# math_verify: put their wheels in .whl/ (see the device notes) and they are installed to /tmp/site.
# It has no tensorflow, so jetstream does not import there (the sampler's core does not need it).
# JAX_PLATFORMS keeps cpu beside cuda: jax.debug.callback (a logprobs test counts its calls) needs a CPU device.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=3 \
  PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda,cpu}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

section() {  # name, seconds, command...: the command's output to $OUT/name.log, its exit code and time to summary
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - start)) s (limit $limit)" >>"$OUT/summary.txt"
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import sys, jax, flax, optax, orbax.checkpoint as o, transformers, torch
print(sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'orbax', o.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)
print(jax.devices())
import oapl_jax.sampler.core, oapl_jax.rl.loop; print('oapl_jax imports without tensorflow and jetstream')"
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"

run_section() {
  case $1 in
    decode_0p6b | decode_1p7b)
      # shellcheck disable=SC2086
      section "$1" 170 python3 -m benchmarks.gpu_bench decode --widths "qwen3_${1#decode_}" --new_tokens 64 \
        --repeats 3 --batches $DECODE_BATCHES ;;
    decode_cmdbuf)  # the decode loop as one CUDA graph: XLA's command buffers with WHILE and CONDITIONAL added,
      # so the early-exit loop's predicate is not copied to the host every step; Qwen3-0.6B
      # shellcheck disable=SC2086
      section "$1" 170 env XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=$COMMAND_BUFFERS" \
        python3 -m benchmarks.gpu_bench decode --widths qwen3_0p6b --new_tokens 64 --repeats 3 \
        --batches $DECODE_BATCHES ;;
    train)
      section train 110 python3 -m benchmarks.gpu_bench train --lengths 2048 4096 8192 --tokens 4096 --repeats 3 \
        --remat ;;
    attention) section attention 50 python3 -m benchmarks.gpu_bench attention --lengths 4096 16384 --repeats 5 ;;
    tests)  # alone: at -n 6 beside the runs below it took over 140 s, and --tb=line prints reasons only at the end
      local tests="tests/models_attention_test.py tests/models_qwen_test.py tests/models_hf_test.py
        tests/models_logprobs_test.py tests/models_remat_test.py tests/objectives_test.py tests/trainer_test.py
        tests/sampler_core_test.py"
      # shellcheck disable=SC2086
      section tests 300 python3 -m pytest $tests -n 12 -v --tb=short -rfE -p no:cacheprovider ;;
    functional)  # two runs share the GPU (memory grows on demand); their wall times are under that load
      section demo 200 python3 -m oapl_jax.main --config configs/arithmetic.py --workdir /tmp/demo &
      section gsm8k_smoke 200 python3 -m benchmarks.gsm8k_smoke &
      wait ;;
    *) echo "unknown section $1" >&2; exit 2 ;;
  esac
}
DECODE_BATCHES=${DECODE_BATCHES:-1 16 64 256}
COMMAND_BUFFERS=${COMMAND_BUFFERS:-FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL}
SECTIONS=${*:-tests decode_0p6b decode_1p7b train attention functional}
for name in $SECTIONS; do run_section "$name"; done

echo "== summary"; tail -n 8 "$OUT/summary.txt"
for name in decode_0p6b decode_cmdbuf decode_1p7b train attention; do
  [ -f "$OUT/$name.log" ] && { echo "== $name"; grep -v "it/s\]\|^Loading\|^Writing" "$OUT/$name.log" | tail -14; }
done
[ -f "$OUT/tests.log" ] && {
  echo "== tests"; grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/tests.log" | cut -c1-300 | tail -40
}
[ -f "$OUT/demo.log" ] && { echo "== demo"; tail -c 1500 "$OUT/demo.log"; }
[ -f "$OUT/gsm8k_smoke.log" ] && { echo "== gsm8k_smoke"; tail -c 1200 "$OUT/gsm8k_smoke.log"; }
exit 0
