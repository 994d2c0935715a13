"""The multi-fidelity surrogate: the budget drift it learns, its mixture, samples and shapes."""

import math

import pytest
import torch

from allocopt.surrogate import (DRIFT_GRID, DRIFT_PRIOR_SD, Encoding, MultiFidelitySurrogate,
                                drift_support, fidelity_of)

ENC = Encoding((0.2, 0.9), (4, 8), ("sparse", "prm"))
SHIFT = 0.05  # the true optimum moves +0.05 in rho per decade of budget


def truth(rho, g, reward, fraction):
    """A bump in rho whose centre drifts with the budget; prm 0.05 above sparse; G=8 +0.02."""
    centre = (0.45 if reward == "prm" else 0.7) + SHIFT * math.log10(fraction)
    return 0.3 + 0.05 * (reward == "prm") + 0.02 * (g == 8) + 0.25 * math.exp(-((rho - centre) / 0.15) ** 2)


def data(full_rhos, noise=0.005, seed=0):
    gen = torch.Generator().manual_seed(seed)
    rows, ys = [], []
    for reward in ("sparse", "prm"):
        for i in range(14):
            rho, g = 0.2 + 0.7 * i / 13, (4, 8)[i % 2]
            rows.append(ENC.row(rho, g, reward, None, 0.1))
            ys.append(truth(rho, g, reward, 0.1))
    for rho in full_rhos:
        rows.append(ENC.row(rho, 8, "prm", None, 1.0))
        ys.append(truth(rho, 8, "prm", 1.0))
    Y = torch.tensor(ys, dtype=torch.double)[:, None]
    return ENC.tensor(rows), Y + noise * torch.randn(Y.shape, generator=gen, dtype=torch.double)


def argmax_full(sur, reward="prm", g=8):
    rhos = [0.2 + 0.7 * i / 700 for i in range(701)]
    mean, _ = sur.predict(ENC.tensor([ENC.row(r, g, reward, None, 1.0) for r in rhos]))
    return rhos[int(mean.argmax())]


def test_fidelity_scale():
    assert fidelity_of(1.0) == 1.0 and fidelity_of(0.1) == 0.5 and fidelity_of(1e-4) == 0.0


def test_pilots_only_keep_the_drift_prior():
    """With pilots of one budget the likelihood does not depend on the drift: the mixture is the
    prior N(0, DRIFT_PRIOR_SD²) on the grid (weights below 1e-3 dropped)."""
    X, Y = data([])
    sur = MultiFidelitySurrogate(ENC, X, Y)
    w = [math.exp(-0.5 * (d / DRIFT_PRIOR_SD) ** 2) for d in DRIFT_GRID]
    w = [x / sum(w) for x in w]
    kept = [(d, x) for d, x in zip(DRIFT_GRID, w) if x >= 1e-3]
    sd = math.sqrt(sum(x * d * d for d, x in kept) / sum(x for _, x in kept))
    mean, got_sd = sur.drift
    assert abs(mean) < 1e-9 and got_sd == pytest.approx(sd, rel=1e-6)
    assert 0.04 < got_sd < 0.06
    # the pilots' optimum, unshifted (the prior is centred on no drift): 0.45 - 0.05
    assert abs(argmax_full(sur) - 0.40) < 0.03


def test_full_runs_teach_the_drift_and_move_the_optimum():
    """A few full runs near the pilots' optimum: the drift posterior centres on +0.05 per decade
    and the full-budget optimum of prm moves to 0.45, sparse's (no full run) to 0.70."""
    X, Y = data([0.35, 0.42, 0.48, 0.55])
    sur = MultiFidelitySurrogate(ENC, X, Y)
    mean, sd = sur.drift
    assert abs(mean - SHIFT) < 0.02 and sd < 0.03, (mean, sd)
    assert abs(argmax_full(sur) - 0.45) < 0.02
    assert abs(argmax_full(sur, "sparse") - 0.70) < 0.04  # learned from prm's full runs
    # G: the shared G curve puts 8 above 4 in both cells, by about 0.02
    m, _ = sur.predict(ENC.tensor([ENC.row(0.45, 8, "prm", None, 1.0), ENC.row(0.45, 4, "prm", None, 1.0)]))
    assert 0.005 < float(m[0] - m[1]) < 0.035


def test_predict_and_sample_shapes_and_agreement():
    X, Y = data([0.4, 0.5])
    sur = MultiFidelitySurrogate(ENC, X, Y, seed=3)
    Z = ENC.tensor([ENC.row(r, 8, "prm", None, 1.0) for r in (0.3, 0.45, 0.6)])
    mean, sd = sur.predict(Z)
    assert mean.shape == (3,) and sd.shape == (3,) and bool((sd > 0).all())
    s = sur.sample(Z.reshape(1, 3, -1), 4000)
    assert s.shape == (4000, 1, 3)
    assert torch.allclose(s.mean(0)[0], mean, atol=4 * float(sd.max()) / math.sqrt(4000) + 1e-4)
    assert torch.allclose(s.std(0)[0], sd, rtol=0.1)
    assert torch.equal(s, sur.sample(Z.reshape(1, 3, -1), 4000))  # seeded
    # warm start from the fitted hyperparameters gives the same fit
    again = MultiFidelitySurrogate(ENC, X, Y, seed=3, init=sur.raw)
    assert torch.allclose(again.predict(Z)[0], mean, atol=2e-3)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="n x"):
        MultiFidelitySurrogate(ENC, torch.zeros(3, 2, dtype=torch.double), torch.zeros(3, 1))
    with pytest.raises(ValueError, match="at least 2"):
        MultiFidelitySurrogate(ENC, ENC.tensor([ENC.row(0.5, 4, "prm", None, 1.0)]),
                               torch.zeros(1, 1, dtype=torch.double))


@pytest.mark.parametrize("full_rhos", [[], [0.35, 0.42, 0.48, 0.55]], ids=["pilots-only", "with-full-runs"])
def test_gpytorch_port_matches_the_closed_form_reference(full_rhos):
    """An independent second method: at the reference's fitted hyperparameters (``fit=False``),
    the GPyTorch model's δ-mixture weights, its posterior mean and variance per δ and the
    mixture's mean and sd equal the hand-written closed-form GP's (tests/_reference_gp.py)."""
    from _reference_gp import MultiFidelitySurrogate as Reference

    X, Y = data(full_rhos)
    ref = Reference(ENC, X, Y)
    port = MultiFidelitySurrogate(ENC, X, Y, init=ref.raw, fit=False)

    def rel(a, b):
        return float(((a - b).abs() / b.abs().clamp_min(1e-12)).max())

    # mixture weights over the whole δ grid, and the kept components
    if full_rhos:
        assert rel(port._log_weights().exp(), ref._log_weights(ref.raw).exp()) < 1e-6
    assert torch.equal(port.drifts, ref.drifts) and rel(port.weights, ref.weights) < 1e-6
    Z = ENC.tensor([ENC.row(0.2 + 0.7 * i / 40, g, r, None, f)
                    for i in range(41) for g in (4, 8) for r in ("sparse", "prm") for f in (0.1, 0.3, 1.0)])
    # per component: posterior mean and (noise-free) variance in standardized units
    post = port._posterior(Z)
    with torch.no_grad():
        for k, comp in enumerate(ref._comps):
            m_ref, v_ref = ref._component(Z, comp, False)
            assert rel(post.mean[k].detach(), m_ref) < 1e-6
            assert rel(post.variance[k].detach(), v_ref) < 1e-6
    # the mixture, in target units
    (m1, s1), (m0, s0) = port.predict(Z), ref.predict(Z)
    assert rel(m1, m0) < 1e-6 and rel(s1, s0) < 1e-6
    # the joint covariance used for pilot-versus-full gains
    c1, v1 = port.covariance_with(Z[:1], Z[1:20])
    c0, v0 = ref.covariance_with(Z[:1], Z[1:20])
    assert rel(c1, c0) < 1e-6 and rel(v1, v0) < 1e-6
    # the refit-free update's δ grid (the kept δ and their neighbours): the same kept components
    # (and perhaps a neighbour that the smaller normalization lifts over MIN_WEIGHT), and the
    # same posterior to a hundredth of its sd
    assert drift_support([0.0]) == (-0.01, 0.0, 0.01) and drift_support([-0.15, -0.14]) == (-0.15, -0.14, -0.13)
    grid = drift_support(port.drifts.tolist())
    part = MultiFidelitySurrogate(ENC, X, Y, init=ref.raw, fit=False, drift_grid=grid)
    assert set(port.drifts.tolist()) <= set(part.drifts.tolist()) <= set(grid)
    m2, s2 = part.predict(Z)
    assert float(((m2 - m1).abs() / s1).max()) < 0.01 and float(((s2 - s1).abs() / s1).max()) < 0.01
    with pytest.raises(ValueError, match="subset of DRIFT_GRID"):
        MultiFidelitySurrogate(ENC, X, Y, init=ref.raw, fit=False, drift_grid=[0.005])
