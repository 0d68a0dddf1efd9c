"""Does a config fit a TPU slice? The train step and the sampler, compiled ahead of time for a named
topology on any host (a CPU laptop included), against each chip's HBM.

  python -m oapl_jax.apps.compile_check --config configs/math.py --topology v5p-64
  python -m oapl_jax.apps.compile_check --config configs/math.py --topology v5p-128 \
      --config.trainer.micro_batches=4 "--config.mesh.sampler_ici=(8,1,8)" --json /tmp/fit.json

Needs libtpu (jax[tpu]'s pin: `pip install "libtpu==0.0.42.*"` for jax 0.10.2). v4-N and v5p-N count
TensorCores (v5p-64 = 32 chips, 2x4x4), v5e-N (v5litepod-N) and v6e-N count chips; "2xv5e-256" is two
slices (data parallel across them unless mesh.trainer_dcn says otherwise); "v5p:4x4x8" names a shape.
The run's own factories build everything from abstract inputs (ShapeDtypeStruct + sharding); memory is
XLA's per-device analysis; a program XLA cannot fit fails to compile and reports the total it asked for.

FLOPs. XLA's cost analysis counts a loop body once (the layer scan, the micro-batch scan, the
vocabulary chunks), so the step is also counted analytically, per optimizer step, for the slice:
  N = L * (E*D*(H + 2K) + H*D*E + 3*E*F) + V*E         matmul weights touched per token
  model FLOPs    = 6*N*tokens + 12*L*H*D*T^2*sequences   (PaLM's MFU convention: no causal halving)
  executed FLOPs = 3*F + F_layers*remat + F_vocab*recompute   with F = 2*N*tokens + 4*L*H*D*T^2*sequences:
    the forward, a backward of twice it, the layers' forward again under remat and the vocabulary
    chunks' again (unless kept: logprob_recompute=False, or the blocks fit in logprob_keep_bytes); F counts
    the full T x T, as the reference attention computes.
    The trainer skips vocabulary chunks without response tokens; train_flops(vocab_tokens=) counts only the
    chunks that run (the slice's analysis assumes every token does).
    remat_policy="save_dots_no_batch" keeps the weight matmuls (only attention is recomputed); with
    mlp_chunks > 1 each MLP piece's forward runs once more, in its own backward.
XLA's own count (the XLA FLOPs column) is per program with every loop body once: the micro-batch scan's body
holds 1/M of the step, the layer scans one layer, and on an FSDP mesh each layer matmul is itself a windowed loop
(configs/math.py on v5p-64: 16 trips, one per pair of the 32 weight shards). Under remat_policy="offload_layer_input"
XLA also peels one iteration out of each layer scan (forward and backward; the loops then run L - 1 times) and
counts it beside the body: the same per-step work reads as about twice "full"'s at equal M (math on v5p-64, M = 2:
1.09e14 per chip against 5.54e13; "full" at M = 4: 2.87e13). Compare policies by the analytic count, not XLA's.

Host transfers. A remat policy that offloads (offload_layer_input) keeps the layer scan's saved inputs in pinned
host memory: XLA's memory analysis gives that buffer (host temporaries, one micro-batch's [L, sequences, T, E]);
each of its bytes goes out once in the forward and comes back once in the backward, per micro-batch, so the bytes
moved per step = 2 * host temporaries * micro_batches (tests/compile_check_test.py: equal to the analytic size;
the HLO's transfers are dynamic-update-slice-start/dynamic-slice-start of one layer's slice, in each layer loop).
Estimated step time = executed FLOPs / (chips * peak bf16 FLOP/s * fraction) + host bytes per chip / host
bandwidth, the two in series (an upper bound: XLA starts the transfers asynchronously and overlaps what it can).
Host bandwidth: Google's Cloud TPU pages give no host<->chip figure for any generation; we assume 1.5e10 bytes/s
per chip each way, the PCIe figure of the JAX scaling book ("How to Scale Your Model", part 2: TPUs), for every
chip (--host_gbps overrides it).
"""
import contextlib
import dataclasses
import math
import re
import sys
import threading
import time
from typing import Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from oapl_jax import parallel, sections
from oapl_jax.tpu_topology import (  # noqa: F401  (the slices by name, re-exported: cc.parse_topology, ...)
    CHIPS, GIB, Chip, LibtpuMissing, Topology, accelerator_type, parse_topology, topology_devices)
from oapl_jax.models import api, factory, vocab_logprobs
from oapl_jax.rl import batch_spec, preemption, trainer
from oapl_jax.run import assemble, check as run_check, schema
from oapl_jax.sampler import buckets, core

PROGRAMS = ("train_step", "prefill", "insert", "decode")


# ------------------------------------------------------------------------------ the run's own factories
def _model(rc: schema.RunConfig, num_layers: int = 0) -> api.CausalLM:
  """The run's model, no weights (a checkpoint not on this host is read as the preset it is named after);
  num_layers > 0 cuts it to that many layers, a cheap probe of memory = fixed + per_layer * L."""
  if num_layers < 0:
    raise ValueError(f"num_layers={num_layers} must be >= 0 (0: the model's own)")
  model = factory.model_of(rc.model, preset_when_absent=True)
  return api.for_config(model.config.replace(num_layers=num_layers)) if num_layers else model


def _placement(rc: schema.RunConfig, devices) -> parallel.Placement:
  """As the run places its two sides (assemble.placement), over the topology's devices."""
  try:
    return assemble.placement(rc, devices)
  except ValueError as e:
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    hint = (f"; this topology has {slices} slices: e.g. --config.mesh.trainer_dcn='(-1, 1, 1)' "
            "--config.mesh.sampler_dcn='(-1, 1, 1)' for data parallelism across them") if slices > 1 else ""
    raise ValueError(f"the config's mesh section does not fit {len(devices)} devices: {e}{hint}") from e


def seq_len_of(rc: schema.RunConfig) -> int:
  """The trainer's T with the longest prompt at max_prefill_length (assemble.seq_len: the run's one rule)."""
  return assemble.seq_len(rc, rc.sampler.max_prefill_length)


# ------------------------------------------------------------------------------ abstract inputs
def _abstract(shapes, shardings):
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def _abstract_params(model, shardings):
  cast = lambda tree: jax.tree.map(lambda p: p.astype(model.config.jnp_param_dtype), tree)  # noqa: E731
  return _abstract(jax.eval_shape(lambda: cast(nn.unbox(model.init_params(jax.random.PRNGKey(0))))), shardings)


def train_inputs(train_cfg, model, layout: parallel.Layout, batch_prompts: int, group_size: int, seq_len: int):
  """Abstract (state, batch, rng) of the train step: the buffer's packed [B, G, T] batch (rl/batch_spec)."""
  state = trainer.abstract_state(train_cfg, model, layout)
  batch = batch_spec.train_batch(batch_prompts, group_size, seq_len, layout, num_prompts=batch_prompts)
  return state, batch, jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=layout.replicated)


def sampler_inputs(sampler: core.Sampler, prefill_rows: int):
  """Abstract arguments of the sampler's prefill, insert and decode at its longest cache
  (max_prefill_length + max_new_tokens), prefilling `prefill_rows` prompts of the longest bucket."""
  model, layout = sampler.model, sampler.layout
  params = _abstract(jax.eval_shape(model.decode_params, _abstract_params(model, sampler.param_shardings)),
                     sampler.snapshot_shardings)
  repl = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=layout.replicated)  # noqa: E731
  S, T, N = sampler.num_slots, sampler.max_prefill_length, sampler.max_new_tokens
  tokens, lengths = repl((prefill_rows, T), jnp.int32), repl((prefill_rows,), jnp.int32)
  with layout.context():
    prefix = _abstract(jax.eval_shape(sampler._prefill, params, tokens, lengths), sampler.prefix_shardings)
    knobs = (np.full((1,), -1, np.int32), np.float32(1.0), np.float32(1.0), np.int32(0))
    state = jax.eval_shape(lambda: core.init_state_fn(model, S, T + N, N, T + N, knobs))
  state, slots = _abstract(state, sampler.state_shardings), repl((S,), jnp.int32)
  return {"prefill": (params, tokens, lengths),
          "insert": (prefix, state, slots, slots, repl((S, 2), jnp.uint32), slots),
          "decode": (params, state, repl((), jnp.int32))}


# ------------------------------------------------------------------------------ compile and measure
@dataclasses.dataclass
class Memory:
  """Per-device bytes of one compiled program (total = arguments + outputs - aliased + temporaries + code)."""
  argument: int = 0
  output: int = 0
  alias: int = 0
  temp: int = 0
  generated_code: int = 0
  total: int = 0
  xla_flops: float = float("nan")  # per device, loop bodies counted once
  error: str = ""  # why it did not compile (an out-of-memory error still sets total)
  seconds: float = 0.0  # to lower and compile
  host_temp: int = 0  # temporaries in the host's pinned memory (remat_policy="offload_layer_input"), not HBM
  host_bytes: int = 0  # moved between host and chip per call (the train step: per optimizer step), both ways

  def with_host_trips(self, trips: int) -> "Memory":
    """host_bytes for a program that fills and drains its host temporaries `trips` times a call: every byte out
    once and back once per trip (the train step: once per micro-batch)."""
    return dataclasses.replace(self, host_bytes=2 * self.host_temp * trips)


_OOM = re.compile(r"(?:HLO temporaries \(|Used )([\d.]+)([KMGT]?)\)? (?:exceeds available HBM|of [\d.]+[KMGT]? hbm)")


def required_bytes_from_error(message: str) -> Optional[int]:
  """The total HBM an XLA:TPU out-of-memory message says the program needs, or None."""
  m = _OOM.search(message)
  return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " ")) if m else None


@contextlib.contextmanager
def without_persistent_cache():
  """JAX's persistent compilation cache off for one compile: an ahead-of-time program for a TPU topology (no client
  here) cannot be read back from it (every hit warns and recompiles), a measurement is not a result to keep, and a
  profile reads op names a cached program keeps from the source that first compiled it."""
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", before)


def compile_memory(build, context=None, compiler_options: Optional[dict] = None) -> Memory:
  """Lower and compile `build()` = (jitted, abstract args); the program's per-device memory. A failure
  is a finding: an out-of-memory one carries the total the compiler asked for, any other its message.
  compiler_options: XLA debug options for this compile (e.g. {"xla_dump_to": dir}: benchmarks/memory_breakdown)."""
  start = time.perf_counter()
  try:
    with context or contextlib.nullcontext():
      jitted, args = build()
      lowered = jitted.lower(*args)
    with without_persistent_cache():
      compiled = lowered.compile(compiler_options=compiler_options)
  except Exception as e:  # noqa: BLE001
    message = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"[:400]
    return Memory(total=required_bytes_from_error(str(e)) or 0, error=message, seconds=time.perf_counter() - start)
  m, cost = compiled.memory_analysis(), compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  parts = (m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes, m.temp_size_in_bytes,
           m.generated_code_size_in_bytes)
  return Memory(*parts, total=sum(parts) - 2 * parts[2], xla_flops=float(cost.get("flops", float("nan"))),
                seconds=time.perf_counter() - start, host_temp=m.host_temp_size_in_bytes)


def train_flops(model_config, sequences: int, seq_len: int, vocab_tokens: Optional[int] = None,
                shard_tokens: Optional[int] = None) -> dict:
  """Analytic FLOPs of one optimizer step over `sequences` of `seq_len` positions (module docstring).
  `vocab_tokens`: the tokens whose vocabulary projection is executed (the trainer skips chunks with no response
  token; default: all); model FLOPs count every token either way. `shard_tokens`: the positions of one row shard
  of one micro-batch (default: all on one), which decide whether the logits are recomputed (logprob_keep_bytes)."""
  c, T, tokens = model_config, seq_len, sequences * seq_len
  E, H, K, D, F, L, V = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.num_layers, \
      c.vocab_size
  layer_weights = L * (E * D * (H + 2 * K) + H * D * E + 3 * E * F)
  attention_fwd = 4 * L * H * D * T * T * sequences
  layers_fwd, vocab_fwd = 2 * layer_weights * tokens + attention_fwd, 2 * V * E * tokens
  model = 6 * (layer_weights + V * E) * tokens + 3 * attention_fwd
  recomputed = (attention_fwd if c.remat_policy == "save_dots_no_batch" else layers_fwd) if c.remat else 0
  mlp_fwd = 2 * L * 3 * E * F * tokens
  vocab_run = 2 * V * E * (tokens if vocab_tokens is None else vocab_tokens)
  recompute = vocab_logprobs.recomputes(c.logprob_recompute, c.logprob_keep_bytes,
                                        tokens if shard_tokens is None else shard_tokens, c.logprob_chunk_tokens,
                                        c.logprob_tail_levels, V)
  executed = 3 * (layers_fwd + vocab_run) + recomputed + vocab_run * recompute + mlp_fwd * (c.mlp_chunks > 1)
  return {"model": float(model), "executed": float(executed), "tokens": tokens, "matmul_weights": layer_weights + V * E}


@dataclasses.dataclass
class Report:
  topology: str
  chip: str
  hbm_bytes: int
  num_chips: int
  trainer_devices: int
  shared: bool  # trainer and sampler on the same chips: both sides' buffers live there at once
  layout: dict
  programs: dict  # name -> Memory
  flops: dict
  mfu: float  # the fraction of the chips' peak the executed FLOPs are assumed to run at
  step_seconds: float  # estimated: compute_seconds + host_seconds
  notes: list
  peak_flops: float = 0.0  # per chip, dense bf16
  host_bytes_per_s: float = 0.0  # per chip, each way
  compute_seconds: float = 0.0  # executed FLOPs / (trainer chips * peak * mfu)
  host_seconds: float = 0.0  # the train step's host bytes per chip / host_bytes_per_s

  def fits(self) -> dict:
    out = {name: mem.total <= self.hbm_bytes and not mem.error for name, mem in self.programs.items()}
    if self.shared and "train_step" in out and "decode" in out and not self.programs["decode"].error:
      out["train_step + sampler resident"] = out["train_step"] and self.resident_bytes() <= self.hbm_bytes
    return out

  def resident_bytes(self) -> int:
    """Shared chips: the train step's peak plus what the sampler keeps between calls (snapshot + decode state)."""
    return self.programs["train_step"].total + self.programs["decode"].argument


def estimate_seconds(executed_flops: float, chips: int, peak_flops: float, fraction: float, host_bytes_per_chip: float,
                     host_bytes_per_s: float) -> tuple[float, float]:
  """(compute, host transfer) seconds of one step: the FLOPs over the chips at `fraction` of their peak, the host
  bytes over one chip's host link (every chip moves its own, in parallel)."""
  return executed_flops / (chips * peak_flops * fraction), host_bytes_per_chip / host_bytes_per_s


def config_problems(rc: schema.RunConfig, devices) -> list:
  """run/check's rules (the ones every entry point runs) over the topology's devices: raises sections.ConfigError,
  returns the warnings. The task's own problems (its data and tokenizer files) are left out: compiling reads
  neither, and a compile host need not hold them."""
  try:
    return run_check.check(rc, devices, preset_when_absent=True)
  except sections.ConfigError as e:
    problems = [p for p in e.problems if not p.startswith("task.")]
    if problems:
      raise sections.ConfigError(problems) from None
    return []


def check(cfg, topology: str, *, seq_len: Optional[int] = None, mfu: float = 0.4, hbm_bytes: Optional[int] = None,
          programs: Sequence[str] = PROGRAMS, num_layers: int = 0, compiler_options: Optional[dict] = None,
          host_bytes_per_s: Optional[float] = None, stop: Optional[preemption.StopFlag] = None,
          on_program: Callable[[Report], None] = lambda report: None) -> Report:
  """Compile `programs` of the run `cfg` describes for `topology`; per-device memory against HBM.
  seq_len: the trainer's T (default `seq_len_of(cfg)`); mfu: the fraction of peak the step-time estimate assumes;
  hbm_bytes: the chip's HBM unless given; num_layers: > 0 compiles a model cut to that many layers (a probe, not
  the run); compiler_options: XLA debug options for every compile; host_bytes_per_s: per chip, each way (default
  the chip's assumed figure). The config goes through run/check first (config_problems).
  on_program(report so far) follows each finished program; once `stop` is requested (its handlers installed by
  the caller) no further program starts, the one compiling finishes, and the report holds those that finished."""
  if set(programs) - set(PROGRAMS):
    raise ValueError(f"unknown programs {sorted(set(programs) - set(PROGRAMS))}; known: {PROGRAMS}")
  topo, stop = parse_topology(topology), stop or preemption.StopFlag()
  cfg = cfg if isinstance(cfg, schema.RunConfig) else schema.from_config(cfg)
  say(f"compile check for {topo.name}: {topo.num_chips} {topo.chip.name} chips, {', '.join(programs)}; each program "
      "takes seconds (a tiny model) to minutes (billions of parameters) to compile on a CPU host")
  devices = topology_devices(topo)
  model, placement = _model(cfg, num_layers), _placement(cfg, devices)
  warnings = config_problems(cfg, devices)
  loop, T, M = cfg.loop, seq_len or seq_len_of(cfg), cfg.trainer.micro_batches
  layout = {"batch_prompts": loop.batch_prompts, "group_size": loop.group_size, "seq_len": T, "micro_batches": M,
            "trainer_mesh": dict(placement.trainer.mesh.shape), "sampler_mesh": dict(placement.sampler.mesh.shape),
            "num_slots": cfg.sampler.num_slots,
            "cache_len": cfg.sampler.max_prefill_length + max(cfg.sampler.max_new_tokens, cfg.eval.max_new_tokens)}
  notes = [f"num_layers={num_layers}: a probe, the model cut to that many layers"] if num_layers else []
  notes, results = notes + [f"config: {w}" for w in warnings], {}

  order = [name for name in PROGRAMS if name in programs]
  hbm = int(hbm_bytes or topo.chip.hbm_bytes)
  rows = loop.batch_prompts * loop.group_size // M  # of one micro-batch, in row shards as vocab_logprobs splits it
  shards = placement.trainer.axis_size("activation_batch")
  shards = shards if rows % shards == 0 else 1
  flops = train_flops(model.config, loop.batch_prompts * loop.group_size, T, shard_tokens=rows // shards * T)
  n_trainer = placement.trainer.mesh.size
  host_bw = host_bytes_per_s or topo.chip.host_bytes_per_s

  def so_far() -> Report:
    step_host = results.get("train_step", Memory()).host_bytes
    compute_s, host_s = estimate_seconds(flops["executed"], n_trainer, topo.chip.peak_bf16_flops, mfu, step_host,
                                         host_bw)
    return Report(topology, topo.chip.name, hbm, topo.num_chips, n_trainer, placement.shared, layout, dict(results),
                  flops, mfu, compute_s + host_s, notes, topo.chip.peak_bf16_flops, host_bw, compute_s, host_s)

  def report(name, compile_it):
    if stop.requested:
      return
    results[name] = mem = _watched(f"compiling {name} ({order.index(name) + 1}/{len(order)})", compile_it)
    outcome = (f"did not fit: asks {mem.total / GIB:.1f} GiB per chip" if mem.error and mem.total else
               f"did not compile: {mem.error[:200]}" if mem.error else
               f"{mem.total / GIB:.2f} GiB per chip ({100 * mem.total / hbm:.1f}% of HBM)")
    say(f"  {name}: done in {mem.seconds:.0f} s, {outcome}")
    on_program(so_far())

  if "train_step" in programs:
    def build_train_step():
      train_cfg = assemble.train_config(cfg, cfg.sampler.max_prefill_length)
      step = trainer.make_train_step(train_cfg, model, placement.trainer, cfg.loop.batch_prompts,
                                     assemble.loss_fn(cfg))
      return step, train_inputs(train_cfg, model, placement.trainer, loop.batch_prompts, loop.group_size, T)
    report("train_step", lambda: compile_memory(build_train_step, compiler_options=compiler_options).with_host_trips(M))
  sampler_programs = [name for name in PROGRAMS[1:] if name in programs]
  if sampler_programs:
    try:
      sampler = assemble.build_sampler(cfg, model, placement.sampler)
      jitted = {"prefill": sampler._prefill, "insert": sampler._insert, "decode": sampler._decode}
      # the largest prefill a run makes: a call of max_prefill_batch prompts, or one per slot (the entropy probe)
      inputs = sampler_inputs(sampler, prefill_rows=buckets.pow2(min(sampler.num_slots,
                                                                     sampler.max_prefill_batch or sampler.num_slots)))
      for name in sampler_programs:
        report(name, lambda name=name: compile_memory(lambda: (jitted[name], inputs[name]), sampler.layout.context(),
                                                      compiler_options).with_host_trips(1))
    except Exception as e:  # noqa: BLE001 - e.g. a cache axis the sampler mesh cannot split
      for name in sampler_programs:
        if name not in results:
          report(name, lambda: Memory(error=f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"[:400]))
  return so_far()


# ------------------------------------------------------------------------------ progress
def say(line: str) -> None:
  """A progress line on stderr (the report itself goes to stdout)."""
  print(line, file=sys.stderr, flush=True)


def _watched(what: str, work: Callable[[], Memory], every_s: float = 60.0) -> Memory:
  """work() on a worker thread while this one says `what ...` now and `what: still running, N s` every `every_s`:
  a compile of a 4B model at 16K tokens runs for minutes with nothing else to show, and a signal's handler (Python
  runs it on the main thread only, between bytecodes) says at once that the stop is heard, not when XLA returns."""
  say(f"{what} ...")
  start, out = time.perf_counter(), []

  def run():
    try:
      out.append(work())
    except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
      out.append(e)
  worker = threading.Thread(target=run, daemon=True)  # daemon: a second signal's exit does not wait for XLA
  worker.start()
  worker.join(every_s)
  while worker.is_alive():
    say(f"{what}: still running, {time.perf_counter() - start:.0f} s")
    worker.join(every_s)
  if isinstance(out[0], BaseException):
    raise out[0]
  return out[0]
