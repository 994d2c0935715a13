"""The tiny world's build: deterministic, cached, rebuilt when the cache is not whole."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import pytest
import torch

from objectives.tiny import build as tb
from objectives.tiny import manifest as tm
from objectives.tiny import prm_eval as tpe
from objectives.tiny import tasks as tt
from objectives.tiny import train as ttr
from objectives.tiny.build import build_world
from objectives.tiny.manifest import BuildSettings, WorldPaths, check_cache

torch.set_num_threads(1)

QUICK = dict(sft_steps=20, proxy_prm_steps=10, prm_steps=10, sft_batch_size=8, prm_batch_size=8,
             eval_problems=16, sft_check_problems=8, prm_train_problems=24,
             prm_eval_problems=16, max_new_tokens=32)
"""A build of a few seconds: 20 SFT steps, 10 steps of each PRM, small evaluations."""


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> WorldPaths:
    return build_world(tmp_path_factory.mktemp("quick") / "world", **QUICK)


def _copy(paths: WorldPaths, dest: Path) -> WorldPaths:
    shutil.copytree(paths.root, dest)
    return WorldPaths.at(dest)


def _raiser(exc: BaseException):
    def raise_it(*args, **kwargs):
        raise exc

    return raise_it


class _Counter:
    """Wraps ``tb._build_into`` and counts the builds."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = tb._build_into

        def counting(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(tb, "_build_into", counting)


# ------------------------------------------------------------------ pieces, no training
def test_encode_matches_the_tokenizer():
    from objectives.tiny.models import build_tokenizer

    tok = build_tokenizer()
    rng = random.Random(0)
    for p in tt.make_split("train", 30):
        for text in (p.prompt + p.solution, p.prompt + tt.mark_steps(tpe.corrupt(p, rng)),
                     "12 + x?\n<step><eos>"):
            assert ttr.encode(text) == tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("kind", tpe.CORRUPTIONS)
def test_every_corruption_is_wrong(kind):
    rng = random.Random(kind)
    for p in tt.make_split("train", 200) + tt.make_split("downstream", 50):
        text = tpe.corrupt(p, rng, kind)
        assert not all(tt.step_labels(text, p.prompt)), (p.prompt, text)
    with pytest.raises(ValueError, match="kind"):
        tpe.corrupt(p, rng, "nonsense")


def test_judged_data_and_probe_sources():
    problems = tt.make_split("train", 20)
    samples = [(problems[0], "#### 5"), (problems[1], problems[1].solution)]
    data = tpe.judged_set(problems, samples, random.Random(0))
    assert [x[2] for x in data].count("correct") == 20
    assert [x[2] for x in data].count("corrupt") == 40
    assert [x[2] for x in data].count("policy") == 2
    probe = tpe.corruption_probe(problems[:5], seed=0)
    assert {x[2] for x in probe} == set(tpe.CORRUPTIONS) and len(probe) == 5 * len(tpe.CORRUPTIONS)


class _OracleVerifier:
    """Scores a step 1.0 when tiny_tasks calls it correct, except the steps listed in
    ``flip`` (by (completion, step index)), which it gets wrong."""

    def __init__(self, data, flip):
        self.data, self.flip = data, flip

    def step_scores(self, prompts, completions):
        out = []
        for prompt, text in zip(prompts, completions):
            truth = tt.step_labels(text, prompt)[:len(tt.parse_steps(text))]
            out.append([float(ok != ((text, i) in self.flip)) for i, ok in enumerate(truth)])
        return out

    def consume_usage(self):
        return None


def test_verifier_metrics_count_by_hand():
    p = tt.make_problem([23, 45, 12], ["+", "-"])  # 23+45=68, 68-12=56
    wrong = "23+45=69\n69-12=57\n#### 57"  # step 0 wrong, step 1 right (chains on 69)
    data = [(p, p.solution, "correct"), (p, wrong, "policy"), (p, "23+45=68\n#### 68", "policy")]
    # truth: correct 2 right; policy: wrong + right; short: right (the left-out step not judged)
    perfect = tpe.verifier_metrics(_OracleVerifier(data, set()), data)
    assert perfect["wrong_recall"] == 1.0 and perfect["false_alarm"] == 0.0
    assert perfect["steps"] == 5 and perfect["share_correct_steps"] == 4 / 5
    # miss the wrong step, flag one right step of the correct solution
    m = tpe.verifier_metrics(_OracleVerifier(data, {(wrong, 0), (p.solution, 1)}), data)
    assert m["wrong_recall"] == 0.0 and m["wrong_recall_policy"] == 0.0
    assert m["false_alarm"] == 1 / 4 and m["false_alarm_correct"] == 1 / 2
    assert m["false_alarm_policy"] == 0.0 and m["step_accuracy"] == 3 / 5
    assert m["wrong_steps_policy"] == 1


def test_settings_are_checked():
    with pytest.raises(ValueError, match="sft_steps"):
        BuildSettings(sft_steps=-1)
    with pytest.raises(ValueError, match="prm_batch_size"):
        BuildSettings(prm_batch_size=0)
    spec = BuildSettings(downstream={"num_steps": [3, 3]}).downstream
    assert spec == tt.TaskSpec(num_steps=(3, 3))
    assert BuildSettings().to_json() == json.loads(json.dumps(BuildSettings().to_json()))


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(tm.CACHE_ENV, str(tmp_path / "c"))
    assert tm.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(tm.CACHE_ENV)
    assert tm.default_cache_dir() == Path.home() / ".cache" / "allocopt" / "tiny-v2"


# ---------------------------------------------------------------------- quick builds
def test_quick_build_is_complete_and_loads(quick):
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    manifest = quick.read_manifest()
    assert manifest["settings"] == BuildSettings(**QUICK).to_json()
    assert check_cache(quick.root, BuildSettings(**QUICK)) == manifest
    assert {k.split("/")[0] for k in manifest["checksums"]} == set(tm.PARTS)
    for part in ("policy", "proxy_prm", "prm"):
        assert f"{part}/model.safetensors" in manifest["checksums"]
    assert manifest["metrics"]["policy"]["steps_run"] == 20
    assert manifest["metrics"]["prm"]["steps_run"] == 10
    for key in ("sft", "proxy_prm", "prm", "total"):
        assert manifest["timings_s"][key] >= 0
    tok = PreTrainedTokenizerFast.from_pretrained(str(quick.tokenizer))
    assert tok("9+1\n", add_special_tokens=False)["input_ids"] == ttr.encode("9+1\n")
    policy = Qwen2ForCausalLM.from_pretrained(str(quick.policy))
    assert policy.generation_config.eos_token_id == ttr._EOS_ID
    for path, layers in ((quick.prm, 4), (quick.proxy_prm, 3)):
        config = Qwen2ForCausalLM.from_pretrained(str(path)).config
        assert (config.hidden_size, config.num_hidden_layers) == (96, layers)
    leftovers = [p.name for p in quick.root.parent.iterdir() if ".tmp-" in p.name]
    assert leftovers == []


@pytest.mark.slow  # a second tiny world built from scratch: ~25 s on 2 loaded cores
def test_same_settings_give_identical_weights(quick, tmp_path):
    rng_state, threads = torch.random.get_rng_state(), torch.get_num_threads()
    again = build_world(tmp_path / "again", **QUICK)
    assert again.read_manifest()["checksums"] == quick.read_manifest()["checksums"]
    assert torch.equal(torch.random.get_rng_state(), rng_state)  # caller's RNG untouched
    assert torch.get_num_threads() == threads


@pytest.mark.slow  # ~15 s: a second quick build from scratch
def test_reusing_the_policy_gives_the_files_of_a_build_from_scratch(quick, tmp_path, monkeypatch):
    # only PRM settings change: the reused build copies the policy instead of training it and
    # must end with exactly the files (and policy measurements) a build from scratch writes
    other = {**QUICK, "prm_steps": 12, "proxy_prm_lr": 1e-3}
    scratch = build_world(tmp_path / "scratch", **other).read_manifest()
    trained = []
    monkeypatch.setattr(tb, "train_policy", lambda *a, **k: trained.append(1) or pytest.fail())
    reused = build_world(tmp_path / "reused", reuse_policy=quick.root, **other).read_manifest()
    assert not trained
    assert reused["checksums"] == scratch["checksums"]
    assert reused["metrics"] == scratch["metrics"]
    # a change to how a PRM is scored only: both PRMs are copied (no training), measured again
    monkeypatch.setattr(tb, "train_prm", lambda *a, **k: pytest.fail("PRM retrained"))
    rescored = build_world(tmp_path / "rescored", reuse_policy=tmp_path / "scratch",
                           **{**other, "proxy_prm_score": "line"}).read_manifest()
    assert rescored["checksums"] == scratch["checksums"]
    assert rescored["metrics"]["prm"] == scratch["metrics"]["prm"]
    assert (rescored["metrics"]["proxy_prm"]["score"], scratch["metrics"]["proxy_prm"]["score"]) \
        == ("line", "token")
    assert rescored["proxy_prm_reused_from_build_at"] == scratch["built_at"]
    # a change to the policy's own settings cannot reuse it
    with pytest.raises(ValueError, match="reuse_policy"):
        build_world(tmp_path / "x", reuse_policy=quick.root, **{**QUICK, "sft_steps": 21})


def test_cache_hit_returns_without_training(quick, monkeypatch):
    mtime = quick.manifest.stat().st_mtime_ns
    counter = _Counter(monkeypatch)
    monkeypatch.setattr(tb, "train_policy", _raiser(AssertionError("retrained")))
    start = time.perf_counter()
    assert build_world(quick.root, **QUICK) == quick
    assert time.perf_counter() - start < 5
    assert counter.calls == 0 and quick.manifest.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("damage", ["flip_byte", "no_manifest", "missing_part", "extra_file",
                                    "bad_json", "other_settings"])
def test_damaged_or_foreign_cache_is_not_a_hit(quick, tmp_path, damage):
    copy = _copy(quick, tmp_path / "world")
    settings = BuildSettings(**QUICK)
    assert check_cache(copy.root, settings) is not None
    if damage == "flip_byte":
        weights = copy.prm / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 1
        weights.write_bytes(bytes(data))
    elif damage == "no_manifest":
        copy.manifest.unlink()
    elif damage == "missing_part":
        shutil.rmtree(copy.proxy_prm)
    elif damage == "extra_file":
        (copy.policy / "stray.bin").write_bytes(b"x")
    elif damage == "bad_json":
        copy.manifest.write_text("{not json")
    else:
        settings = BuildSettings(**{**QUICK, "prm_steps": 11})
    assert check_cache(copy.root, settings) is None


@pytest.mark.slow  # a quick tiny world rebuilt from scratch: ~17 s on 2 loaded cores
def test_corrupted_cache_is_rebuilt_whole(quick, tmp_path, monkeypatch):
    copy = _copy(quick, tmp_path / "world")
    weights = copy.policy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    shutil.rmtree(copy.prm)
    counter = _Counter(monkeypatch)
    assert build_world(copy.root, **QUICK) == copy
    assert counter.calls == 1
    assert copy.read_manifest()["checksums"] == quick.read_manifest()["checksums"]
    assert check_cache(copy.root, BuildSettings(**QUICK)) is not None
    assert build_world(copy.root, **QUICK) == copy and counter.calls == 1  # now a hit


@pytest.mark.slow  # a whole study or build end to end, several seconds (CI runs -m slow)
def test_interrupted_build_leaves_no_half_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(tb, "train_prm", _raiser(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        build_world(tmp_path / "world", **{**QUICK, "eval_problems": 4, "prm_eval_samples": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".world.lock"]


def test_failed_rebuild_keeps_the_old_folder(quick, tmp_path, monkeypatch):
    copy = _copy(quick, tmp_path / "world")
    monkeypatch.setattr(tb, "train_policy", _raiser(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        build_world(copy.root, force=True, **QUICK)
    assert check_cache(copy.root, BuildSettings(**QUICK)) is not None
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_stale_temporary_folders_are_cleaned(quick, tmp_path, monkeypatch):
    copy = _copy(quick, tmp_path / "world")
    (tmp_path / ".world.tmp-dead").mkdir()
    (tmp_path / ".world.tmp-dead" / "junk").write_text("x")
    monkeypatch.setattr(tb, "_build_into", _raiser(RuntimeError("stop")))
    with pytest.raises(RuntimeError):
        build_world(copy.root, force=True, **QUICK)
    assert not (tmp_path / ".world.tmp-dead").exists()


def test_cli_prints_the_manifest(quick, capsys, monkeypatch):
    counter = _Counter(monkeypatch)
    args = ["--cache-dir", str(quick.root)]
    for key, value in QUICK.items():
        args += ["--set", f"{key}={value}"]
    assert tb.main(args) == 0
    assert json.loads(capsys.readouterr().out) == quick.read_manifest()
    assert counter.calls == 0


@pytest.mark.parametrize("bad", ["nonsense=1", "sft_steps", "sft_steps=-3", "sft_lr=abc"])
def test_cli_rejects_bad_settings_in_one_line(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        tb.main(["--set", bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 3 and "Traceback" not in " ".join(err)
    assert bad.split("=")[0] in err[-1]


# ----------------------------------------------------------------------- shipped world
def test_shipped_world_is_the_default_build(monkeypatch, tmp_path):
    # the files shipped in objectives/tiny/world are a whole build of today's default recipe
    # (settings, task fingerprint, every file's sha256); a change to the recipe without a
    # rebuild of the shipped files fails here
    manifest = check_cache(tm.SHIPPED_DIR, BuildSettings())
    assert manifest is not None
    assert set(manifest["checksums"]) == {
        p.relative_to(tm.SHIPPED_DIR).as_posix()
        for part in tm.PARTS for p in (tm.SHIPPED_DIR / part).rglob("*") if p.is_file()}
    # and build_world() uses it as it is: no training, whatever the cache holds
    monkeypatch.setenv(tm.CACHE_ENV, str(tmp_path / "empty-cache"))
    monkeypatch.setattr(tb, "_build_into", _raiser(AssertionError("built instead of shipped")))
    assert build_world() == WorldPaths.at(tm.SHIPPED_DIR)
    assert not (tmp_path / "empty-cache").exists()


@pytest.mark.slow  # a tiny world built from scratch: ~23 s on 2 loaded cores
def test_other_settings_do_not_use_the_shipped_world(monkeypatch, tmp_path):
    counter = _Counter(monkeypatch)
    monkeypatch.setenv(tm.CACHE_ENV, str(tmp_path / "cache"))
    paths = build_world(**QUICK)
    assert paths.root == (tmp_path / "cache").absolute() and counter.calls == 1


# --------------------------------------------------------------------------- full build
_FINGERPRINT_STEPS = 30
_FLOAT_FINGERPRINTS = {
    # sha256 of the policy's model.safetensors after the first 30 SFT steps of the default
    # recipe (BuildSettings(sft_steps=30, sft_stop_accuracy=None), one thread): a float
    # environment (CPU kernels of torch 2.13.0+cpu, transformers 5.24.0) in which the whole
    # build was run and gave the shipped tokenizer and policy byte for byte. Measured
    # 2026-12-03 on an AMD EPYC with AVX-512 (torch's CPU capability AVX512): fingerprint
    # 12 s, the whole SFT 328 s, model.safetensors 9770e8f7... = the manifest's.
    "765fd6fe1cb24ddd1c70bf05735fb9fc9bd12c35743307ad66fc4754b045376d",
}
_OTHER_FLOATS = (
    "this machine's float results differ from those of the environments that reproduce the "
    "shipped policy (its first {steps} SFT steps give {fingerprint}, not one of "
    "_FLOAT_FINGERPRINTS; CPU capability {capability}): the build is deterministic on a machine "
    "but not across CPUs (a CI machine of 2026-12-02 gave other policy bytes with the same "
    "code and versions); the rebuilt policy's quality bars were checked instead")
_PRM_BYTES = (
    "the shipped PRMs were trained on 2026-12-01 (full 05:30, proxy 05:30 and again 08:13, "
    "byte-identical) in an environment whose float results differ from this machine's: with "
    "the same code (train_prm unchanged since d5dd5a5 but for imports), torch 2.13.0+cpu and "
    "transformers 5.24.0, the full PRM trained here from the shipped policy gives other bytes "
    "(final loss 0.00783401 vs the manifest's 0.00783581), the same in two processes, while "
    "the code of 7cba01b gives that commit's 2026-11-30 proxy PRM byte for byte here (and "
    "ATEN_CPU_CAPABILITY=avx2 with MKL/oneDNN held to AVX2 gives a third file); a "
    "rebuild here is deterministic but not the shipped PRMs, which the measured numbers "
    "(docs, calibration, the tiny grid) were made with")


def _float_fingerprint(tmp_path: Path, steps: int = _FINGERPRINT_STEPS) -> str:
    """sha256 of the policy after the first ``steps`` SFT steps of the default recipe."""
    import hashlib

    s = BuildSettings(sft_steps=steps, sft_stop_accuracy=None)
    native = tt.make_split("native", s.eval_problems + s.sft_check_problems, seed=s.seed)
    model, _ = ttr.train_policy(s, tt.make_split("train", seed=s.seed),
                                native[s.eval_problems:], lambda _: None)
    model.save_pretrained(str(tmp_path / "fingerprint"))
    return hashlib.sha256((tmp_path / "fingerprint" / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.slow
def test_the_float_fingerprint_is_the_recipes_first_steps(tmp_path):
    # ~25 s: the fingerprint is a deterministic function of the recipe on a machine (two runs,
    # the same bytes) and of the step count (31 steps give other bytes), so a matching
    # fingerprint says the same kernels gave the same floats on these steps, not that it
    # matches by construction
    first = _float_fingerprint(tmp_path / "a")
    assert _float_fingerprint(tmp_path / "b") == first
    assert _float_fingerprint(tmp_path / "c", _FINGERPRINT_STEPS + 1) != first


def _unstamped(path: Path) -> dict:
    """A model's JSON config without ``transformers_version``: the stamp of the library release
    that wrote it, which moves with every release while the build's output does not."""
    config = json.loads(path.read_text())
    config.pop("transformers_version", None)
    return config


def _same_build(names: tuple[str, ...], built: WorldPaths, manifest: dict, shipped: dict) -> bool:
    """Whether the built parts ``names`` are the shipped ones: every file byte for byte, the JSON
    configs but for their transformers stamp (:func:`_unstamped`)."""
    def files(m: dict, json_files: bool) -> dict:
        return {k: v for k, v in m["checksums"].items()
                if k.split("/")[0] in names and k.endswith(".json") == json_files}

    configs = files(shipped, True)
    return (files(manifest, False) == files(shipped, False) and files(manifest, True).keys() == configs.keys()
            and all(_unstamped(built.root / k) == _unstamped(tm.SHIPPED_DIR / k) for k in configs))


def test_same_build_ignores_only_the_transformers_stamp(tmp_path):
    # the shipped policy copied as a "build" by another transformers release: the same build;
    # any other change to a config, or a weight file's bytes, is not
    shipped = json.loads((tm.SHIPPED_DIR / tm.MANIFEST).read_text())
    built = WorldPaths.at(tmp_path)
    shutil.copytree(tm.SHIPPED_DIR / "policy", built.policy)
    config = json.loads((built.policy / "config.json").read_text())
    manifest = json.loads(json.dumps(shipped))
    manifest["checksums"]["policy/config.json"] = "another release's bytes"
    (built.policy / "config.json").write_text(json.dumps({**config, "transformers_version": "9.9.9"}))
    assert _same_build(("policy",), built, manifest, shipped)
    (built.policy / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 99}))
    assert not _same_build(("policy",), built, manifest, shipped)
    (built.policy / "config.json").write_text(json.dumps({**config, "transformers_version": "9.9.9"}))
    manifest["checksums"]["policy/model.safetensors"] = "other weights"
    assert not _same_build(("policy",), built, manifest, shipped)


@pytest.mark.slow
def test_full_build_reproduces_the_shipped_world(tmp_path):
    # ~8 min on one idle thread (~55 min at load 3): the script that made the shipped files
    # makes them again, byte for byte, where the machine's float results are those of an
    # environment known to reproduce them (_FLOAT_FINGERPRINTS): the tokenizer always; the
    # policy there (elsewhere an xfail after its quality bars, _OTHER_FLOATS); the PRMs only
    # where the float results match those of the environment that trained them (_PRM_BYTES)
    fingerprint = _float_fingerprint(tmp_path)
    start = time.perf_counter()
    paths = build_world(tmp_path / "world")
    elapsed = time.perf_counter() - start
    manifest = paths.read_manifest()
    shipped = json.loads((tm.SHIPPED_DIR / tm.MANIFEST).read_text())

    def part(checksums, names):
        return {k: v for k, v in checksums.items() if k.split("/")[0] in names}

    versions = (manifest["versions"], shipped["versions"])
    assert part(manifest["checksums"], ("tokenizer",)) \
        == part(shipped["checksums"], ("tokenizer",)), versions
    metrics = manifest["metrics"]
    policy = metrics["policy"]
    assert 0.25 <= policy["native_sampled_accuracy"] <= 0.55, policy
    assert policy["native_greedy_accuracy"] >= policy["native_sampled_accuracy"] - 0.05
    if fingerprint not in _FLOAT_FINGERPRINTS:
        pytest.xfail(_OTHER_FLOATS.format(steps=_FINGERPRINT_STEPS, fingerprint=fingerprint,
                                          capability=torch.backends.cpu.get_cpu_capability()))
    assert _same_build(("policy",), paths, manifest, shipped), versions
    assert metrics["policy"] == shipped["metrics"]["policy"]
    if not _same_build(("prm", "proxy_prm"), paths, manifest, shipped):
        pytest.xfail(_PRM_BYTES)
    # issue 17's bar on the policy's own samples: the full PRM flags >= 60% of the wrong steps
    # at <= 10% false alarms, the proxy is measurably weaker
    full, proxy = metrics["prm"], metrics["proxy_prm"]
    assert full["wrong_recall_policy"] >= 0.6 and full["false_alarm_policy"] <= 0.1, full
    assert proxy["wrong_recall_policy"] < full["wrong_recall_policy"] - 0.1, (proxy, elapsed)
    assert proxy["false_alarm_policy"] <= 0.15, proxy


def test_shipped_prms_judge_the_policys_own_steps():
    # Independent of the build's own measurement: fresh samples of the shipped base policy
    # (temperature 1) on native problems no part of the world or the objective uses, the
    # truth from tiny_tasks.step_labels, the PRMs through the reward class the trials use.
    # Issue 17's bar: the full PRM flags >= 60% of the wrong steps at <= 10% false alarms on
    # the right ones; the proxy is cheaper and weaker.
    from transformers import Qwen2ForCausalLM

    from objectives.tiny.models import build_tokenizer
    from allocopt.rewards.verifier import LikelihoodVerifier

    torch.set_num_threads(1)
    paths = WorldPaths.at(tm.SHIPPED_DIR)
    policy = Qwen2ForCausalLM.from_pretrained(str(paths.policy))
    problems = tt.make_split("native", 1900)[1600:]
    texts = ttr.generate(policy, [p.prompt for p in problems], sample=True, seed=21,
                        max_new_tokens=48)
    data = [(p, t, "policy") for p, t in zip(problems, texts)]
    rates, sizes, auc = {}, {}, {}
    for part in ("prm", "proxy_prm"):
        model = Qwen2ForCausalLM.from_pretrained(str(getattr(paths, part)))
        sizes[part] = sum(x.numel() for x in model.parameters())
        score = paths.read_manifest()["settings"][f"{part}_score"]  # as the objective reads it
        verifier = LikelihoodVerifier(model, build_tokenizer(), score=score)
        rates[part] = tpe.verifier_metrics(verifier, data)
        # threshold-free: how often a wrong step scores below a right one (AUROC, by counting)
        wrong, right = [], []
        for (p, t, _), sc in zip(data, verifier.step_scores([p.prompt for p in problems], texts)):
            for ok, x in zip(tt.step_labels(t, p.prompt), sc):
                (right if ok else wrong).append(x)
        auc[part] = sum((w < r) + 0.5 * (w == r) for w in wrong for r in right) / (
            len(wrong) * len(right))
    full, proxy = rates["prm"], rates["proxy_prm"]
    print("full", full, "proxy", proxy, "auroc", auc)
    assert full["wrong_steps_policy"] >= 60, full  # enough wrong steps to measure
    assert full["wrong_recall"] >= 0.6 and full["false_alarm"] <= 0.1, full
    assert sizes["proxy_prm"] < sizes["prm"]
    # weaker: worse step accuracy, recall and ranking of the same steps, at sane false alarms
    assert proxy["step_accuracy"] < full["step_accuracy"], (proxy, full)
    assert 0.3 <= proxy["wrong_recall"] < full["wrong_recall"] - 0.1, (proxy, full)
    assert proxy["false_alarm"] <= 0.15, proxy
    assert 0.5 < auc["proxy_prm"] < auc["prm"], auc
