"""Serve a Qwen or Llama model over gRPC with JetStream's orchestrator and our SamplerEngine (oapl_jax/sampler/server.py).

  oapl-serve --checkpoint /ckpt/Qwen3-4B --port 9000 --slots 32          # an HF directory
  oapl-serve --checkpoint runs/demo --port 9000                          # a run: its newest checkpoint
  oapl-serve --checkpoint runs/demo --step 40                            # a run: checkpoint step 40
  oapl-serve --checkpoint runs/demo --config configs/arithmetic.py       # a run without config.json

Clients speak JetStream's `Orchestrator.Decode`; every request is checked before JetStream sees it
(a bad one gets INVALID_ARGUMENT, for that client alone). Sampling settings are server flags.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import signal
import sys
from typing import Optional, Sequence

from oapl_jax.apps import cli

cli.prepare_host()
if importlib.util.find_spec("jetstream") is None:  # an extra: the main job does not need it
  print("error: oapl-serve needs JetStream, the package's `serve` extra (it brings TensorFlow, ~2 GB): "
        "pip install -e '.[serve]'", file=sys.stderr)
  sys.exit(2)

import jax  # noqa: E402

from oapl_jax import checkpoint_files, parallel  # noqa: E402
from oapl_jax.run import export, policy  # noqa: E402
from oapl_jax.sampler import server as grpc_server  # noqa: E402
from oapl_jax.sampler.engine import SamplerEngine, load_tokenizer  # noqa: E402
from oapl_jax.sampler.settings import SamplingSettings  # noqa: E402
from oapl_jax.sampler.tokenizers import TokenIdTokenizer  # noqa: E402
from oapl_jax.tasks.char_tokenizer import CharTokenizer  # noqa: E402


def _run_engine(run: str, args: argparse.Namespace, cfg, settings: SamplingSettings,
                **engine_kwargs) -> SamplerEngine:
  """An engine over checkpoint --step (default: the newest) of a run directory, with the run's config
  (`cfg`; None: the one it recorded). Text is encoded as the run's prompts were (HF tokenizer files, or the
  character tokenizer's HF form, <bos> first); a run whose tokenizer has neither takes token ids, and a sample
  stops at the run's EOS (unless --stop_tokens says otherwise)."""
  weights = policy.policy(run, config=cfg, step=args.step)  # params only, no optimizer state
  cfg = weights.config
  run_tokenizer = export.run_tokenizer(cfg)
  source = export.tokenizer_source(run_tokenizer)
  if source:
    tokenizer, described = load_tokenizer(source), source
  elif isinstance(run_tokenizer, CharTokenizer):
    tokenizer, described = run_tokenizer.to_hf(), f"the {run_tokenizer.name} character tokenizer"
  else:
    tokenizer, described = None, "none (token ids)"
  if tokenizer is None and not settings.stop_tokens:
    settings = settings.replace(stop_tokens=(run_tokenizer.eos_id,))
  logging.info("oapl-serve: %s, checkpoint step %d (%d sync windows), tokenizer: %s", run,
               weights.step, weights.meta.syncs_done, described)
  model = weights.model.with_execution(param_dtype=args.dtype, dtype=args.dtype, remat=False)
  return SamplerEngine(model, params=weights.params, tokenizer=tokenizer, settings=settings, **engine_kwargs)


def build_engine(args: argparse.Namespace, cfg=None) -> SamplerEngine:
  """The engine the flags ask for; `cfg`: a run directory's config from --config (else recorded)."""
  devices = jax.devices()[:args.tensor_parallel]
  layout = parallel.Layout(parallel.make_mesh((1, 1, len(devices)), devices=devices))
  settings = SamplingSettings(max_new_tokens=args.max_decode_length, temperature=args.temperature,
                              top_p=args.top_p, top_k=args.top_k, stop_tokens=args.stop_tokens or ())
  common = dict(layout=layout, max_concurrent_decodes=args.slots, max_prefill_length=args.max_prefill_length,
                seed=args.seed)
  path = str(checkpoint_files.absolute(args.checkpoint))  # as the user typed it: relative, or with ~
  if policy.is_run_dir(path):
    return _run_engine(path, args, cfg, settings, **common)
  if cfg is not None or args.step is not None:
    raise ValueError(f"--config and --step are for run directories; {path} has no checkpoints/ directory")
  return SamplerEngine.from_checkpoint(path, dtype=args.dtype, settings=settings, **common)


def parse(argv: Optional[Sequence[str]] = None):
  """(flags, the --config ConfigDict or None)."""
  p = cli.parser("oapl-serve", __doc__)
  p.add_argument("--checkpoint", required=True,
                 help="an HF Qwen2/2.5/3 or Llama 3 directory (config.json + safetensors), or a run directory (one of its "
                      "checkpoints, see --step)")
  p.add_argument("--step", type=int, default=None, help="run directories: the checkpoint step (default: the newest)")
  cli.add_config(p)  # run directories: the config the run was started with (default: RUN_DIR/config.json)
  p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 or :: for every interface)")
  p.add_argument("--port", type=int, default=9000, help="0 picks a free port (printed at start)")
  p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
  p.add_argument("--slots", type=int, default=8, help="concurrent decodes")
  p.add_argument("--max_prefill_length", type=int, default=1024,
                 help="the longest prompt in tokens, a power of two >= 16; longer prompts are refused")
  p.add_argument("--max_decode_length", type=int, default=1024, help="the largest max_tokens a request may ask for")
  p.add_argument("--tensor_parallel", type=int, default=1, help="devices per model replica (mesh 'tensor' axis)")
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--top_p", type=float, default=1.0)
  p.add_argument("--top_k", type=int, default=0)
  p.add_argument("--stop_tokens", type=int, nargs="*", default=None, help="default: the tokenizer's EOS")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--log_level", default="WARNING", help="the orchestrator logs every step at INFO")
  return cli.parse(p, argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
  args, cfg = parse(argv)
  logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  logging.getLogger().addFilter(grpc_server.NoFalseTruncationWarning())
  engine = build_engine(args, cfg)
  server = grpc_server.Server(engine, host=args.host, port=args.port)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a clean stop on SIGTERM, as on Ctrl-C
  prompts = "token ids" if isinstance(engine.build_tokenizer(None), TokenIdTokenizer) else "text"
  print(f"oapl-serve: {args.checkpoint} on {server.address} ({engine.mesh.devices.size} device(s), {args.slots} "
        f"slots, {prompts} prompts up to {engine.max_prefill_length} tokens, max_tokens up to "
        f"{engine.max_decode_length})", flush=True)
  try:
    server.wait_for_termination()
  except KeyboardInterrupt:
    pass
  finally:
    server.stop()
  return 0


def run() -> None:
  """Console script entry point (oapl-serve)."""
  cli.run(main)


if __name__ == "__main__":
  run()
