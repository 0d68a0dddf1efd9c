"""models/projection_grad.dot_general: lax.dot_general's values and gradients (autodiff of lax.dot_general is the
reference) for every projection layout the model uses, and in a scanned backward on CPU fewer transposed copies
than autodiff's rule (the control), the reason it exists."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from oapl_jax.models import projection_grad

# (x shape, w shape, dimension numbers): the model's q/k/v (features split into heads), gate/up/down, o_proj (two
# contracted axes), then layouts the rule leaves to lax (a batch dim; contracted axes not trailing / leading).
DENSE = [((2, 5, 16), (16, 24), (((2,), (0,)), ((), ()))),
         ((2, 5, 16), (16, 3, 8), (((2,), (0,)), ((), ()))),
         ((2, 5, 3, 8), (3, 8, 16), (((2, 3), (0, 1)), ((), ())))]
OTHER = [((4, 5, 16), (4, 16, 24), (((2,), (1,)), ((0,), (0,)))),
         ((16, 5), (16, 24), (((0,), (0,)), ((), ())))]


def _value_and_grads(dot, x, w, dims, g):
  y, vjp = jax.vjp(lambda a, b: dot(a, b, dims), x, w)
  return (y, *vjp(g))


@pytest.mark.parametrize("x_shape, w_shape, dims", DENSE + OTHER)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values_and_gradients_are_lax_dot_generals(x_shape, w_shape, dims, dtype):
  kx, kw, kg = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, x_shape).astype(dtype)
  w = jax.random.normal(kw, w_shape).astype(dtype)
  g = jax.random.normal(kg, jax.eval_shape(lambda: lax.dot_general(x, w, dims)).shape).astype(dtype)
  got = _value_and_grads(projection_grad.dot_general, x, w, dims, g)
  want = _value_and_grads(lax.dot_general, x, w, dims, g)
  tol = 1e-6 if dtype == jnp.float32 else 1e-2
  for a, b in zip(got, want):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("x_shape, w_shape, dims", OTHER)
def test_other_layouts_are_lax_dot_general_itself(x_shape, w_shape, dims):
  x, w = jnp.ones(x_shape), jnp.ones(w_shape)
  jaxpr = str(jax.make_jaxpr(lambda a, b: projection_grad.dot_general(a, b, dims))(x, w))
  assert "custom_vjp" not in jaxpr and "dot_general" in jaxpr


def _scanned_mlp_backward_hlo(dot_general) -> str:
  """The compiled backward of two scanned gated-MLP layers (tokens N=40, width E=16, hidden F=48)."""

  class Layer(nn.Module):
    @nn.compact
    def __call__(self, h, _):
      dense = lambda n, name: nn.DenseGeneral(n, use_bias=False, dot_general=dot_general, name=name)  # noqa: E731
      return h + dense(16, "down")(nn.silu(dense(48, "gate")(h)) * dense(48, "up")(h)), None

  stack = nn.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
  x = jax.random.normal(jax.random.PRNGKey(0), (5, 8, 16))
  params = stack().init(jax.random.PRNGKey(1), x, None)
  grad = jax.jit(jax.grad(lambda p, x: jnp.sum(jnp.sin(stack().apply(p, x, None)[0]))))
  return grad.lower(params, x).compile().as_text()


def _copied_elements(hlo: str) -> int:
  """Elements written by the copy fusions (XLA:CPU's transposes) of a compiled program."""
  shapes = re.findall(r"%copy[\w.-]* = f32\[(\d+),(\d+)\]", hlo)
  return sum(int(a) * int(b) for a, b in shapes)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's layout choice")
def test_scanned_backward_transposes_each_layer_input_once_and_no_cotangent():
  """XLA:CPU's matmul takes its left operand untransposed, so a kernel gradient x^T g transposes one side. With
  autodiff's rule it is the cotangent, once per kernel: gate's and up's [N, F] and down's [N, E], 40 x (48 + 48 +
  16) elements (the control). Ours transposes the layer inputs instead, each once whatever reads it (x for gate
  and up, h for down): 40 x (16 + 48)."""
  autodiff = _copied_elements(_scanned_mlp_backward_hlo(None))
  ours = _copied_elements(_scanned_mlp_backward_hlo(projection_grad.dot_general))
  assert autodiff == 40 * (48 + 48 + 16)
  assert ours == 40 * (16 + 48)
