"""benchmarks/tunix_bench and tunix_worker: the pure pieces; the Tunix side's weights only where its venv exists."""
import os

import numpy as np
import pytest

from benchmarks import tunix_bench, tunix_worker


def test_pair_summary_takes_medians_and_the_median_of_pair_ratios():
  s = tunix_bench.pair_summary([10.0, 30.0, 20.0], [5.0, 10.0, 40.0], higher_is_better=True)
  assert (s["ours"], s["tunix"], s["pairs"]) == (20.0, 10.0, 3)
  assert s["ratio"] == 2.0  # pair ratios 2, 3, 0.5
  t = tunix_bench.pair_summary([2.0, 4.0], [3.0, 4.0], higher_is_better=False)  # times: theirs over ours
  assert t["ratio"] == pytest.approx(1.25)


def test_markdown_table_rounds_rates_to_tokens_and_times_to_hundredths():
  rows = [("sampling, batch 1", "tokens/s", {"ours": 1234.4, "tunix": 600.2, "ratio": 2.0567, "pairs": 5}, 0.0312,
           0.015),
          ("train step", "s/step", {"ours": 12.345, "tunix": 20.0, "ratio": 1.62, "pairs": 3}, None, None)]
  assert tunix_bench.markdown_table(rows).splitlines() == [
      "| row | ours | Tunix | ours ahead by | ours % ceil | Tunix % ceil | pairs |",
      "|---|---:|---:|---:|---:|---:|---:|",
      "| sampling, batch 1 (tokens/s) | 1234 | 600 | 2.06x | 3.1% | 1.5% | 5 |",
      "| train step (s/step) | 12.35 | 20.00 | 1.62x |  |  | 3 |"]


def test_grpo_batch_as_our_rows_predicts_each_completion_token_once():
  data = tunix_bench.grpo_batch(2, 3, 24, vocab=50, prompt_len=5, seed=3)
  assert data["prompt_ids"].shape == (6, 5) and data["completion_ids"].shape == (6, 19)
  assert data["prompt_ids"].min() >= 1  # 0 is Tunix's pad
  data["old_logp"] = np.where(data["completion_mask"], np.arange(19.0) + 1, 0.0).astype(np.float32)
  ours = tunix_worker.ours_train_batch(data)
  assert ours["tokens"].shape == (2, 3, 24) and ours["rewards"].shape == (2, 3)
  mask = ours["response_mask"].astype(bool).reshape(6, 24)
  completion = data["completion_mask"].astype(bool)
  for n in range(6):  # the targets under our mask are the completion's tokens, in order, with their old log-probs
    assert ours["targets"].reshape(6, 24)[n][mask[n]].tolist() == data["completion_ids"][n][completion[n]].tolist()
    assert ours["old_policy_token_logp"].reshape(6, 24)[n][mask[n]].tolist() == list(range(1, completion[n].sum() + 1))
  np.testing.assert_array_equal(ours["sampler_token_logp"], ours["old_policy_token_logp"])  # our TIS weight 1


@pytest.mark.skipif(not os.path.exists(os.path.join(tunix_bench.TUNIX_VENV, "bin", "python")),
                    reason="no Tunix venv (python -m benchmarks.tunix_bench --setup)")
def test_tunix_loads_the_checkpoint_to_the_log_probs_transformers_computes(tmp_path):
  import torch
  from benchmarks import sampler_bench
  model = sampler_bench.make_checkpoint(str(tmp_path / "ckpt"), hf_config=tunix_bench.hf_config("tiny", 2))
  data = tunix_bench.grpo_batch(1, 2, 24, vocab=model.config.vocab_size, prompt_len=6)
  np.savez(tmp_path / "b.npz", **data)
  seq = torch.tensor(np.concatenate([data["prompt_ids"], data["completion_ids"]], 1), dtype=torch.long)
  with torch.no_grad():
    logp = torch.log_softmax(model(input_ids=seq).logits, -1)[:, 5:-1].gather(-1, seq[:, 6:, None])[..., 0].numpy()
  tunix = tunix_bench.run_logps(tunix_bench.tunix_python(setup=False), "tunix", str(tmp_path / "ckpt"),
                                str(tmp_path / "b.npz"))
  mask = data["completion_mask"].astype(bool)
  np.testing.assert_allclose(tunix[mask], logp[mask], atol=2e-5)
