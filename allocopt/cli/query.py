"""Query commands of the ``allocopt`` CLI: ``pareto``, ``best`` and ``report``.

Plain functions with typer annotations; :func:`register` adds them to the app in
:mod:`allocopt.cli`. They read trials from an Optuna study (``--study``, ``--storage``) or from
MLflow experiments across studies (``--from-mlflow``, repeatable; ``--mlflow-uri``), narrow
them (``--where``, ``--fidelity``) and answer with :mod:`allocopt.query.pareto` and
:mod:`allocopt.query.report`. Bad queries raise :class:`allocopt.query.pareto.QueryError` (a
:class:`~allocopt.flops.ConfigError`): ``allocopt.cli.main`` prints one line, exit code 2.

Nothing heavy at import: Optuna, MLflow, pandas and matplotlib load inside the commands.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

import typer
from rich.console import Console
from rich import box
from rich.table import Table

from allocopt.cli.common import bundled_options
from allocopt.cli.consoles import PipeConsole
from allocopt.cli.model_labels import legend, short_names
from allocopt.store.connect import DEFAULT_STORAGE
from allocopt.query.stored import (parent_run_id, stored_objectives, stored_recommendation, stored_target,
                                   stored_vocabulary)

FIDELITY_CHOICES = ("full", "pilot", "all")

_STUDY = typer.Option(None, "--study", help="Optuna study name (in --storage) \\[default: the one study the storage holds].")
_STORAGE = typer.Option(DEFAULT_STORAGE, "--storage", envvar="ALLOCOPT_STORAGE", help="Optuna storage URL (sqlite:///…, postgresql://…); a password is better given in $ALLOCOPT_STORAGE than on the command line.")
_FROM_MLFLOW = typer.Option(None, "--from-mlflow", help="MLflow experiment (allocopt/<study> or the study name) to read trials from instead of --study; repeat for several studies.")
_MLFLOW_URI = typer.Option(None, "--mlflow-uri", help="MLflow tracking URI \\[default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db].")
_WHERE = typer.Option(None, "--where", help="Filter, repeatable (all must hold): KEY=VALUE, KEY!=VALUE, KEY>N, KEY>=N, KEY<N, KEY<=N; e.g. reward=prm, 'rho>0.5', group_size=8.")
_JSON = typer.Option(False, "--json", help="Print JSON instead of tables.")
_FIDELITY = typer.Option("full", "--fidelity", help="Trials of this fidelity: full (whole budget), pilot, or all.")
_reads_trials = bundled_options("trials", {
    "study": (Optional[str], _STUDY), "storage": (str, _STORAGE),
    "from_mlflow": (Optional[List[str]], _FROM_MLFLOW), "mlflow_uri": (Optional[str], _MLFLOW_URI),
    "where": (Optional[List[str]], _WHERE)})
"""The options naming the trials a query reads, as one dict ``trials`` (``_load(**trials, ...)``)."""


def _out() -> Console:
    """stdout console; when stdout is not a terminal (a pipe, a log) tables get 160 columns."""
    c = PipeConsole()
    if not c.is_terminal:
        c.width = max(c.width, 160)
    return c


def _problem(msg: str) -> Exception:
    from allocopt.query.pareto import QueryError

    return QueryError(msg)


def _split(text: str, what: str, unique: bool = True) -> list[str]:
    """``text``'s comma-separated items; ``unique``: each at most once."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise _problem(f"{what}={text!r}: give one or more names separated by commas")
    twice = next((t for i, t in enumerate(items) if t in items[:i]), None)
    if twice is not None and unique:
        raise _problem(f"{what}={text!r}: {twice!r} given more than once; give each once")
    return items


def _study_or_only(study: Optional[str], storage: str, from_mlflow: Optional[List[str]]) -> Optional[str]:
    """``study``; without ``--study`` and ``--from-mlflow``, the one study ``storage`` holds.

    Raises:
        QueryError: the storage holds none or several studies (the line lists them).
    """
    if study or from_mlflow:
        return study
    from allocopt.query.sources import study_names
    from allocopt.redact import redact_url

    from allocopt.query.pareto import QueryError

    try:
        names = study_names(storage)
    except QueryError as e:  # e.g. no allocopt.db here: the storage first, the missing study second
        raise _problem(f"{e}; study=None too: give --study NAME (Optuna) or --from-mlflow EXPERIMENT "
                       "(MLflow)") from None
    if len(names) == 1:
        return names[0]
    raise _problem(f"study=None: give --study NAME ({redact_url(storage)} holds "
                   f"{', '.join(names) if names else 'no study'}) or --from-mlflow EXPERIMENT (MLflow)")


def _load(study: Optional[str], storage: str, from_mlflow: Optional[List[str]], mlflow_uri: Optional[str],
          where: Optional[List[str]], fidelity: str) -> tuple[list[Any], str, Optional[str]]:
    """Rows of the source, filtered; a short description of the source; and the study read
    (``study``, else the one the storage holds: :func:`_study_or_only`; ``None`` for MLflow)."""
    from allocopt.query.pareto import filter_rows, parse_where
    from allocopt.query.sources import load_rows_from_mlflow, load_rows_from_study

    if fidelity not in FIDELITY_CHOICES:
        raise _problem(f"fidelity={fidelity!r}: allowed: {', '.join(FIDELITY_CHOICES)}")
    for clause in where or []:
        parse_where(clause)  # malformed clauses fail before anything is opened
    if study and from_mlflow:
        raise _problem(f"study={study!r}: give --study or --from-mlflow, not both")
    study = _study_or_only(study, storage, from_mlflow)
    if study:
        rows, source = load_rows_from_study(storage, study), f"study {study}"
    else:
        from allocopt.tracking.requests import short_mlflow_requests

        with short_mlflow_requests():  # an unreachable server: one line in seconds, not minutes
            rows = load_rows_from_mlflow(list(from_mlflow or []), mlflow_uri)
        source = f"MLflow {', '.join(from_mlflow or [])}"
    if fidelity != "all":
        rows = [r for r in rows if r.fidelity == fidelity]
    kept = filter_rows(rows, where or [])
    if where and any(r.state == "COMPLETE" for r in rows) \
            and not any(r.state == "COMPLETE" for r in kept):
        raise _problem(f"where={' and '.join(where)!r}: matches no complete trial of the "
                       f"{len(rows)} in {source} (fidelity {fidelity})")
    return kept, source, study


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(_clean(obj), indent=2) + "\n")


def _labels(vocabulary: Any) -> Callable[[str], str]:
    """A field's name as the study declared it (:func:`allocopt.query.pareto.field_label` with
    ``vocabulary``), for the tables and JSON of one query."""
    from functools import partial

    from allocopt.query.pareto import field_label

    return partial(field_label, vocabulary=vocabulary)


def _f(v: float, spec: str) -> str:
    return format(v, spec) if math.isfinite(v) else "–"


def _rows_table(rows: list[Any], title: str, first: list[str], all_rows: list[Any],
                vocabulary: Any = None) -> Table:
    """Allocation, targets (``first`` in bold, then the other measured ones, each under its
    declared name in ``vocabulary``) and breakdown shares."""
    from allocopt.query.pareto import measured_targets, number, value

    field_label = _labels(vocabulary)

    several = len({r.study for r in all_rows}) > 1
    fidelities = len({r.fidelity for r in rows}) > 1
    # a study that searched the model shows it, also on a front of one model's trials
    models = len({value(r, "model") for r in all_rows}) > 1
    label = short_names(str(value(r, "model")) for r in all_rows)  # the part that tells them apart
    others = [k for k in measured_targets(all_rows) if k not in first]
    totals = {_f(number(r, "total_flops"), ".3e") for r in rows}
    same = len(totals) == 1  # trials that spent one budget: said once, in the caption
    # one space between columns, a rule under the header: the usual three targets, a model
    # column and the breakdown fit 80 columns (a study column can make it wider; pipes get 160)
    t = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0), caption_justify="left")
    cols = (["study"] if several else []) + ["trial"] + (["fidelity"] if fidelities else []) + ["rho", "G", "reward"] \
        + (["model"] if models else []) + [f"[bold]{field_label(k)}[/]" for k in first] \
        + [field_label(k) for k in others if k not in first] + ["search", "learn", "rwd"] + ([] if same else ["FLOPs"])
    for c in cols:
        t.add_column(c, justify="left" if c in ("study", "fidelity", "reward", "model") else "right")
    spec = {k: _spec(k, [number(r, k) for r in rows]) for k in first}  # the front's own columns only
    for r in rows:
        total = number(r, "total_flops")
        share = [_f(number(r, p) / total, ".0%") if total > 0 else "–"
                 for p in ("search_flops", "learning_flops", "reward_flops")]
        cells = ([r.study] if several else []) + [str(r.number)] + ([r.fidelity] if fidelities else []) \
            + [_f(number(r, "rho"), ".3f"), str(value(r, "group_size")), str(value(r, "reward"))] \
            + ([label[str(value(r, "model"))]] if models else []) \
            + [f"[bold]{_f(number(r, k), spec[k])}[/]" for k in first] \
            + [_f(number(r, k), ".4f") for k in others if k not in first] + share \
            + ([] if same else [_f(total, ".3e")])
        t.add_row(*cells)
    t.caption = ("rho: the allocation's update fraction; search / learn / rwd: shares of the "
                 "executed FLOPs (learn = realized rho); "
                 + (f"{'each' if len(rows) > 1 else 'it'} executed {next(iter(totals))} FLOPs" if same
                    else "FLOPs: the total executed")) \
        + (f"; {legend(label)}" if models and legend(label) else "")
    return t


def _spec(key: str, values: Sequence[float] = ()) -> str:
    """The format of ``key``'s column: FLOPs in 4 significant digits, more where ``values``
    that differ would print alike (a front's trials at one budget differ in the last few)."""
    if not key.endswith("_flops"):
        return ".4f"
    distinct = {v for v in values if math.isfinite(v)}
    digits = 3
    while digits < 9 and len({format(v, f".{digits}e") for v in distinct}) < len(distinct):
        digits += 1
    return f".{digits}e"


# ---------------------------------------------------------------------------- pareto
@_reads_trials
def pareto(
    objectives: Optional[str] = typer.Option(None, "--objectives", help="Comma-separated targets or fields, e.g. pass@1,judge or judge,total_flops \\[default: the study's targets, when it has two or more]."),
    target: Optional[List[str]] = typer.Option(None, "--target", help="A target or field of the front; repeat it (--target pass@1 --target judge); the same as --objectives."),
    trials: Optional[dict] = None,  # --study, --storage, --from-mlflow, --mlflow-uri, --where
    directions: Optional[str] = typer.Option(None, "--directions", help="Comma-separated maximize/minimize, one per objective \\[default: each target's declared direction (maximize for the built-in ones), minimize *_flops]."),
    fidelity: str = _FIDELITY,
    as_json: bool = _JSON,
) -> None:
    """The non-dominated trials over several targets (Pareto front): allocation, targets, breakdown."""
    if objectives and target:
        from allocopt.errors import ConfigError

        raise ConfigError("objectives/target: give the front's targets one way, --objectives a,b or --target a --target b")
    given = _split(objectives, "objectives") if objectives else list(target) if target else None  # before the storage is opened
    if given is not None and len(given) < 2:
        from allocopt.errors import ConfigError

        flag = f"objectives={objectives!r}" if objectives else f"target={given[0]!r}"
        raise ConfigError(f"{flag}: a Pareto front is over two or more targets or fields, e.g. pass@1,judge or "
                          "pass@1,total_flops; the best of one target: allocopt best")
    dirs = _split(directions, "directions", unique=False) if directions else None  # two objectives may share one
    rows, source, study = _load(**trials, fidelity=fidelity)
    stored = (study, trials["storage"], trials["from_mlflow"], trials["mlflow_uri"])
    names = given or stored_objectives(*stored)
    print_front(rows, names, dirs, source, fidelity, as_json, stored_vocabulary(*stored))


def print_front(rows: list[Any], names: list[str], dirs: Optional[list[str]], source: str,
                fidelity: str, as_json: bool = False, vocabulary: Any = None) -> None:
    """The Pareto front of ``rows`` over the targets or fields ``names`` (directions ``dirs``,
    default: each target's declared direction in ``vocabulary``, maximize the built-in targets,
    minimize ``*_flops``), best first along the first, as a table or one JSON document. Raises
    :class:`~allocopt.query.pareto.QueryError` for an unknown name."""
    from allocopt.query.pareto import check_fields, default_direction, number, pareto_front, row_dict

    field_label = _labels(vocabulary)

    keys = check_fields(rows, names, "objectives", vocabulary=vocabulary)  # the flag's name
    dirs = dirs or [default_direction(k, vocabulary) for k in keys]
    front = pareto_front(rows, keys, dirs)
    sign = 1 if dirs[0] == "maximize" else -1  # show the front along its first objective, best first
    front.sort(key=lambda r: (-sign * number(r, keys[0]), r.study, r.number))
    n_done = sum(r.state == "COMPLETE" for r in rows)
    if as_json:
        _print_json({"source": source, "objectives": [field_label(k) for k in keys], "directions": dirs,
                     "complete_trials": n_done, "front": [row_dict(r) for r in front]})
        return
    spec = ", ".join(f"{field_label(k)} ({d})" for k, d in zip(keys, dirs))
    t = _rows_table(front, f"Pareto front of {source}: {spec}", keys, rows, vocabulary)
    t.caption = (f"{len(front)} non-dominated of {n_done} complete trials"
                 + (f" ({fidelity} fidelity)" if fidelity != "all" else "") + "; " + t.caption)
    _out().print(t)


# ------------------------------------------------------------------------------ best
@_reads_trials
def best(
    target: Optional[str] = typer.Option(None, "--target", help="Target: native_reward, pass@1, pass@1:gsm8k, pass@1:math500, judge, one the study declared (or a field such as total_flops) \\[default: the study's target, when it has one]."),
    trials: Optional[dict] = None,  # --study, --storage, --from-mlflow, --mlflow-uri, --where
    direction: Optional[str] = typer.Option(None, "--direction", help="maximize or minimize \\[default: the target's declared direction (maximize for the built-in ones), minimize *_flops]."),
    fidelity: str = _FIDELITY,
    as_json: bool = _JSON,
) -> None:
    """The study's recommendation (its tuner's answer), then the best observed trial for one target as its evidence, overall and per reward system."""
    from allocopt.query.pareto import best as best_of, best_per, check_fields, default_direction, row_dict
    rows, source, study = _load(**trials, fidelity=fidelity)
    stored = (study, trials["storage"], trials["from_mlflow"], trials["mlflow_uri"])
    if target is None:
        target = stored_target(*stored)
    vocab = stored_vocabulary(*stored)
    field_label = _labels(vocab)

    (key,) = check_fields(rows, [target], "target", vocabulary=vocab)
    d = direction or default_direction(key, vocab)
    b = best_of(rows, key, d)
    per = best_per(rows, key, "reward", d)
    rec = stored_recommendation(*stored)
    if as_json:
        _print_json({"source": source, "target": field_label(key), "direction": d, "recommendation": rec,
                     "best": row_dict(b) if b else None,
                     "per_reward": {str(w): row_dict(r) for w, r in per.items()}})
        return
    out = _out()
    # the study's answer is for its target over full runs: shown (with the trials below as its
    # evidence) only when this query asks the same; a filtered, pilot or other-target query
    # gets its best trial alone (it once labelled a pilot or another target's trial evidence)
    if rec and not (field_label(key) == str(rec.get("target", field_label(key)))
                    and not trials["where"] and fidelity == "full"):
        rec = None
    if rec:  # the study's one answer first; the trials below are its evidence
        from allocopt.answer import from_dict, recommendation_lines

        for line in recommendation_lines(from_dict(rec), str(rec.get("target", key))):
            out.print(line, highlight=False, markup=False)
    if b is None:  # check_fields found a complete trial, so only a filter can empty this
        out.print(f"no complete trial of {source} matches")
        return
    out.print(_best_table(b, key, d, source, evidence=bool(rec), vocabulary=vocab))
    if len(per) > 1:
        out.print(_rows_table(list(per.values()), f"Best observed trial per reward system for {field_label(key)}",
                              [key], rows, vocab))
    n_done = sum(r.state == "COMPLETE" for r in rows)  # what the answer and the tables rest on
    out.print(f"from {n_done} complete trial(s) of {source}" + (f" ({fidelity} fidelity)" if fidelity != "all" else ""),
              highlight=False, markup=False)


def _best_table(b: Any, key: str, d: str, source: str, evidence: bool, vocabulary: Any = None) -> Table:
    """One trial ``b``, best for ``key`` (direction ``d``): its allocation, targets (each under
    its declared name in ``vocabulary``) and compute."""
    from allocopt.query.pareto import number

    field_label = _labels(vocabulary)
    from allocopt.tracking.layout import EXPECTED_GPU_HOURS, GPU_HOURS

    total = number(b, "total_flops")
    share = (lambda p: f" ({number(b, p) / total:.0%})") if total > 0 else (lambda p: "")
    # two lines, each a whole phrase: the table is narrower than the title, and rich would
    # break it mid-phrase
    t = Table(title=f"Best observed trial for {field_label(key)} ({d})\nin {source}"
                    + (" (evidence)" if evidence else ""), show_header=False)
    for k, v in (("trial", f"{b.study} #{b.number}" if b.study else f"#{b.number}"),
                 ("fidelity", b.fidelity),
                 ("rho (update fraction)", _f(number(b, "rho"), ".4f")),
                 ("group size G", str(b.params.get("group_size"))), ("reward", str(b.params.get("reward"))),
                 ("model", str(b.params.get("model"))),
                 (field_label(key), f"[bold]{_f(number(b, key), _spec(key))}[/]"),
                 *((field_label(k), _f(v, ".4f")) for k, v in b.targets.items() if k != key),
                 ("search FLOPs", _f(number(b, "search_flops"), ".3e") + share("search_flops")),
                 ("learning FLOPs", _f(number(b, "learning_flops"), ".3e") + share("learning_flops")),
                 ("reward FLOPs", _f(number(b, "reward_flops"), ".3e") + share("reward_flops")),
                 ("total FLOPs", _f(total, ".3e")),
                 ("realized rho", _f(number(b, "realized_rho"), ".4f"))):
        t.add_row(k, v)
    for k, label in ((EXPECTED_GPU_HOURS, "expected GPU-hours"), (GPU_HOURS, "measured GPU-hours")):
        if not math.isnan(number(b, k)):  # trials of a study under a time budget
            t.add_row(label, _f(number(b, k), ".2f"))
    return t


# ---------------------------------------------------------------------------- report
def report(
    out_dir: Path = typer.Option(Path("report"), "--out", help="Folder for the PNGs and report.html (created)."),
    study: Optional[str] = _STUDY,
    storage: str = _STORAGE,
    from_mlflow: Optional[List[str]] = _FROM_MLFLOW,
    mlflow_uri: Optional[str] = _MLFLOW_URI,
    targets: Optional[str] = typer.Option(None, "--targets", help="Comma-separated targets to plot \\[default: the study's targets, then every other target measured]."),
    pareto_of: Optional[str] = typer.Option(None, "--pareto", help="Two comma-separated targets for the Pareto figure \\[default: the study's targets; one target: it and the next measured; --from-mlflow: the first two of --targets]."),
    where: Optional[List[str]] = _WHERE,
    fidelity: str = typer.Option("all", "--fidelity", help="Trials of this fidelity: all (pilots marked), full, or pilot."),
    title: Optional[str] = typer.Option(None, "--title", help="Title of the page and figures \\[default: the source]."),
    mlflow_run: Optional[str] = typer.Option(None, "--mlflow-run", help="Also log the files as artifacts (report/) of this MLflow run id (at --mlflow-uri); 'parent': the study's parent run."),
) -> None:
    """A visual report: allocation frontier per reward system, compute breakdown, Pareto front, regime table (PNG + one HTML page)."""
    from allocopt.query.pareto import check_fields, measured_targets
    from allocopt.query.report import write_report

    rows, source, study = _load(study, storage, from_mlflow, mlflow_uri, where, fidelity)
    context = None
    if study:  # the study's targets, budget, RACE regimes and recommendation
        from allocopt.query.sources import open_study_for_query
        from allocopt.query.report_data import study_context

        context = study_context(open_study_for_query(storage, study))
    measured = measured_targets(rows)
    own = [k for k in (context.targets if context else ()) if k in measured]
    keys = check_fields(rows, _split(targets, "targets"), "target") if targets else own + [k for k in measured if k not in own]
    if not keys:
        raise _problem(f"targets: no complete trial of {source} measured a target yet; nothing to plot")
    pair = check_fields(rows, _split(pareto_of, "pareto"), "target") if pareto_of else None
    if pair is not None and len(pair) != 2:
        raise _problem(f"pareto={pareto_of!r}: give exactly two targets, e.g. pass@1,judge")
    if mlflow_run == "parent":
        mlflow_run = parent_run_id(study, mlflow_uri)
    elif mlflow_run:
        from allocopt.query.stored import check_run_id

        check_run_id(mlflow_run, mlflow_uri)  # an unknown id: one line, before any file is written
    files = write_report(rows, out_dir, title=title or source.capitalize(), targets=keys, context=context,
                         pareto_targets=pair, run_id=mlflow_run, tracking_uri=mlflow_uri)
    out = _out()
    for f in files:
        out.print(str(f), markup=False, highlight=False)
    if mlflow_run:
        out.print(f"logged {len(files)} files to MLflow run {mlflow_run} (artifacts report/)")


def register(app: typer.Typer) -> None:
    """Add ``pareto``, ``best`` and ``report`` to the ``allocopt`` app."""
    app.command()(pareto)
    app.command()(best)
    app.command()(report)


__all__ = ["best", "pareto", "register", "report"]
