"""One ``qwen`` trial in its own process: a crash fails the trial, not the study; the process's
end frees its GPU memory (vLLM's and torch's) before the next trial.

The child (``multiprocessing`` ``spawn``: no CUDA state inherited) runs the trial function it
is given (the objective's ``run_here``, e.g. :meth:`objectives.qwen.objective.QwenObjective.run_here`,
a picklable bound method) and sends back, over a pipe, each iteration's
progress ``(record, meter)`` and then one outcome: the result, an infeasible first iteration,
a failed trial with what it spent, a set-up error, or any other error. A child that dies
without an outcome (killed, out of memory, a segfault in a kernel) fails the trial with its
exit code; nothing was recorded for it but the failure. The child quiets the libraries'
warnings when its parent ran the trial inside :func:`allocopt.quiet.quiet` (no ``--verbose``).
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Callable

from allocopt.plan.allocation import InfeasiblePlan, TrialPlan
from allocopt.flops import ComputeBreakdown, ConfigError, FlopAccount
from allocopt.objective import TrialFailed, TrialResult


def _child(run_here: Callable[..., TrialResult], plan: TrialPlan, seed: int, conn: Any) -> None:
    from allocopt.quiet import quiet_if_asked

    def progress(rec: Any, meter: Any) -> None:
        conn.send(("progress", (rec, meter)))

    try:
        with quiet_if_asked():  # the parent's quiet (ALLOCOPT_QUIET=1 in the inherited environment)
            result = run_here(plan, seed=seed, progress=progress)
        conn.send(("result", result))
    except InfeasiblePlan as e:
        conn.send(("infeasible", (str(e), e.min_budget_flops)))
    except TrialFailed as e:
        conn.send(("failed", (str(e), e.result)))
    except ConfigError as e:
        conn.send(("config", str(e)))
    except BaseException as e:  # noqa: BLE001 - everything goes back as one line
        conn.send(("error", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    finally:
        conn.close()


def _nothing_spent(plan: TrialPlan, error: str) -> TrialResult:
    empty = FlopAccount(ComputeBreakdown(), ComputeBreakdown())
    return TrialResult(targets={}, spent=empty, budget_flops=plan.budget_flops, curves=[],
                       wall_seconds={}, status="failed", error=error)


def run_in_process(run_here: Callable[..., TrialResult], plan: TrialPlan, seed: int,
                   progress: Callable[..., None] | None) -> TrialResult:
    """Run one trial, ``run_here(plan, seed=seed, progress=...)``, in a fresh process and
    return or raise what it did. ``run_here`` must pickle (a module-level function or a bound
    method of a picklable object): ``spawn`` sends it to the child.

    Raises:
        InfeasiblePlan, ConfigError: as raised in the child (one line).
        TrialFailed: the child failed or died; ``.result`` holds what it spent (the last
            progress report's meter when it died).
    """
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(run_here, plan, seed, send), daemon=False)
    proc.start()
    send.close()
    outcome: tuple[str, Any] | None = None
    last_meter = None
    try:
        while True:
            try:
                kind, payload = recv.recv()
            except EOFError:
                break
            if kind == "progress":
                last_meter = payload[1]
                if progress:
                    progress(*payload)
                continue
            outcome = (kind, payload)
            break
    finally:
        proc.join()
        recv.close()
    if outcome is None:
        result = _nothing_spent(plan, f"trial process died (exit code {proc.exitcode})")
        if last_meter is not None:
            result.spent, result.curves = last_meter.spent, list(last_meter.records)
        raise TrialFailed(result.error or "trial process died", result)
    kind, payload = outcome
    if kind == "result":
        return payload
    if kind == "infeasible":
        raise InfeasiblePlan(payload[0], min_budget_flops=payload[1])
    if kind == "failed":
        raise TrialFailed(payload[0], payload[1])
    if kind == "config":
        raise ConfigError(payload)
    raise TrialFailed(payload, _nothing_spent(plan, payload))


__all__ = ["run_in_process"]
