"""`python -m oapl_jax.main` = oapl-train (oapl_jax/apps/train.py), the README's and the launch scripts' command."""
from oapl_jax.apps.train import run

if __name__ == "__main__":
  run()
