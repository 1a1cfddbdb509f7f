"""The templates' slots (mirasc/codegen/templates/): `{{NAME}}` is a text slot, replaced where it stands; a slot that
stands alone on its line can also take whole lines (`fill_lines`), or none, which removes its line; an optional part
of a module is a file of templates/sections/ that such a slot takes (`section`). There is no conditional text: what a
spec leaves out is a slot it fills with nothing."""

from __future__ import annotations

import functools
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"


def section(name: str) -> list[str]:
    """The lines of the optional section templates/sections/`name`.py.tmpl, for a line slot (read once)."""
    return list(_section_lines(name))


@functools.cache
def _section_lines(name: str) -> tuple[str, ...]:
    return tuple((TEMPLATES / "sections" / f"{name}.py.tmpl").read_text().split("\n")[:-1])


def fill_lines(text: str, hooks: dict[str, list[str]]) -> str:
    """`text` with each hook `{{NAME}}` that stands alone on a line replaced by its lines, each indented like the
    hook (a blank line stays blank); a hook with no lines removes its line, and one that `text` lacks is skipped. A
    hook that shares its line with other text raises ValueError."""
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
