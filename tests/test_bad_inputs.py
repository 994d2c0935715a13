"""Every command refuses bad input the same way: exit code 2 and exactly one line naming the
field, the value and what is allowed, no traceback, within 10 s and 2 GB of address space,
and nothing recorded. Every row runs in this process (conftest's ``cli``: ``allocopt.cli.main``,
within 10 s and with at most 2 GB more address space than before the call); one row per command
runs in a subprocess (``python -m allocopt.cli``, within 10 s and 2 GB of address space in all).

Each row: (kind, arguments, substrings the line must contain: the field, the value, what is
allowed). ``{tmp}`` is the test's folder, which holds an empty Optuna study ``s`` in
``s.db`` (for the query commands) and a study file without a budget (``nob.toml``).
"""

import contextlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_command_objective import command_objective  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 2 * 1024**3
TIMEOUT_S = 10
SYN = ["--objective", "synthetic", "--target", "pass@1"]
S = ["--study", "s", "--storage", "sqlite:///{tmp}/s.db"]

ROWS = [
    # ---- account
    ("account: huge G", ["account", "-G", "1000000000"], ["group_size", "1000000000", "at most 65536"]),
    ("account: G below 2", ["account", "-G", "1"], ["-G: group_size=1", ">= 2"]),
    ("trial: seed not a number", ["trial", "--objective", "tiny", "--budget", "1e12", "--rho", "0.5", "--seed=abc"],
     ["'--seed'", "valid integer", "(got 'abc')"]),
    ("account: no prompts", ["account", "--prompts", "0"], ["prompts=0", ">= 1"]),
    ("account: NaN prompt length", ["account", "--prompt-tokens", "nan"], ["prompt_tokens=nan", ">= 1"]),
    ("account: negative passes", ["account", "--update-passes", "-1"], ["update_passes=-1.0", "must be a number"]),
    ("account: unknown engine", ["account", "--engine", "foo"], ["engine='foo'", "allowed: trl-cpu"]),
    ("account: negative LoRA rank", ["account", "--lora-rank", "-3"], ["lora_rank=-3", ">= 0"]),
    ("account: missing recipe file", ["account", "--recipe", "{tmp}/none.toml"], ["recipe=", "none.toml", "file not found"]),
    ("account: zero steps", ["account", "--steps", "0"], ["steps=0", ">= 1"]),
    ("account: negative beta", ["account", "--beta", "-1"], ["beta=-1.0", ">= 0"]),
    ("account: G not an integer", ["account", "-G", "abc"], ["'--group-size'", "valid integer"]),
    ("account: unknown LoRA target", ["account", "--lora-targets", "bogus_proj"], ["bogus_proj", "allowed: q_proj"]),
    # ---- plan
    ("plan: negative budget", ["plan", "--budget", "-5", "--rho", "0.5"], ["error: --budget: budget_flops='-5'", "positive finite"]),
    ("plan: budget not a number", ["plan", "--budget", "abc", "--rho", "0.5"], ["budget_flops='abc'", "positive number"]),
    ("plan: infinite budget", ["plan", "--budget", "inf", "--rho", "0.5"], ["budget_flops='inf'", "finite"]),
    ("plan: NaN budget", ["plan", "--budget", "nan", "--rho", "0.5"], ["budget_flops='nan'", "finite"]),
    ("plan: budget below one iteration", ["plan", "--budget", "1", "--rho", "0.5"],
     ["budget_flops=1", "smallest feasible plan needs"]),
    ("plan: rho above 1", ["plan", "--budget", "1e19", "--rho", "1.5"], ["rho=1.5", "strictly between 0 and 1"]),
    ("plan: rho 0", ["plan", "--budget", "1e19", "--rho", "0"], ["rho=0.0", "strictly between 0 and 1"]),
    ("plan: rho not a number", ["plan", "--budget", "1e19", "--rho", "abc"], ["rho='abc'", "a number"]),
    ("plan: huge G", ["plan", "--budget", "1e19", "--rho", "0.5", "-G", "1000000000"],
     ["group_size=1000000000", "at most 65536"]),
    ("plan: unknown reward", ["plan", "--budget", "1e19", "--rho", "0.5", "--reward", "foo"],
     ["reward='foo'", "allowed: sparse"]),
    ("plan: one rollout", ["plan", "--budget", "1e19", "--rho", "0.5", "--rollouts", "1"],
     ["rollouts_per_iteration=1", "from 2 to 65536"]),
    ("plan: huge rollouts", ["plan", "--budget", "1e19", "--rho", "0.5", "--rollouts", "100000000"],
     ["rollouts_per_iteration=100000000", "from 2 to 65536"]),
    ("plan: empty completions", ["plan", "--budget", "1e19", "--rho", "0.5", "--completion-tokens", "0"],
     ["completion_tokens=0.0", ">= 1"]),
    ("plan: unknown engine", ["plan", "--budget", "1e19", "--rho", "0.5", "--engine", "nope"], ["engine='nope'", "allowed"]),
    ("plan: negative beta", ["plan", "--budget", "1e19", "--rho", "0.5", "--beta", "-1"], ["beta=-1.0", ">= 0"]),
    ("plan: negative LoRA rank", ["plan", "--budget", "1e19", "--rho", "0.5", "--lora-rank", "-1"],
     ["lora_rank=-1", "positive integer"]),
    ("plan: budget missing", ["plan", "--rho", "0.5"], ["budget: missing", "--budget FLOPS", "--budget-gpu-hours"]),
    ("plan: unknown flag", ["plan", "--budget", "1e19", "--rho", "0.5", "--bogus-flag", "1"],
     ["No such option", "--bogus-flag"]),
    # ---- trial
    ("trial: years of CPU", ["trial", "--objective", "tiny", "--budget", "1e19", "--rho", "0.5"],
     ["budget=1e+19", "31.7 years", "at most 1.0 h", "--yes"]),
    ("trial: unknown objective", ["trial", "--objective", "nope", "--budget", "1e12", "--rho", "0.5"],
     ["objective='nope'", "allowed: "]),
    ("trial: negative seed", ["trial", "--objective", "tiny", "--budget", "1e12", "--rho", "0.5", "--seed", "-1"],
     ["seed=-1", "from 0 to 2**32 - 1"]),
    ("trial: rho 2", ["trial", "--objective", "tiny", "--budget", "1e12", "--rho", "2"], ["rho=2.0", "between 0 and 1"]),
    ("trial: G 1", ["trial", "--objective", "tiny", "--budget", "1e12", "--rho", "0.5", "-G", "1"], ["group_size=1", ">= 2"]),
    # ---- study
    ("study: missing spec file", ["study", "--spec", "{tmp}/none.toml"], ["spec=", "none.toml", "file not found", "study file (TOML"]),
    ("study: spec without budget", ["study", "--spec", "{tmp}/nob.toml"], ["budget_flops", "missing", "--budget"]),
    ("study: no budget at all", ["study", *SYN], ["budget", "missing", "--budget FLOPS"]),
    ("study: unknown target", ["study", "--objective", "synthetic", "--budget", "1e18", "--target", "bleu"],
     ["target='bleu'", "allowed: native_reward"]),
    ("study: target twice", ["study", *SYN, "--budget", "1e18", "--target", "pass@1"],
     ["target='pass@1'", "more than once", "each target once"]),
    ("study: a FLOP and an hour budget, no profile", ["study", *SYN, "--budget", "1e18", "--budget-gpu-hours", "2"],
     ["budget, budget_gpu_hours", "not both"]),
    ("ask: a FLOP and an hour budget, no profile", ["ask", "--study", "x", "--budget", "1e18", "--budget-gpu-hours", "2"],
     ["budget, budget_gpu_hours", "not both"]),
    ("study: trials not a number", ["study", *SYN, "--budget", "1e18", "--trials", "two"],
     ["'--trials'", "valid integer", "(got 'two')"]),
    ("study: zero trials", ["study", *SYN, "--budget", "1e18", "--trials", "0"], ["trials=0", ">= 1"]),
    ("study: models the synthetic variant ignores", ["study", "--spec", "{tmp}/sizes.toml", "--dry-run"],
     ["space.models=", "scores every model alike", "--set variant=model-size"]),
    ("study: negative pilots", ["study", *SYN, "--budget", "1e18", "--pilots", "-1"], ["pilots=-1", ">= 0"]),
    ("study: unknown tuner", ["study", *SYN, "--budget", "1e18", "--tuner", "tpe"], ["tuner='tpe'", "allowed: kg, race, bo"]),
    ("study: pilots with plain BO", ["study", *SYN, "--budget", "1e18", "--tuner", "bo", "--pilots", "5"],
     ["pilots=5", "tuner = \"bo\" runs full-budget trials only"]),
    ("study: negative until-gain", ["study", *SYN, "--budget", "1e18", "--tuner", "kg", "--until-gain", "-1"],
     ["until_gain=-1.0", "must be a finite number >= 0"]),
    ("study: until-gain with two targets", ["study", "--objective", "synthetic", "--budget", "1e18", "--tuner", "kg",
                                            "--until-gain", "0.01", "--target", "pass@1", "--target", "judge"],
     ["until_gain=0.01", "one target only"]),
    ("study: until-gain with RACE", ["study", *SYN, "--budget", "1e18", "--tuner", "race", "--until-gain", "0.01"],
     ["until_gain=0.01", "needs tuner = \"kg\""]),
    ("race: two targets", ["race", *SYN, "--budget", "1e18", "--target", "judge", "--no-mlflow"],
     ["--target: pass@1, judge", "RACE has one target", "give --target once"]),
    ("race: two targets in the file", ["race", "--spec", "{tmp}/two.toml", "--no-mlflow"],
     ["target=['pass@1', 'judge']", "RACE has one target", "(in spec two.toml)"]),
    ("study: --sampler with the kg tuner", ["study", *SYN, "--budget", "1e18", "--sampler", "botorch", "--dry-run"],
     ["--sampler: sampler='botorch'", "uses no Optuna sampler", "--tuner bo"]),
    ("study: --replicates with the kg tuner, dry run", ["study", *SYN, "--budget", "1e18", "--replicates", "2",
                                                        "--dry-run"],
     ["--replicates: replicates=2", "RACE only"]),
    ("race: the kg tuner's initial design in the file", ["race", "--spec", "{tmp}/kg.toml", "--no-mlflow"],
     ["initial_design=true", "needs tuner = \"kg\", not \"race\"", "set it false", "(in spec kg.toml)"]),
    ("study: pilot fraction 1.5", ["study", *SYN, "--budget", "1e18", "--pilot-fraction", "1.5"],
     ["pilot_fraction=1.5", "(0, 1)"]),
    ("study: quoted pilot fraction in the file", ["study", "--spec", "{tmp}/pf.toml"],
     ["pilot_fraction='0.25'", "must be a number"]),
    ("study: too few pilots", ["study", *SYN, "--budget", "1e18", "--tuner", "race", "--pilots", "3"],
     ["--pilots 3", "too few", "needs at least"]),
    ("study: unknown sampler", ["study", *SYN, "--budget", "1e18", "--sampler", "foo"], ["sampler='foo'", "allowed: botorch"]),
    ("study: budget below every allocation", ["study", *SYN, "--budget", "1e12", "--pilots", "0", "--no-mlflow",
                                              "--storage", "sqlite:///{tmp}/o.db"],
     ["budget_flops=1e+12", "any allocation", "smallest feasible plan", "needs"]),
    ("study: storage URL typo", ["study", *SYN, "--budget", "1e18", "--storage", "bogus://x",
                                 "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage='bogus://x'", "not a database URL", "allowed: sqlite"]),  # m.db not made either
    ("study: storage URL typo in a dry run", ["study", *SYN, "--budget", "1e18", "--storage", "bogus://x", "--dry-run"],
     ["storage='bogus://x'", "not a database URL", "allowed: sqlite"]),
    ("study: storage URL typo, no pilots", ["study", *SYN, "--budget", "1e18", "--pilots", "0", "--storage",
                                            "postgresq://u@h/db", "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage='postgresq://u@h/db'", "allowed: sqlite"]),
    ("study: SQLite file in a missing folder", ["study", *SYN, "--budget", "1e18", "--storage",
                                                "sqlite:///{tmp}/no/such/x.db", "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage=", "cannot be opened", "does not exist"]),  # m.db not made either
    ("race: PostgreSQL server not there", ["race", *SYN, "--budget", "1e18", "--storage",
                                           "postgresql://u:pw@127.0.0.1:1/x", "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage='postgresql://u:***@127.0.0.1:1/x'", "cannot be opened", "Connection refused"]),
    ("study: MLflow URI of an unknown scheme", ["study", *SYN, "--budget", "1e18", "--trials", "1", "--storage",
                                                "sqlite:///{tmp}/o.db", "--mlflow-uri", "bogus://x"],
     ["mlflow_uri='bogus://x'", "unsupported URI", "check the server"]),
    ("study: negative seed", ["study", *SYN, "--budget", "1e18", "--seed", "-1"], ["seed=-1", "from 0"]),
    ("study: unknown objective", ["study", "--objective", "nope", "--budget", "1e18", "--target", "pass@1"],
     ["objective='nope'", "allowed: "]),
    # ---- race
    ("race: pilot fraction 0", ["race", *SYN, "--budget", "1e18", "--pilot-fraction", "0"],
     ["pilot_fraction=0.0", "between 0 and 1"]),
    ("race: negative validations", ["race", *SYN, "--budget", "1e18", "--validations", "-1"], ["validations=-1", ">= 0"]),
    ("race: pilots below every allocation", ["race", *SYN, "--budget", "1e14", "--no-mlflow",
                                             "--storage", "sqlite:///{tmp}/o.db"],
     ["pilot_fraction=0.1", "1e+13", "smallest feasible plan", "budget_flops >= "]),
    ("race: budget below every allocation", ["race", *SYN, "--budget", "1e12", "--no-mlflow",
                                             "--storage", "sqlite:///{tmp}/o.db"],
     ["budget_flops=1e+12", "too small for one GRPO iteration", "smallest feasible plan"]),
    ("race: zero pilots", ["race", *SYN, "--budget", "1e18", "--max-pilots", "0"], ["max_pilots=0", ">= 3"]),
    ("race: negative budget", ["race", *SYN, "--budget", "-1"], ["budget_flops='-1'", "positive"]),
    ("race: huge repeats", ["race", *SYN, "--budget", "1e18", "--repeats", "1000000"],
     ["repeats=1000000", ">= 1 and <= 100"]),
    ("race: huge replicates", ["race", *SYN, "--budget", "1e18", "--replicates", "1000"],
     ["replicates=1000", ">= 0 and <= 100"]),
    ("race: infinite extra-pilot budget", ["race", *SYN, "--budget", "1e18", "--extra-pilot-budget", "inf"],
     ["extra_pilot_budget=inf", "from 0 to 1000"]),
    # ---- best / pareto / report
    ("best: no study named", ["best", "--target", "pass@1"], ["study=None", "--study NAME"]),
    ("best: unknown study", ["best", "--target", "pass@1", "--study", "nope", "--storage", "sqlite:///{tmp}/s.db"],
     ["study='nope'", "known: s"]),
    ("best: missing database", ["best", "--target", "pass@1", "--study", "s", "--storage", "sqlite:///{tmp}/none.db"],
     ["storage=", "none.db", "no such database file", "give --storage with its file"]),
    ("best: unknown target", ["best", "--target", "bleu", *S], ["target='bleu'", "targets measured"]),
    ("best: unknown fidelity", ["best", "--target", "pass@1", "--fidelity", "sideways"],
     ["fidelity='sideways'", "allowed: full, pilot, all"]),
    ("best: malformed filter", ["best", "--target", "pass@1", "--where", "rho"], ["where='rho'", "allowed forms"]),
    ("pareto: target nobody measured", ["pareto", "--objectives", "pass@1,judge", *S],
     ["objectives='pass@1'", "no complete trial measured it"]),
    ("pareto: unknown objective", ["pareto", "--objectives", "bleu,pass@1", *S],
     ["objectives='bleu'", "unknown; targets measured"]),
    ("report: unknown fidelity", ["report", "--out", "{tmp}/r", "--fidelity", "sideways"],
     ["fidelity='sideways'", "allowed: full, pilot, all"]),
    ("report: unknown target", ["report", "--out", "{tmp}/r", "--targets", "bleu", *S], ["target='bleu'", "targets measured"]),
    ("pareto: one objective twice", ["pareto", "--objectives", "pass@1,pass@1", *S],
     ["objectives='pass@1,pass@1'", "more than once", "give each once"]),
    ("pareto: one objective", ["pareto", "--objectives", "pass@1", *S],
     ["objectives='pass@1'", "two or more targets or fields", "allocopt best"]),
    ("best: another tool's database", ["best", "--target", "pass@1", "--study", "s", "--storage", "sqlite:///{tmp}/other.db"],
     ["storage=", "other.db", "another tool's SQLite database", "tables: users"]),
]

# Files and values from strangers (allocopt.limits): run folders, logs and metrics files written
# by other people's jobs. {tmp}'s files are made by ``_stranger_files``.
T = ["--study", "t", "--storage", "sqlite:///{tmp}/t.db", "--trial", "0", "--no-mlflow"]
STRANGER_ROWS = [
    # ---- account --from-trl
    ("trl: trainer_state over 64 MiB", ["account", "--from-trl", "{tmp}/trl_huge"],
     ["trainer_state.json", "over the limit of 64 MiB"]),
    ("trl: trainer_state nested 100000 deep", ["account", "--from-trl", "{tmp}/trl_deep"],
     ["trainer_state.json", "nested deeper than the limit of 64 levels"]),
    ("trl: trainer_state number of 5000 digits", ["account", "--from-trl", "{tmp}/trl_digits"],
     ["trainer_state.json", "a number of 5000 characters", "over the limit of 64"]),
    ("trl: pickle asks for a 2 GB bytearray", ["account", "--from-trl", "{tmp}/trl_bytearray"],
     ["training_args.bin", "bytearray(2000000000)", "over the limit of 16 MiB"]),
    ("trl: pickle of shared lists expanding to 2**39 values", ["account", "--from-trl", "{tmp}/trl_laughs"],
     ["training_args.bin", "more than the limit of 100000 values"]),
    ("trl: pickle nested 10000 deep", ["account", "--from-trl", "{tmp}/trl_pdeep"],
     ["training_args.bin", "nested deeper than the limit of 64 levels"]),
    ("trl: archive member declaring 3 GB", ["account", "--from-trl", "{tmp}/trl_zip"],
     ["training_args.bin", "declares 3000000000 bytes", "over the limit of 16 MiB"]),
    ("trl: archive member larger than it declares", ["account", "--from-trl", "{tmp}/trl_zip_lies"],
     ["training_args.bin", "not a readable zip archive"]),
    ("trl: num_generations a string", ["account", "--from-trl", "{tmp}/trl_str"],
     ["num_generations='8'", "must be a number, not str"]),
    ("trl: zero batch size", ["account", "--from-trl", "{tmp}/trl_zero"],
     ["per_device_train_batch_size=0", "whole number >= 1"]),
    ("trl: num_iterations out of float range", ["account", "--from-trl", "{tmp}/trl_inf"],
     ["num_iterations=inf", "whole number >= 1"]),
    ("trl: LoRA r a string", ["account", "--from-trl", "{tmp}/trl_lora"], ["adapter_config.json", "r='8'", "1 to 65536"]),
    # ---- account --from-verl
    ("verl: log over 512 MiB", ["account", "--from-verl", "{tmp}/verl_huge.log"],
     ["verl_huge.log", "over the limit of 512 MiB"]),
    ("verl: a 2 MiB line", ["account", "--from-verl", "{tmp}/verl_line.log"],
     ["verl_line.log", "line 1 is longer than the limit of 1 MiB"]),
    ("verl: batch size a string", ["account", "--from-verl", "{tmp}/verl_str.log"],
     ["data.train_batch_size='abc'", "must be a number"]),
    ("verl: zero mini-batch", ["account", "--from-verl", "{tmp}/verl_zero.log"],
     ["ppo_mini_batch_size=0", "whole number >= 1"]),
    ("verl: step out of float range", ["account", "--from-verl", "{tmp}/verl_inf.jsonl"],
     ["line 1", "step=inf", "from 0 to 2**31"]),
    ("verl: NaN response length", ["account", "--from-verl", "{tmp}/verl_nan.log"],
     ["response_length/mean=nan", "not a finite number"]),
    ("verl: JSON line nested 100000 deep", ["account", "--from-verl", "{tmp}/verl_deep.jsonl"],
     ["verl_deep.jsonl:1", "nested deeper than the limit of 64 levels"]),
    # ---- account --lengths
    ("lengths: file over 512 MiB", ["account", "--lengths", "{tmp}/len_huge.csv"],
     ["len_huge.csv", "over the limit of 512 MiB"]),
    ("lengths: 40-digit token count", ["account", "--lengths", "{tmp}/len_digits.csv"],
     ["line 2", "completion_tokens=", "from 1 to 2**31"]),
    ("lengths: JSON line nested 100000 deep", ["account", "--lengths", "{tmp}/len_deep.jsonl"],
     ["len_deep.jsonl:1", "nested deeper than the limit of 64 levels"]),
    # ---- study --spec / --set / --storage
    ("spec: over 1 MiB", ["study", "--spec", "{tmp}/spec_huge.toml"], ["spec_huge.toml", "over the limit of 1 MiB"]),
    ("spec: nested 2000 deep", ["study", "--spec", "{tmp}/spec_deep.toml"],
     ["spec_deep.toml", "nested deeper than the limit of 64 levels"]),
    ("spec: integer of 5000 digits", ["study", "--spec", "{tmp}/spec_digits.toml"], ["spec_digits.toml", "malformed TOML"]),
    ("spec: quoted budget", ["study", "--spec", "{tmp}/spec_str.toml"], ["budget_flops='1e19'", "unquoted"]),
    ("spec: study name with a newline", ["study", "--spec", "{tmp}/spec_nl.toml"],
     ["name='a\\nerror: forged'", "printable"]),
    ("study: --study-name with a control character", ["study", *SYN, "--budget", "1e18", "--study-name", "a\x1b[2Jb"],
     ["name='a\\x1b[2Jb'", "printable"]),
    ("spec: a reward system 100000 times", ["study", "--spec", "{tmp}/spec_dup.toml"],
     ["space.rewards", "'sparse' given more than once", "100000 values, 1 distinct"]),
    ("study: --set of an unknown setting", ["study", *SYN, "--budget", "1e18", "--set", "nosuch=1"],
     ["--set: objective_settings: setting 'nosuch': unknown for objective synthetic", "allowed: "]),
    ("study: --set of an unknown setting, dry run", ["study", *SYN, "--budget", "1e18", "--set", "nosuch=1", "--dry-run"],
     ["--set: objective_settings: setting 'nosuch': unknown for objective synthetic", "allowed: "]),
    ("study: --set of a bad value, dry run", ["study", "--objective", "tiny", "--budget", "1e12", "--set=lora_rank=-1",
                                              "--dry-run"], ["--set: lora_rank=-1", ">= 0"]),
    ("study: --set of a model path that is not there", ["study", "--budget", "1e19", "--set", "model=/nonexistent",
                                                        "--dry-run"], ["--set: model='/nonexistent'", "no such local path"]),
    ("study: --set NaN", ["study", *SYN, "--budget", "1e18", "--set", "noise=nan"], ["--set noise=nan", "finite"]),
    ("study: --set negative noise", ["study", *SYN, "--budget", "1e18", "--set", "noise=-1"], ["noise=-1", "[0, 1]"]),
    ("study: --set nested 2000 deep", ["study", *SYN, "--budget", "1e18", "--set", "k=" + "[" * 2000 + "]" * 2000],
     ["--set k", "nested deeper than the limit of 64"]),
    ("study: in-memory storage", ["study", *SYN, "--budget", "1e18", "--storage", "sqlite://"],
     ["storage='sqlite://'", "in-memory", "vanish"]),
    ("race: in-memory storage", ["race", *SYN, "--budget", "1e18", "--storage", "sqlite:///:memory:"],
     ["storage='sqlite:///:memory:'", "in-memory"]),
    ("ask: -n below 1", ["ask", "--study", "x", "-n", "-2"], ["-n: num=-2", "1..1000"]),
    ("ask: in-memory storage", ["ask", "--study", "x", "--storage", "sqlite://", "--objective", "synthetic",
                                "--budget", "1e18", "--target", "pass@1"], ["storage='sqlite://'", "in-memory"]),
    ("study: another tool's database", ["study", *SYN, "--budget", "1e18", "--storage", "sqlite:///{tmp}/other.db",
                                        "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage=", "other.db", "another tool's SQLite database", "tables: users"]),
    ("study: a file that is no database", ["study", *SYN, "--budget", "1e18", "--storage", "sqlite:///{tmp}/nob.toml",
                                           "--mlflow-uri", "sqlite:///{tmp}/m.db"],
     ["storage=", "nob.toml", "not an Optuna storage"]),
    # ---- tell --metrics
    ("tell: metrics over 1 MiB", ["tell", *T, "--metrics", "{tmp}/m_huge.json"], ["m_huge.json", "over the limit of 1 MiB"]),
    ("tell: metrics nested 100000 deep", ["tell", *T, "--metrics", "{tmp}/m_deep.json"],
     ["m_deep.json", "nested deeper than the limit of 64"]),
    ("tell: pass@1 = 52", ["tell", *T, "--metrics", "{tmp}/m_52.json"], ["pass@1=52", "share in [0, 1]"]),
    ("tell: pass@1 = -3", ["tell", *T, "--metrics", "{tmp}/m_neg.json"], ["pass@1=-3", "share in [0, 1]"]),
    ("tell: pass@1 a string", ["tell", *T, "--metrics", "{tmp}/m_str.json"], ["pass@1='0.5'", "finite number"]),
    ("tell: 1e300 FLOPs", ["tell", *T, "--metrics", "{tmp}/m_absurd.json"], ["search_flops=1e+300", "from 0 to 1e+30"]),
    ("tell: negative FLOPs", ["tell", *T, "--metrics", "{tmp}/m_negflops.json"], ["learning_flops=-1", "from 0 to"]),
    ("tell: FLOPs out of float range", ["tell", *T, "--metrics", "{tmp}/m_inf.json"], ["search_flops=inf", "from 0 to"]),
]

# Every reader of a user's file through the one reading layer (allocopt.limits), per kind:
# deep nesting, a huge file, a FIFO, a device, a long number, numbers in other scripts, zero or
# non-numeric counts in foreign logs, a backtracking pattern, 100,000 repeated entries. Files
# made by ``_layer_files``; benchmarks/bad_input.py measures each row's time and memory.
TT = ["trial", "--objective", "tiny-table", "--budget", "3e11", "--rho", "0.5", "-G", "2", "--reward", "sparse",
      "--set"]
TP = ["plan", "--budget-gpu-hours", "1", "--rho", "0.5", "--throughput"]
LAYER_ROWS = [
    # ---- verl
    ("verl: a FIFO", ["account", "--from-verl", "{tmp}/fifo.log"], ["fifo.log", "is a FIFO", "allowed: a regular file"]),
    ("verl: a device", ["account", "--from-verl", "/dev/zero"], ["/dev/zero", "is a character device"]),
    ("verl: a folder", ["account", "--from-verl", "{tmp}"], ["is a folder", "allowed: a regular file"]),
    ("verl: a 100-digit length", ["account", "--from-verl", "{tmp}/verl_long.log"],
     ["line 4: response_length/mean", "ASCII digits", "at most 64 characters"]),
    ("verl: a length in Arabic-Indic digits", ["account", "--from-verl", "{tmp}/verl_script.log"],
     ["response_length/mean='١٢٣'", "ASCII digits"]),
    ("verl: G zero", ["account", "--from-verl", "{tmp}/verl_n0.log"], ["actor_rollout_ref.rollout.n=0", "whole number >= 1"]),
    ("verl: DAPO zero generation batches", ["account", "--from-verl", "{tmp}/verl_gen0.log"],
     ["step 1", "train/num_gen_batches=0", "whole number >= 1"]),
    ("verl: batch size in Arabic-Indic digits", ["account", "--from-verl", "{tmp}/verl_batch_script.log"],
     ["data.train_batch_size='١٢٨'", "must be a number, not str"]),
    ("verl: one step 100000 times", ["account", "--from-verl", "{tmp}/verl_rep.log"],
     ["step 1 logged more than 1000 times"]),
    # ---- TRL
    ("trl: trainer_state a FIFO", ["account", "--from-trl", "{tmp}/trl_fifo"], ["trainer_state.json", "is a FIFO"]),
    ("trl: trainer_state a link to /dev/zero", ["account", "--from-trl", "{tmp}/trl_dev"],
     ["trainer_state.json", "is a character device"]),
    ("trl: a length in Arabic-Indic digits", ["account", "--from-trl", "{tmp}/trl_script", "--model", "Qwen/Qwen2.5-0.5B"],
     ["completions/mean_length='١٢'", "ASCII digits"]),
    ("trl: no process count anywhere", ["account", "--from-trl", "{tmp}/trl_noworld", "--model", "Qwen/Qwen2.5-0.5B"],
     ["process count is not in training_args.bin", "pass --prompts"]),
    ("trl: a backtracking rank_pattern", ["account", "--from-trl", "{tmp}/trl_regex"],
     ["adapter_config.json: rank_pattern", "(a+)+$", "repeats or alternates"]),
    ("trl: one step 100000 times", ["account", "--from-trl", "{tmp}/trl_rep", "--model", "Qwen/Qwen2.5-0.5B"],
     ["log_history: step 1 logged more than 1000 times"]),
    ("trl: a key twice", ["account", "--from-trl", "{tmp}/trl_dupkey"], ["key 'log_history' given more than once"]),
    # ---- OpenRLHF
    ("openrlhf: a FIFO", ["account", "--from-openrlhf", "{tmp}/fifo_o.log"], ["fifo_o.log", "is a FIFO"]),
    ("openrlhf: a device", ["account", "--from-openrlhf", "/dev/zero"], ["is a character device"]),
    ("openrlhf: log over 512 MiB", ["account", "--from-openrlhf", "{tmp}/o_huge.log"], ["over the limit of 512 MiB"]),
    ("openrlhf: zero train batch", ["account", "--from-openrlhf", "{tmp}/o_zero.log"], ["train.batch_size=0", "whole number >= 1"]),
    ("openrlhf: batch not a number", ["account", "--from-openrlhf", "{tmp}/o_str.log"],
     ["rollout.batch_size='abc'", "must be a number, not str"]),
    ("openrlhf: batch of 70 digits", ["account", "--from-openrlhf", "{tmp}/o_long.log"],
     ["rollout.batch_size='1111", "must be a number, not str"]),
    ("openrlhf: zero rows in a step", ["account", "--from-openrlhf", "{tmp}/o_rows0.log"],
     ["step 1", "rollout/num_samples=0", "whole number >= 1"]),
    ("openrlhf: one step 100000 times", ["account", "--from-openrlhf", "{tmp}/o_rep.log"],
     ["Global step 1 logged more than 1000 times"]),
    # ---- NeMo-RL
    ("nemo-rl: an event file that is a FIFO", ["account", "--from-nemo-rl", "{tmp}/nemo_fifo"], ["events.out.tfevents", "is a FIFO"]),
    ("nemo-rl: a device", ["account", "--from-nemo-rl", "/dev/zero"], ["is a character device"]),
    ("nemo-rl: event files over 128 MiB", ["account", "--from-nemo-rl", "{tmp}/nemo_huge"], ["over the limit of 128 MiB"]),
    ("nemo-rl: zero prompts per step", ["account", "--from-nemo-rl", "{tmp}/nemo_zero"],
     ["grpo.num_prompts_per_step=0", "whole number >= 1"]),
    ("nemo-rl: one scalar 100000 times", ["account", "--from-nemo-rl", "{tmp}/nemo_rep"],
     ["train/mean_gen_tokens_per_sample at step 1 logged more than 1000 times"]),
    # ---- study file
    ("spec: a FIFO", ["study", "--spec", "{tmp}/fifo.toml"], ["fifo.toml", "is a FIFO"]),
    ("spec: a device", ["study", "--spec", "/dev/zero"], ["is a character device"]),
    ("spec: an integer of 4000 digits", ["study", "--spec", "{tmp}/spec_4000.toml"],
     ["spec_4000.toml", "more than 64 digits"]),
    ("spec: a budget in Arabic-Indic digits", ["study", "--spec", "{tmp}/spec_script.toml"], ["spec_script.toml", "malformed TOML"]),
    # ---- tell --metrics
    ("tell: metrics a FIFO", ["tell", *T, "--metrics", "{tmp}/fifo.json"], ["fifo.json", "is a FIFO"]),
    ("tell: metrics a device", ["tell", *T, "--metrics", "/dev/zero"], ["is a character device"]),
    ("tell: a 70-digit number", ["tell", *T, "--metrics", "{tmp}/m_long.json"], ["a number of 70 characters", "over the limit of 64"]),
    ("tell: a key 100000 times", ["tell", *T, "--metrics", "{tmp}/m_rep.json"], ["key 'a' given more than once"]),
    # ---- throughput profiles
    ("throughput: a FIFO", [*TP, "{tmp}/fifo_tp.json"], ["fifo_tp.json", "is a FIFO"]),
    ("throughput: a device", [*TP, "/dev/zero"], ["is a character device"]),
    ("throughput: over 1 MiB", [*TP, "{tmp}/tp_huge.json"], ["over the limit of 1 MiB"]),
    ("throughput: nested 100000 deep", [*TP, "{tmp}/tp_deep.json"], ["nested deeper than the limit of 64"]),
    ("throughput: a 70-digit rate", [*TP, "{tmp}/tp_long.json"], ["a number of 70 characters"]),
    ("throughput: a key 100000 times", [*TP, "{tmp}/tp_rep.json"], ["key 'a' given more than once"]),
    ("throughput: zero GPUs", [*TP, "{tmp}/tp_gpus0.json"], ["throughput.gpus=0", "from 1 to"]),
    # ---- tiny-table's table
    ("tiny-table: a FIFO", [*TT, "table={tmp}/fifo.csv"], ["fifo.csv", "is a FIFO"]),
    ("tiny-table: a device", [*TT, "table=/dev/zero"], ["is a character device"]),
    ("tiny-table: over 64 MiB", [*TT, "table={tmp}/tt_huge.csv"], ["over the limit of 64 MiB"]),
    ("tiny-table: a 70-digit budget", [*TT, "table={tmp}/tt_long.csv"], ["line 2: budget_flops", "at most 64 characters"]),
    ("tiny-table: G in Arabic-Indic digits", [*TT, "table={tmp}/tt_script.csv"], ["line 2: group_size='٢'", "ASCII digits"]),
    ("tiny-table: G not a number", [*TT, "table={tmp}/tt_str.csv"], ["group_size='two'", "whole number from 1 to 65536"]),
    ("tiny-table: one trial 100000 times", [*TT, "table={tmp}/tt_rep.csv"], ["a trial logged more than 1000 times"]),
    ("tiny-table: 13 group sizes", [*TT, "table={tmp}/tt_groups.csv"], ["13 distinct group sizes", "at most 12"]),
    # ---- lengths files
    ("lengths: a FIFO", ["account", "--lengths", "{tmp}/fifo.csv"], ["fifo.csv", "is a FIFO"]),
    ("lengths: a device", ["account", "--lengths", "/dev/zero"], ["is a character device"]),
    ("lengths: a length in Arabic-Indic digits", ["account", "--lengths", "{tmp}/len_script.csv"],
     ["completion_tokens='١٠٣'", "ASCII digits"]),
]

# The ``command`` objective's metrics file, written by the user's command (tests/data's
# ``bad_metrics.sh`` writes each kind): the trial fails in one line naming the file and the
# trial's folder (``trial`` exits 1), nothing else runs.
CMD = ["trial", "--objective", "command", "--set", "log=metrics", "--set", "timeout_s=60",
       "--budget", "1e16", "--rho", "0.5", "-G", "4", "--reward", "sparse", "--set"]
FAILED_TRIAL_ROWS = [
    (f"command metrics: {kind}", [*CMD, f"out_dir={{tmp}}/trials-out/{kind}", "--set",
                                  f"command=sh {{tmp}}/bad_metrics.sh {{trial_dir}} {kind}"], needles)
    for kind, needles in (("fifo", ["is a FIFO"]), ("device", ["is a character device"]),
                          ("deep", ["nested deeper than the limit of 64"]),
                          ("huge", ["over the limit of 1 MiB"]), ("long", ["a number of 71 characters"]),
                          ("repeated", ["key 'a' given more than once"]))]

STRANGER_ROWS += LAYER_ROWS


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("bad"))


def make_folder(tmp: Path) -> Path:
    """``tmp`` with every file the rows name (``{tmp}``); also used by benchmarks/bad_input.py."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(storage=f"sqlite:///{tmp}/s.db", study_name="s")
    (tmp / "nob.toml").write_text('name = "nob"\nobjective = "synthetic"\ntrials = 2\n')
    (tmp / "two.toml").write_text('objective = "synthetic"\nbudget_flops = 1e18\ntarget = ["pass@1", "judge"]\n')
    (tmp / "kg.toml").write_text('objective = "synthetic"\nbudget_flops = 1e18\ntarget = "pass@1"\n'
                                 'initial_design = true\n')
    (tmp / "pf.toml").write_text('name = "pf"\nobjective = "synthetic"\nbudget_flops = 1e18\npilot_fraction = "0.25"\n')
    (tmp / "sizes.toml").write_text('name = "sizes"\nobjective = "synthetic"\nbudget_flops = 1e19\n[space]\n'
                                    'models = ["Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B"]\n')
    _stranger_files(tmp)
    _layer_files(tmp)
    return tmp


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that takes no disk (a hole)."""
    with open(path, "wb") as f:
        f.truncate(size)


def _zip_declaring(path: Path, declared: int, actual: bytes) -> None:
    """A torch-style zip whose ``archive/data.pkl`` holds ``actual`` (deflated) while its central
    directory declares ``declared`` bytes."""
    import io
    import struct
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", actual)
    raw = bytearray(buf.getvalue())
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 24:cd + 28] = struct.pack("<I", declared)  # central directory: uncompressed size
    path.write_bytes(bytes(raw))


def _stranger_files(tmp: Path) -> None:
    """The files of STRANGER_ROWS, each wrong in one way."""
    import json
    import pickle
    import sqlite3

    state = json.dumps({"log_history": [{"step": 1, "completions/mean_length": 10.0}]})

    def trl(name: str, args: bytes | None = None, state_text: str = state, adapter: dict | None = None) -> Path:
        d = tmp / name
        d.mkdir()
        (d / "trainer_state.json").write_text(state_text)
        if args is not None:
            (d / "training_args.bin").write_bytes(args)
        if adapter is not None:
            (d / "adapter_config.json").write_text(json.dumps(adapter))
        return d

    _sparse(trl("trl_huge") / "trainer_state.json", 64 * 2**20 + 1)
    trl("trl_deep", state_text="[" * 100_000 + "]" * 100_000)
    trl("trl_digits", state_text='{"log_history": [{"step": ' + "1" * 5000 + "}]}")
    # REDUCE builtins.bytearray((2000000000,)): 30 bytes that ask for 2 GB
    trl("trl_bytearray", b"\x80\x02cbuiltins\nbytearray\nJ\x00\x94\x35\x77\x85R.")
    laughs = bytearray(b"\x80\x02]q\x00K\x01a")  # L0 = [1]; L(i) = (L(i-1), L(i-1)): 2**39 leaves
    for i in range(1, 40):
        laughs += b"h%c" % (i - 1) + b"h%c" % (i - 1) + b"\x86q%c" % i
    trl("trl_laughs", bytes(laughs) + b".")
    trl("trl_pdeep", b"\x80\x02" + b"]" * 10_000 + b"a" * 9_999 + b".")
    _zip_declaring(trl("trl_zip", b"") / "training_args.bin", 3_000_000_000, pickle.dumps({"beta": 0.0}))
    _zip_declaring(trl("trl_zip_lies", b"") / "training_args.bin", 1000, b"\0" * (20 * 2**20))
    trl("trl_str", pickle.dumps({"num_generations": "8"}, protocol=2))
    trl("trl_zero", pickle.dumps({"per_device_train_batch_size": 0}, protocol=2))
    trl("trl_inf", pickle.dumps({"num_iterations": float("inf")}, protocol=2))
    trl("trl_lora", adapter={"r": "8", "base_model_name_or_path": "Qwen/Qwen2.5-0.5B"})

    cfg = "data.train_batch_size=4\nactor_rollout_ref.rollout.n=2\nactor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B\n"
    _sparse(tmp / "verl_huge.log", 512 * 2**20 + 1)
    (tmp / "verl_line.log").write_text("x" * (2 * 2**20))
    (tmp / "verl_str.log").write_text("data.train_batch_size=abc\nstep:1 - response_length/mean:10 - prompt_length/mean:5\n")
    (tmp / "verl_zero.log").write_text(cfg + "actor_rollout_ref.actor.ppo_mini_batch_size=0\n"
                                       "step:1 - response_length/mean:10 - prompt_length/mean:5\n")
    (tmp / "verl_inf.jsonl").write_text('{"step": 1e400, "data": {"response_length/mean": 1}}\n')
    (tmp / "verl_nan.log").write_text(cfg + "step:1 - response_length/mean:nan - prompt_length/mean:5\n")
    (tmp / "verl_deep.jsonl").write_text('{"step": 1, "data": ' + "[" * 100_000 + "]" * 100_000 + "}\n")

    _sparse(tmp / "len_huge.csv", 512 * 2**20 + 1)
    (tmp / "len_digits.csv").write_text("prompt_tokens,completion_tokens\n1," + "9" * 40 + "\n")
    (tmp / "len_deep.jsonl").write_text("{" + '"a":[' * 1 + "[" * 100_000 + "]" * 100_000 + "]}\n")

    head = 'objective = "synthetic"\ntarget = "pass@1"\n'
    _sparse(tmp / "spec_huge.toml", 2**20 + 1)
    (tmp / "spec_deep.toml").write_text(head + 'name = "x"\nbudget_flops = 1e18\n[objective_settings]\na = '
                                        + "[" * 2000 + "]" * 2000 + "\n")
    (tmp / "spec_digits.toml").write_text(head + 'name = "x"\nbudget_flops = 1' + "0" * 5000 + "\n")
    (tmp / "spec_str.toml").write_text(head + 'name = "x"\nbudget_flops = "1e19"\n')
    (tmp / "spec_nl.toml").write_text(head + 'name = "a\\nerror: forged"\nbudget_flops = 1e18\n')
    (tmp / "spec_dup.toml").write_text(head + 'name = "x"\nbudget_flops = 1e18\n[space]\nrewards = ['
                                       + ",".join(['"sparse"'] * 100_000) + "]\n")

    con = sqlite3.connect(tmp / "other.db")
    con.execute("CREATE TABLE users (name TEXT)")
    con.commit()
    con.close()

    good = {"search_flops": 3e17, "learning_flops": 5e17, "reward_flops": 0}
    _sparse(tmp / "m_huge.json", 2**20 + 1)
    (tmp / "m_deep.json").write_text("[" * 100_000 + "]" * 100_000)
    for name, doc in (("m_52", {"pass@1": 52, **good}), ("m_neg", {"pass@1": -3, **good}),
                      ("m_str", {"pass@1": "0.5", **good}),
                      ("m_absurd", {"pass@1": 0.5, **good, "search_flops": 1e300}),
                      ("m_negflops", {"pass@1": 0.5, **good, "learning_flops": -1})):
        (tmp / f"{name}.json").write_text(json.dumps(doc))
    (tmp / "m_inf.json").write_text('{"pass@1": 0.5, "search_flops": 1e400, "learning_flops": 1, "reward_flops": 0}')
    # a study "t" with trial 0 reserved by ask (what tell rows try to record)
    from allocopt.cli import main

    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        main(["ask", "--study", "t", "--storage", f"sqlite:///{tmp}/t.db", "--objective", "synthetic",
              "--budget", "1e18", "--target", "pass@1", "--out", str(tmp / "asked"), "--json"])
    except SystemExit as e:
        assert e.code in (0, None), e.code
    finally:
        os.chdir(cwd)


def _layer_files(tmp: Path) -> None:
    """The files of LAYER_ROWS and FAILED_TRIAL_ROWS, each wrong in one way."""
    for name in ("fifo.log", "fifo_o.log", "fifo.toml", "fifo.json", "fifo_tp.json", "fifo.csv"):
        os.mkfifo(tmp / name)
    _foreign_log_files(tmp)
    _trl_layer_files(tmp)
    _event_layer_files(tmp)
    _table_layer_files(tmp)
    (tmp / "spec_4000.toml").write_text('name = "x"\nobjective = "synthetic"\ntarget = "pass@1"\n'
                                        "budget_flops = 1" + "0" * 3999 + "\n")
    (tmp / "spec_script.toml").write_text('name = "x"\nobjective = "synthetic"\nbudget_flops = ١e18\n')
    (tmp / "m_long.json").write_text('{"pass@1": 0.5, "search_flops": 1' + "0" * 69
                                     + ', "learning_flops": 1, "reward_flops": 0}')
    (tmp / "m_rep.json").write_text("{" + ", ".join(['"a": 1'] * 100_000) + "}")
    prof = '{"gpu": "H100", "setup_fingerprint": "*", "search_prefill": 1e14, "search_decode": 1e14, '
    _sparse(tmp / "tp_huge.json", 2**20 + 1)
    (tmp / "tp_deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "tp_long.json").write_text(prof + '"learning": 1' + "0" * 69 + "}")
    (tmp / "tp_rep.json").write_text("{" + ", ".join(['"a": 1'] * 100_000) + "}")
    (tmp / "tp_gpus0.json").write_text(prof + '"learning": 1e14, "gpus": 0}')
    (tmp / "len_script.csv").write_text("prompt_tokens,completion_tokens\n103,١٠٣\n")
    (tmp / "trials-out").mkdir()
    (tmp / "bad_metrics.sh").write_text(BAD_METRICS)


BAD_METRICS = """d="$1/metrics.json"
case "$2" in
fifo) mkfifo "$d";;
device) ln -s /dev/zero "$d";;
deep) python3 -c "print('[' * 100000 + ']' * 100000)" > "$d";;
huge) head -c 2097152 /dev/zero > "$d";;
long) echo '{"pass@1": 0.5, "search_flops": 1'"$(printf '0%.0s' $(seq 70))"', "learning_flops": 1, "reward_flops": 0}' > "$d";;
repeated) python3 -c "print('{' + ', '.join(['\\"a\\": 1'] * 100000) + '}')" > "$d";;
esac
"""
"""The ``command`` of FAILED_TRIAL_ROWS: writes the metrics file wrong in the way ``$2`` names."""


def _foreign_log_files(tmp: Path) -> None:
    """verl and OpenRLHF console logs of LAYER_ROWS."""
    cfg = "data.train_batch_size=4\nactor_rollout_ref.rollout.n=2\nactor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B\n"
    step = "step:1 - response_length/mean:10 - prompt_length/mean:5\n"
    (tmp / "verl_long.log").write_text(cfg + "step:1 - response_length/mean:" + "1" * 100 + " - prompt_length/mean:5\n")
    (tmp / "verl_script.log").write_text(cfg + "step:1 - response_length/mean:١٢٣ - prompt_length/mean:5\n")
    (tmp / "verl_n0.log").write_text(cfg.replace("rollout.n=2", "rollout.n=0") + step)
    (tmp / "verl_gen0.log").write_text(cfg + "algorithm.filter_groups.enable=True\ndata.gen_batch_size=8\n"
                                       + step.replace("\n", " - train/num_gen_batches:0\n"))
    (tmp / "verl_batch_script.log").write_text(cfg.replace("batch_size=4", "batch_size=١٢٨") + step)
    (tmp / "verl_rep.log").write_text(cfg + step * 100_000)
    flags = ("--actor.model_name_or_path Qwen/Qwen2.5-0.5B --rollout.n_samples_per_prompt 2 "
             "--algo.advantage.estimator group_norm ")
    gstep = "Global step 1: {'response_length': 10.0, 'total_length': 20.0}\n"
    _sparse(tmp / "o_huge.log", 512 * 2**20 + 1)
    (tmp / "o_zero.log").write_text(flags + "--rollout.batch_size 4 --train.batch_size 0\n" + gstep)
    (tmp / "o_str.log").write_text(flags + "--rollout.batch_size abc\n" + gstep)
    (tmp / "o_long.log").write_text(flags + "--rollout.batch_size " + "1" * 70 + "\n" + gstep)
    (tmp / "o_rows0.log").write_text(flags + "--rollout.batch_size 4\n"
                                     + gstep.replace("20.0}", "20.0, 'rollout/num_samples': 0}"))
    (tmp / "o_rep.log").write_text(flags + "--rollout.batch_size 4\n" + gstep * 100_000)


def _trl_layer_files(tmp: Path) -> None:
    """TRL output folders of LAYER_ROWS (one process, so the account reaches the field)."""
    import json
    import pickle

    one = pickle.dumps({"distributed_state": {"num_processes": 1}}, protocol=2)

    def trl(name: str, state: str, args: bytes | None = one, adapter: dict | None = None) -> Path:
        d = tmp / name
        d.mkdir()
        (d / "trainer_state.json").write_text(state)
        if args is not None:
            (d / "training_args.bin").write_bytes(args)
        if adapter is not None:
            (d / "adapter_config.json").write_text(json.dumps(adapter))
        return d

    rec = {"step": 1, "completions/mean_length": 5.0}
    for name in ("trl_fifo", "trl_dev"):
        (tmp / name).mkdir()
    os.mkfifo(tmp / "trl_fifo" / "trainer_state.json")
    (tmp / "trl_dev" / "trainer_state.json").symlink_to("/dev/zero")
    trl("trl_script", json.dumps({"log_history": [{"step": 1, "completions/mean_length": "١٢"}]}))
    trl("trl_noworld", json.dumps({"log_history": [rec]}), args=pickle.dumps({}, protocol=2))
    trl("trl_regex", json.dumps({"log_history": [rec]}),
        adapter={"r": 4, "target_modules": ["q_proj"], "rank_pattern": {"(a+)+$": 8},
                 "base_model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    trl("trl_rep", json.dumps({"log_history": [rec] * 100_000}))
    trl("trl_dupkey", '{"log_history": [], "log_history": []}')


def _event_file(folder: Path, hparams: dict, scalars: list[tuple[str, int, float]], repeat_last: int = 1) -> None:
    """An event file in ``folder`` as ``torch.utils.tensorboard.SummaryWriter`` writes it
    (TFRecords of ``Event`` messages: hparams through the hparams plugin, scalars as
    ``simple_value``), its last record written ``repeat_last`` times."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    folder.mkdir(parents=True)
    info = plugin_data_pb2.SessionStartInfo()
    for k, v in hparams.items():
        if isinstance(v, str):
            info.hparams[k].string_value = v
        else:
            info.hparams[k].number_value = v
    events = [event_pb2.Event(file_version="brain.Event:2")]
    e = events[0].__class__()
    value = e.summary.value.add(tag="_hparams_/session_start_info")
    value.metadata.plugin_data.plugin_name = "hparams"
    value.metadata.plugin_data.content = plugin_data_pb2.HParamsPluginData(
        session_start_info=info, version=0).SerializeToString()
    events.append(e)
    for tag, step, x in scalars:
        e = event_pb2.Event(step=step)
        e.summary.value.add(tag=tag, simple_value=x)
        events.append(e)
    with open(folder / "events.out.tfevents.1.host.1.0", "wb") as f:
        w = RecordWriter(f)
        for ev in events[:-1]:
            w.write(ev.SerializeToString())
        for _ in range(repeat_last):
            w.write(events[-1].SerializeToString())


def _event_layer_files(tmp: Path) -> None:
    """NeMo-RL TensorBoard folders of LAYER_ROWS."""
    hp = {"grpo.num_prompts_per_step": 4, "grpo.num_generations_per_prompt": 2, "policy.model_name": "Qwen/Qwen2.5-0.5B"}
    lengths = [("train/mean_prompt_length", 1, 50.0), ("train/mean_gen_tokens_per_sample", 1, 100.0)]
    (tmp / "nemo_fifo").mkdir()
    os.mkfifo(tmp / "nemo_fifo" / "events.out.tfevents.1.host.1.0")
    (tmp / "nemo_huge").mkdir()
    _sparse(tmp / "nemo_huge" / "events.out.tfevents.1.host.1.0", 128 * 2**20 + 1)
    _event_file(tmp / "nemo_zero", {**hp, "grpo.num_prompts_per_step": 0}, lengths)
    _event_file(tmp / "nemo_rep", hp, lengths, repeat_last=100_000)


def _table_layer_files(tmp: Path) -> None:
    """tiny-table tables of LAYER_ROWS (the grid's columns; one complete row, changed)."""
    head = ("reward,group_size,rho,fidelity,budget_flops,seed,status,native_reward,pass_at_1,judge,"
            "search_flops,learning_flops,reward_flops\n")
    row = "sparse,{g},0.5,full,{b},0,complete,0.5,0.5,0.5,1e11,1e11,0\n"
    ok = row.format(g=2, b="3e11")
    _sparse(tmp / "tt_huge.csv", 64 * 2**20 + 1)
    (tmp / "tt_long.csv").write_text(head + row.format(g=2, b="3" + "0" * 69))
    (tmp / "tt_script.csv").write_text(head + row.format(g="٢", b="3e11"))
    (tmp / "tt_str.csv").write_text(head + row.format(g="two", b="3e11"))
    (tmp / "tt_rep.csv").write_text(head + ok * 100_000)
    (tmp / "tt_groups.csv").write_text(head + "".join(row.format(g=g, b="3e11") for g in range(2, 15)))


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def test_at_least_40_kinds_over_every_command():
    commands = {args[0] for _, args, _ in ROWS}
    assert len(ROWS) >= 40 and commands >= {"account", "plan", "trial", "study", "race", "best", "pareto", "report"}
    assert {args[0] for _, args, _ in STRANGER_ROWS} >= {"account", "study", "race", "ask", "tell"}
    assert len({kind for kind, _, _ in ROWS + STRANGER_ROWS}) == len(ROWS + STRANGER_ROWS)  # kinds named once


def _check(kind, r, needles):
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2, (kind, r.returncode, lines[-5:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (kind, lines[:5])
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[0], (kind, needle, lines[0])


@contextlib.contextmanager
def _address_space_grows_at_most(extra: int):
    """This process may map at most ``extra`` more bytes inside the block (``RLIMIT_AS``'s soft
    limit, restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as f:
        vm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    limit = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


ALL_ROWS = ROWS + STRANGER_ROWS


@pytest.mark.parametrize("kind,args,needles", ALL_ROWS, ids=[r[0] for r in ALL_ROWS])
def test_bad_input_is_one_line_exit_2(folder, kind, args, needles, cli):
    before = sorted(p.name for p in folder.iterdir())
    argv = [a.replace("{tmp}", str(folder)) for a in args]
    t0 = time.perf_counter()
    with _address_space_grows_at_most(MEMORY_LIMIT):
        r = cli(*argv, cwd=folder, env={"COLUMNS": "200"})
    assert time.perf_counter() - t0 < TIMEOUT_S, kind
    _check(kind, r, needles)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing recorded, nothing created


@pytest.mark.parametrize("kind,args,needles", FAILED_TRIAL_ROWS, ids=[r[0] for r in FAILED_TRIAL_ROWS])
def test_a_bad_metrics_file_fails_its_trial_in_one_line(folder, kind, args, needles, cli, command_objective):
    """The command ran and wrote its metrics file wrong: the trial fails (exit 1) with one
    ``error:`` line naming the file, what is allowed and the trial's folder, no traceback, at
    once (a FIFO is not waited on, a device not read), in bounded memory."""
    argv = [a.replace("{tmp}", str(folder)) for a in args]
    with _address_space_grows_at_most(MEMORY_LIMIT):
        r = cli(*argv, cwd=folder, env={"COLUMNS": "200"})
    errors = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("error: ")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, (kind, r.stderr[-2000:])
    assert "trial failed" in errors[0] and "metrics_file=" in errors[0] and "trial folder" in errors[0]
    for needle in needles:
        assert needle in errors[0], (kind, needle, errors[0])


FIRST_OF_EACH_COMMAND = [r for i, r in enumerate(ALL_ROWS) if r[1][0] not in {x[1][0] for x in ALL_ROWS[:i]}]


@pytest.mark.parametrize("kind,args,needles", FIRST_OF_EACH_COMMAND, ids=[r[0] for r in FIRST_OF_EACH_COMMAND])
def test_bad_input_is_one_line_exit_2_in_a_fresh_process(folder, kind, args, needles):
    before = sorted(p.name for p in folder.iterdir())
    argv = [a.replace("{tmp}", str(folder)) for a in args]
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", *argv], cwd=folder, capture_output=True,
                       text=True, timeout=TIMEOUT_S, preexec_fn=_limit_memory,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    _check(kind, r, needles)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing recorded, nothing created


def test_a_refused_resume_leaves_the_study_and_its_mlflow_runs_as_they_were(tmp_path, cli, mlflow_store):
    """Resuming a finished study under another budget or target is refused in one line before
    MLflow is touched: its parent run stays FINISHED with the same end time (it was turned
    FAILED), and neither store changes by a byte."""
    from mlflow import MlflowClient

    base = ["study", "--objective", "synthetic", "--pilots", "0",
            "--trials", "1", "--no-report", "--storage", f"sqlite:///{tmp_path}/o.db",
            "--mlflow-uri", mlflow_store]
    env = {"COLUMNS": "200"}
    r = cli(*base, "--budget", "1e18", "--target", "pass@1", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]

    def parent():
        c = MlflowClient(mlflow_store)
        exp = c.get_experiment_by_name("allocopt/allocopt")
        (run,) = [x for x in c.search_runs([exp.experiment_id]) if x.data.tags.get("allocopt.role") == "study"]
        return run.info.status, run.info.end_time
    before = parent(), (tmp_path / "o.db").read_bytes(), (tmp_path / "mlflow.db").read_bytes()
    assert before[0][0] == "FINISHED"
    for args, needle in ((["--budget", "2e18", "--target", "pass@1"], "it was run with budget 1e+18, not 2e+18"),
                         (["--budget", "1e18", "--target", "judge"], "it was run with target 'pass@1', not 'judge'")):
        r = cli(*base, *args, cwd=tmp_path, env=env)
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], lines[:5]
        assert (parent(), (tmp_path / "o.db").read_bytes(), (tmp_path / "mlflow.db").read_bytes()) == before


def test_refused_tells_record_nothing(folder):
    """After every refused ``tell`` row, trial 0 of study ``t`` is still RUNNING, with the
    attributes ``ask`` gave it and no values."""
    import optuna

    t = optuna.load_study(study_name="t", storage=f"sqlite:///{folder}/t.db").trials[0]
    assert t.state.name == "RUNNING" and t.values is None
    assert not any(k.startswith("allocopt.targets") or k == "allocopt.state" for k in t.user_attrs)


def test_two_tells_of_one_trial_at_once_one_wins_the_other_is_told_already_finished(tmp_path, cli):
    """Two ``tell``s of one reserved trial that both passed the RUNNING check (two threads
    released together, three rounds): one records it, the other gets TellError "already
    finished" (a ValueError: one line at the command line) and writes nothing; the trial holds
    the winner's values and targets."""
    import threading

    import optuna

    from allocopt.cli.asktell import _load
    from allocopt.record import TrialRecord
    from allocopt.run_metrics import account_from_metrics
    from allocopt.study.asktell import TellError, check_tellable, record

    url = f"sqlite:///{tmp_path}/t.db"
    spent = account_from_metrics({"search_flops": 3e17, "learning_flops": 5e17, "reward_flops": 0})
    for n in range(3):
        r = cli("ask", "--study", f"t{n}", "--storage", url, "--objective", "synthetic", "--budget", "1e18",
                "--target", "pass@1", "--out", f"asked{n}", "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        st, spec = _load(f"t{n}", url)
        frozen = check_tellable(st, 0)
        gate = threading.Barrier(2)
        outcome: dict[float, object] = {}

        def tell(value: float) -> None:
            gate.wait()
            try:
                record(st, frozen, spec, {"pass_at_1": value}, spent)
                outcome[value] = "recorded"
            except Exception as e:  # noqa: BLE001 - the test looks at what it was
                outcome[value] = e

        threads = [threading.Thread(target=tell, args=(v,)) for v in (0.25, 0.75)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        won = [v for v, o in outcome.items() if o == "recorded"]
        lost = [o for o in outcome.values() if o != "recorded"]
        assert len(won) == 1 and len(lost) == 1, (n, outcome)
        assert isinstance(lost[0], TellError) and "already finished" in str(lost[0]) and "\n" not in str(lost[0])
        t = optuna.load_study(study_name=f"t{n}", storage=url).trials[0]
        assert t.state.name == "COMPLETE" and t.values == [won[0]]
        assert TrialRecord.of(t).targets == {"pass_at_1": won[0]}
    # a third tell, at the command line: the one line of check_tellable
    (tmp_path / "m.json").write_text('{"pass@1": 0.5, "search_flops": 1, "learning_flops": 1, "reward_flops": 0}')
    r = cli("tell", "--study", "t0", "--storage", url, "--trial", "0", "--metrics", "m.json", "--no-mlflow", cwd=tmp_path)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "already finished" in lines[0], lines


def test_a_sequential_second_record_of_a_told_trial_is_refused_in_one_line(tmp_path, cli):
    """The loser's path without timing luck: a second ``record`` with the trial frozen while it
    was RUNNING (as a tell that passed its check just before the first one finished)."""
    from allocopt.cli.asktell import _load
    from allocopt.run_metrics import account_from_metrics
    from allocopt.study.asktell import TellError, check_tellable, record

    url = f"sqlite:///{tmp_path}/t.db"
    assert cli("ask", "--study", "t", "--storage", url, "--objective", "synthetic", "--budget", "1e18",
               "--target", "pass@1", "--out", "asked", cwd=tmp_path).returncode == 0
    st, spec = _load("t", url)
    frozen = check_tellable(st, 0)
    spent = account_from_metrics({"search_flops": 3e17, "learning_flops": 5e17, "reward_flops": 0})
    record(st, frozen, spec, {"pass_at_1": 0.25}, spent)
    with pytest.raises(TellError, match=r"^trial=0: already finished \(told by another tell"):
        record(st, frozen, spec, {"pass_at_1": 0.75}, spent)
    assert st.trials[0].values == [0.25]


def test_report_to_an_unknown_mlflow_run_is_one_line_and_writes_nothing(tmp_path, cli, mlflow_store):
    from allocopt.spec import SearchSpace, StudySpec
    from allocopt.study.loop import run_study
    from objectives.synthetic import SyntheticObjective

    s = StudySpec(name="r", objective="synthetic", budget_flops=1e18, target="pass@1", trials=1,
                  sampler="random", tuner="bo", space=SearchSpace(rewards=("sparse",)))
    obj = SyntheticObjective()
    run_study(s, objective=obj, workload=obj.workload(), storage=f"sqlite:///{tmp_path}/r.db")
    r = cli("report", "--study", "r", "--storage", f"sqlite:///{tmp_path}/r.db", "--out", "rep",
            "--mlflow-run", "0123456789abcdef0123456789abcdef", "--mlflow-uri", mlflow_store, cwd=tmp_path)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, lines
    assert "mlflow_run='0123456789abcdef0123456789abcdef': no such run" in lines[0]
    assert not (tmp_path / "rep").exists()


def test_a_config_without_num_key_value_heads_says_what_was_assumed(tmp_path, cli):
    """As transformers does (``num_key_value_heads`` defaults to ``num_attention_heads``): the
    account is the one of multi-head attention, and one warning line says so."""
    import json

    cfg = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "intermediate_size": 4864,
           "vocab_size": 151936, "tie_word_embeddings": True}
    (tmp_path / "nokv").mkdir()
    (tmp_path / "nokv" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "mha").mkdir()
    (tmp_path / "mha" / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 14}))
    # a fresh process: pytest catches warnings in its own; what a user sees is Python's display
    r = subprocess.run([sys.executable, "-m", "allocopt.cli", "account", "--model", "nokv", "--json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    warn = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 0 and len(warn) == 1, warn
    assert warn[0].startswith("warning: ") and "assumed num_key_value_heads = num_attention_heads = 14" in warn[0]
    mha = cli("account", "--model", "mha", "--json", cwd=tmp_path)
    assert mha.returncode == 0 and not mha.stderr.strip()
    (tmp_path / "gqa").mkdir()
    (tmp_path / "gqa" / "config.json").write_text(json.dumps({**cfg, "num_key_value_heads": 2}))
    gqa = cli("account", "--model", "gqa", "--json", cwd=tmp_path)
    flops = [{k: v for k, v in json.loads(x.stdout).items() if k.endswith("flops")} for x in (r, mha, gqa)]
    assert flops[0] and flops[0] == flops[1] != flops[2]  # the field counts; missing = multi-head
