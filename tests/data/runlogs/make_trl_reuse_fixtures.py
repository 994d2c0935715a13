"""Write ``tests/data/runlogs/trl_reuse_aligned/`` and ``trl_reuse_misaligned/``: output
folders of real (tiny) TRL GRPO runs whose rollout batches are reused across micro-steps.

Run from the repository root: ``PYTHONPATH=$PWD:tests python tests/data/runlogs/make_trl_reuse_fixtures.py``
(about two minutes on 2 CPU cores). The run of ``make_trl_fixture.py`` (``run_tiny_grpo``: the
tiny Qwen2 of ``tests/flop_utils.py``, LoRA r=4 all-linear, G=3, β=0.04, gradient
checkpointing, 4 optimizer steps, ``FlopCounterMode`` over the whole run), with 3 rows per
micro-step, non-default batch reuse and prompts all of one length (6 characters: no left
padding, so the account can be exact):

* ``trl_reuse_aligned``: ``gradient_accumulation_steps=4``, ``steps_per_generation=2``,
  ``num_iterations=2``: a rollout batch is generated every 2 × 2 = 4 micro-steps, at the start
  of each optimizer step, and used twice (two passes) before the weights change. TRL 1.16
  (``grpo_trainer.py``, ``_generate_and_score_completions``: ``generate_every =
  steps_per_generation * num_iterations``; the old-policy pass runs when
  ``gradient_accumulation_steps % generate_every != 0``) skips the old-policy log-prob pass.
* ``trl_reuse_misaligned``: ``gradient_accumulation_steps=3``, ``steps_per_generation=2``,
  ``num_iterations=1``: a batch every 2 micro-steps, an optimizer step every 3, so a batch
  can straddle a weight update; 3 % 2 != 0 and TRL runs the old-policy pass, though each batch
  is used once.

Each folder keeps ``trainer_state.json``, ``training_args.bin`` and ``adapter_config.json``
of the last checkpoint, the checkpoint's ``rng_state.pth`` name (an empty file: transformers
writes ``rng_state.pth`` for one process, ``rng_state_<rank>.pth`` for several), the base
model's ``config.json`` under ``base/``, and ``measured.json``: the FLOPs ``FlopCounterMode``
counted over the whole run, the no-grad log-prob passes TRL ran (calls of
``_get_per_token_logps_and_entropies`` under ``torch.no_grad``: the reference pass of every
batch, β > 0, plus the old-policy pass where TRL runs it) and the completion lengths of each
rollout batch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from make_trl_fixture import run_tiny_grpo

HERE = Path(__file__).parent
PROMPTS = ["11+22=", "30-12=", "7*8=?=", "99-9=?", "12+30=", "45+45=", "81/9=?", "64-32="]
CASES = {
    "trl_reuse_aligned": dict(gradient_accumulation_steps=4, steps_per_generation=2, num_iterations=2),
    "trl_reuse_misaligned": dict(gradient_accumulation_steps=3, steps_per_generation=2, num_iterations=1),
}


def run(name: str, reuse: dict) -> None:
    r = run_tiny_grpo(PROMPTS * 8, per_device_train_batch_size=3, **reuse)
    out = HERE / name
    if out.exists():
        shutil.rmtree(out)
    (out / "base").mkdir(parents=True)
    (out / "checkpoint-4").mkdir()
    for f in ("trainer_state.json", "training_args.bin", "adapter_config.json"):
        shutil.copy(r["checkpoint"] / f, out / f)
    assert (r["checkpoint"] / "rng_state.pth").is_file()
    (out / "checkpoint-4" / "rng_state.pth").write_bytes(b"")
    r["model"].config.to_json_file(out / "base" / "config.json")
    (out / "measured.json").write_text(json.dumps(
        {"flop_counter_mode_total_flops": r["flops"], "no_grad_logprob_calls": r["no_grad_logprob_calls"],
         "batches": r["batches"], "settings": reuse}, indent=1) + "\n")
    print("wrote", out, "measured", r["flops"], "no-grad log-prob calls", r["no_grad_logprob_calls"])


def main() -> None:
    for name, reuse in CASES.items():
        run(name, reuse)


if __name__ == "__main__":
    main()
