"""The compile check against libtpu's compile-only TPU devices (no TPU needed): topology names, memory
that matches the abstract inputs, analytic FLOPs against XLA's count, and misfits reported as such."""
import json
import math
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from configs import arithmetic, code, math as math_config
from oapl_jax import sections
from oapl_jax.run import compile_check as cc
from oapl_jax.models import vocab_logprobs
from oapl_jax.apps import compile_check as app
from oapl_jax.run import assemble, schema

pytest.importorskip("libtpu", reason="libtpu is not installed (pip install 'libtpu==0.0.42.*'): no TPU topologies")
GIB = 1024 ** 3
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(**model):
  """configs/arithmetic.py with a model big enough for matmuls to dominate, one micro-batch, and the
  reference attention (the analytic count assumes its full T x T scores)."""
  cfg = arithmetic.get_config()
  cfg.model.overrides = dict(vocab_size=512, hidden_size=256, intermediate_size=1024, num_layers=1, num_heads=4,
                             num_kv_heads=2, head_dim=64, max_position_embeddings=512, **model)
  cfg.model.update(logprob_chunk_tokens=8 * 4 * 128, attention="reference")  # every token in one chunk
  cfg.loop.update(batch_prompts=8, group_size=4)
  cfg.sampler.update(num_slots=16, max_prefill_length=64, max_new_tokens=64)
  cfg.eval.max_new_tokens = 64
  return cfg


@pytest.mark.parametrize("name, chip, chips, shape, slices", [
    ("v5p-64", "v5p", 32, "2x4x4", 1),  # v5p-N counts TensorCores: 2 per chip
    ("v5p-8", "v5p", 4, "2x2x1", 1),
    ("v5e-256", "v5e", 256, "16x16", 1),
    ("v5litepod-16", "v5e", 16, "4x4", 1),
    ("v6e-16", "v6e", 16, "4x4", 1),
    ("2xv5e-256", "v5e", 512, "16x16", 2),
    ("v5p:4x4x8", "v5p", 128, "4x4x8", 1),
])
def test_topology_names(name, chip, chips, shape, slices):
  topo = cc.parse_topology(name)
  assert (topo.chip.name, topo.num_chips, topo.shape, topo.num_slices) == (chip, chips, shape, slices)


@pytest.mark.parametrize("name", ["v5p-63", "v7x-8", "v5e-48", "0xv5e-8", "banana"])
def test_bad_topology_names_are_refused(name):
  with pytest.raises(ValueError, match="topology"):
    cc.parse_topology(name)


@pytest.mark.parametrize("name, chips", [("v5p:1x1x1", 1), ("v5p:1x2x1", 2), ("v5e:1x1", 1), ("v6e:2x1", 2)])
def test_slices_smaller_than_a_host_are_described(name, chips):
  assert len(cc.topology_devices(cc.parse_topology(name))) == chips


def test_libtpu_describes_single_and_multi_slice():
  v5p = cc.topology_devices(cc.parse_topology("v5p-64"))
  assert len(v5p) == 32 and {d.device_kind for d in v5p} == {"TPU v5"}
  two = cc.topology_devices(cc.parse_topology("2xv5e-16"))
  assert len(two) == 32 and sorted({d.slice_index for d in two}) == [0, 1]


def test_multi_slice_placement_needs_dcn_and_spans_slices_with_it():
  devices = cc.topology_devices(cc.parse_topology("2xv5e-16"))
  cfg = tiny_config()
  cfg.mesh.update(trainer_dcn=(1, 1, 1), sampler_dcn=(1, 1, 1))
  with pytest.raises(ValueError, match="2 slices"):
    cc._placement(schema.from_config(cfg), devices)  # a dcn of (1, 1, 1) cannot cover two slices
  cfg.mesh.update(trainer_dcn=(-1, 1, 1), sampler_dcn=(-1, 1, 1))  # the default: data parallel across slices
  placement = cc._placement(schema.from_config(cfg), devices)
  assert dict(placement.trainer.mesh.shape) == {"data": 2, "fsdp": 16, "tensor": 1}
  for row in placement.trainer.mesh.devices.reshape(2, 16):  # each data index is one whole slice
    assert len({d.slice_index for d in row}) == 1


def _shard_bytes(tree, tpu_tiles: bool = False) -> int:
  """Per-device bytes of the shards; with `tpu_tiles`, each shard's two minor dims padded to XLA:TPU's tiles (128
  lanes, 8 sublanes of 32 bits: 16 rows for 2-byte types)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shape, itemsize = list(x.sharding.shard_shape(x.shape)), np.dtype(x.dtype).itemsize
    if tpu_tiles and shape:
      shape[-1] = -(-shape[-1] // 128) * 128
      if len(shape) > 1:
        rows = 8 * max(1, 4 // itemsize)
        shape[-2] = -(-shape[-2] // rows) * rows
    total += math.prod(shape) * itemsize
  return total


@pytest.fixture(scope="module")
def report():
  return cc.check(tiny_config(), "v5e-8", seq_len=128)


@pytest.mark.slow  # compiles 5 TPU programs (~100 s); fast: test_tiny_hbm_is_reported..., the CLI test, the FLOP counts
def test_memory_of_every_program_matches_its_inputs(report):
  topo_devices = cc.topology_devices(cc.parse_topology("v5e-8"))
  rc = schema.from_config(tiny_config())
  placement = cc._placement(rc, topo_devices)
  model = cc._model(rc)
  args = cc.train_inputs(assemble.train_config(rc), model, placement.trainer, 8, 4, 128)
  # the largest prefill a run makes: min(num_slots 16, max_prefill_batch 16) prompts (the entropy probe's, 1 sample)
  sampler_args = cc.sampler_inputs(assemble.build_sampler(rc, model, placement.sampler), prefill_rows=16)
  inputs = {"train_step": args, **sampler_args}
  expected = {k: _shard_bytes(v) for k, v in inputs.items()}
  padded = {k: _shard_bytes(v, tpu_tiles=True) for k, v in inputs.items()}
  assert set(report.programs) == set(cc.PROGRAMS)
  for name, mem in report.programs.items():
    assert not mem.error, name
    # Per-device argument bytes = the shards of the abstract inputs, at most with XLA:TPU's padding of each
    # array's two minor dims to its tiles (this toy's 64-wide minor dims pad to 128 lanes); jit drops inputs
    # a program never reads (prefill does not read the untied lm_head).
    assert mem.argument <= padded[name] * 1.05 + 64 * 1024, (name, mem.argument, padded[name])
    if name in ("train_step", "decode"):  # these read every input
      assert mem.argument >= expected[name], (name, mem.argument, expected[name])
    assert mem.total >= mem.argument + mem.temp > 0
  assert report.programs["train_step"].alias > 0  # the state is donated
  assert all(report.fits().values())


@pytest.mark.slow  # shares the fixture above; fast: the analytic counts below (remat, skipped tokens, kept logits)
def test_analytic_flops_match_xla_on_a_loop_free_step(report):
  # One layer (its scan runs once), one micro-batch, one vocabulary chunk: XLA sees every FLOP.
  xla_total = report.programs["train_step"].xla_flops * report.trainer_devices
  assert 0.9 < xla_total / report.flops["executed"] < 1.2, (xla_total, report.flops)
  sequences, T, tokens = 8 * 4, 128, 8 * 4 * 128
  layer = 2 * 4 * 64 * 256 + 2 * 2 * 64 * 256 + 3 * 256 * 1024  # q and o, k and v, the MLP's three
  attention_fwd = 4 * 4 * 64 * T * T * sequences  # QK^T and PV, every score
  assert report.flops["model"] == 6 * (layer + 512 * 256) * tokens + 3 * attention_fwd
  forward = 2 * (layer + 512 * 256) * tokens + attention_fwd
  # the logits' blocks (4096 tokens x 512 words x 4 B) fit in model.logprob_keep_bytes: the backward reuses them,
  # no projection again (tests/models_logprobs_test.py counts the recomputing one's extra matmul in XLA's FLOPs)
  assert report.flops["executed"] == 3 * forward


def test_remat_adds_the_layers_forward_once():
  c = cc._model(schema.from_config(tiny_config())).config
  plain, remat = (cc.train_flops(c.replace(remat=r, num_layers=3), 10, 100) for r in (False, True))
  layers_forward = 3 * (2 * (2 * 4 * 64 * 256 + 2 * 2 * 64 * 256 + 3 * 256 * 1024) * 1000 + 4 * 4 * 64 * 100 * 100 * 10)
  assert remat["executed"] - plain["executed"] == layers_forward and remat["model"] == plain["model"]


def test_skipped_vocabulary_tokens_leave_the_executed_count_four_projections_each():
  """Each token whose vocabulary chunk is skipped saves its forward, recomputed forward and two backward
  matmuls (4 x 2 x V x E), or 3 with the logits kept; model FLOPs count every token."""
  c = cc._model(schema.from_config(tiny_config())).config
  for recompute, projections in ((True, 4), (False, 3)):
    cr = c.replace(logprob_recompute=recompute, logprob_keep_bytes=0)
    every, part = cc.train_flops(cr, 10, 100), cc.train_flops(cr, 10, 100, vocab_tokens=400)
    assert every["executed"] - part["executed"] == projections * 2 * 512 * 256 * 600
    assert every["model"] == part["model"]


def test_the_logits_are_kept_when_their_blocks_fit_in_logprob_keep_bytes():
  """logprob_keep_bytes: the backward reuses the kept blocks (3 projections a token, not 4) when a row shard's
  float32 [tokens, vocab] blocks fit: 1000 tokens in chunks of 500 of 512 words, with tails of 252, 126 and 63."""
  assert vocab_logprobs.kept_block_bytes(1000, 512, 3, 512) == 4 * 512 * (1000 + 252 + 126 + 63)
  assert vocab_logprobs.kept_block_bytes(1000, 512, 3, 512, needed_mask=False) == 4 * 512 * 1000
  c = cc._model(schema.from_config(tiny_config())).config.replace(logprob_chunk_tokens=512, logprob_tail_levels=3)
  kept = vocab_logprobs.kept_block_bytes(1000, 512, 3, c.vocab_size)
  count = lambda keep_bytes, **kw: cc.train_flops(c.replace(logprob_keep_bytes=keep_bytes), 10, 100, **kw)  # noqa
  assert count(kept)["executed"] == cc.train_flops(c.replace(logprob_recompute=False), 10, 100)["executed"]
  assert count(kept - 1)["executed"] - count(kept)["executed"] == 2 * c.vocab_size * c.hidden_size * 1000
  assert count(kept - 1, shard_tokens=500)["executed"] == count(kept)["executed"]  # a smaller shard fits
  assert count(2 << 30)["model"] == count(0)["model"]


def test_remat_policy_and_mlp_pieces_change_only_the_executed_count():
  c = cc._model(schema.from_config(tiny_config())).config.replace(num_layers=3, remat=True)
  full, dots, pieces = (cc.train_flops(c.replace(**kw), 10, 100) for kw in (
      {}, {"remat_policy": "save_dots_no_batch"}, {"mlp_chunks": 2}))
  weight_matmuls = 3 * 2 * (2 * 4 * 64 * 256 + 2 * 2 * 64 * 256 + 3 * 256 * 1024) * 1000  # not recomputed
  mlp_forward = 3 * 2 * 3 * 256 * 1024 * 1000  # each piece's forward again, in its backward
  assert full["executed"] - dots["executed"] == weight_matmuls
  assert pieces["executed"] - full["executed"] == mlp_forward
  assert full["model"] == dots["model"] == pieces["model"]


def _cli(json_path, programs="prefill,insert,decode"):
  return ["--config", os.path.join(REPO, "configs/arithmetic.py"), "--topology", "v5e-8", f"--programs={programs}",
          "--json", str(json_path)]


def test_the_json_holds_each_finished_program_as_it_goes(tmp_path, monkeypatch):
  """Before each program's compile (a fake: nothing compiles) the file holds the programs before it, not complete;
  at the end all of them, complete; no temporary file is left beside it."""
  path, found = tmp_path / "fit.json", []

  def compile_memory(build, context=None, compiler_options=None):
    found.append(json.loads(path.read_text()) if path.exists() else None)
    return cc.Memory(argument=len(found), total=len(found) * GIB)
  monkeypatch.setattr(cc, "compile_memory", compile_memory)
  assert app.main(_cli(path)) == 0
  assert found[0] is None
  assert [(list(r["programs"]), r["complete"]) for r in found[1:]] == [(["prefill"], False),
                                                                        (["prefill", "insert"], False)]
  final = json.loads(path.read_text())
  assert final["complete"] is True
  assert {name: m["total"] for name, m in final["programs"].items()} == {"prefill": GIB, "insert": 2 * GIB,
                                                                         "decode": 3 * GIB}
  assert os.listdir(tmp_path) == ["fit.json"]


def test_without_libtpu_the_check_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
  """The package alone (make demo's install) has no libtpu: before, a traceback ending in JAX's RuntimeError."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else find_spec(name, *a))

  def no_tpu(*args, **kwargs):
    raise RuntimeError("JAX TPU support not installed; cannot generate TPU topology.")
  monkeypatch.setattr(topologies, "get_topology_desc", no_tpu)
  monkeypatch.setattr(cc, "compile_memory", lambda *a, **k: pytest.fail("compiled without libtpu"))
  assert app.main(_cli(tmp_path / "fit.json")) == 2
  err = capsys.readouterr().err.strip().splitlines()  # the plan's header line, then the error
  assert err[1:] == ["error: the compile check needs libtpu to describe v5e-8 (no TPU is used): install the compile-check "
                 "extra, pip install -e '.[compile-check]' (make install has it)"]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_before_the_next_program_with_one_line(tmp_path, monkeypatch, capsys, sig, code):
  """The signal arrives while the first program compiles (a fake that sends it): that program finishes and is in
  the file, no other starts, one line says so, the exit is 128 + the signal and the handlers are given back."""
  path, calls, before = tmp_path / "fit.json", [], signal.getsignal(sig)

  def compile_memory(build, context=None, compiler_options=None):
    calls.append(build)
    os.kill(os.getpid(), sig)
    return cc.Memory(total=GIB)
  monkeypatch.setattr(cc, "compile_memory", compile_memory)
  assert app.main(_cli(path)) == code
  assert len(calls) == 1
  record = json.loads(path.read_text())
  assert record["complete"] is False and list(record["programs"]) == ["prefill"]
  assert capsys.readouterr().err.splitlines()[-1] == (
      f'compile check stopped by {sig.name}: prefill in {path} ("complete": false); not compiled: insert, decode')
  assert signal.getsignal(sig) is before


def test_tiny_hbm_is_reported_as_a_misfit_and_the_cli_exits_nonzero():
  cmd = [sys.executable, "-m", "oapl_jax.apps.compile_check", "--config", "configs/arithmetic.py", "--topology", "v5e-8",
         "--programs=prefill", "--hbm_gib=0.000001"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 1, out.stdout + out.stderr
  assert "DOES NOT FIT v5e-8: prefill" in out.stderr


def test_the_cli_says_what_it_compiles_as_it_goes_and_libtpu_stays_quiet():
  env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}  # as a fresh shell has them
  cmd = [sys.executable, "-m", "oapl_jax.apps.compile_check", "--config", "configs/arithmetic.py", "--topology", "v5e-8",
         "--programs=prefill,insert"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**env, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stdout + out.stderr
  lines = out.stderr.splitlines()
  starts = [i for i, line in enumerate(lines) if line.startswith("compiling ")]
  assert [lines[i] for i in starts] == ["compiling prefill (1/2) ...", "compiling insert (2/2) ..."]
  assert lines[starts[0] + 1].startswith("  prefill: done in ") and "GiB per chip" in lines[starts[0] + 1]
  assert "unexpected worker hostname" not in out.stderr and "could not determine TPU" not in out.stderr


@pytest.mark.parametrize("name, accelerator", [("v5p-64", "v5p-64"), ("v5e-16", "v5litepod-16"), ("v6e-8", "v6e-8"),
                                                ("2xv5e-256", "v5litepod-256"), ("v5p:4x4x8", "v5p-256")])
def test_accelerator_type_is_the_tpu_vms_name_for_one_slice(name, accelerator):
  assert cc.accelerator_type(cc.parse_topology(name)) == accelerator


def test_a_program_too_big_for_hbm_reports_what_the_compiler_asked_for():
  devices = cc.topology_devices(cc.parse_topology("v5e-4"))
  mesh = Mesh(np.asarray(devices), ("x",))
  x = jax.ShapeDtypeStruct((1 << 16, 1 << 17), jnp.float32, sharding=NamedSharding(mesh, P(None, "x")))
  mem = cc.compile_memory(lambda: (jax.jit(lambda a: jnp.sort(a * 2, axis=0) + 1), (x,)))
  per_device = (1 << 16) * (1 << 15) * 4  # 8 GiB in, 8 GiB out: more than v5e's 15.75 GiB with the sort's scratch
  assert mem.error and mem.total >= 2 * per_device > cc.CHIPS["v5e"].hbm_bytes


@pytest.mark.parametrize("message, expected", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (96.00G) "
     "exceeds available HBM (95.74G).", 96 * GIB),
    ("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 533.50G of 95.74G hbm.", 533.5 * GIB),
    ("INTERNAL: something else", None),
])
def test_required_bytes_from_compiler_messages(message, expected):
  got = cc.required_bytes_from_error(message)
  assert got == (None if expected is None else int(expected))


def test_trainer_length_is_the_rollouts_budget_offline_and_the_loops_online():
  offline = code.get_config()  # the offline trainer (rl/offline.py) packs only the stored 32000-token rollouts
  assert (offline.sampler.max_new_tokens, offline.eval.max_new_tokens) == (32000, 65536)
  assert cc.seq_len_of(schema.from_config(offline)) == 4096 + 32000 - 1
  online = math_config.get_config()  # the loop's buffer also fits eval's lengths
  online.eval.max_new_tokens = online.sampler.max_new_tokens + 100
  assert cc.seq_len_of(schema.from_config(online)) == online.sampler.max_prefill_length + online.sampler.max_new_tokens + 100 - 1


def test_num_layers_probe_cuts_only_the_layers():
  cfg = code.get_config()
  full, cut = cc._model(schema.from_config(cfg)), cc._model(schema.from_config(cfg), num_layers=3)
  assert (full.config.num_layers, cut.config.num_layers) == (48, 3)
  assert cut.config.replace(num_layers=48) == full.config
  with pytest.raises(ValueError, match="num_layers=-1"):
    cc._model(schema.from_config(cfg), num_layers=-1)


@pytest.fixture(scope="module")
def by_policy():
  """The train step of a 3-layer tiny model in 2 micro-batches on v5p:2x2x1 (4 chips), under each remat policy that
  keeps the layer inputs (in HBM, or offloaded to pinned host memory)."""
  out = {}
  for policy in ("full", "offload_layer_input"):
    cfg = tiny_config()
    cfg.model.overrides["num_layers"] = 3
    cfg.model.update(remat=True, remat_policy=policy)
    cfg.trainer.micro_batches = 2
    out[policy] = cc.check(cfg, "v5p:2x2x1", seq_len=128, programs=("train_step",), mfu=0.5, host_bytes_per_s=2e9)
  return out


@pytest.mark.slow  # compiles two TPU train steps (~100 s); kept in make test-all
def test_host_bytes_are_the_offloaded_layer_inputs_out_and_back_per_micro_batch(by_policy):
  full, offload = (by_policy[p].programs["train_step"] for p in ("full", "offload_layer_input"))
  assert not full.error and not offload.error
  assert full.host_temp == full.host_bytes == 0
  # 8 prompts x 4 samples in 2 micro-batches = 16 sequences each, over 4 chips: [3 layers, 4, T=128, E=256] float32
  # per chip, written in the forward and read in the backward, twice a step.
  per_micro_batch = 3 * 4 * 128 * 256 * 4
  assert offload.host_temp == per_micro_batch
  assert offload.host_bytes == 2 * 2 * per_micro_batch


@pytest.mark.slow  # shares the fixture above
def test_step_estimate_is_executed_flops_at_the_fraction_of_peak_plus_host_bytes_at_host_bandwidth(by_policy):
  report = by_policy["offload_layer_input"]
  compute = report.flops["executed"] / (4 * 459e12 * 0.5)  # 4 v5p chips, 459 TFLOP/s each, at half of it
  host = 4 * 3 * 4 * 128 * 256 * 4 / 2e9  # 6 MiB per chip at 2 GB/s
  assert report.compute_seconds == pytest.approx(compute, rel=1e-12)
  assert report.host_seconds == pytest.approx(host, rel=1e-12)
  assert report.step_seconds == pytest.approx(compute + host, rel=1e-12)
  assert by_policy["full"].step_seconds == pytest.approx(compute, rel=1e-12)  # same FLOPs, nothing moved
  text = app.format_report(report)
  assert f"{host:.2f} s, assumed PCIe rate" in text and "at 2.0 GB/s" in text
  row = next(line for line in text.splitlines() if line.startswith("train_step "))
  assert row.split()[-2:] == [f"{6 * 1024 ** 2 / GIB:.2f}", f"{report.programs['train_step'].xla_flops:.3e}"]


def test_the_compile_check_goes_through_run_check_but_not_the_tasks_files():
  devices = cc.topology_devices(cc.parse_topology("v5p-64"))
  paper = schema.from_config(math_config.get_config())  # its data and tokenizer are not on this host
  assert cc.config_problems(paper, devices) == []
  bad = tiny_config()
  bad.trainer.micro_batches = 3  # 8 prompts do not split into 3 micro-batches
  with pytest.raises(sections.ConfigError, match="loop.batch_prompts=8: must split into trainer.micro_batches=3"):
    cc.check(bad, "v5e-8", seq_len=128, programs=("train_step",))
