"""Hugging Face Hub access with its failures as one-line `PrepareError`s (an unreachable hub names the
offline alternatives)."""
from __future__ import annotations

import contextlib

from huggingface_hub import constants, errors


class PrepareError(Exception):
  """A model or data set that cannot be prepared; the message says why and what to do."""


def _unreachable(repo_id: str, repo_type: str) -> str:
  kind, local = ("", "a local checkpoint directory as the source") if repo_type == "model" else \
      (f" --repo-type {repo_type}", "--source PATH (the published files, on this host)")
  why = "HF_HUB_OFFLINE is set" if constants.is_offline_mode() else \
      f"cannot reach the Hugging Face Hub ({constants.ENDPOINT})"
  return (f"{why} and {repo_id} is not in the local cache "
          f"({constants.HF_HUB_CACHE}); offline, pass {local} instead, or set HF_HUB_OFFLINE=1 "
          f"with a cache that holds it, or on a machine with network run `hf download {repo_id}{kind} --local-dir DIR` "
          f"(`huggingface-cli download` in older versions) and copy DIR here")


def _offline_errors() -> tuple:
  import httpx2  # pylint: disable=import-outside-toplevel  (huggingface_hub's HTTP client)
  return (ConnectionError, errors.LocalEntryNotFoundError, httpx2.TransportError)


@contextlib.contextmanager
def errors_explained(repo_id: str, revision: str | None = None, repo_type: str = "model"):
  """Turns the hub's exceptions raised inside the block into PrepareErrors with one line each."""
  try:
    yield
  except errors.GatedRepoError:
    raise PrepareError(f"{repo_id} is gated: accept its terms on the hub, then `hf auth login` (or set HF_TOKEN)") \
        from None
  except errors.RepositoryNotFoundError:
    raise PrepareError(f"no {repo_type} repository {repo_id!r} on the hub (or it is private: set HF_TOKEN)") from None
  except errors.RevisionNotFoundError:
    raise PrepareError(f"{repo_id} has no revision {revision!r}") from None
  except _offline_errors():
    raise PrepareError(_unreachable(repo_id, repo_type)) from None
  except errors.HfHubHTTPError as e:
    raise PrepareError(f"the hub refused {repo_id}: {str(e).splitlines()[0]}") from None
