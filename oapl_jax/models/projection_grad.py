"""The projections' dot_general, with the kernel gradient contracted straight into the kernel's axis order.

    y = dot_general(x_BxTxE, w_ExF, (((2,), (0,)), ((), ())))   # what nn.DenseGeneral calls (its `dot_general`)

Values and gradients are lax.dot_general's. Autodiff forms a kernel's gradient as the transpose of
dot_general(g, x) ([F, E], then transposed to [E, F]). XLA:CPU's matmul takes its left operand untransposed, and
inside the layer scan's backward it then writes each projection's output cotangent transposed (the MLP's
[tokens, 3072] twice per layer): at Qwen3-0.6B width (4 layers, 2 x 4 x 256 tokens) the step's transposing copies
took 2.31 s, 1.03 s with this rule. Here dW = dot_general(x, g) contracts the token axes into [E, F] directly and
dx = dot_general(g, w) comes out in x's order, so XLA transposes the layer input instead, once for every
projection reading it (q, k, v; gate, up). Only the dense layout (no batch dims; x's contracted axes last, the
kernel's first, in order) takes this rule; any other call is lax.dot_general itself.

A bfloat16 / float16 dense projection (forward) runs as `low_precision_dot`: float32 accumulation, one rounding
to the operands' dtype. See there; float32 projections are untouched.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax

_LOW_PRECISION = (jnp.bfloat16, jnp.float16)


def low_precision_dot(x, w, dimension_numbers, precision=None):
  """lax.dot_general(x, w) in x's dtype; a bfloat16 / float16 pair accumulates in float32 and rounds once.

  XLA:CPU has no bf16 -> bf16 matmul: its float normalization rewrites one as an f32 dot on converted operands,
  and inside the sampler's decode loop the convert of each (loop-invariant) weight is hoisted out of the loop, so
  every step reads float32 copies of the weights (the float32 model's bytes) and each decode call first converts
  them all. XLA:CPU hands a bf16 x bf16 -> f32 dot to YNNPACK on the bf16 operands, unless one side is a single
  row (m or n = 1: its own matrix-vector emitter, which upcasts as before): the batch-16 bf16 decode at Qwen3-0.6B
  width ran 2.07x faster, batch 1 is unchanged (benchmarks/bf16_decode_ab.py). TPU and GPU accumulate bf16 dots in
  float32 either way. Any other dtype: lax.dot_general as is.
  """
  if x.dtype == w.dtype and x.dtype in _LOW_PRECISION:
    return lax.dot_general(x, w, dimension_numbers, precision=precision,
                           preferred_element_type=jnp.float32).astype(x.dtype)
  return lax.dot_general(x, w, dimension_numbers, precision=precision)


def dot_general(x, w, dimension_numbers, precision=None, preferred_element_type=None):
  """lax.dot_general's signature and result; the dense layout differentiates by _dense_dot_bwd."""
  (x_contract, w_contract), (x_batch, w_batch) = dimension_numbers
  n = len(x_contract)
  dense_layout = (not x_batch and not w_batch and tuple(w_contract) == tuple(range(n))
                  and tuple(x_contract) == tuple(range(x.ndim - n, x.ndim)))
  if not dense_layout or preferred_element_type is not None:
    return lax.dot_general(x, w, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)
  return _dense_dot(n, precision, x, w)


def _contract(n, precision, x, w):
  """x [tokens..., K...] . w [K..., F...] over the n axes K."""
  return low_precision_dot(x, w, ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ())), precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _dense_dot(n, precision, x, w):
  return _contract(n, precision, x, w)


def _dense_dot_fwd(n, precision, x, w):
  return _contract(n, precision, x, w), (x, w)


def _dense_dot_bwd(n, precision, residuals, g):
  x, w = residuals
  tokens = x.ndim - n
  g_features, w_features = tuple(range(tokens, g.ndim)), tuple(range(n, w.ndim))
  dx = lax.dot_general(g, w, ((g_features, w_features), ((), ())), precision=precision)  # [tokens..., K...]
  dw = lax.dot_general(x, g, ((tuple(range(tokens)),) * 2, ((), ())), precision=precision)  # [K..., F...]
  return dx.astype(x.dtype), dw.astype(w.dtype)


_dense_dot.defvjp(_dense_dot_fwd, _dense_dot_bwd)
