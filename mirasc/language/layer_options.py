"""The Layer's options checked against one schema, `spec.LayerOptions` (docs/language.md, "The layer block").

`schema()` turns the pydantic model into a plain dict (type, range, accepted words per option); every emitted
module carries that dict as `LAYER_SCHEMA` and mirasc.runtime.layer_options as its checker, so
`Layer(...)`, `mirasc train --layer-options`, `mirasc export --layer-options` and `mirasc explore --layer` refuse
the same values with the same words as a spec's `layer { ... }` block, every bad value in one message.
"""

from __future__ import annotations

import typing

from ..runtime.layer_options import layer_combination_problems, layer_option_problems


def schema() -> dict:
    """option -> {"type": "int" | "float" | "bool" | "choice", "ge"/"gt"/"le"/"lt": bound, "choices": (...)}."""
    from . import spec as S

    out = {}
    for name, field in S.LayerOptions.model_fields.items():
        if name == "kind":
            continue
        ann = field.annotation
        if ann is bool:
            entry = {"type": "bool"}
        elif typing.get_origin(ann) is typing.Literal:
            entry = {"type": "choice", "choices": tuple(typing.get_args(ann))}
        else:
            entry = {"type": "int" if ann is int else "float"}
            for m in field.metadata:
                for attr in ("ge", "gt", "le", "lt"):
                    if getattr(m, attr, None) is not None:
                        entry[attr] = getattr(m, attr)
        out[name] = entry
    return out


def check(options: dict) -> list[str]:
    """Every problem with `options` (a dict of Layer options) as a list of messages; empty when all are good."""
    if not isinstance(options, dict):
        return [f"Layer options must be a mapping of option names to values, not {type(options).__name__}"]
    from .spec import LayerOptions

    problems = layer_option_problems(options, schema())
    return problems + layer_combination_problems({**dict(LayerOptions()), **options})
