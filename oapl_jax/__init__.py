"""oapl_jax: off-policy RL of LLMs with OAPL, in JAX/Flax."""
