"""The tiny objective end to end on the shipped world: its targets and one real trial."""

from __future__ import annotations

import json
import re

import pytest
import torch

from allocopt.plan.allocation import Allocation, make_plan
from allocopt.objective import objective_targets
from objectives.tiny import manifest as tm
from objectives.tiny import tasks as tt
from objectives.tiny import train as ttr
from objectives.tiny.objective import TinyObjective, TinySettings

torch.set_num_threads(1)


def _left_to_right(prompt: str) -> int:
    """The prompt's value computed directly: tokens of the expression, left to right."""
    tokens = re.findall(r"\d+|[+\-*]", prompt)
    value = int(tokens[0])
    for op, b in zip(tokens[1::2], tokens[2::2]):
        value = value + int(b) if op == "+" else value - int(b) if op == "-" else value * int(b)
    return value


def _answer(completion: str) -> int | None:
    m = re.search(r"#### (-?\d+)\s*$", completion.strip("\n"))
    return int(m.group(1)) if m else None


@pytest.fixture(scope="module")
def objective() -> TinyObjective:
    obj = TinyObjective(TinySettings(eval_problems=40, eval_batch_size=100))
    assert obj.world().root == tm.SHIPPED_DIR  # the shipped world, no training
    return obj


def test_targets_match_a_direct_evaluation(objective):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(objective.world().policy))
    targets, eval_flops = objective.evaluate(model, objective._tokenizer(), objective.reward("sparse"))
    # the same greedy completions through the build's own generation code (own encoding and
    # left padding), scored with the arithmetic computed here from the prompt
    native = tt.make_split("native", 640, 0)[600:]
    down = tt.make_split("downstream", 40, 0)
    native_out = ttr.generate(model, [p.prompt for p in native], sample=False, seed=0, max_new_tokens=48)
    down_out = ttr.generate(model, [p.prompt for p in down], sample=False, seed=0, max_new_tokens=48)
    hits = [_answer(c) == _left_to_right(p.prompt) for c, p in zip(down_out, down)]
    assert targets["pass_at_1"] == pytest.approx(sum(hits) / len(hits))
    native_hits = [_answer(c) == _left_to_right(p.prompt) for c, p in zip(native_out, native)]
    assert targets["native_reward"] == pytest.approx(sum(native_hits) / len(native_hits))
    assert targets["judge"] == pytest.approx(sum(tt.judge(c, p.prompt) for c, p in zip(down_out, down)) / 40)
    # a weak but not hopeless base (manifest: greedy native 0.565, downstream 0.435 on 200)
    assert 0.2 < targets["native_reward"] < 0.9 and 0.1 < targets["pass_at_1"] < 0.8
    assert eval_flops > 0


@pytest.mark.slow  # a real tiny GRPO trial: ~34 s on 2 loaded cores
def test_one_trial_stays_within_its_budget(objective):
    budget = 6e10  # 4 iterations of 64 rollouts
    plan = make_plan(budget, Allocation(0.5, 4, "sparse"), objective.workload())
    result = objective.run(plan, seed=0)
    spent = result.spent.executed
    assert 0.7 * budget < spent.total_flops <= budget
    assert spent.reward_flops == 0 and spent.search_flops > 0 and spent.learning_flops > 0
    assert spent.rho == pytest.approx(0.5, abs=0.02)
    assert set(result.targets) == {"native_reward", "pass_at_1", "judge"}
    assert set(result.targets) == set(objective_targets("tiny"))  # the contract's declared targets
    assert all(0.0 <= v <= 1.0 for v in result.targets.values())
    walls = result.wall_seconds
    assert walls["learning"] > 0 and walls["search+reward"] > 0 and walls["eval"] > 0


def test_a_world_build_is_announced_before_it_starts(tmp_path, monkeypatch, capsys):
    """The shipped world matches the recipe: no notice. A world that must be built (the
    shipped one no build of the recipe, an empty cache) is announced on stderr, with the
    shipped build's own time, before the build starts."""
    from objectives.tiny.objective import build_notice

    assert build_notice() is None  # the shipped world is a build of the recipe
    cache = tmp_path / "cache"
    note = build_notice(cache)
    parts = json.loads((tm.SHIPPED_DIR / tm.MANIFEST).read_text())["timings_s"]
    minutes = round((parts["sft"] + parts["prm"] + parts["proxy_prm"] + parts["data"] + parts["prm_data"]
                     + parts["policy_eval"] + parts["prm_eval"] + parts["proxy_prm_eval"]) / 60)
    assert note == (f"tiny world: {cache} holds no build of the current recipe; building it into "
                    f"{cache} now (about {minutes} min on one core, once; `python -m "
                    "objectives.tiny.build` builds it ahead)")
    monkeypatch.setattr(tm, "SHIPPED_DIR", tmp_path / "not-shipped")  # a recipe the shipped world misses
    monkeypatch.setenv(tm.CACHE_ENV, str(cache))
    note = build_notice()
    assert note is not None and note.startswith(
        f"tiny world: neither the shipped world ({tmp_path / 'not-shipped'}) nor {cache} holds a build")
    assert "several minutes" in note  # the moved shipped manifest has no timings to quote
    seen: list[str] = []
    monkeypatch.setattr("objectives.tiny.build.build_world",
                        lambda c: seen.append(capsys.readouterr().err) or "paths")
    assert TinyObjective().world() == "paths"
    assert seen == [note + "\n"]  # said once, on stderr, before the build was called
