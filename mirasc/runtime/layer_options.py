"""The Layer options' checker that every emitted module carries (a runtime piece: no imports; its body is copied
into the module by mirasc.codegen.standalone). `schema` is mirasc.language.layer_options.schema()'s dict: option ->
its type and range.
"""

import math


def layer_option_problems(options, schema):
    """Each bad Layer option as a message: unknown names (with the closest known one), wrong types, values out of
    range, words not accepted (with the accepted ones). `schema`: option -> its type and range."""
    def distance(a, b):  # edit distance (insertions, deletions, substitutions)
        row = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            prev, row[0] = row[0], i
            for j, cb in enumerate(b, 1):
                prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
        return row[-1]

    problems, unknown = [], []
    for key in sorted(set(options) - set(schema), key=str):
        close = sorted((distance(str(key), name), name) for name in schema)[0]
        unknown.append(f"{key!r}" + (f" (did you mean {close[1]!r}?)" if close[0] <= max(1, len(str(key)) // 3)
                                     else ""))
    if unknown:
        problems.append(f"unknown Layer option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; options: "
                        f"{', '.join(sorted(schema))}")
    for key, rule in schema.items():
        if key not in options:
            continue
        value, kind = options[key], rule["type"]
        if kind == "bool":
            if not isinstance(value, bool):
                problems.append(f"Layer option {key!r} takes true or false, not {value!r}")
            continue
        if kind == "choice":
            if not isinstance(value, str) or value not in rule["choices"]:
                words = ", ".join(repr(c) for c in rule["choices"])
                lower = value.lower() if isinstance(value, str) else None
                hint = f" (did you mean {lower!r}?)" if lower in rule["choices"] else ""
                problems.append(f"Layer option {key!r} takes one of {words}, not {value!r}{hint}")
            continue
        numbers = (int,) if kind == "int" else (int, float)
        if isinstance(value, bool) or not isinstance(value, numbers) or (kind == "float" and not math.isfinite(value)):
            what = "an integer" if kind == "int" else "a finite number"
            problems.append(f"Layer option {key!r} takes {what}, not {value!r}")
            continue
        bounds = [(op, rule[op]) for op in ("ge", "gt", "le", "lt") if op in rule]
        tests = {"ge": lambda x, b: x >= b, "gt": lambda x, b: x > b, "le": lambda x, b: x <= b,
                 "lt": lambda x, b: x < b}
        if not all(tests[op](value, bound) for op, bound in bounds):
            signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
            accepted = " and ".join(f"{signs[op]} {bound}" for op, bound in bounds)
            problems.append(f"Layer option {key!r} = {value!r} is out of range (accepted: {accepted})")
    return problems


def layer_combination_problems(options):
    """Settings each in range that do not go together. `options`: every Layer option's value (the defaults with the
    given ones over them); a value of the wrong type is left to layer_option_problems."""
    problems = []
    shift, conv = options.get("key_shift"), options.get("conv")
    if isinstance(shift, (int, float)) and not isinstance(shift, bool) and shift and isinstance(conv, int) \
            and not isinstance(conv, bool) and conv < 2:
        problems.append(f"Layer option 'key_shift' = {shift!r} adds to the convolution's tap one token back, and "
                        f"conv = {conv} has none: set conv >= 2 or key_shift = 0")
    return problems


def layer_size_problems(d_model, num_heads, head_dim):
    """What is wrong with the Layer's sizes: positive integers, and d_model a multiple of num_heads unless
    head_dim is given (0: head_dim = d_model // num_heads)."""
    problems = []
    for name, value in (("d_model", d_model), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(f"{name} must be an integer >= 1, not {value!r}")
    if not problems and not head_dim and d_model % num_heads:
        problems.append(f"d_model = {d_model} is not a multiple of num_heads = {num_heads} (the head width is "
                        f"d_model // num_heads); choose sizes that divide, or set the head_dim option")
    return problems
