"""Tests of gatekeeper.targets: target ids, expansion, --target globs and --shard."""

from __future__ import annotations

import random

import pytest

from gatekeeper.config import Config
from gatekeeper.errors import ConfigError, UsageError
from gatekeeper.project import expand
from gatekeeper.targets import parse_shard, select, shapes_label


def model(name: str, shapes=None, modes=None, dynamic=False, names=("batch",), **extra):
    m = {"name": name, "factory": "mymod:make", "dynamic": dynamic}
    if "inputs_factory" not in extra:
        m["inputs"] = [{"shape": [*names, 4]}]
    if shapes is not None:
        m["shapes"] = shapes
    if modes is not None:
        m["modes"] = modes
    m.update(extra)
    return m


def config(*models) -> Config:
    return Config.model_validate({"models": list(models)})


def ids(cfg: Config) -> list[str]:
    return [t.id for t in expand(cfg)]


# -- ids ------------------------------------------------------------------------------------
def test_single_name_id():
    assert ids(config(model("mlp", [{"batch": 8}]))) == ["mlp/b8/default"]


def test_two_names_id():
    cfg = config(model("block", [{"batch": 1, "seq": 32}], names=("batch", "seq")))
    assert ids(cfg) == ["block/b1-s32/default"]


def test_no_names_is_fixed():
    cfg = config({"name": "x", "factory": "mymod:make", "inputs": [{"shape": [2, 4]}]})
    assert ids(cfg) == ["x/fixed/default"]


def test_dynamic_suffix():
    cfg = config(model("mlp", [{"batch": 8}], modes=["default", "max-autotune"], dynamic=True))
    assert ids(cfg) == ["mlp/b8/default+dynamic", "mlp/b8/max-autotune+dynamic"]


def test_names_sharing_an_initial_keep_full_names():
    cfg = config(model("beam", [{"batch": 2, "beams": 4}], names=("batch", "beams")))
    assert ids(cfg) == ["beam/batch2-beams4/default"]


@pytest.mark.parametrize(
    "shape_set, label",
    [
        ({}, "fixed"),
        ({"batch": 8}, "b8"),
        ({"batch": 2, "seq": 64}, "b2-s64"),
        ({"batch": 2, "beam": 3, "seq": 5}, "batch2-beam3-seq5"),
        ({"n": 1}, "n1"),
    ],
)
def test_shapes_label(shape_set, label):
    assert shapes_label(shape_set) == label


def test_id_has_three_parts_and_describe():
    (t,) = expand(
        config(model("mlp", [{"batch": 8}], modes=["reduce-overhead"], dynamic=True, device="cpu"))
    )
    assert t.id.count("/") == 2
    assert t.variant == "reduce-overhead+dynamic"
    assert t.shape_set == {"batch": 8}
    assert t.describe() == {
        "id": "mlp/b8/reduce-overhead+dynamic",
        "model": "mlp",
        "shapes": {"batch": 8},
        "mode": "reduce-overhead",
        "dynamic": True,
        "device": "cpu",
    }


def test_ids_are_stable_across_loads():
    spec = model("mlp", [{"batch": 1}, {"batch": 8}], modes=["default", "max-autotune"])
    assert ids(config(spec)) == ids(config(spec))


# -- expansion ------------------------------------------------------------------------------
def test_expansion_is_models_times_shapes_times_modes():
    cfg = config(
        model("a", [{"batch": 1}, {"batch": 2}, {"batch": 4}], modes=["default", "max-autotune"]),
        model("b", [{"batch": 1}], modes=["default", "reduce-overhead", "max-autotune"]),
        {"name": "c", "factory": "mymod:make", "inputs": [{"shape": [3]}]},
    )
    targets = expand(cfg)
    assert len(targets) == 3 * 2 + 1 * 3 + 1 * 1
    assert len({t.id for t in targets}) == len(targets)
    assert [t.id for t in targets][:2] == ["a/b1/default", "a/b1/max-autotune"]
    assert {t.model.name for t in targets} == {"a", "b", "c"}


def test_duplicate_shape_sets_rejected():
    cfg = config(model("mlp", [{"batch": 8}, {"batch": 8}]))
    with pytest.raises(ConfigError, match="mlp/b8/default"):
        expand(cfg)


def test_colliding_labels_rejected():
    # with an inputs_factory the shape sets are free-form: 'a1=2' and 'a=2' both label 'a2'
    cfg = config(model("m", [{"a1": 2}, {"a": 2}], inputs_factory="mymod:inputs"))
    with pytest.raises(ConfigError) as ei:
        expand(cfg)
    assert "m/a2/default" in str(ei.value)


def test_shape_names_cannot_break_the_id():
    try:
        cfg = config(model("m", [{"a/x": 1, "a/y": 2}], inputs_factory="mymod:inputs"))
    except Exception as e:  # rejected at load: fine
        assert "shapes" in str(e)
        return
    assert all(len(t.id.split("/")) == 3 for t in expand(cfg))


# -- select: globs --------------------------------------------------------------------------
@pytest.fixture
def targets():
    cfg = config(
        model("mlp", [{"batch": 1}, {"batch": 8}], modes=["default", "max-autotune"]),
        model("cnn", [{"batch": 1}, {"batch": 8}]),
        model("block", [{"batch": 1, "seq": 32}], names=("batch", "seq")),
    )
    return expand(cfg)


def test_select_everything_by_default(targets):
    assert select(targets) == targets
    assert select(targets, [], None) == targets


def test_select_glob(targets):
    assert [t.id for t in select(targets, ["mlp/*"])] == [
        "mlp/b1/default",
        "mlp/b1/max-autotune",
        "mlp/b8/default",
        "mlp/b8/max-autotune",
    ]
    assert [t.id for t in select(targets, ["*/b8/default"])] == ["mlp/b8/default", "cnn/b8/default"]
    assert [t.id for t in select(targets, ["block/b1-s32/default"])] == ["block/b1-s32/default"]


def test_select_any_glob_may_match(targets):
    got = [t.id for t in select(targets, ["cnn/b1/*", "block/*"])]
    assert got == ["cnn/b1/default", "block/b1-s32/default"]


def test_select_glob_is_case_sensitive(targets):
    with pytest.raises(UsageError):
        select(targets, ["MLP/*"])


def test_select_no_match_is_usage_error(targets):
    with pytest.raises(UsageError) as ei:
        select(targets, ["nomatch*"])
    assert "nomatch*" in str(ei.value) and "mlp/b1/default" in str(ei.value)


def test_glob_then_shard(targets):
    chosen = select(targets, ["mlp/*"])
    got = select(targets, ["mlp/*"], "1/2") + select(targets, ["mlp/*"], "2/2")
    assert sorted(t.id for t in got) == sorted(t.id for t in chosen)
    assert len(select(targets, ["mlp/*"], "1/2")) == 2


# -- select: shards -------------------------------------------------------------------------
@pytest.fixture
def many():
    cfg = config(
        *[
            model(f"m{i:02d}", [{"batch": b} for b in (1, 2, 4)], modes=["default", "max-autotune"])
            for i in range(4)
        ]
    )
    return expand(cfg)  # 24 targets


@pytest.mark.parametrize("n", range(1, 9))
def test_every_target_in_exactly_one_shard(many, n):
    shards = [select(many, None, f"{i}/{n}") for i in range(1, n + 1)]
    seen = [t.id for shard in shards for t in shard]
    assert sorted(seen) == sorted(t.id for t in many)  # each exactly once
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1  # balanced


def test_more_shards_than_targets(many):
    n = len(many) + 3
    shards = [select(many, None, f"{i}/{n}") for i in range(1, n + 1)]
    assert sum(len(s) for s in shards) == len(many)
    assert all(len(s) <= 1 for s in shards)


def test_shards_are_deterministic_and_independent_of_order(many):
    expected = {i: [t.id for t in select(many, None, f"{i}/5")] for i in range(1, 6)}
    rng = random.Random(1234)
    for _ in range(5):
        shuffled = many[:]
        rng.shuffle(shuffled)
        for i in range(1, 6):
            assert [t.id for t in select(shuffled, None, f"{i}/5")] == expected[i]


def test_shard_of_one_is_everything(many):
    assert sorted(t.id for t in select(many, None, "1/1")) == sorted(t.id for t in many)


@pytest.mark.parametrize(
    "bad",
    [
        "0/2",
        "3/2",
        "2/0",
        "0/0",
        "-1/2",
        "1/-1",
        "a/b",
        "1",
        "1/2/3",
        "1.5/2",
        "/2",
        "1/",
        "",
        "one/two",
    ],
)
def test_bad_shard_strings(bad):
    with pytest.raises(UsageError) as ei:
        parse_shard(bad)
    assert "--shard" in str(ei.value)


@pytest.mark.parametrize("bad", ["3/2", "0/2", "x"])
def test_bad_shard_via_select(targets, bad):
    with pytest.raises(UsageError):
        select(targets, None, bad)


@pytest.mark.parametrize(
    "good, parsed", [("1/1", (1, 1)), ("2/4", (2, 4)), ("4/4", (4, 4)), ("10/12", (10, 12))]
)
def test_good_shard_strings(good, parsed):
    assert parse_shard(good) == parsed


def test_shape_set_key_order_does_not_change_the_id():
    assert shapes_label({"seq": 32, "batch": 1}) == shapes_label({"batch": 1, "seq": 32})
    cfg = config(
        model(
            "m", names=("batch", "seq"), shapes=[{"batch": 1, "seq": 32}, {"seq": 32, "batch": 1}]
        )
    )
    with pytest.raises(ConfigError, match="same target id"):
        expand(cfg)


def test_empty_shard_is_refused():
    with pytest.raises(UsageError):
        select(expand(config(model("m", shapes=[{"batch": 1}]))), None, "")


def test_merge_needs_every_shard_once():
    from gatekeeper.shards import check_shards as _check_shards

    _check_shards(["1/3", "3/3", "2/3"])
    _check_shards([None, None])
    with pytest.raises(UsageError, match="missing shard"):
        _check_shards(["1/3", "3/3"])
    with pytest.raises(UsageError, match="twice"):
        _check_shards(["1/2", "2/2", "2/2"])
    with pytest.raises(UsageError, match="different splits"):
        _check_shards(["1/2", "2/3"])
    with pytest.raises(UsageError, match="all sharded"):
        _check_shards(["1/2", None])


# -- tasks and precisions (issue 12) ----------------------------------------------------------
def test_task_and_precision_join_the_variant_infer_and_fp32_implicit():
    cfg = config(
        model("gpt2", [{"batch": 4}], tasks=["infer", "train"], precisions=["fp32", "bf16"])
    )
    assert ids(cfg) == [
        "gpt2/b4/default",
        "gpt2/b4/default+bf16",
        "gpt2/b4/default+train",
        "gpt2/b4/default+train+bf16",
    ]
    t = expand(cfg)[3]
    assert (t.task, t.precision) == ("train", "bf16")
    assert t.describe()["task"] == "train" and t.describe()["precision"] == "bf16"
    assert "task" not in expand(cfg)[0].describe()  # old manifests' description unchanged


def test_dynamic_shape_sets_share_one_bundle_id():
    from gatekeeper.targets import one_per_bundle

    cfg = config(
        model("mlp", [{"batch": 2}, {"batch": 8}], dynamic=True),
        model("fix", [{"batch": 2}, {"batch": 8}]),
    )
    targets = expand(cfg)
    assert [t.id for t in targets[:2]] == ["mlp/b2/default+dynamic", "mlp/b8/default+dynamic"]
    assert {t.bundle_id for t in targets[:2]} == {"mlp/dynamic/default+dynamic"}
    assert [t.bundle_id for t in targets[2:]] == ["fix/b2/default", "fix/b8/default"]
    assert [t.id for t in one_per_bundle(targets)] == [
        "mlp/b2/default+dynamic",
        "fix/b2/default",
        "fix/b8/default",
    ]


# -- strategies (issue 23) --------------------------------------------------------------------
def test_strategy_joins_the_variant_whole_implicit_and_training_stays_whole():
    cfg = config(
        model(
            "gpt",
            [{"batch": 1}],
            tasks=["infer", "train"],
            precisions=["fp32", "bf16"],
            strategies=["whole", "regional", "aot"],
        )
    )
    assert ids(cfg) == [
        "gpt/b1/default",
        "gpt/b1/default+regional",
        "gpt/b1/default+aot",
        "gpt/b1/default+bf16",
        "gpt/b1/default+bf16+regional",  # aot exports the float32 forward only
        "gpt/b1/default+train",  # a training step is compiled whole
        "gpt/b1/default+train+bf16",
    ]
    by_id = {t.id: t for t in expand(cfg)}
    assert by_id["gpt/b1/default+aot"].describe()["strategy"] == "aot"
    assert "strategy" not in by_id["gpt/b1/default"].describe()  # old manifests unchanged
    assert select(expand(cfg), ["*+aot"]) == [by_id["gpt/b1/default+aot"]]


# -- generation (issue 50) --------------------------------------------------------------------
def test_generate_joins_the_variant_and_infer_keeps_its_id():
    lm = model(
        "lm",
        [{"batch": 1}],
        inputs={"input_ids": {"shape": ["batch", 32], "dtype": "int64"}},
        tasks=["infer", "generate"],
        generate={"new_tokens": 8},
    )
    assert ids(config(lm)) == ["lm/b1/default", "lm/b1/default+generate"]
    infer, gen = expand(config(lm))
    assert gen.task == "generate" and gen.describe()["generate"]["new_tokens"] == 8
    assert "generate" not in infer.describe() and "task" not in infer.describe()


def test_a_generation_may_be_regional_or_aot_beside_inference():
    lm = model(
        "lm",
        [{"batch": 1}],
        inputs={"input_ids": {"shape": ["batch", 32], "dtype": "int64"}},
        tasks=["infer", "generate"],
        strategies=["whole", "regional", "aot"],
        precisions=["fp32", "bf16"],
    )
    assert ids(config(lm)) == [
        "lm/b1/default",
        "lm/b1/default+regional",
        "lm/b1/default+aot",
        "lm/b1/default+bf16",
        "lm/b1/default+bf16+regional",
        "lm/b1/default+generate",
        "lm/b1/default+generate+regional",
        "lm/b1/default+generate+aot",  # transformers' static-cache forward, exported
        "lm/b1/default+generate+bf16",
        "lm/b1/default+generate+bf16+regional",
        "lm/b1/default+generate+bf16+aot",  # a generation's bf16 is its weights', exported
    ]
    dynamic = {**lm, "generate": {"cache": "dynamic"}}  # aot exports a static cache only
    assert "lm/b1/default+generate+aot" not in ids(config(dynamic))
