"""A model's inputs in the config: seeded random tensors (a table each) or plain values,
positional (a list) or by keyword (a table of named inputs)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Tag,
    field_validator,
    model_validator,
)

Dtype = Literal[
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"
]
DTYPES: tuple[Dtype, ...] = get_args(Dtype)


class Strict(BaseModel):
    # strict: TOML has real types, so "yes" is not a bool and "8" is not an int
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class InputSpec(Strict):
    """One seeded random input tensor; names in ``shape`` are bound by a shape set."""

    shape: list[int | str]
    dtype: Dtype = "float32"
    low: float | None = None
    high: float | None = None

    @field_validator("shape")
    @classmethod
    def _dims(cls, dims: list[int | str]) -> list[int | str]:
        for d in dims:
            if isinstance(d, int) and d < 0:
                raise ValueError(f"dimension {d} is negative")
            if isinstance(d, str) and not re.match(r"^[A-Za-z_]\w*$", d):
                raise ValueError(f"dimension name {d!r} is not an identifier")
        return dims

    @model_validator(mode="after")
    def _bounds(self) -> InputSpec:
        if self.low is not None and self.high is not None and self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self

    def names(self) -> set[str]:
        return {d for d in self.shape if isinstance(d, str)}


def _input_kind(value: Any) -> str:
    return "tensor-input" if isinstance(value, (dict, InputSpec)) else "plain-input"


def _plain_value(value: Any) -> Any:
    if not isinstance(value, (bool, int, float, str)):
        raise ValueError(
            "expected a tensor's table ({ shape = [...], dtype = ... }) or a plain value "
            f"(true/false, a number, a string), got {value!r}"
        )
    return value


# one input: a seeded random tensor (a table) or a plain value passed as it is
Input = Annotated[
    Annotated[InputSpec, Tag("tensor-input")]
    | Annotated[Any, BeforeValidator(_plain_value), Tag("plain-input")],
    Discriminator(_input_kind),
]
# positional inputs (a list) or keyword inputs (a table of named inputs)
Inputs = Annotated[
    Annotated[list[Input], Tag("positional-inputs")]
    | Annotated[dict[str, Input], Tag("keyword-inputs")],
    Discriminator(lambda v: "keyword-inputs" if isinstance(v, dict) else "positional-inputs"),
]
INPUT_TAGS = ("tensor-input", "plain-input", "positional-inputs", "keyword-inputs")
