"""gpu_smoke's parity section: transformers' ResNet (examples/zoo_models.py's) through an
unchanged pull request and two planted numerics changes, each paired with main as the
Action runs it (compiled vs eager under the TF32 rule, and vs the base commit's outputs);
and the errors behind that rule (gatekeeper/worker/tf32.py), measured."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODELS = textwrap.dedent("""
    import torch
    from zoo_models import resnet as stock  # examples/zoo_models.py, copied beside

    SCALE = {scale}  # one layer's weights times this
    ACT = {act!r}  # the activation

    def resnet():
        return stock()

    def resnet_scaled():
        model = stock()
        with torch.no_grad():
            model.resnet.encoder.stages[-1].layers[0].layer[0].convolution.weight.mul_(SCALE)
        return model

    def resnet_act():
        from transformers import ResNetConfig, ResNetForImageClassification

        config = stock().config
        config.hidden_act = ACT
        return ResNetForImageClassification(config)
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"
    precompile = "off"

    [tool.gatekeeper.measure]
    min_time = {min_time}
""")
MODEL = textwrap.dedent("""
    [[tool.gatekeeper.models]]
    name = "{name}"
    factory = "parity_models:{name}"
    inputs = [{{ shape = ["batch", 3, 32, 32] }}]
    shapes = [{{ batch = 4 }}]
    device = "{device}"
""")

# The errors from float64 behind the rule, in one process: eager and compiled with
# cuDNN's TF32 on (the default) and off, and eager at TF32 as gatekeeper emulates it
ERRORS = textwrap.dedent("""
    import json, math, sys
    import torch
    sys.path.insert(0, sys.argv[2])
    from zoo_models import resnet
    from gatekeeper.worker.calls import Inputs
    from gatekeeper.worker.parity import fp64_reference
    from gatekeeper.worker.tf32 import tf32_eager
    device = sys.argv[1]
    torch.manual_seed(0)
    model = resnet().to(device).eval()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0)).to(device)
    inputs = Inputs((x,))
    ref = list(fp64_reference(model, inputs).leaves.values())[0].cpu()
    def rmse(out):
        t = out.logits if hasattr(out, "logits") else out
        return math.sqrt(((t.detach().cpu().double() - ref) ** 2).mean().item())
    def with_tf32(on, fn):
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = on
        try:
            with torch.no_grad():
                return fn()
        finally:
            torch.backends.cudnn.allow_tf32 = before
    compiled = torch.compile(model)
    errors = {
        "eager, cuDNN TF32 on": rmse(with_tf32(True, lambda: model(x))),
        "eager, cuDNN TF32 off": rmse(with_tf32(False, lambda: model(x))),
        "compiled, cuDNN TF32 on": rmse(with_tf32(True, lambda: compiled(x))),
        "compiled, cuDNN TF32 off": rmse(with_tf32(False, lambda: compiled(x))),
    }
    for nearest, how in ((False, "truncated, the rule's"), (True, "rounded to nearest")):
        emulated = tf32_eager(model, inputs, conv=True, matmul=False, nearest=nearest)
        errors[f"eager at TF32, operands {how}"] = rmse(list(emulated.leaves.values())[0])
    print(json.dumps(errors))
""")


def parity_section(args, work: Path, sh, gk, log) -> dict:
    repo = work / "parity"
    repo.mkdir()
    names = ("resnet", "resnet_scaled", "resnet_act")
    examples = str(ROOT / "examples")
    shutil.copy(ROOT / "examples" / "zoo_models.py", repo)  # the project's own code
    write = (repo / "parity_models.py").write_text
    write(MODELS.format(scale=1.0, act="relu"))
    config = CONFIG.format(min_time=args.min_time)
    models = "".join(MODEL.format(name=n, device=args.device) for n in names)
    (repo / "gatekeeper.toml").write_text(config + models)
    (repo / ".gitignore").write_text("store/\nout*/\n__pycache__/\n")
    ident = ["-c", "user.name=s", "-c", "user.email=s@localhost"]
    for git_args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "main"]):
        sh(["git", *ident, *git_args], repo)
    t = args.step_timeout
    out: dict = {"changes": {"resnet_scaled": "a conv's weights x1.01", "resnet_act": "gelu"}}
    sh(["git", "checkout", "-qb", "pr"], repo)
    write(MODELS.format(scale=1.01, act="gelu") + "\n# pr\n")
    sh(["git", *ident, "commit", "-qam", "pr"], repo)
    rc, doc, err = gk(repo, "run", "--base-ref", "main", "--out", "out-pr", timeout=t)
    out["pr"] = {
        x["target"]: {"verdict": x["verdict"], "reasons": x["reasons"], "parity": x.get("parity")}
        for x in doc.get("targets", [])
    } or {"error": err}
    log(f"parity: pull request exit {rc}")
    proc = sh([sys.executable, "-c", ERRORS, args.device, examples], repo, t)
    try:
        out["errors"] = json.loads(proc.stdout.splitlines()[-1])
    except (ValueError, IndexError):
        out["errors"] = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return out
