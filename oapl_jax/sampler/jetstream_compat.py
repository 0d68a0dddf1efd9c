"""The one place that patches JAX for JetStream. Import this before `jetstream.core`.

google-jetstream 0.2.2's orchestrator (jetstream/core/orchestrator.py, `delete_pytree`) calls
`jax.tree_map`, which JAX deprecated in 0.4.26 and removed in 0.6. Without it the orchestrator's
generate thread dies on the first insert (and its JetThread then SIGKILLs the process). We install
the exact replacement, `jax.tree.map`, and only when the attribute is missing.
"""
import jax


def install() -> None:
  if not hasattr(jax, "tree_map"):
    jax.tree_map = jax.tree.map


install()
