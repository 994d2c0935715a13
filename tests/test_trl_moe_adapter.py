"""``--from-trl`` reads LoRA on a mixture-of-experts model from the adapter peft saved.

peft 0.21 under transformers 5 saves ``adapter_config.json`` after converting the MLP names of a
MoE model in place (``target_parameters``, ``rank_pattern`` with the fused ``gate_up_proj`` at
``2r``). Each adapter here is saved by a real ``PeftModel.save_pretrained`` on a shrunk model of
each family (tests/test_moe.py); the importer's ``lora_targets`` must adapt, per
:meth:`LoRASpec.ranks`, exactly the modules peft's own layers carry, at their ranks, and the
imported run's FLOPs must equal the same run with the targets given directly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from allocopt.flops import LoRASpec, ModelShape
from allocopt.runlogs import RunLogError, import_trl

TRL = Path(__file__).parent / "data" / "runlogs" / "trl_tiny"
_EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"]


def _folder(tmp_path: Path, adapter: dict, config: dict) -> Path:
    """The tiny TRL run's log and arguments, with ``adapter`` on the model of ``config``."""
    out = tmp_path / "run"
    out.mkdir()
    for f in ("trainer_state.json", "training_args.bin"):
        shutil.copy(TRL / f, out)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    (out / "adapter_config.json").write_text(json.dumps(
        {**adapter, "base_model_name_or_path": str(tmp_path / "model")}))
    return out


@pytest.mark.parametrize("family,lora,direct", [
    ("qwen3-moe", dict(target_modules="all-linear"), "all-linear"),
    ("qwen3-moe", dict(target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]),
     "q_proj,v_proj,gate_proj,up_proj,down_proj"),
    ("qwen3-moe", dict(target_modules=["q_proj", "v_proj"], target_parameters=_EXPERTS),
     "q_proj,v_proj,experts,router"),
    ("mixtral", dict(target_modules="all-linear"), "all-linear"),
    ("mixtral", dict(target_modules=["q_proj", "v_proj"], target_parameters=_EXPERTS[:2]),
     "q_proj,v_proj,experts"),
    ("mixtral", dict(target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]),
     "q_proj,v_proj,gate_proj,up_proj,down_proj"),
    ("qwen2-moe", dict(target_modules="all-linear"), "all-linear"),
    ("qwen2-moe", dict(target_modules=["q_proj", "v_proj"], target_parameters=_EXPERTS),
     "q_proj,v_proj,experts,router"),
    ("deepseek-v3", dict(target_modules="all-linear"), "all-linear"),
    ("deepseek-v3", dict(target_modules=["gate_proj", "up_proj", "down_proj"]),
     "gate_proj,up_proj,down_proj")])
def test_saved_peft_adapter_imports_as_the_direct_account(family, lora, direct, tmp_path, cli):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from tests.test_moe import _allocopt_adapted, _families, _peft_adapted

    cls, cfg, _ = _families()[family]
    pm = get_peft_model(cls(cfg), LoraConfig(r=4, lora_alpha=8, **lora))
    pm.save_pretrained(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    folder = _folder(tmp_path, saved, cfg.to_dict())
    run = import_trl(folder)
    shape = ModelShape.from_pretrained(str(tmp_path / "model"))
    spec = LoRASpec(run.settings["lora_rank"], run.settings["lora_targets"])
    # what peft's own layers carry (module, in a MoE layer or not) -> rank
    assert _allocopt_adapted(spec, shape) == _peft_adapted(pm)
    assert spec.ranks(shape) == LoRASpec(4, direct).ranks(shape)
    same = import_trl(folder, lora_targets=direct)
    assert run.account.executed == same.account.executed
    # the adapter is read, not defaulted: other targets cost otherwise
    assert run.account.executed.total_flops != \
        import_trl(folder, lora_targets="o_proj").account.executed.total_flops
    # a live run (the callback) reads the trainer's own peft config: the same targets
    from allocopt.runlogs.live import _adapter
    from allocopt.runlogs.trl import adapter_targets
    assert adapter_targets(_adapter(pm), 4) == run.settings["lora_targets"]
    r = cli("account", "--from-trl", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total_flops"] == same.account.executed.total_flops


CFG = json.loads((Path(__file__).parent / "data" / "configs" / "Qwen3-30B-A3B" / "config.json").read_text())


def _hand(tmp_path: Path, **fields) -> Path:
    return _folder(tmp_path, {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"],
                              **fields}, CFG)


def test_converted_all_linear_by_hand(tmp_path):
    """The file peft 0.21 writes for all-linear on Qwen3-MoE, written by hand (no torch)."""
    folder = _hand(tmp_path, target_modules=["k_proj", "q_proj", "o_proj", "v_proj"],
                   target_parameters=["down_proj", "gate_up_proj", "gate.weight"],
                   rank_pattern={r".*\.gate_up_proj": 16}, alpha_pattern={r".*\.gate_up_proj": 32})
    run = import_trl(folder)
    assert run.settings["lora_targets"] == "all-linear"
    assert run.account.executed == import_trl(folder, lora_targets="all-linear").account.executed
    # without the fused rank the same names are the experts at r: fewer FLOPs than all-linear
    (folder / "adapter_config.json").write_text(json.dumps({
        **json.loads((folder / "adapter_config.json").read_text()), "rank_pattern": {}}))
    plain = import_trl(folder)
    assert plain.settings["lora_targets"] == "q_proj,k_proj,v_proj,o_proj,experts.gate_up_proj,experts.down_proj,router"
    assert plain.account.executed.total_flops < run.account.executed.total_flops


@pytest.mark.parametrize("fields,says", [
    (dict(target_parameters=["mlp.experts.gate_up_proj", "mlp.shared_expert.weight"]),
     "target_parameters: 'mlp.shared_expert.weight': not counted; allowed:"),
    (dict(target_modules=["q_proj", "lm_head"]), "target_modules: 'lm_head': not counted"),
    (dict(rank_pattern={"q_proj": 16}), "rank_pattern: 'q_proj': 16: per-module ranks"),
    (dict(layers_to_transform=[0, 1]), "layers_to_transform=[0, 1]: adapters on some layers"),
    (dict(modules_to_save=["lm_head"]), "modules_to_save=['lm_head']: modules trained whole"),
    (dict(use_dora=True), "use_dora=True: DoRA is not counted"),
    (dict(target_parameters="mlp.experts.gate_up_proj"), "target_parameters='mlp.experts.gate_up_proj': must be a list")])
def test_unmappable_adapter_is_one_line_exit_2(fields, says, tmp_path, cli):
    folder = _hand(tmp_path, **fields)
    with pytest.raises(RunLogError, match="adapter_config.json: "):
        import_trl(folder)
    r = cli("account", "--from-trl", str(folder))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, r.stderr


def test_module_paths_on_some_layers_only_refused(tmp_path, cli):
    """peft saves module paths (the shipped dense run: all seven on both layers); a name on
    one layer of two would be counted on both, so it is refused in one line."""
    adapter = json.loads((TRL / "adapter_config.json").read_text())
    base = json.loads((TRL / "base" / "config.json").read_text())
    (tmp_path / "a").mkdir()
    whole = _folder(tmp_path / "a", adapter, base)
    assert import_trl(whole).settings["lora_targets"] == ",".join(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    part = dict(adapter, target_modules=[t for t in adapter["target_modules"]
                                         if t != "model.layers.1.self_attn.q_proj"])
    (tmp_path / "b").mkdir()
    folder = _folder(tmp_path / "b", part, base)
    r = cli("account", "--from-trl", str(folder))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "target_modules: q_proj on layers [0] of 2" in r.stderr


def test_a_layer_index_too_long_for_an_int_is_not_a_layer_path():
    # found by the fuzzed readers (tests/test_fuzz_readers.py): a module path whose layer index
    # has 5,000 digits was a ValueError from int() (Python's 4,300-digit limit), a traceback;
    # such a name is no layer path (an index has at most 9 digits here) and is left to the
    # target-name checks, while a real path is still checked against the model's layers
    from allocopt.errors import RunLogError
    from allocopt.runlogs.trl import _check_path_layers

    huge = {"target_modules": [f"model.layers.{'1' * 5000}.self_attn.q_proj"]}
    assert _check_path_layers(huge, "Qwen/Qwen2.5-0.5B-Instruct", None, "trl") is None
    some = {"target_modules": ["model.layers.3.self_attn.q_proj"]}
    with pytest.raises(RunLogError, match="some layers"):
        _check_path_layers(some, "Qwen/Qwen2.5-0.5B-Instruct", None, "trl")
