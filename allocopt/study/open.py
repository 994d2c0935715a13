"""Opening a study: the Optuna study on its storage (created or resumed, heartbeats on), its
sampler, the search space as Optuna distributions, the check that a resumed study keeps its
terms, the objectives named after the targets. Optuna and torch are imported inside functions.
"""

from __future__ import annotations

import time
from typing import Any

from allocopt.plan.allocation import Workload
from allocopt.spec import StudySpec

from allocopt.errors import StudyError  # noqa: E402,F401  (defined there; imported from here too)


def make_sampler(spec: StudySpec, *, workload: Workload | None = None, race_settings: Any = None) -> Any:
    """The Optuna sampler of the study: with ``spec.tuner = "kg"`` a
    :class:`allocopt.study.sampler.RaceSampler` asking the knowledge-gradient tuner
    (:func:`allocopt.study.sampler.kg_sampler`; several targets: a fresh random weighting of
    them per proposal); with ``tuner = "race"`` a RaceSampler asking RACE (pilots, then
    surrogate proposals) unless ``spec.pilots == 0`` or the study has several targets; else
    (``tuner = "bo"``, RACE without pilots or several targets) the one ``spec.sampler`` names
    (several targets: ``gp``: Optuna's log EHVI; ``botorch``: BoTorch's qLogNEHVI).
    Other workers' RUNNING trials are pending points of the BoTorch acquisition
    (:func:`_ei_candidates`; Optuna's ``GPSampler`` conditions on them itself), and workers started
    by ``allocopt workers`` are seeded ``spec.seed`` + their index (``ALLOCOPT_WORKER``).
    torch fits run on one thread (5–12× faster on 2 cores).

    Args:
        spec: the study.
        workload: what plans are made for (RACE proposes feasible plans only when given).
        race_settings: :class:`allocopt.race.RaceSettings` (default:
            :func:`allocopt.race.design.settings_for`: the study's ``[race]`` table, ``max_pilots = spec.pilots``);
            the RaceSampler is built by :func:`allocopt.study.sampler.race_sampler`.
    """
    import optuna

    if spec.tuner == "kg":
        from allocopt.study.sampler import kg_sampler

        return kg_sampler(spec, workload)
    if spec.tuner == "race" and spec.pilots != 0 and not spec.multi_objective:
        from allocopt.study.sampler import race_sampler

        return race_sampler(spec, workload, race_settings)
    # workers of one study started by `allocopt workers` (ALLOCOPT_WORKER = 0, 1, ...) draw
    # different random start-up proposals: the same seed would make them propose the same ones
    import os

    worker = os.environ.get("ALLOCOPT_WORKER", "0")
    seed = (spec.seed + (int(worker) if worker.isdigit() else 0)) % 2**32
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    import torch

    torch.set_num_threads(1)
    if spec.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=spec.startup_trials)
    from optuna_integration import BoTorchSampler

    return BoTorchSampler(seed=seed, n_startup_trials=spec.startup_trials, consider_running_trials=True,
                          candidates_func=_hypervolume_candidates if spec.multi_objective else _ei_candidates)


def _ei_candidates(train_x: Any, train_obj: Any, train_con: Any, bounds: Any, pending_x: Any) -> Any:
    """BoTorchSampler's proposal for one target, with other workers' RUNNING trials pending.

    ``train_x`` ``n x d`` (complete trials' encoded parameters), ``train_obj`` ``n x 1``,
    ``train_con`` ``n x c`` or ``None`` (the ``budget`` constraint), ``bounds`` ``2 x d``,
    ``pending_x`` ``p x d``: the RUNNING trials' parameters (``consider_running_trials``).
    With nothing pending: log expected improvement (``logei_candidates_func``, BoTorch's
    ``LogExpectedImprovement``: what one worker always used). With pending points: Monte-Carlo
    log expected improvement with them as BoTorch's ``X_pending`` (``qlogei_candidates_func``:
    ``qLogExpectedImprovement(..., X_pending=pending_x)``, the candidate's improvement taken
    jointly with the pending points' outcomes drawn from the posterior, i.e. fantasies; Ament et
    al. 2023, "Unexpected improvements to expected improvement"; what Optuna's ``GPSampler``
    does with running trials), so a point next to one already running gains almost nothing and
    parallel workers propose different allocations. Returns ``1 x d`` (the candidate).
    """
    from optuna_integration.botorch import logei_candidates_func, qlogei_candidates_func

    if pending_x is None or pending_x.shape[0] == 0:
        return logei_candidates_func(train_x, train_obj, train_con, bounds, None)
    return qlogei_candidates_func(train_x, train_obj, train_con, bounds, pending_x)


def _hypervolume_candidates(train_x: Any, train_obj: Any, train_con: Any, bounds: Any, pending_x: Any) -> Any:
    """Several targets: qLogNEHVI (log noisy expected hypervolume improvement,
    ``qnehvi_candidates_func``), RUNNING trials as its ``X_pending`` (shapes as
    :func:`_ei_candidates`)."""
    from optuna_integration.botorch import qnehvi_candidates_func

    pending = None if pending_x is None or pending_x.shape[0] == 0 else pending_x
    return qnehvi_candidates_func(train_x, train_obj, train_con, bounds, pending)


def distributions(spec: StudySpec, *, fidelity: bool = False) -> dict[str, Any]:
    """Optuna distributions of the search space (and the ``fidelity`` parameter of RACE)."""
    from allocopt.study.sampler import space_distributions

    return space_distributions(spec.space, fidelity=fidelity)


def check_same_study(study: Any, spec: StudySpec) -> None:
    """Refuse to resume a study under other terms: its trials would be mixed with the new ones
    (another budget, target, objective, search space or tuner: a RACE study resumed by the kg
    tuner would mix two designs). Raises :class:`StudyError`."""
    old = study.user_attrs.get("spec")
    if not old:
        return
    new = spec.to_dict()
    for key, label in (("objective", "objective"), ("budget_flops", "budget"), ("target", "target"),
                       ("space", "search space"), ("pilot_fraction", "pilot fraction"), ("tuner", "tuner")):
        a, b = old.get(key), new.get(key)
        if isinstance(a, list):
            a = tuple(a)
        if isinstance(b, list):
            b = tuple(b)
        if key == "space":
            a = {k: tuple(v) if isinstance(v, list) else v for k, v in (a or {}).items()}
            b = {k: tuple(v) if isinstance(v, list) else v for k, v in (b or {}).items()}
        if a is not None and a != b:
            raise StudyError(f"study={spec.name!r}: it was run with {label} {a!r}, not {b!r}; resume it "
                             "with the same settings or give another --study-name")


def open_study(spec: StudySpec, storage: str | None, sampler: Any = None) -> Any:
    """Create or load the Optuna study, heartbeats on (:mod:`allocopt.store.connect`).

    Builds no sampler of its own: the study asks ``sampler`` when given, else Optuna's
    :class:`~optuna.samplers.RandomSampler` (seeded ``spec.seed``) until the caller sets
    ``study.sampler`` (:func:`make_sampler`; the loop does). ``storage`` ``None``: in memory.

    Opening settles what stopped workers left (:func:`allocopt.store.settle.reconcile_on_open`:
    a gone worker's trial finished from its whole record or failed and run again once, stale
    ones after the grace period, Ctrl-C'd ones enqueued to run again); it never touches a live
    worker's RUNNING trial or a trial reserved by ``allocopt ask``.

    Raises:
        StudyError: the storage cannot be opened (the URL in the message has its password
            redacted), or the study was run under other terms.
    """
    import optuna

    from allocopt.errors import StorageError
    from allocopt.redact import redact_url
    from allocopt.store.connect import make_storage
    from allocopt.store.handles import register
    from allocopt.store.settle import reconcile_on_open

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shown = redact_url(storage)
    try:
        for attempt in range(4):  # workers that create one database at the same instant race
            try:  # on its schema (alembic_version, a table already there): the loser retries
                store = make_storage(storage)
                study = optuna.create_study(study_name=spec.name, storage=store, load_if_exists=True,
                                            directions=list(spec.directions),
                                            sampler=sampler or optuna.samplers.RandomSampler(seed=spec.seed))
                break
            except Exception as e:  # noqa: BLE001
                if attempt == 3 or not _creation_race(e):
                    raise
                time.sleep(1.0 + attempt)
    except StorageError as e:
        raise StudyError(str(e)) from None
    except ImportError as e:
        raise StudyError(f"storage={shown!r}: its database driver is not installed ({e})") from None
    except Exception as e:  # bad URL, unreachable server, unwritable file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StudyError(f"storage={shown!r}: cannot be opened ({redact_url(msg)})") from None
    register(study, store)
    _check_terms(study, spec)
    reconcile_on_open(study, spec.targets)  # a stopped worker's trials settled before anything is asked
    return study


def _check_terms(study: Any, spec: StudySpec) -> None:
    """An existing study resumed under ``spec``: as many targets, then :func:`check_same_study`.
    Raises :class:`StudyError` (one line)."""
    if len(study.directions) != len(spec.targets):
        raise StudyError(f"study={spec.name!r}: it was created with {len(study.directions)} target(s), "
                         f"not {len(spec.targets)}; give the same --target(s) or another --study-name")
    made = [d.name.lower() for d in study.directions]
    if made != list(spec.directions):
        raise StudyError(f"study={spec.name!r}: it was created to {', '.join(made)} its target(s), "
                         f"not {', '.join(spec.directions)}; keep each target's direction or give "
                         "another --study-name")
    check_same_study(study, spec)


def preflight_study(spec: StudySpec, storage: str) -> None:
    """Check, writing nothing, that ``storage`` can be opened and that a study named
    ``spec.name`` in it, if there is one, was run under ``spec``'s terms (what
    :func:`open_study` checks), so a bad storage or a refused resume fails before MLflow
    records anything. A SQLite file must be a regular file that can be written, or a file its
    folder lets be made (:func:`_check_sqlite_path`); a server must answer a ``SELECT 1``.
    Optuna is imported only to read an existing study's terms. Non-RDB URLs are left to
    :func:`open_study`.

    Raises:
        StudyError: one line, as :func:`open_study` words it.
    """
    from sqlalchemy.engine import make_url

    from allocopt.redact import redact_url

    shown = redact_url(storage)
    scheme = str(storage).split("://", 1)[0].split("+", 1)[0].lower()
    if scheme not in ("sqlite", "postgresql", "postgres", "mysql"):
        return
    try:
        if scheme == "sqlite":
            db = make_url(storage).database
            if not db or db == ":memory:" or not _check_sqlite_path(db, shown):
                return  # in memory (refused by check_storage_url), or a new file: nothing to compare
        else:
            from sqlalchemy import create_engine, text

            engine = create_engine(storage, pool_pre_ping=True)
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
            finally:
                engine.dispose()
    except StudyError:
        raise
    except ImportError as e:
        raise StudyError(f"storage={shown!r}: its database driver is not installed ({e})") from None
    except Exception as e:  # unreachable server, bad credentials, unreadable file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StudyError(f"storage={shown!r}: cannot be opened ({redact_url(msg)})") from None
    import optuna

    try:  # read only: no table creation, no migration
        store = optuna.storages.RDBStorage(storage, skip_table_creation=True,
                                           skip_compatibility_check=True)
        known = {s.study_name for s in store.get_all_studies()}
    except Exception:  # noqa: BLE001 - no Optuna tables yet: a new database, nothing to check
        return
    if spec.name not in known:
        return
    _check_terms(optuna.load_study(study_name=spec.name, storage=store), spec)


def _check_sqlite_path(db: str, shown: str) -> bool:
    """Whether the SQLite file ``db`` exists (a regular file this process can write);
    ``False``: it does not, and its folder lets a file be made (a probe file is made and
    removed beside it: permissions alone do not say so for root, ``/proc`` or a read-only
    mount). Raises :class:`StudyError` (one line) otherwise."""
    import os
    from pathlib import Path

    p = Path(db)
    why = None
    if p.exists():
        if not p.is_file():
            why = f"{p} is {'a folder' if p.is_dir() else 'not a regular file'}"
        else:
            try:
                os.close(os.open(p, os.O_RDWR))
                return True
            except OSError as e:
                why = f"{p} cannot be written: {e.strerror}"
    elif not p.parent.is_dir():
        why = f"folder {p.parent} does not exist" if not p.parent.exists() else f"{p.parent} is not a folder"
    else:
        probe = p.parent / f".{p.name}.probe-{os.getpid()}"
        try:
            os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            probe.unlink()
            return False
        except OSError as e:
            why = f"no file can be made in folder {p.parent}: {e.strerror}"
    raise StudyError(f"storage={shown!r}: cannot be opened ({why})")


def _creation_race(e: BaseException) -> bool:
    """An error of two processes creating the same database schema at once (SQLAlchemy
    IntegrityError on ``alembic_version``, a table or index that already exists, a locked
    SQLite file): the second one's retry finds the schema made."""
    text = str(e).lower()
    return any(k in text for k in ("alembic_version", "already exists", "database is locked",
                                   "duplicate column", "unique constraint failed"))


def name_objectives(study: Any, spec: StudySpec) -> None:
    """Name the study's objectives after its targets (``study.set_metric_names``), so Optuna's
    plots and optuna-dashboard say ``pass@1`` instead of ``Objective 0``."""
    if study.metric_names != list(spec.targets):
        study.set_metric_names(list(spec.targets))
