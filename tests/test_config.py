"""Tests of gatekeeper.config (schema, discovery, one-line errors) and of how the CLI
reports config and usage errors: exit 2 and exactly one line on stderr."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from gatekeeper import cli
from gatekeeper.config import DEFAULT_STORE, Config, GateConfig, ModelConfig, find_config
from gatekeeper.errors import ConfigError
from gatekeeper.project import load_config

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "gatekeeper.toml"

MODEL = """
[[models]]
name = "m"
factory = "mymod:make"
inputs = [{ shape = ["batch", 4] }]
shapes = [{ batch = 2 }]
"""


def write(dir_: Path, name: str, text: str) -> Path:
    p = dir_ / name
    p.write_text(textwrap.dedent(text))
    return p


def config_error(tmp_path: Path, text: str, name: str = "gatekeeper.toml") -> str:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: "), msg
    return msg


# -- valid configs --------------------------------------------------------------------------
def test_example_config_loads():
    cfg = load_config(EXAMPLE)
    assert [m.name for m in cfg.models] == ["mlp", "cnn", "block", "lm"]
    assert cfg.path == EXAMPLE.absolute()
    assert cfg.base_dir == EXAMPLE.parent
    assert cfg.store == ".gatekeeper/store"
    block = cfg.models[2]
    assert block.inputs[0].dtype == "int64"
    assert (block.inputs[0].low, block.inputs[0].high) == (0, 512)
    assert block.shapes == [{"batch": 1, "seq": 32}, {"batch": 4, "seq": 64}]
    assert cfg.gate == GateConfig()
    lm = cfg.models[3]  # the tour's generation: the model's own loop
    assert lm.tasks == ["generate"]
    assert (lm.generation.prefill, lm.generation.decode) == (
        "tiny_models:prefill",
        "tiny_models:decode",
    )


def test_top_level_keys_in_gatekeeper_toml(tmp_path):
    write(
        tmp_path,
        "gatekeeper.toml",
        'store = "s3://bucket/prefix"\n'
        + MODEL
        + """
        [gate]
        latency_regression = 0.1
        """,
    )
    cfg = load_config(None, cwd=tmp_path)
    assert cfg.store == "s3://bucket/prefix"
    assert cfg.gate.latency_regression == 0.1
    assert cfg.models[0].factory == "mymod:make"
    assert cfg.path == (tmp_path / "gatekeeper.toml").absolute()


def test_tool_section_in_pyproject(tmp_path):
    write(
        tmp_path,
        "pyproject.toml",
        """
        [project]
        name = "someone-elses"

        [tool.gatekeeper]
        read_only = true

        [[tool.gatekeeper.models]]
        name = "m"
        factory = "mymod:make"
        inputs_factory = "mymod:inputs"
        shapes = [{ batch = 2 }]

        [tool.gatekeeper.gate.parity]
        atol = 0.01
        """,
    )
    cfg = load_config(None, cwd=tmp_path)
    assert cfg.read_only is True
    assert cfg.store == DEFAULT_STORE
    assert cfg.models[0].inputs_factory == "mymod:inputs"
    assert cfg.gate.parity.atol == 0.01
    assert cfg.gate.parity.rtol == 1e-4  # the rest of the table keeps its default


def test_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "gatekeeper.toml", MODEL))
    m = cfg.models[0]
    assert m.modes == ["default"] and m.dynamic is False and m.device == "auto"
    assert m.backend == "inductor" and m.options == {} and m.seed == 0
    assert cfg.read_only is False and cfg.endpoint_url is None
    assert cfg.measure.warmup >= 0 and cfg.measure.timeout > 0


# -- discovery ------------------------------------------------------------------------------
def test_gatekeeper_toml_wins_over_pyproject(tmp_path):
    write(tmp_path, "gatekeeper.toml", MODEL)
    write(tmp_path, "pyproject.toml", '[tool.gatekeeper]\nstore = "x"\n')
    assert find_config(None, tmp_path) == tmp_path / "gatekeeper.toml"


def test_pyproject_without_section_is_skipped(tmp_path):
    write(tmp_path, "pyproject.toml", '[project]\nname = "x"\n')
    with pytest.raises(ConfigError) as ei:
        find_config(None, tmp_path)
    msg = str(ei.value)
    assert "gatekeeper.toml" in msg and "[tool.gatekeeper]" in msg and "--config" in msg


def test_pyproject_with_section_is_found(tmp_path):
    write(tmp_path, "pyproject.toml", '[project]\nname = "x"\n[tool.gatekeeper]\n')
    assert find_config(None, tmp_path) == tmp_path / "pyproject.toml"


def test_no_config_at_all(tmp_path):
    with pytest.raises(ConfigError, match="no config"):
        load_config(None, cwd=tmp_path)


def test_explicit_path_wins_over_discovery(tmp_path):
    write(tmp_path, "gatekeeper.toml", "this is not toml = = =")
    other = write(tmp_path, "other.toml", MODEL)
    assert load_config(other, cwd=tmp_path).path == other.absolute()


def test_missing_explicit_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert str(ei.value) == f"{path}: config file not found"


def test_explicit_pyproject_without_section(tmp_path):
    path = write(tmp_path, "pyproject.toml", '[project]\nname = "x"\n')
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert str(path) in str(ei.value) and "[tool.gatekeeper]" in str(ei.value)


# -- errors: one line, the file and the field -------------------------------------------------
def test_unknown_field(tmp_path):
    msg = config_error(tmp_path, MODEL + 'colour = "red"\n')
    assert "models[0].colour" in msg and "unknown field" in msg


def test_unknown_top_level_field(tmp_path):
    msg = config_error(tmp_path, 'stroe = "typo"\n' + MODEL)
    assert "stroe" in msg and "unknown field" in msg


def test_unknown_gate_field(tmp_path):
    msg = config_error(tmp_path, MODEL + "[gate]\nlatency = 0.1\n")
    assert "gate.latency" in msg and "unknown field" in msg


def test_wrong_type(tmp_path):
    msg = config_error(tmp_path, MODEL.replace("shapes = [{ batch = 2 }]", 'shapes = "x"'))
    assert "models[0].shapes" in msg and "list" in msg and "'x'" in msg


def test_bad_dtype(tmp_path):
    msg = config_error(
        tmp_path,
        MODEL.replace('shape = ["batch", 4] }', 'shape = ["batch", 4], dtype = "float8" }'),
    )
    assert "models[0].inputs[0].dtype" in msg and "float32" in msg and "bfloat16" in msg


def test_bad_mode(tmp_path):
    msg = config_error(tmp_path, MODEL + 'modes = ["default", "turbo"]\n')
    assert "models[0].modes[1]" in msg and "max-autotune" in msg


def test_duplicate_modes(tmp_path):
    msg = config_error(tmp_path, MODEL + 'modes = ["default", "default"]\n')
    assert "models[0]" in msg and "distinct" in msg


@pytest.mark.parametrize(
    "factory", ["mymod.make", "mymod:", ":make", "my mod:make", "1mod:make", "mymod:make:again"]
)
def test_bad_factory_syntax(tmp_path, factory):
    msg = config_error(tmp_path, MODEL.replace("mymod:make", factory))
    assert "models[0].factory" in msg and repr(factory) in msg


def test_bad_model_name(tmp_path):
    msg = config_error(tmp_path, MODEL.replace('name = "m"', 'name = "my/model"'))
    assert "models[0].name" in msg


def test_shape_set_not_binding_a_name(tmp_path):
    msg = config_error(
        tmp_path, MODEL.replace("shapes = [{ batch = 2 }]", "shapes = [{ batch = 2 }, { seq = 2 }]")
    )
    assert "models[0]" in msg and "shapes[1] does not bind batch" in msg


def test_shape_set_binding_an_unused_name(tmp_path):
    msg = config_error(
        tmp_path, MODEL.replace("shapes = [{ batch = 2 }]", "shapes = [{ batch = 2, seq = 3 }]")
    )
    assert "models[0]" in msg and "shapes[0] binds seq" in msg and "no input uses" in msg


def test_shape_value_must_be_positive(tmp_path):
    msg = config_error(tmp_path, MODEL.replace("batch = 2", "batch = 0"))
    assert "shapes[0].batch" in msg and "positive" in msg


def test_duplicate_model_names(tmp_path):
    msg = config_error(tmp_path, MODEL + MODEL)
    assert "unique" in msg and "m repeats" in msg


def test_options_with_non_default_mode(tmp_path):
    msg = config_error(
        tmp_path, MODEL + 'modes = ["max-autotune"]\noptions = { "triton.cudagraphs" = false }\n'
    )
    assert "models[0]" in msg and "options" in msg and "mode" in msg


def test_options_with_default_mode_is_fine(tmp_path):
    cfg = load_config(
        write(tmp_path, "gatekeeper.toml", MODEL + 'options = { "max_autotune" = true }\n')
    )
    assert cfg.models[0].options == {"max_autotune": True}


def test_inputs_and_inputs_factory_are_exclusive(tmp_path):
    msg = config_error(tmp_path, MODEL + 'inputs_factory = "mymod:inputs"\n')
    assert "exactly one of 'inputs' or 'inputs_factory'" in msg


def test_neither_inputs_nor_inputs_factory(tmp_path):
    msg = config_error(tmp_path, MODEL.replace('inputs = [{ shape = ["batch", 4] }]\n', ""))
    assert "exactly one of" in msg


def test_low_not_below_high(tmp_path):
    msg = config_error(
        tmp_path,
        MODEL.replace('shape = ["batch", 4] }', 'shape = ["batch", 4], low = 5, high = 5 }'),
    )
    assert "models[0].inputs[0]" in msg and "below" in msg


def test_no_models(tmp_path):
    msg = config_error(tmp_path, 'store = "x"\n')
    assert "models" in msg and "required" in msg.lower()


def test_bad_device(tmp_path):
    msg = config_error(tmp_path, MODEL + 'device = "tpu"\n')
    assert "models[0].device" in msg and "'tpu'" in msg


def test_invalid_toml(tmp_path):
    msg = config_error(tmp_path, MODEL + "name = \n")
    assert "invalid TOML" in msg and "line" in msg


def test_invalid_toml_in_pyproject(tmp_path):
    path = write(tmp_path, "pyproject.toml", "[tool.gatekeeper\n")
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert str(ei.value).startswith(f"{path}: invalid TOML")


def test_many_errors_are_still_one_line(tmp_path):
    msg = config_error(tmp_path, MODEL + "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n")
    assert "and 2 more" in msg


def test_errors_in_pyproject_name_the_pyproject(tmp_path):
    path = write(
        tmp_path,
        "pyproject.toml",
        """
        [[tool.gatekeeper.models]]
        name = "m"
        factory = "mymod:make"
        inputs = [{ shape = [4] }]
        modes = ["fast"]
        """,
    )
    with pytest.raises(ConfigError) as ei:
        load_config(None, cwd=tmp_path)
    assert str(ei.value).startswith(f"{path}: models[0].modes[0]")


# -- per-model gate overrides -------------------------------------------------------------
GATE = (
    MODEL
    + """
gate = { latency_regression = 0.2, parity = { atol = 0.01 } }

[[models]]
name = "plain"
factory = "mymod:make"
inputs = [{ shape = [4] }]

[gate]
latency_regression = 0.05
memory_regression = 0.1
parity = { atol = 1e-5, rtol = 1e-3, cosine = 0.999 }
"""
)


def test_gate_override_merges_over_gate(tmp_path):
    cfg = load_config(write(tmp_path, "gatekeeper.toml", GATE))
    m, plain = cfg.models
    g = cfg.gate_for(m)
    assert g.latency_regression == 0.2  # overridden
    assert g.memory_regression == 0.1  # from [gate]
    assert g.compile_time_regression == GateConfig().compile_time_regression  # default
    assert g.parity.atol == 0.01  # nested override
    assert (g.parity.rtol, g.parity.cosine) == (1e-3, 0.999)  # nested merge keeps [gate]'s
    assert cfg.gate_for(plain) == cfg.gate
    # the global gate is not mutated by the merge
    assert cfg.gate.latency_regression == 0.05 and cfg.gate.parity.atol == 1e-5


@pytest.mark.parametrize(
    "override, field",
    [
        ("{ latency_regression = -1 }", "models.m.gate.latency_regression"),
        ('{ parity = { atol = "x" } }', "models.m.gate.parity.atol"),
        ("{ bogus = 1 }", "models.m.gate.bogus"),
        ('{ graph_breaks = "sometimes" }', "models.m.gate.graph_breaks"),
    ],
)
def test_bad_gate_override_names_the_model(tmp_path, override, field):
    path = write(tmp_path, "gatekeeper.toml", MODEL + f"gate = {override}\n")
    with pytest.raises(ConfigError) as ei:
        cfg = load_config(path)
        cfg.gate_for(cfg.models[0])
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path.absolute()}: {field}"), msg


def test_bad_gate_override_fails_at_load(tmp_path):
    path = write(tmp_path, "gatekeeper.toml", MODEL + "gate = { bogus = 1 }\n")
    with pytest.raises(ConfigError, match=r"models\.m\.gate"):
        load_config(path)


def test_config_is_frozen(tmp_path):
    cfg = load_config(write(tmp_path, "gatekeeper.toml", MODEL))
    with pytest.raises(ValidationError):
        cfg.store = "elsewhere"  # type: ignore[misc]
    assert isinstance(cfg, Config)


# -- the CLI: exit 2 and one line on stderr -------------------------------------------------
@pytest.fixture
def run_cli(capsys, monkeypatch, tmp_path):
    """Run ``gatekeeper.cli.main`` in-process; returns (code, stdout, stderr)."""
    log = logging.getLogger("gatekeeper")
    saved = (log.handlers[:], log.level, log.propagate)
    monkeypatch.chdir(tmp_path)

    def run(*argv: str):
        try:
            code = cli.main(list(argv))
        except SystemExit as e:  # argparse errors
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    log.handlers[:], log.level, log.propagate = saved


def assert_one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gatekeeper: error: "), err
    assert "Traceback" not in err
    return lines[0]


BAD_CONFIGS = {
    "unknown-field": MODEL + 'colour = "red"\n',
    "wrong-type": MODEL.replace("shapes = [{ batch = 2 }]", 'shapes = "x"'),
    "bad-mode": MODEL + 'modes = ["turbo"]\n',
    "invalid-toml": MODEL + "name = \n",
    "duplicate": MODEL + MODEL,
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_cli_bad_config_exits_2_with_one_line(run_cli, tmp_path, case):
    path = write(tmp_path, "bad.toml", BAD_CONFIGS[case])
    code, out, err = run_cli("key", "--config", str(path))
    assert code == 2
    line = assert_one_error_line(err)
    assert str(path) in line
    assert out == ""


def test_cli_missing_config_file(run_cli, tmp_path):
    code, _, err = run_cli("key", "--config", str(tmp_path / "nope.toml"))
    assert code == 2
    assert "nope.toml: config file not found" in assert_one_error_line(err)


def test_cli_no_config_discovered(run_cli):
    code, _, err = run_cli("key")
    assert code == 2
    assert "no config" in assert_one_error_line(err)


@pytest.mark.e2e  # a worker or a fresh interpreter importing torch
def test_cli_key_with_unimportable_factory(run_cli, tmp_path):
    path = write(tmp_path, "gatekeeper.toml", MODEL.replace("mymod:make", "nosuchmod:make"))
    code, out, err = run_cli("key", "--config", str(path))
    assert code == 2
    line = assert_one_error_line(err)
    assert "'nosuchmod:make'" in line and "nosuchmod" in line
    assert out == ""


def test_cli_unknown_verb(run_cli):
    code, _, err = run_cli("frobnicate")
    assert code == 2
    assert "frobnicate" in assert_one_error_line(err)


def test_cli_no_verb(run_cli):
    code, _, err = run_cli()
    assert code == 2
    assert_one_error_line(err)


def test_cli_unknown_flag(run_cli):
    code, _, err = run_cli("key", "--frob")
    assert code == 2
    assert "--frob" in assert_one_error_line(err)


@pytest.mark.parametrize("shard", ["3/2", "0/2", "x/y", "1", "1/2/3", "2/0"])
def test_cli_bad_shard(run_cli, tmp_path, shard):
    path = write(tmp_path, "gatekeeper.toml", MODEL)
    code, out, err = run_cli("key", "--config", str(path), "--shard", shard)
    assert code == 2
    assert "--shard" in assert_one_error_line(err)
    assert out == ""


def test_cli_target_matching_nothing(run_cli, tmp_path):
    path = write(tmp_path, "gatekeeper.toml", MODEL)
    code, out, err = run_cli("key", "--config", str(path), "--target", "nomatch*")
    assert code == 2
    line = assert_one_error_line(err)
    assert "nomatch*" in line and "m/b2/default" in line
    assert out == ""


def test_cli_entry_point_bad_config_subprocess(tmp_path):
    """The installed console script: real exit status, real stderr, no traceback."""
    path = write(tmp_path, "bad.toml", MODEL + 'modes = ["turbo"]\n')
    exe = Path(sys.executable).parent / "gatekeeper"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gatekeeper"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    proc = subprocess.run(
        cmd + ["key", "--config", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    line = assert_one_error_line(proc.stderr)
    assert f"{path}: models[0].modes[0]" in line
    assert proc.stdout == ""


# -- tasks, precisions, train (issue 12) ---------------------------------------------------
def test_tasks_precisions_and_train_defaults(tmp_path):
    m = load_config(write(tmp_path, "gatekeeper.toml", MODEL)).models[0]
    assert (m.tasks, m.precisions, m.train) == (["infer"], ["fp32"], None)
    assert m.training.optimizer == "AdamW" and m.training.steps == 3


def test_train_table_with_optimizer_kwargs(tmp_path):
    m = load_config(
        write(
            tmp_path,
            "gatekeeper.toml",
            MODEL
            + textwrap.dedent("""
        tasks = ["infer", "train"]
        precisions = ["fp32", "bf16", "fp16"]
        train = { optimizer = "SGD", lr = 0.01, steps = 2, momentum = 0.9, loss = "pkg.mod:fn" }
    """),
        )
    ).models[0]
    assert m.training.optimizer == "SGD" and m.training.steps == 2
    assert m.training.kwargs == {"momentum": 0.9}
    assert m.training.spec() == {
        "optimizer": "SGD",
        "lr": 0.01,
        "loss": "pkg.mod:fn",
        "kwargs": {"momentum": 0.9},
    }


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ('tasks = ["infer", "fit"]', "models[0].tasks[1]", "'train'"),
        ("tasks = []", "models[0]", "at least one"),
        ('precisions = ["fp32", "fp8"]', "models[0].precisions[1]", "'bf16'"),
        ('precisions = ["bf16", "bf16"]', "models[0]", "distinct"),
        (
            'tasks = ["train"]\ntrain = { optimizer = "Adamm" }',
            "models[0].train.optimizer",
            "unknown optimizer 'Adamm'",
        ),
        (
            'tasks = ["train"]\ntrain = { optimizer = "LBFGS" }',
            "models[0].train.optimizer",
            "unknown optimizer",
        ),
        ('tasks = ["train"]\ntrain = { steps = 0 }', "models[0].train.steps", "greater"),
        ('tasks = ["train"]\ntrain = { lr = -1.0 }', "models[0].train.lr", "greater"),
        ('tasks = ["train"]\ntrain = { loss = "nocolon" }', "models[0].train.loss", "pattern"),
        ("train = { lr = 0.1 }", "models[0]", "'tasks' has no \"train\""),
    ],
)
def test_task_and_precision_errors_name_the_field(tmp_path, extra, field, words):
    msg = config_error(tmp_path, MODEL + extra + "\n")
    assert field in msg and words in msg, msg


def test_precompile_defaults_to_auto_and_a_model_can_turn_it_off(tmp_path):
    cfg = load_config(write(tmp_path, "gatekeeper.toml", MODEL))
    assert cfg.precompile_for(cfg.models[0])
    off = load_config(write(tmp_path, "off.toml", MODEL + 'precompile = "off"\n'))
    assert not off.precompile_for(off.models[0])
    top = load_config(write(tmp_path, "top.toml", 'precompile = "off"\n' + MODEL))
    assert not top.precompile_for(top.models[0])


def test_bad_precompile_value_names_the_field(tmp_path):
    msg = config_error(tmp_path, MODEL + 'precompile = "always"\n')
    assert "models[0].precompile" in msg and "\n" not in msg


def test_keyword_inputs_plain_values_call_and_function(tmp_path):
    path = write(
        tmp_path,
        "gatekeeper.toml",
        """
        [[models]]
        name = "lm"
        factory = "mymod:make"
        call = "encode"
        shapes = [{ batch = 2 }]

        [models.inputs]
        input_ids = { shape = ["batch", 4], dtype = "int64", high = 10 }
        use_cache = false

        [[models]]
        name = "f"
        function = "mymod:fn"
        inputs = [{ shape = [4] }, 3, "mean"]
        """,
    )
    lm, f = load_config(path).models
    assert lm.call == "encode" and lm.builder == "mymod:make"
    assert isinstance(lm.inputs, dict) and lm.inputs["use_cache"] is False
    assert [s.dtype for s in lm.input_specs()] == ["int64"]
    assert f.function == "mymod:fn" and f.factory is None and f.inputs[1:] == [3, "mean"]


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            'factory = "m:f"\nshapes = [{ batch = 2 }]\n[models.inputs]\n'
            'x = { shape = ["batch"], dtype = "int65" }',
            "models[0].inputs.x.dtype: expected 'float32'",
        ),
        ('factory = "m:f"\ninputs = { x = [1, 2] }', "models[0].inputs.x: expected a tensor's"),
        ('factory = "m:f"\nfunction = "m:g"\ninputs = []', "exactly one of 'factory'"),
        ('function = "m:g"\ninputs = []\ntasks = ["train"]', 'tasks: "train" needs a module'),
        ('function = "m:g"\ncall = "encode"\ninputs = []', "'call' names a method"),
        ('function = "m:g"\ninputs = []\nstrategies = ["regional"]', "a 'function' model has"),
        ('factory = "m:f"\ncall = "not a name"\ninputs = []', "models[0].call:"),
    ],
)
def test_bad_inputs_call_and_function_are_one_line_errors(tmp_path, body, expected):
    msg = config_error(tmp_path, f'[[models]]\nname = "m"\n{body}\n')
    assert expected in msg and "\n" not in msg, msg


# -- strategies (issue 23) --------------------------------------------------------------------
def test_strategies_default_to_whole_and_take_regions_and_export(tmp_path):
    (m,) = load_config(write(tmp_path, "gatekeeper.toml", MODEL)).models
    assert (m.strategies, m.regions, m.export) == (["whole"], None, None)
    text = MODEL + 'strategies = ["whole", "regional", "aot"]\nregions = ["layers.*"]\n'
    (m,) = load_config(write(tmp_path, "s.toml", text + "export = { strict = true }\n")).models
    assert m.strategies == ["whole", "regional", "aot"] and m.regions == ["layers.*"]
    assert m.export is not None and m.export.strict


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ('strategies = ["whole", "eager"]', "models[0].strategies[1]", "'regional'"),
        ('strategies = ["aot", "aot"]', "models[0]", "distinct"),
        ('regions = ["layers.*"]', "models[0]", "'strategies' has no \"regional\""),
        ('strategies = ["regional"]\nregions = ["layers/0"]', "models[0]", "'regions'"),
        ("export = { strict = true }", "models[0]", "'strategies' has no \"aot\""),
        ('strategies = ["aot"]\nexport = { strict = "yes" }', "models[0].export.strict", "bool"),
        ('strategies = ["aot"]\nbackend = "eager"', "models[0]", "needs backend"),
        (
            'tasks = ["train"]\nstrategies = ["whole", "aot"]',
            "models[0]",
            "a training step is compiled whole; aot applies to float32 inference targets and "
            "generate() generations on a static cache only",
        ),
    ],
)
def test_strategy_errors_name_the_field(tmp_path, extra, field, words):
    msg = config_error(tmp_path, MODEL + extra + "\n")
    assert field in msg and words in msg, msg


def test_the_kinds_errors_come_in_the_same_line_as_the_schemas(tmp_path):
    """The schema imports no kind; the loader passes the kinds' checks into the same
    validation, so an unknown strategy, a kind's own check and a schema error of three
    models are one line, in the order they always came (a kind's check before the
    shapes': model n's unbound shape is not reached)."""
    unbound = MODEL.replace("batch = 2", "seq = 2")
    text = (
        MODEL
        + 'strategies = ["whole", "eager"]\n'
        + unbound.replace('"m"', '"n"')
        + 'regions = ["layers.*"]\n'
        + unbound.replace('"m"', '"o"')
        + 'strategies = ["regional"]\n'
    )
    msg = config_error(tmp_path, text)
    assert msg.partition(": ")[2] == (
        "models[0].strategies[1]: expected 'whole', 'regional' or 'aot'; "
        "models[1]: 'regions' is set but 'strategies' has no \"regional\" "
        '(add it: strategies = ["whole", "regional"]); '
        "models[2]: shapes[0] does not bind batch"
    )


def test_the_schema_alone_knows_no_kind(tmp_path):
    """A model built in code (or read back by a worker from its request) is checked
    against the schema only: the kinds' checks run where a config is loaded
    (gatekeeper.project.load_config), which the schema no longer imports."""
    m = ModelConfig(name="m", factory="a:b", inputs=[], strategies=["nonesuch"])
    assert m.strategies == ["nonesuch"]
    msg = config_error(tmp_path, MODEL + 'strategies = ["nonesuch"]\n')
    assert "models[0].strategies[0]: expected 'whole', 'regional' or 'aot'" in msg


def test_pass_env_never_names_what_gatekeeper_withholds(tmp_path):
    """pass_env adds names to the worker's allow-list, but never the signing key, the
    store's credentials or the runner's file commands: one line naming the field."""
    write(tmp_path, "gatekeeper.toml", 'pass_env = ["WANDB_MODE", "MYLIB_*"]\n' + MODEL)
    assert load_config(None, cwd=tmp_path).pass_env == ["WANDB_MODE", "MYLIB_*"]
    for name in ("GITHUB_ENV", "RUNNER_TEMP", "GATEKEEPER_SIGNING_KEY", "AWS_*", "BAD NAME"):
        write(tmp_path, "gatekeeper.toml", f"pass_env = [{name!r}]\n" + MODEL)
        with pytest.raises(ConfigError) as e:
            load_config(None, cwd=tmp_path)
        assert "pass_env" in str(e.value) and "\n" not in str(e.value), e.value


def test_pass_env_never_names_a_credential_in_any_spelling(tmp_path, monkeypatch):
    """Before: ``pass_env = ["PGPASSWORD", "DATABASE_URL", "DEPLOY_KEY", "SSH_KEY",
    "MYSQL_PWD"]`` in a pull request's own config passed all five values to the worker
    (the credential check wanted a separator before the word). Now a name that may hold
    a credential is one line at load, naming the way out only the workflow has
    (``GATEKEEPER_PASS_SECRETS``); a glob still loads (it never matches such a name)."""
    monkeypatch.delenv("GATEKEEPER_PASS_SECRETS", raising=False)
    names = ("PGPASSWORD", "DATABASE_URL", "DEPLOY_KEY", "SSH_KEY", "MYSQL_PWD", "HF_TOKEN")
    for name in (*names, "MY_SECRET_THING", "DB_PASS*", "SENTRY_DSN"):
        write(tmp_path, "gatekeeper.toml", f"pass_env = [{name!r}]\n" + MODEL)
        with pytest.raises(ConfigError) as e:
            load_config(None, cwd=tmp_path)
        said = str(e.value)
        assert "may name a credential" in said and "GATEKEEPER_PASS_SECRETS" in said, said
        assert "\n" not in said
    write(tmp_path, "gatekeeper.toml", 'pass_env = ["KEYBOARD_LAYOUT", "MY_*"]\n' + MODEL)
    assert load_config(None, cwd=tmp_path).pass_env == ["KEYBOARD_LAYOUT", "MY_*"]
    monkeypatch.setenv("GATEKEEPER_PASS_SECRETS", "PGPASSWORD,DEPLOY_KEY")
    write(tmp_path, "gatekeeper.toml", 'pass_env = ["PGPASSWORD", "DEPLOY_KEY"]\n' + MODEL)
    assert load_config(None, cwd=tmp_path).pass_env == ["PGPASSWORD", "DEPLOY_KEY"]


# -- generation (issue 50) ------------------------------------------------------------------
LM = """
[[models]]
name = "lm"
factory = "lm:make_lm"
inputs = { input_ids = { shape = [1, 32], dtype = "int64", high = 2048 } }
"""


def test_generate_defaults_and_settings(tmp_path):
    cfg = load_config(write(tmp_path, "gatekeeper.toml", LM + 'tasks = ["generate"]\n'))
    m = cfg.models[0]
    assert m.tasks == ["generate"] and m.generate is None
    assert m.generation.spec() == {"new_tokens": 16, "cache": "static"}
    full = LM + 'tasks = ["infer", "generate"]\n'
    full += 'generate = { new_tokens = 8, cache = "static", cache_length = 64 }\n'
    g = load_config(write(tmp_path, "full.toml", full)).models[0].generation
    assert g.spec() == {"new_tokens": 8, "cache": "static", "cache_length": 64}


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ("generate = { new_tokens = 8 }", "models[0]", "'tasks' has no \"generate\""),
        ('tasks = ["generate"]\ngenerate = { new_tokens = 1 }', "generate.new_tokens", "greater"),
        ('tasks = ["generate"]\ngenerate = { cache = "paged" }', "generate.cache", "'static'"),
        (
            'tasks = ["generate"]\ngenerate = { new_tokens = 16, cache_length = 16 }',
            "models[0]",
            "must hold the prompt",
        ),
        ('tasks = ["generate"]\ngenerate = { prefill = "m:f" }', "models[0]", "both"),
        ('tasks = ["generate"]\ndynamic = true', "models[0]", "drop dynamic"),
        (
            'tasks = ["generate"]\nstrategies = ["whole", "aot"]\ngenerate = { cache = "dynamic" }',
            "models[0]",
            "a generation is compiled whole or regional; aot applies to float32 inference "
            "targets and generate() generations on a static cache only",
        ),
        (
            'tasks = ["generate"]\nstrategies = ["aot"]\n'
            'generate = { prefill = "m:p", decode = "m:d" }',
            "models[0]",
            "a generation is compiled whole or regional; aot applies",
        ),
        ('tasks = ["generate"]\ngenerate = { top_k = 3 }', "generate.top_k", "unknown field"),
    ],
)
def test_generate_errors_name_the_field(tmp_path, extra, field, words):
    msg = config_error(tmp_path, LM + extra + "\n")
    assert field in msg and words in msg, msg


def test_generate_needs_the_prompt_as_input_ids(tmp_path):
    msg = config_error(tmp_path, MODEL + 'tasks = ["generate"]\n')
    assert "input_ids" in msg, msg
