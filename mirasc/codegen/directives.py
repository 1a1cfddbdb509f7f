"""The templates' line directives: `# @if FLAG`, `# @elif FLAG`, `# @else`, `# @endif` (FLAG or `not FLAG`), each on a
line of its own; the lines of a branch not taken are dropped, the directive lines always."""

from __future__ import annotations


def preprocess(text: str, flags: dict[str, bool]) -> str:
    out, stack = [], []  # stack of (branch_taken, active)
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# @"):
            word, _, arg = s[3:].partition(" ")
            if word == "if":
                val = _flag(arg, flags)
                stack.append((val, val))
            elif word == "elif":
                taken, _ = stack.pop()
                val = (not taken) and _flag(arg, flags)
                stack.append((taken or val, val))
            elif word == "else":
                taken, _ = stack.pop()
                stack.append((True, not taken))
            elif word == "endif":
                stack.pop()
            else:
                raise ValueError(f"unknown template directive {s}")
            continue
        if all(active for _, active in stack):
            out.append(line)
    if stack:
        raise ValueError("unterminated # @if in template")
    return "\n".join(out) + "\n"


def _flag(arg: str, flags: dict[str, bool]) -> bool:
    arg = arg.strip()
    if arg.startswith("not "):
        return not flags[arg[4:].strip()]
    return flags[arg]
