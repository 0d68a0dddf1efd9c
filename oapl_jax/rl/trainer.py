"""Trainer state and the jitted train step: (state, batch, rng) -> (state, metrics).

    config = TrainConfig(loss="oapl", loss_settings=objectives.OAPLSettings(beta1=1.0, beta2=1e-3),
                         optim=OptimConfig(lr=1e-6, b2=0.95), micro_batches=2, temperature=1.0)
    layout = parallel.Layout(mesh)                     # where the trainer runs (mesh + logical rules)
    state = create_train_state(config, model, params, layout)   # model: a models.api.CausalLM
    train_step = make_train_step(config, model, layout)
    state, metrics = train_step(state, batch, rng)   # batch: dict of [B, G, T] / [B, G] arrays

Batch (right-padded, B prompts x G samples x T positions): its fields, their dtypes, shapes and meanings are
objectives/batch_fields.FIELDS (rl/buffer packs it so, rl/batch_spec declares it so).

Policy log-probs are taken at the sampler's temperature (log_softmax(logits / T)), as the
official OAPL code does. Master weights stay in model.config.param_dtype; the loss casts them
to model.config.dtype (e.g. bfloat16) so the forward and backward run in the compute dtype
while gradients and the optimizer state stay in the master dtype.
"""
import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from oapl_jax import objectives, parallel, sections
from oapl_jax.models import lora, prompt_groups
from oapl_jax.models.lora import LoraSettings
from oapl_jax.models.api import CausalLM
from oapl_jax.parallel import Layout
from oapl_jax.rl.optim import OptimConfig, make_optimizer, make_schedule

Batch = Mapping[str, jax.Array]
Params = Any  # a pytree of (sharded) arrays: a model's parameters, or LoRA adapters
StepFn = Callable[["TrainState", Batch, jax.Array], tuple["TrainState", dict[str, jax.Array]]]  # (state, batch, rng)


def _loss_settings(per_loss, path: str, problems: sections.Problems, section: Mapping[str, Any]):
  """The `trainer.loss_settings` field: {loss name: its settings}, of which the chosen loss's is built."""
  if not isinstance(per_loss, Mapping) and not hasattr(per_loss, "items"):
    problems.add(path, per_loss, "must be a mapping")
    return sections.MISSING
  per_loss = dict(per_loss.items())
  for name in sorted(set(per_loss) - set(objectives.LOSSES), key=str):
    problems.add(f"{path}.{name}", sections.MISSING, f"not a loss; known: {sorted(objectives.LOSSES)}")
  loss = section.get("loss", "oapl")
  if loss not in objectives.LOSSES:
    return sections.MISSING  # the loss field reports it
  return objectives.build_settings(loss, per_loss.get(loss), f"{path}.{loss}", problems)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The `trainer` section. In a config, loss_settings = {loss name: its settings}; only the chosen
  loss's entry is read (the others keep their defaults, so a sweep over `loss` needs no edits)."""
  loss: str = sections.rule("oapl", choices=tuple(objectives.LOSSES))  # the objective (objectives/<loss>.py)
  loss_settings: objectives.Settings = sections.rule(default_factory=objectives.OAPLSettings, convert=_loss_settings)
  optim: OptimConfig = OptimConfig()
  # LoRA adapters (rank > 0): only they are trained, held in the optimizer and checkpointed; the base is frozen
  lora: LoraSettings = LoraSettings()
  micro_batches: int = sections.rule(1, low=1)  # gradient accumulation: the batch is split along B into this many
  # an update whose norm exceeds this times the params' norm is a blow-up, skipped like a non-finite one
  # (lr 1e30 gives a finite update of ~1e30 per weight); 0 = off. Sane AdamW steps are ~1e-3 .. 1e-1 of it.
  max_update_ratio: float = sections.rule(1.0, low=0)
  # loop.demo_use='sft': the batch's demonstration slots (demo_slots [B,G]) add this x their token-mean NLL to the
  # loss and are left out of OAPL's V* and regression (the control for demonstrations in the buffer; the
  # assembler wraps the loss: objectives/demo_sft.py)
  demo_sft_weight: float = sections.rule(1.0, low=0)
  # each group's prompt run once in the forward and backward instead of G times (models/prompt_groups.py): fewer
  # positions where prompts are long against responses; needs model.attention 'reference' or 'blockwise'
  share_prompts: bool = False
  # share_prompts: the longest prompt's tokens (set from the task), the packed rows' prompt slots
  longest_prompt: int = sections.rule(0, low=0, internal=True)
  # the sampler's temperature (set from the sampler section); policy log-probs use logits / temperature
  temperature: float = sections.rule(1.0, low=0, low_open=True, internal=True)

  def __post_init__(self):
    sections.enforce(self)
    wanted = objectives.LOSSES[self.loss].settings_type
    if not isinstance(self.loss_settings, wanted):
      raise TypeError(f"TrainConfig.loss={self.loss!r} takes {wanted.__name__}, got {type(self.loss_settings).__name__}")
    if self.optim.schedule == "cosine" and self.optim.total_steps < 1:
      raise ValueError(f"trainer.optim.schedule='cosine': needs trainer.optim.total_steps >= 1 (it is "
                       f"{self.optim.total_steps})")

  @staticmethod
  def default_loss_settings() -> dict:
    """Every loss's default settings, as the config lists them (config_base)."""
    return {name: sections.to_mapping(spec.settings_type()) for name, spec in objectives.LOSSES.items()
            if name != "sft"}


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer updates applied so far
  params: Params  # what the optimizer trains: the model's params, or with LoRA the adapters
  opt_state: optax.OptState
  frozen: Optional[Params] = None  # with LoRA: the base params (not trained, not in step checkpoints); else None


def policy_params(config: "TrainConfig", model: CausalLM, params, frozen):
  """The model's full params: `params` themselves, or the frozen base with the LoRA adapters merged in."""
  return lora.merge(config.lora, model, frozen, params) if config.lora.enabled else params


def checkpointed(state: TrainState) -> TrainState:
  """What a step checkpoint holds: the state without the frozen base (a LoRA run saves that once)."""
  return state.replace(frozen=None)


# ------------------------------------------------------------------------------ shardings
def batch_sharding(layout: Layout, num_prompts: Optional[int] = None) -> NamedSharding:
  """How a batch arrives: its leading (prompt) axis over the logical 'batch' axes when they divide
  `num_prompts` (None: assume they do), else replicated (token ids are small; the step then spreads
  the B x G sequences over every device itself). A prefix for every batch array."""
  if num_prompts is not None and num_prompts % layout.axis_size("batch"):
    return layout.replicated
  return layout.sharding(P("batch"))


def state_shardings(config: TrainConfig, model: CausalLM, layout: Layout) -> TrainState:
  """TrainState of NamedShardings: params (or LoRA adapters) from their logical axes, optimizer moments alike."""
  full_sh = layout.sharding(model.param_logical_axes())
  abstract_params = jax.eval_shape(lambda: nn.unbox(model.init_params(jax.random.PRNGKey(0))))
  params_sh, frozen_sh = full_sh, None
  if config.lora.enabled:
    params_sh, frozen_sh = layout.sharding(lora.logical_axes(config.lora, model)), full_sh
    abstract_params = jax.eval_shape(
        lambda: lora.init_adapters(config.lora, model, abstract_params, jax.random.PRNGKey(0)))
  tx = make_optimizer(config.optim)
  replicated = layout.replicated
  opt_sh = optax.tree_map_params(tx, lambda _, sharding: sharding, jax.eval_shape(tx.init, abstract_params),
                                 params_sh, transform_non_params=lambda _: replicated)
  return TrainState(step=replicated, params=params_sh, opt_state=opt_sh, frozen=frozen_sh)


def create_train_state(config: TrainConfig, model: CausalLM, params, layout: Layout, rng=None) -> TrainState:
  """Step 0 state on `layout`; params cast to param_dtype. With LoRA they become the frozen base and fresh
  adapters (from `rng`; default PRNGKey(0)) are what the optimizer trains.

  `params` are copied device-to-device into the trainer's shardings and not donated (the caller
  may still hold them, e.g. as the sampler's snapshot).
  """
  shardings = state_shardings(config, model, layout)
  full_sh = shardings.frozen if config.lora.enabled else shardings.params
  params = parallel.reshard(params, full_sh)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  init = functools.partial(_init_state, config, model)
  return jax.jit(init, in_shardings=(full_sh, layout.replicated), out_shardings=shardings,
                 compiler_options=layout.compiler_options)(params, rng)


def _init_state(config: TrainConfig, model: CausalLM, params, rng) -> TrainState:
  params = jax.tree.map(lambda p: p.astype(model.config.jnp_param_dtype), params)
  trainable, frozen = params, None
  if config.lora.enabled:
    trainable, frozen = lora.init_adapters(config.lora, model, params, rng), params
  return TrainState(step=jnp.zeros((), jnp.int32), params=trainable,
                    opt_state=make_optimizer(config.optim).init(trainable), frozen=frozen)


def abstract_state(config: TrainConfig, model: CausalLM, layout: Layout) -> TrainState:
  """The step-0 state as jax.ShapeDtypeStructs with its shardings (an ahead-of-time compile's input)."""
  full = jax.eval_shape(lambda: nn.unbox(model.init_params(jax.random.PRNGKey(0))))
  shapes = jax.eval_shape(functools.partial(_init_state, config, model), full, jax.random.PRNGKey(0))
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                      state_shardings(config, model, layout))


def make_policy_params(config: TrainConfig, model: CausalLM, layout: Layout):
  """state -> the model's full params on the trainer's devices (LoRA: merged, a new tree; else state.params)."""
  if not config.lora.enabled:
    return lambda state: state.params
  full_sh = layout.sharding(model.param_logical_axes())
  merged = jax.jit(functools.partial(policy_params, config, model), out_shardings=full_sh,
                   compiler_options=layout.compiler_options)
  return lambda state: merged(state.params, state.frozen)


# ------------------------------------------------------------------------------ loss
def _policy_logp(config: TrainConfig, model: CausalLM, params, batch: Batch, with_entropy: bool, lora=None):
  """Policy per-token log-probs [B,G,T] (and entropies) at the sampler's temperature; `lora`: scaled adapters
  the model applies in-layer on top of `params` (the frozen base)."""
  params, lora = jax.tree.map(lambda p: p.astype(model.config.jnp_dtype), (params, lora))  # master -> compute dtype
  if config.share_prompts:
    return _shared_prompt_logp(config, model, params, batch, with_entropy, lora)
  B, G, T = batch["tokens"].shape
  # Sequences, not prompts, over the data axes: a micro-batch of one prompt x G samples still
  # spreads over G devices. Per-prompt quantities (V*) are computed after the reshape back.
  flat = lambda x: parallel.constrain_where_divisible(x.reshape(B * G, T), ("batch", None))  # noqa: E731
  # Only response positions are read (the losses and metrics all mask by response_mask): prompts and
  # padding skip the vocabulary projection.
  out = model.token_logprobs(params, flat(batch["tokens"]), flat(batch["targets"]), flat(batch["positions"]),
                             temperature=config.temperature, with_entropy=with_entropy,
                             needed_BxT=flat(batch["response_mask"]) > 0, **({} if lora is None else {"lora": lora}))
  return jax.tree.map(lambda x: x.reshape(B, G, T), out)


def _check_share_prompts(config: TrainConfig, model: CausalLM, layout: Layout) -> None:
  """trainer.share_prompts' needs, refused where the step is made (before any batch): the longest prompt, an
  attention kernel that reads positions."""
  if not config.share_prompts:
    return
  if config.longest_prompt < 1:
    raise ValueError("trainer.share_prompts: the longest prompt is unknown (TrainConfig.longest_prompt is set from "
                     "the task: run/assemble.train_config)")
  prompt_groups.require_position_kernel(model.config.attention, layout.platform)


def _shared_prompt_logp(config: TrainConfig, model: CausalLM, params, batch: Batch, with_entropy: bool, lora):
  """_policy_logp with each group packed into one row, its prompt run once (models/prompt_groups.py)."""
  B, G, T = batch["tokens"].shape
  groups = prompt_groups.PromptGroups.for_batch(config.longest_prompt, G, T)
  start_B = prompt_groups.first_response_position(groups, batch["response_mask"])
  packed = prompt_groups.pack(groups, start_B, batch["tokens"], batch["targets"], batch["response_mask"],
                              batch["positions"])
  tokens, targets, positions, keys, needed = (parallel.constrain_where_divisible(x, ("batch", None)) for x in packed)
  out = model.token_logprobs(params, tokens, targets, positions, temperature=config.temperature,
                             with_entropy=with_entropy, needed_BxT=needed, key_mask_BxT=keys, prompt_groups=groups,
                             **({} if lora is None else {"lora": lora}))
  return jax.tree.map(lambda x_BxL: prompt_groups.unpack(groups, start_B, x_BxL, T), out)


def _loss_and_sums(config: TrainConfig, model: CausalLM, params, batch: Batch, lora=None,
                   loss_fn: Optional[objectives.BoundLoss] = None):
  """(loss, (loss metrics, additive token/sequence sums)) for one (micro-)batch; `loss_fn` as make_train_step's."""
  logp_BxGxT, entropy_BxGxT = _policy_logp(config, model, params, batch, with_entropy=True, lora=lora)
  loss_fn = loss_fn or functools.partial(objectives.compute_loss, config.loss)
  loss, loss_metrics = loss_fn(logp_BxGxT, batch, config.loss_settings)

  mask_BxGxT = batch["response_mask"].astype(bool)
  diff_BxGxT = jnp.where(mask_BxGxT, jax.lax.stop_gradient(logp_BxGxT)
                         - batch["sampler_token_logp"].astype(jnp.float32), 0.0)
  seq_diff_BxG = jnp.sum(diff_BxGxT, axis=-1)
  has_tokens_BxG = jnp.any(mask_BxGxT, axis=-1)
  sums = {
      "tokens": jnp.sum(mask_BxGxT, dtype=jnp.float32),
      "sequences": jnp.sum(has_tokens_BxG, dtype=jnp.float32),
      "entropy": jnp.sum(jnp.where(mask_BxGxT, jax.lax.stop_gradient(entropy_BxGxT), 0.0)),
      "token_log_ratio": jnp.sum(diff_BxGxT),
      "token_log_ratio_abs": jnp.sum(jnp.abs(diff_BxGxT)),
      "seq_log_ratio": jnp.sum(jnp.where(has_tokens_BxG, seq_diff_BxG, 0.0)),
      "seq_log_ratio_abs": jnp.sum(jnp.where(has_tokens_BxG, jnp.abs(seq_diff_BxG), 0.0)),
  }
  return loss, (loss_metrics, sums)


def _finish_metrics(loss, loss_metrics, sums) -> dict[str, jax.Array]:
  per_token = lambda name: sums[name] / jnp.maximum(sums["tokens"], 1.0)  # noqa: E731
  per_seq = lambda name: sums[name] / jnp.maximum(sums["sequences"], 1.0)  # noqa: E731
  return {
      "loss": loss, **loss_metrics, "tokens": sums["tokens"], "entropy": per_token("entropy"),
      "token_log_ratio_mean": per_token("token_log_ratio"),
      "token_log_ratio_abs_mean": per_token("token_log_ratio_abs"),
      "seq_log_ratio_mean": per_seq("seq_log_ratio"), "seq_log_ratio_abs_mean": per_seq("seq_log_ratio_abs"),
  }


# ------------------------------------------------------------------------------ micro-batches
def _split(batch: Batch, micro_batches: int) -> Batch:
  """[B, ...] -> [M, B/M, ...], micro-batch m = rows m, m+M, m+2M, ...

  Strided, so with B sharded in contiguous blocks every micro-batch stays spread over all batch
  shards (the reshape moves no data). A micro-batch with fewer prompts than shards is left to
  `_policy_logp`, which spreads its sequences.
  """
  B = batch["tokens"].shape[0]
  if B % micro_batches:
    raise ValueError(f"batch of {B} prompts does not split into micro_batches={micro_batches}")
  return jax.tree.map(lambda x: parallel.constrain_where_divisible(
      x.reshape(B // micro_batches, micro_batches, *x.shape[1:]).swapaxes(0, 1), (None, "batch")), batch)


def _merge(x_MxBm):
  """Inverse of `_split` for one array: [M, B/M, ...] -> [B, ...]."""
  return x_MxBm.swapaxes(0, 1).reshape(-1, *x_MxBm.shape[2:])


def _grads_and_metrics(grad_fn, params, batch: Batch, micro_batches: int):
  """Gradient of the mean micro-batch loss; equal to one big batch for losses that are means over
  prompts (OAPL: V* is per prompt and a micro-batch holds whole groups)."""
  if micro_batches == 1:
    (loss, (loss_metrics, sums)), grads = grad_fn(params, batch)
    return grads, _finish_metrics(loss, loss_metrics, sums)
  mbs = _split(batch, micro_batches)

  def body(acc, mb):
    (loss, aux), grads = grad_fn(params, mb)
    return jax.tree.map(jnp.add, acc, (grads, loss, aux)), None

  first_mb = jax.tree.map(lambda x: x[0], mbs)
  abstract = jax.eval_shape(lambda p, mb: (lambda out: (out[1], *out[0]))(grad_fn(p, mb)), params, first_mb)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract)
  (grads, loss, (loss_metrics, sums)), _ = jax.lax.scan(body, zeros, mbs)
  mean = lambda tree: jax.tree.map(lambda x: x / micro_batches, tree)  # noqa: E731
  return mean(grads), _finish_metrics(mean(loss), mean(loss_metrics), sums)


# ------------------------------------------------------------------------------ jitted entry points
def make_train_step(config: TrainConfig, model: CausalLM, layout: Layout, num_prompts: Optional[int] = None,
                    loss_fn: Optional[objectives.BoundLoss] = None):
  """The train step, jitted once with explicit shardings; the state argument is donated. `loss_fn`: the loss as
  (policy_token_logp_BxGxT, batch, config.loss_settings) -> (loss, metrics); default config.loss's
  (objectives.compute_loss). The assembler wraps it for loop.demo_use='sft' (objectives/demo_sft.py).

  A step whose loss, gradients or updated parameters are not all finite, or whose update norm exceeds
  config.max_update_ratio times the params' norm (a finite blow-up), leaves params and optimizer state as
  they were (update_skipped = 1): a diverged update never reaches the state, so no checkpoint can hold
  it. The step counter still advances.

  Metrics (replicated scalars): loss and the loss's own metrics, grad_norm (before clipping),
  update_norm and param_norm (before the update), learning_rate (used for this update), update_skipped, tokens (response tokens), entropy (mean per
  response token), token_/seq_log_ratio_[abs_]mean (policy - sampler log-probs over response tokens /
  sequences). Losses' own metrics are means over micro-batches; the rest are exact.
  """
  _check_share_prompts(config, model, layout)
  tx = make_optimizer(config.optim)
  schedule = make_schedule(config.optim)
  state_sh = state_shardings(config, model, layout)
  def loss_of(trainable, frozen, batch: Batch):
    if config.lora.enabled:  # in-layer x·A·B on the frozen base (the sampler gets the merged weights)
      return _loss_and_sums(config, model, frozen, batch, lora=lora.scaled(config.lora, trainable), loss_fn=loss_fn)
    return _loss_and_sums(config, model, trainable, batch, loss_fn=loss_fn)
  grad_fn = jax.value_and_grad(loss_of, has_aux=True)

  def train_step(state: TrainState, batch: Batch, rng: jax.Array):
    del rng  # the losses are deterministic; kept so every step has the same signature
    with layout.context():
      grads, metrics = _grads_and_metrics(lambda p, mb: grad_fn(p, state.frozen, mb), state.params, batch,
                                          config.micro_batches)
    def updated():  # (params, opt_state) after this step's update
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
      return optax.apply_updates(state.params, updates), opt_state, updates

    # The checks read the update through one reduction, its norm; the cond computes it again and writes params and
    # moments in one pass. Selecting between kept new and old trees instead costs a pass more and twice the
    # temporaries (at Qwen3-0.6B width on CPU: 1.86 vs 1.40 s, 3.3 vs 1.5 GiB for this part of the step). Finite
    # norms stand for finite trees: a NaN or inf entry makes its tree's sum of squares NaN or inf, and a finite sum
    # bounds every entry by sqrt(float max), so finite old params plus a finite update are finite new params. (A
    # tree whose sum of squares overflows counts as non-finite: a blow-up either way.)
    update_norm = optax.tree.norm(updated()[2])
    grad_norm, param_norm = optax.tree.norm(grads), optax.tree.norm(state.params)
    finite = jnp.all(jnp.isfinite(jnp.stack([x.astype(jnp.float32)
                                             for x in (metrics["loss"], grad_norm, update_norm, param_norm)])))
    if config.max_update_ratio > 0:
      finite &= update_norm <= config.max_update_ratio * param_norm
    params, opt_state = jax.lax.cond(finite, lambda: updated()[:2], lambda: (state.params, state.opt_state))
    metrics.update(grad_norm=grad_norm, update_norm=update_norm, param_norm=param_norm,
                   learning_rate=schedule(state.step), update_skipped=1.0 - finite.astype(jnp.float32))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state, frozen=state.frozen), metrics

  replicated = layout.replicated
  return jax.jit(train_step, in_shardings=(state_sh, batch_sharding(layout, num_prompts), replicated),
                 out_shardings=(state_sh, replicated), donate_argnums=0, compiler_options=layout.compiler_options)


def make_score_fn(config: TrainConfig, model: CausalLM, layout: Layout, num_prompts: Optional[int] = None):
  """score_logprobs(params, batch) -> policy per-token log-probs [B,G,T], 0 off the response.

  Same temperature, compute dtype and micro-batching as the train step (for evaluation and for
  GRPO's old_policy_token_logp).
  """
  _check_share_prompts(config, model, layout)

  def score_logprobs(params, batch: Batch):
    logp = functools.partial(_policy_logp, config, model, params, with_entropy=False)
    with layout.context():
      if config.micro_batches == 1:
        logp_BxGxT = logp(batch)
      else:
        logp_BxGxT = _merge(jax.lax.map(logp, _split(batch, config.micro_batches)))
    return jnp.where(batch["response_mask"].astype(bool), logp_BxGxT, 0.0)

  params_sh = layout.sharding(model.param_logical_axes())  # the full params (LoRA: merged)
  batch_sh = batch_sharding(layout, num_prompts)
  return jax.jit(score_logprobs, in_shardings=(params_sh, batch_sh), out_shardings=batch_sh,
                 compiler_options=layout.compiler_options)
