"""The templates' line directives: `# @if FLAG`, `# @elif FLAG`, `# @else`, `# @endif` (FLAG or `not FLAG`), each on a
line of its own; the lines of a branch not taken are dropped, the directive lines always."""

from __future__ import annotations


def preprocess(text: str, flags: dict[str, bool]) -> str:
    """`text` with the branches `flags` do not take removed. A malformed template (a directive out of place, an
    unknown directive or flag, an `# @if` never closed) raises ValueError naming the template line."""
    out, stack = [], []  # one [branch taken, active, line of its # @if, seen # @else] per open # @if
    for number, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s.startswith("# @"):
            if all(frame[1] for frame in stack):
                out.append(line)
            continue
        word, _, arg = s[3:].partition(" ")
        where = f"template line {number}: {s!r}"
        if word == "if":
            val = _flag(arg, flags, where)
            stack.append([val, val, number, False])
            continue
        if word not in ("elif", "else", "endif"):
            raise ValueError(f"{where}: unknown directive (# @if, # @elif, # @else, # @endif)")
        if not stack:
            raise ValueError(f"{where}: no open # @if")
        frame = stack[-1]
        if word == "endif":
            stack.pop()
        elif frame[3]:
            raise ValueError(f"{where}: after the # @else of the # @if on line {frame[2]}")
        elif word == "elif":
            val = _flag(arg, flags, where) and not frame[0]
            frame[0], frame[1] = frame[0] or val, val
        else:
            frame[0], frame[1], frame[3] = True, not frame[0], True
    if stack:
        raise ValueError(f"template line {stack[-1][2]}: # @if without # @endif")
    return "\n".join(out) + "\n"


def _flag(arg: str, flags: dict[str, bool], where: str) -> bool:
    arg = arg.strip()
    negate = arg.startswith("not ")
    name = arg[4:].strip() if negate else arg
    if name not in flags:
        raise ValueError(f"{where}: unknown flag {name!r}")
    return not flags[name] if negate else flags[name]


def fill_lines(text: str, hooks: dict[str, list[str]]) -> str:
    """`text` with each hook `{{NAME}}` that stands alone on a line replaced by its lines, each indented like the
    hook (a blank line stays blank); a hook with no lines removes its line, and one that `text` lacks (in a branch
    the directives dropped) is skipped. A hook that shares its line with other text raises ValueError."""
    lines = text.split("\n")
    for name, filled in hooks.items():
        slot = "{{" + name + "}}"
        at = [n for n, line in enumerate(lines) if slot in line]
        if any(lines[n].strip() != slot for n in at):
            raise ValueError(f"hook {slot} must stand alone on a line of the template")
        for n in reversed(at):
            indent = lines[n][:len(lines[n]) - len(lines[n].lstrip())]
            lines[n:n + 1] = [indent + line if line else "" for line in filled]
    return "\n".join(lines)
