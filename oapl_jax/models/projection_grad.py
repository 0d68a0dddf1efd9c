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
"""
import functools

import jax
from jax import lax


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
  return lax.dot_general(x, w, ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))), ((), ())), precision=precision)


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
