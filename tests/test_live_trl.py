"""The live callback in a real TRL 1.16 ``GRPOTrainer`` run on the tiny world (CPU): what it logs
at each step reaches a real reporter (MLflow), and its totals equal ``allocopt account
--from-trl`` on the run's folder and, within 1 %, what ``FlopCounterMode`` counted in the run."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="TRL is not installed (the live callback needs a GRPOTrainer)")
pytest.importorskip("peft", reason="peft is not installed")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))


def test_callback_module_loads_no_torch():
    code = ("import sys, allocopt.runlogs.live as m; assert callable(m.attach); "
            "print([x for x in ('torch', 'transformers', 'trl') if x in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


@pytest.mark.slow
def test_live_callback_in_a_real_trl_run(tmp_path, monkeypatch):
    import mlflow
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from allocopt.runlogs import import_trl
    from allocopt.runlogs.live import ACCOUNT_FILE, attach
    from flop_utils import FlopMeter
    from objectives.tiny.objective import TinyObjective, TinySettings
    from objectives.tiny.tasks import make_split

    torch.set_num_threads(1)
    torch.manual_seed(0)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "live")
    world = TinyObjective(TinySettings.from_flat(eval_problems=10, lora_rank=4))
    tok = world._tokenizer()
    policy = str(world.world().policy)
    model = AutoModelForCausalLM.from_pretrained(policy)
    # prompts of one length: TRL pads prompts to the longest of a batch and logs no prompt
    # maximum, so equal prompts keep the import's prompt padding exact
    problems = make_split("train", 400, 0)
    length = Counter(len(tok(p.prompt).input_ids) for p in problems).most_common(1)[0][0]
    rows = [{"prompt": p.prompt, "answer": p.answer} for p in problems
            if len(tok(p.prompt).input_ids) == length][:40]
    reward = world.reward("sparse")
    reward.__name__ = "sparse"
    steps = 4
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False,
                      report_to=["mlflow"], max_steps=steps, num_iterations=1, beta=0.04,
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=64,
                      gradient_checkpointing=False, learning_rate=1e-3, logging_steps=1,
                      save_strategy="steps", save_steps=steps, seed=0, disable_tqdm=True,
                      dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok,
                              peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                     lora_dropout=0.0, task_type="CAUSAL_LM"))
        cb = attach(trainer)  # the one line a user adds
        with FlopMeter() as meter:
            trainer.train()
    out = tmp_path / "out"
    written = json.loads((out / ACCOUNT_FILE).read_text())
    imported = import_trl(out)
    from typer.testing import CliRunner

    from allocopt.cli import app

    r = CliRunner().invoke(app, ["account", "--from-trl", str(out), "--json"])
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    ex = imported.account.executed
    # the JSON the callback wrote at the end = account --from-trl on the folder (same numbers)
    for k in ("total_flops", "search_flops", "learning_flops", "reward_flops", "rho"):
        assert written[k] == shown[k]
    assert written["total_flops"] == ex.total_flops and written["steps"] == steps
    assert set(written["phase_seconds"]) == {"search", "learning", "reward"}
    assert written["phase_seconds"]["search"] > 0 and written["phase_seconds"]["learning"] > 0
    # and = what FlopCounterMode counted in that run, within 1 %
    measured = meter.now()
    print(f"callback total {ex.total_flops:.6g}, FlopCounterMode {measured:.6g}, "
          f"ratio {ex.total_flops / measured:.5f}, rho {ex.rho:.4f}")
    assert ex.total_flops == pytest.approx(measured, rel=0.01)
    # every logging step reached the reporter (MLflow), growing to the final totals
    client = mlflow.tracking.MlflowClient()
    [run] = client.search_runs(client.get_experiment_by_name("live").experiment_id)
    hist = client.get_metric_history(run.info.run_id, "allocopt/total_flops")
    values = [m.value for m in sorted(hist, key=lambda m: m.step)]
    assert len(values) == steps and values == sorted(values)
    assert values[-1] == pytest.approx(ex.total_flops, rel=1e-6)  # MLflow stores float64
    for name in ("allocopt/rho", "allocopt/search_flops", "allocopt/learning_flops",
                 "allocopt/reward_flops", "allocopt/search_flops_per_second",
                 "allocopt/learning_flops_per_second"):
        assert client.get_metric_history(run.info.run_id, name), name
    rho = client.get_metric_history(run.info.run_id, "allocopt/rho")
    assert max(rho, key=lambda m: m.step).value == pytest.approx(ex.rho, rel=1e-6)
    assert cb.last is not None and cb.last.account == imported.account
