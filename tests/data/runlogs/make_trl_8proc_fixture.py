"""Write ``tests/data/runlogs/trl_tiny_8proc/``: ``trl_tiny/`` as an 8-process run logs it.

Run from the repository root: ``PYTHONPATH=$PWD python tests/data/runlogs/make_trl_8proc_fixture.py``
(needs torch, transformers and trl to load and re-save ``training_args.bin``).

What TRL 1.16 does with N processes, and so what changes (``trl/trainer/grpo_config.py``
``GRPOConfig.__post_init__``; ``trl/trainer/grpo_trainer.py`` ``_generate_and_score_completions``):

* ``generation_batch_size = per_device_train_batch_size × num_processes × steps_per_generation``
  (6 × 8 × 1 = 48), saved with the config; accelerate's ``PartialState`` (pickled as the
  config's ``distributed_state``) has ``num_processes = 8``;
* each process generates its 6 rows, then ``accelerator.gather`` collects the prompt and
  completion lengths of all 48: ``num_tokens`` (``state.num_input_tokens_seen`` += the sum
  of the gathered prompt + completion lengths) is 8 × the single process's when every
  process draws the same prompts and completions (the replica case this fixture stands for),
  while ``completions/mean_length``, ``min_length``, ``max_length`` over 8 identical copies
  are unchanged;
* ``trainer_state.json`` ``train_batch_size`` is the per-device batch (unchanged).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

HERE = Path(__file__).parent
SRC, OUT = HERE / "trl_tiny", HERE / "trl_tiny_8proc"
N = 8


def main() -> None:
    import torch

    OUT.mkdir(exist_ok=True)
    shutil.copy(SRC / "adapter_config.json", OUT / "adapter_config.json")
    state = json.loads((SRC / "trainer_state.json").read_text())
    for rec in state["log_history"]:
        if "num_tokens" in rec:
            rec["num_tokens"] = rec["num_tokens"] * N
    state["num_input_tokens_seen"] *= N
    (OUT / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    args = torch.load(SRC / "training_args.bin", weights_only=False)
    args.generation_batch_size = args.per_device_train_batch_size * N * args.steps_per_generation
    ds = args.__dict__["distributed_state"]
    ds.__dict__.update(num_processes=N, distributed_type="MULTI_CPU")
    torch.save(args, OUT / "training_args.bin")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
