"""Loss values against hand computations, and the gradients pointing the right way."""

from __future__ import annotations

import math

import pytest
import torch

from sentsim.losses import LOSSES, CoSENTLoss, CosineRegressionLoss


def test_cosine_regression_matches_hand_value():
    u = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    v = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # cosines 1 and 0
    y = torch.tensor([0.5, 0.25])
    assert CosineRegressionLoss()(u, v, y).item() == pytest.approx(((1 - 0.5) ** 2 + 0.25 ** 2) / 2)


def test_cosine_regression_zero_at_target_and_gradient_moves_toward_it():
    u = torch.tensor([[1.0, 0.2]], requires_grad=True)
    v = torch.tensor([[0.3, 1.0]])
    target = torch.tensor([0.9])
    loss_fn = CosineRegressionLoss()
    before = loss_fn(u, v, target)
    before.backward()
    with torch.no_grad():
        u2 = u - 0.5 * u.grad
    assert loss_fn(u2, v, target).item() < before.item()
    assert CosineRegressionLoss.on_scores(torch.tensor([0.3, 0.7]), torch.tensor([0.3, 0.7])).item() == 0.0


def test_cosent_matches_hand_value():
    s = torch.tensor([0.9, 0.1, 0.5])
    y = torch.tensor([1.0, 0.0, 0.5])
    # ordered label pairs (i above j): (0,1), (0,2), (2,1); terms exp(20*(s_j - s_i))
    terms = [20 * (0.1 - 0.9), 20 * (0.5 - 0.9), 20 * (0.1 - 0.5)]
    expected = math.log(1 + sum(math.exp(t) for t in terms))
    assert CoSENTLoss().on_scores(s, y).item() == pytest.approx(expected, rel=1e-4)  # float32 arithmetic


def test_cosent_penalises_misordering_and_ignores_ties():
    y = torch.tensor([1.0, 0.0])
    loss = CoSENTLoss()
    assert loss.on_scores(torch.tensor([0.2, 0.8]), y) > loss.on_scores(torch.tensor([0.8, 0.2]), y)
    ties = loss.on_scores(torch.tensor([0.2, 0.8]), torch.tensor([0.5, 0.5]))
    assert ties.item() == pytest.approx(0.0)  # no ordered pair: log(1 + 0)


def test_cosent_is_finite_for_large_gaps():
    s = torch.tensor([-1.0, 1.0] * 50, requires_grad=True)
    y = torch.tensor([1.0, 0.0] * 50)
    out = CoSENTLoss().on_scores(s, y)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(s.grad).all()


def test_registry_names():
    assert set(LOSSES) == {"cosine_regression", "cosent"}
