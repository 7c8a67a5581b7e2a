"""Parity compares structure as well as numbers: the output tree, dict keys as a set,
sequence lengths and each leaf's dtype and shape, naming the leaf that differs."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from gatekeeper.worker.parity import Outputs, check_parity, load_reference, save_reference

TOL = {"atol": 1e-4, "rtol": 1e-4, "cosine": 0.99}
A, B = torch.randn(4, 3, generator=torch.Generator().manual_seed(0)), torch.arange(6)


def parity(candidate, reference, ref64=None):
    return check_parity(Outputs.of(candidate), Outputs.of(reference), ref64, TOL)


def test_identical_outputs_pass():
    assert parity({"logits": A, "ids": B}, {"logits": A.clone(), "ids": B.clone()})["passed"]


def test_dict_key_order_does_not_matter():
    assert parity({"logits": A, "ids": B}, {"ids": B, "logits": A})["passed"]


@pytest.mark.parametrize(
    "candidate, reference, method, leaf",
    [
        ({"scores": A}, {"logits": A}, "structure", "output"),
        ({"logits": A.half()}, {"logits": A}, "dtype", "output['logits']"),
        ((B.int(),), (B,), "dtype", "output[0]"),
        ([A, B], (A, B), "structure", "output"),
        ((A,), (A, B), "structure", "output"),
        (A[:2], A, "shape", "output"),
        ({"x": (A, A)}, {"x": (A, B)}, "dtype", "output['x'][1]"),
        (OrderedDict(logits=A), {"logits": A}, "structure", "output"),
    ],
)
def test_a_different_structure_fails_naming_the_leaf(candidate, reference, method, leaf):
    got = parity(candidate, reference)
    assert not got["passed"] and got["method"] == method, got
    assert got["detail"].startswith(leaf), got["detail"]


def test_numbers_still_decide_within_one_structure():
    got = parity({"logits": A * 1.01}, {"logits": A})
    assert not got["passed"] and "output['logits']" in got["detail"]
    assert parity({"logits": A + 1e-7}, {"logits": A})["passed"]


def test_nan_fails():
    bad = A.clone()
    bad[0, 0] = float("nan")
    assert parity(bad, A)["method"] == "nan-inf"


def test_reference_file_round_trip(tmp_path):
    out = {"logits": A, "extra": [B, 3]}
    path = tmp_path / "ref.pt"
    save_reference(str(path), Outputs.of(out), Outputs.of({"logits": A.double(), "extra": [B, 3]}))
    loaded, fp64 = load_reference(str(path))
    assert loaded.structure == Outputs.of(out).structure
    assert check_parity(Outputs.of(out), loaded, fp64, TOL)["passed"]
    renamed = check_parity(Outputs.of({"scores": A, "extra": [B, 3]}), loaded, fp64, TOL)
    assert not renamed["passed"] and renamed["method"] == "structure"


def test_an_old_flat_reference_still_loads_and_checks_dtypes(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"compiled": [A, B], "fp64": [A.double(), B]}, path)  # format 1
    loaded, fp64 = load_reference(str(path))
    assert loaded.structure is None
    assert check_parity(Outputs.of((A, B)), loaded, fp64, TOL)["passed"]
    assert check_parity(Outputs.of((A.half(), B)), loaded, fp64, TOL)["method"] == "dtype"
