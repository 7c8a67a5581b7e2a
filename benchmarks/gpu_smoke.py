"""Issue 31's GPU checks at a small size, in one script: run it before and after GPU work.

Sections (``--only`` picks some; each one's figures go into ``OUT/smoke.json``, merged
with what an earlier run of other sections left there, and the tables into
``OUT/smoke.md``):

  study      AOTInductor by hand, each step in a child process that may die: export,
             aoti_compile_and_package, torch's aoti_load_package and a call, then
             torch's C++ loader as gatekeeper.load_aot calls it, run() and
             boxed_run(), single-threaded too; a death is its signal and step
  paths      the pipeline on a decoder (whole, regional, aot; default and
             reduce-overhead): compile, check, baseline, warm --probe, then
             gatekeeper.load_aot's first call in a fresh process (seconds after
             `import torch`, torch._inductor imported or not, equal to eager), and an
             unchanged pull request run paired: every deploy path side by side
  detection  benchmarks/detection_power.py --device cuda: unchanged and 10% slower pull
             requests, the default paired path, for as long as --detection-budget allows
  parity     transformers' ResNet checked unchanged, with one layer x1.01 and with GELU
             for ReLU; and its compiled error from float64 with cuDNN's TF32 on and off,
             against eager's and eager's at TF32 (gatekeeper.worker.tf32)
  zoo        benchmarks/zoo.py on six families of examples/zoo.toml (not in the default
             set: it takes a device call of its own)

The default set (study, paths, detection, parity) is meant to take 8 minutes on one
H100/H200 with the machine's own torch; ``--docs docs/gpu.md`` then rewrites that page's
generated part from ``OUT/smoke.json``, with the commit and torch version. On a CPU,
``--device cpu --tiny`` runs the same plumbing on tiny models (the e2e smoke of a torch
release: ``--only paths``); ``--device cuda`` without a GPU exits 2 with one line.

    python benchmarks/gpu_smoke.py --out OUT [--device cuda|cpu] [--tiny]
        [--only study,paths,detection,parity,zoo] [--docs docs/gpu.md]
    python benchmarks/gpu_smoke.py --out OUT --report-only --docs docs/gpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from smoke_report import DEFAULT, render, write_docs

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("study", "paths", "detection", "parity", "zoo")
FAMILIES = ("llama", "mixtral", "mamba", "bert", "resnet", "vit")  # of examples/zoo.toml

MODELS = textwrap.dedent("""
    from tiny_models import Transformer  # examples/tiny_models.py, copied beside

    def decoder():
        return Transformer(vocab=1024, d={d}, heads={heads}, layers={layers})
""")

CONFIG = textwrap.dedent("""
    [tool.gatekeeper]
    store = "store"

    [tool.gatekeeper.measure]
    min_time = {min_time}

    [[tool.gatekeeper.models]]
    name = "dec"
    factory = "smoke_models:decoder"
    inputs = [{{ shape = ["batch", "seq"], dtype = "int64", low = 0, high = 1024 }}]
    shapes = [{{ batch = 1, seq = {seq} }}]
    strategies = ["whole", "regional", "aot"]
    device = "{device}"
""")
# CUDA graphs: the same decoder whole, under reduce-overhead (its capture timed apart)
GRAPHS = textwrap.dedent("""
    [[tool.gatekeeper.models]]
    name = "dec-graphs"
    factory = "smoke_models:decoder"
    inputs = [{ shape = ["batch", "seq"], dtype = "int64", low = 0, high = 1024 }]
    shapes = [{ batch = 1, seq = {seq} }]
    modes = ["reduce-overhead"]
    device = "cuda"
""")

# AOTInductor by hand: each step printed before it runs, so a death names it
STUDY = textwrap.dedent("""
    import faulthandler, sys, time
    faulthandler.enable()
    step, pkg, device = sys.argv[1:4]
    d, layers = int(sys.argv[4]), int(sys.argv[5])
    def say(s): print("STEP", s, flush=True)
    import torch
    sys.path.insert(0, sys.argv[6])
    from tiny_models import Transformer
    torch.manual_seed(0)
    model = Transformer(vocab=1024, d=d, heads=4, layers=layers).to(device).eval()
    ids = torch.randint(0, 1024, (1, 64), device=device)
    with torch.no_grad():
        want = model(ids)
        if step == "build":
            say("export")
            ep = torch.export.export(model, (ids,))
            say("aoti_compile_and_package")
            torch._inductor.aoti_compile_and_package(ep, package_path=pkg)
        elif step == "torch":
            say("aoti_load_package")
            m = torch._inductor.aoti_load_package(pkg)
            say("first call")
            got = m(ids)
        else:
            from gatekeeper.runtime import LOADER_ARGS, AotModel, load_package
            from pathlib import Path
            say("C++ loader, as load_aot calls it")
            model = load_package(pkg)
            if step == "single":  # the same constructor, run single-threaded
                args = next(a for a in LOADER_ARGS if len(a) >= 2)
                args = args[:1] + (True,) + args[2:]
                say("C++ loader " + repr(args))
                model = AotModel(torch._C._aoti.AOTIModelPackageLoader(pkg, *args), Path(pkg))
            say("first call " + ("boxed_run" if step == "boxed" else "run"))
            if step == "boxed":
                got = model._loader.boxed_run([ids])[0]
            else:
                got = model(ids)
        if step != "build":
            torch.cuda.synchronize() if device == "cuda" else None
            err = (got.double() - want.double()).abs().max().item()
            say(f"done, max abs diff from eager {err:.2g}")
""")


STUDY_STEPS = {
    "build": "torch.export, aoti_compile_and_package",
    "torch": "torch._inductor.aoti_load_package, a call",
    "cxx": "the C++ loader as load_aot calls it, run()",
    "single": "the C++ loader single-threaded, run()",
    "boxed": "the C++ loader, boxed_run()",
}


def sh(cmd: list[str], cwd: Path, timeout: float = 600, env: dict | None = None):
    try:
        return subprocess.run(
            cmd,
            cwd=cwd,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout:.0f} s")


def gk(repo: Path, *args: str, timeout: float = 600) -> tuple[int, dict, str]:
    proc = sh([sys.executable, "-m", "gatekeeper", *args, "--json"], repo, timeout)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = {}
    tail = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return proc.returncode, doc, tail[-1] if tail else f"exit {proc.returncode}"


def log(msg: str) -> None:
    print(f"[smoke {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def died(proc: subprocess.CompletedProcess) -> str:
    """How a child ended: ``ok``, ``SIGSEGV in <step>``, or its last line."""
    steps = [ln[5:] for ln in proc.stdout.splitlines() if ln.startswith("STEP ")]
    last = steps[-1] if steps else "start"
    if proc.returncode == 0:
        return f"ok ({last})"
    if proc.returncode < 0:
        import signal

        return f"{signal.Signals(-proc.returncode).name} in {last}"
    tail = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return f"exit {proc.returncode} in {last}: {tail[-1] if tail else ''}"[:300]


def study(args: argparse.Namespace, work: Path) -> dict:
    d, layers = (64, 2) if args.tiny else (256, 8)
    pkg = work / "study.pt2"
    out = {"model": f"decoder, {layers} layers of width {d}, b1-s64", "steps": {}}
    for step, what in STUDY_STEPS.items():
        if step != "build" and not pkg.is_file():
            out["steps"][what] = "skipped: no package"
            continue
        start = time.monotonic()
        argv = [step, str(pkg), args.device, str(d), str(layers), str(ROOT / "examples")]
        proc = sh([sys.executable, "-c", STUDY, *argv], work, timeout=args.step_timeout)
        out["steps"][what] = f"{died(proc)} ({time.monotonic() - start:.0f} s)"
        log(f"study {what}: {out['steps'][what]}")
    return out


def pipeline_repo(args: argparse.Namespace, work: Path) -> Path:
    repo = work / "paths"
    repo.mkdir()
    d, heads, layers, seq = (64, 4, 2, 16) if args.tiny else (256, 4, 4, 64)
    shutil.copy(ROOT / "examples" / "tiny_models.py", repo)  # the project's own code
    (repo / "smoke_models.py").write_text(MODELS.format(d=d, heads=heads, layers=layers))
    graphs = GRAPHS.replace("{seq}", str(seq)) if args.device == "cuda" else ""
    (repo / "gatekeeper.toml").write_text(
        CONFIG.format(device=args.device, min_time=args.min_time, seq=seq) + graphs
    )
    (repo / ".gitignore").write_text("store/\nout*/\ncache/\n__pycache__/\n")
    for git_args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "main"]):
        sh(["git", "-c", "user.name=s", "-c", "user.email=s@localhost", *git_args], repo)
    return repo


# A deploy's first call through gatekeeper.load_aot in a fresh process, then eager's
LOAD_AOT = textwrap.dedent("""
    import json, sys, time
    start = time.perf_counter()
    import torch
    imported = time.perf_counter()
    import gatekeeper
    device = sys.argv[2]
    ids = torch.randint(0, 1024, (1, int(sys.argv[3])), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    torch.cuda.synchronize() if device == "cuda" else None
    t0 = time.perf_counter()
    model = gatekeeper.load_aot("gatekeeper.toml", sys.argv[1], cache_dir="cache")
    loaded = time.perf_counter()
    with torch.no_grad():
        out = model(ids)
    torch.cuda.synchronize() if device == "cuda" else None
    first = time.perf_counter()
    inductor = "torch._inductor" in sys.modules
    sys.path.insert(0, ".")
    import smoke_models
    torch.manual_seed(0)
    eager = smoke_models.decoder().to(sys.argv[2]).eval()
    with torch.no_grad():
        want = eager(ids)
    from gatekeeper.worker.outputs import Outputs
    from gatekeeper.worker.parity import check_parity, fp64_reference
    from gatekeeper.worker.calls import Inputs
    ref = fp64_reference(eager, Inputs((ids,)))
    from gatekeeper.config import ParityTolerance

    tol = ParityTolerance(atol=1e-4, rtol=1e-4, cosine=0.99)
    parity = check_parity(Outputs.of(out), Outputs.of(want), ref.leaves if ref else None, tol)
    print(json.dumps({"import_torch_s": imported - start, "load_s": loaded - t0,
                      "first_call_s": first - loaded, "load_and_first_call_s": first - t0,
                      "inductor_imported": inductor, "parity": parity}))
""")


def paths(args: argparse.Namespace, work: Path) -> dict:
    repo = pipeline_repo(args, work)
    t = args.step_timeout
    out: dict = {}
    rc, doc, err = gk(repo, "compile", timeout=t)
    out["compile"] = {x["target"]: x for x in doc.get("targets", [])} or {"error": err}
    log(f"compile: exit {rc}")
    rc, doc, err = gk(repo, "check", "--mode", "stored", "--out", "out", timeout=t)
    results = repo / "out" / "results.json"
    checked = json.loads(results.read_text())["targets"] if results.is_file() else []
    out["check"] = {r["target"]: _slim(r) for r in checked} or {"error": err}
    log(f"check: exit {rc}")
    if results.is_file():
        gk(repo, "baseline", "--results", str(results), "--ref", "main", timeout=t)
    rc, doc, err = gk(repo, "warm", "--probe", "--cache-dir", "cache", timeout=t)
    out["warm"] = {x["target"]: x for x in doc.get("targets", [])} or {"error": err}
    log(f"warm --probe: exit {rc}")
    # a service of the whole target alone loads its precompile package (Dynamo skipped)
    rc, doc, err = gk(
        repo,
        "warm",
        "--probe",
        "--cache-dir",
        "cache-whole",
        "--target",
        "dec/*/default",
        timeout=t,
    )
    out["precompiled"] = {x["target"]: x for x in doc.get("targets", [])} or {"error": err}
    seq = "16" if args.tiny else "64"
    for target in [k for k in out["compile"] if k.endswith("+aot")]:
        proc = sh([sys.executable, "-c", LOAD_AOT, target, args.device, seq], repo, t)
        try:
            out.setdefault("load_aot", {})[target] = json.loads(proc.stdout.splitlines()[-1])
        except (ValueError, IndexError):
            out.setdefault("load_aot", {})[target] = {"error": died(proc)}
    sh(["git", "checkout", "-qb", "pr"], repo)
    (repo / "smoke_models.py").write_text((repo / "smoke_models.py").read_text() + "\n# pr\n")
    sh(["git", "-c", "user.name=s", "-c", "user.email=s@localhost", "commit", "-qam", "pr"], repo)
    rc, doc, err = gk(repo, "run", "--base-ref", "main", "--out", "out-pr", timeout=t)
    out["pr"] = {
        x["target"]: x["verdict"] + (f": {x['error']}" if x.get("error") else "")
        for x in doc.get("targets", [])
    } or {"error": err}
    out["pr_exit"] = rc
    log(f"unchanged pull request, paired: exit {rc}")
    return out


def _slim(r: dict) -> dict:
    """A check result without its samples: what the tables read."""
    lat = r.get("latency") or {}
    return {
        "status": r.get("status"),
        "error": r.get("error"),
        "compile": r.get("compile"),
        "p50": (lat.get("compiled") or {}).get("p50"),
        "eager_p50": (lat.get("eager") or {}).get("p50"),
        "parity": r.get("parity"),
        "aot": r.get("aot"),
    }


def detection(args: argparse.Namespace, work: Path) -> dict:
    trials = work / "detection.json"
    n = 2 if args.tiny else 20
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "detection_power.py"),
        "--device",
        args.device,
        "--levels",
        f"0:{n},10:{n}",
        "--modes",
        "default",
        "--min-time",
        str(args.min_time),
        "--calibration",
        "1:3" if args.tiny else "2:4",
        "--budget",
        str(args.detection_budget / 2),  # per level
        "--json",
        str(trials),
    ]
    proc = sh(cmd, work, timeout=args.detection_budget + 360)
    log(f"detection: exit {proc.returncode}")
    found = json.loads(trials.read_text()) if trials.is_file() else []
    return {"trials": found, "error": None if found else died(proc)}


def parity(args: argparse.Namespace, work: Path) -> dict:
    from smoke_parity import parity_section

    return parity_section(args, work, sh, gk, log)


def zoo(args: argparse.Namespace, work: Path) -> dict:
    out = work / "zoo.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "zoo.py"), "--json", str(out)]
    for family in FAMILIES:
        cmd += ["--target", family]
    proc = sh(cmd, work, timeout=args.step_timeout * 3)
    return {"families": json.loads(out.read_text())} if out.is_file() else {"error": died(proc)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny models (the CPU plumbing)")
    ap.add_argument("--only", help=f"sections, comma-separated (default: {','.join(DEFAULT)})")
    ap.add_argument("--min-time", type=float, default=0.5, help="measure.min_time, seconds")
    ap.add_argument("--step-timeout", type=float, default=300)
    ap.add_argument("--detection-budget", type=float, default=150, help="seconds of trials")
    ap.add_argument("--docs", type=Path, help="rewrite this page's generated part")
    ap.add_argument("--commit", help="the commit measured (default: git's HEAD, if any)")
    ap.add_argument("--report-only", action="store_true", help="run nothing: tables, docs")
    args = ap.parse_args()
    wanted = args.only.split(",") if args.only else list(DEFAULT)
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        sys.exit(f"gpu_smoke: unknown section(s) {', '.join(unknown)}; known: {SECTIONS}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "smoke.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    if not args.report_only:
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                print("gpu_smoke: --device cuda, but torch sees no CUDA device", file=sys.stderr)
                return 2
        ran = run_sections(args, wanted)
        if "detection" in ran and "detection" in doc:  # trials add up over device calls
            ran["detection"]["trials"] = doc["detection"].get("trials", []) + ran["detection"].get(
                "trials", []
            )
        doc.update(ran)
        path.write_text(json.dumps(doc, indent=2, default=str))
    (args.out / "smoke.md").write_text(render(doc))
    if args.docs:
        write_docs(args.docs, doc)
    print(render(doc))
    return 0


def run_sections(args: argparse.Namespace, wanted: list[str]) -> dict:
    import torch

    runners = {"study": study, "paths": paths, "detection": detection, "parity": parity}
    runners["zoo"] = zoo
    work = Path(tempfile.mkdtemp(prefix="gk-smoke-"))
    machine = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    head = args.commit or sh(["git", "rev-parse", "--short", "HEAD"], ROOT).stdout.strip()
    out: dict = {
        "machine": {"device": machine, "torch": torch.__version__, "commit": head or "unknown"},
        "run": {"device": args.device, "tiny": args.tiny, "min_time": args.min_time},
    }
    for name in wanted:
        start = time.monotonic()
        log(f"{name}: start")
        try:
            section = runners[name](args, work)
        except Exception as e:  # a section that breaks leaves the others to run
            section = {"error": f"{type(e).__name__}: {e}"}
        section["seconds"] = round(time.monotonic() - start, 1)
        out[name] = section
        log(f"{name}: {section['seconds']:.0f} s")
    shutil.rmtree(work, ignore_errors=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
