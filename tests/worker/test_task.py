"""The worker's training, precision and recompile helpers, without compiling."""

from __future__ import annotations

from pathlib import Path

import torch

from gatekeeper.config import ModelConfig, ParityTolerance
from gatekeeper.worker.parity import Outputs, check_parity
from gatekeeper.worker.precision import check_precision, parity_tolerance
from gatekeeper.worker.train_step import Trainer, copy_state, make_loss, name_task

TOL = ParityTolerance(atol=1e-4, rtol=1e-4, cosine=0.99)
CFG = ModelConfig(name="m", factory="m:make", inputs=[{"shape": [2, 4]}], tasks=["train"])


def test_low_precision_loosens_allclose_only_to_its_scale():
    assert parity_tolerance(TOL, "fp32") == TOL
    assert parity_tolerance(TOL, "bf16").atol == 1.6e-2
    assert parity_tolerance(TOL, "fp16").rtol == 2e-3
    loose = TOL.model_copy(update={"atol": 0.1})
    assert parity_tolerance(loose, "bf16").atol == 0.1  # never tighter


def test_cpu_autocast_supports_both_low_precisions():
    for p in ("fp32", "bf16", "fp16"):
        check_precision("cpu", p)


def test_training_parity_failure_names_the_task_and_parameters():
    torch.manual_seed(0)
    a = Trainer(torch.nn.Linear(4, 2), CFG, make_loss(CFG, None, torch.zeros(1)), "cpu", "fp32")
    out = a.outputs([torch.tensor(1.0)])
    moved = {**out, "params": {k: v + 1e-2 for k, v in out["params"].items()}}
    check = name_task(check_parity(Outputs.of(moved), Outputs.of(out), None, TOL), 3)
    assert not check["passed"]
    assert check["detail"].startswith(
        "train: parameters after 3 steps differ: output['params']['weight']"
    )


def test_copy_state_is_in_place_so_compiled_guards_keep_their_tensors():
    torch.manual_seed(0)
    loss = make_loss(CFG, None, torch.zeros(1))
    src = Trainer(torch.nn.Linear(4, 2), CFG, loss, "cpu", "fp32")
    dst = Trainer.copy_of(src.model, CFG, loss, "cpu", "fp32", Path("."))
    x = torch.randn(3, 4)
    src.step(x)
    src.step(x)
    dst.step(x)
    ids = [id(t) for t in dst.tensors()]
    copy_state(src, dst)
    assert [id(t) for t in dst.tensors()] == ids
    assert all(torch.equal(s, d) for s, d in zip(src.tensors(), dst.tensors(), strict=True))


def test_default_loss_needs_a_floating_output():
    import pytest

    from gatekeeper.errors import ConfigError

    with pytest.raises(ConfigError, match="train.loss"):
        make_loss(CFG, None, torch.zeros(2, dtype=torch.int64))


def test_optimizer_arguments_it_rejects_are_a_config_error_naming_train():
    import pytest

    from gatekeeper.config import TrainConfig
    from gatekeeper.errors import ConfigError
    from gatekeeper.worker.train_step import make_optimizer

    cfg = TrainConfig.model_validate({"optimizer": "SGD", "nesterov_typo": True})
    with pytest.raises(ConfigError, match=r"^train: torch.optim.SGD rejects") as e:
        make_optimizer(torch.nn.Linear(2, 2), cfg)
    assert "\n" not in str(e.value)
