"""RACE validation: pilot regimes against full-budget regimes.

After full-budget runs, per reward system (× model): the full-budget regime (from the
surrogate's posterior at fidelity 1, with the same labelling as the pilots'), whether it matches
the pilot regime, and the regret at full budget of the allocation the pilots recommended
(surrogate mean at the best allocation of that reward system minus at the recommended one).
See :mod:`allocopt.race`.

numpy and (through the surrogate) torch are imported inside functions.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from allocopt.race.data import Observation
from allocopt.race.design import RaceSettings
from allocopt.race.diagnose import RegimeDiagnosis, regime_of, share_fit
from allocopt.race.fit import fit_surrogate
from allocopt.spec import SearchSpace

@dataclass
class ValidationRow:
    """Pilot regime against the full-budget regime for one reward system (× model)."""

    reward: str
    model: str | None
    pilot_regime: str
    pilot_rho: float
    full_regime: str
    full_probability: float
    """Share of posterior samples (at the full budget) with ``full_regime``."""
    full_rho: float
    """Argmax over ρ of the surrogate mean at the full budget (at its best G)."""
    same_regime: bool | None
    """Whether the pilot regime is the full-budget one; ``None`` when the pilots left it
    ``unknown`` (too few for a fit): nothing to compare, neither a match nor a miss."""
    regret: float
    """Surrogate mean at the full budget: best allocation of this reward system minus the
    pilot-recommended one (>= 0; target units)."""
    num_full: int
    """Full-budget runs of this reward system (× model) the surrogate saw."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate(diagnoses: Sequence[RegimeDiagnosis], obs: Sequence[Observation], space: SearchSpace,
             settings: RaceSettings = RaceSettings(), surrogate: Any = None, seed: int = 0) -> list[ValidationRow]:
    """Pilot regimes against full-budget regimes (module docstring), from the surrogate
    fitted on ``obs`` (pilots and full runs; fitted here with ``seed`` when not given)."""
    import numpy as np

    sur = surrogate if surrogate is not None else fit_surrogate(obs, space, seed=seed)
    enc = sur.encoding
    lo, hi = space.rho
    grid = np.array(sorted({round(lo + (hi - lo) * i / (settings.rho_grid - 1), 4)
                            for i in range(settings.rho_grid)}))
    out = []
    for d in diagnoses:
        rows_g = {g: [enc.row(float(r), g, d.reward, d.model, 1.0) for r in grid] for g in space.group_sizes}
        means = {g: sur.predict(enc.tensor(rows_g[g]))[0].numpy() for g in rows_g}
        best_g = max(means, key=lambda g: means[g].max())
        full_rho = float(grid[int(means[best_g].argmax())])
        samples = sur.sample(enc.tensor(rows_g[best_g]).unsqueeze(0), settings.posterior_samples)[:, 0, :]
        rho_s = grid[samples.argmax(-1).numpy()]
        mine = [o for o in obs if o.allocation.reward == d.reward and o.allocation.model == d.model]
        share = share_fit(mine)
        labels = Counter(regime_of(float(r), float(s), settings) for r, s in zip(rho_s, share(rho_s)))
        full_regime, count = labels.most_common(1)[0]
        if math.isnan(d.rho):
            regret = math.nan
        else:
            rec = enc.tensor([enc.row(d.rho, d.group_size, d.reward, d.model, 1.0)])
            regret = max(0.0, float(means[best_g].max()) - float(sur.predict(rec)[0][0]))
        out.append(ValidationRow(
            reward=d.reward, model=d.model, pilot_regime=d.regime, pilot_rho=d.rho,
            full_regime=full_regime, full_probability=count / len(rho_s), full_rho=full_rho,
            same_regime=None if d.regime == "unknown" else d.regime == full_regime, regret=regret,
            num_full=sum(o.fidelity == "full" for o in mine)))
    return out


def same_regime_rate(rows: Sequence[ValidationRow], validated_only: bool = True) -> float:
    """Share of reward systems whose pilot regime matches the full-budget one, over those the
    pilots diagnosed (regime not ``unknown``); with ``validated_only``, also only those with at
    least one full-budget run. NaN when none is left."""
    use = [r for r in rows if r.same_regime is not None and (r.num_full > 0 or not validated_only)]
    return sum(bool(r.same_regime) for r in use) / len(use) if use else math.nan
