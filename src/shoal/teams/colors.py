"""Member colours: a fixed palette, unique within a team while it lasts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

# Named first (what tmux, rich and the seed's UI share), then distinct 256-colour entries so a
# large team still gets distinguishable colours. Past the palette, the least used colour repeats.
PALETTE: tuple[str, ...] = (
    "red", "blue", "green", "yellow", "magenta", "cyan", "orange", "pink",
    "colour33", "colour70", "colour130", "colour135", "colour166", "colour37", "colour99",
    "colour161", "colour142", "colour31", "colour203", "colour107", "colour172", "colour62",
    "colour168", "colour36",
)  # fmt: skip


def pick_color(taken: Iterable[str | None]) -> str:
    """The first palette colour not in `taken`; when all are taken, the least used one."""
    counts = Counter(c for c in taken if c)
    for color in PALETTE:
        if color not in counts:
            return color
    return min(PALETTE, key=lambda c: (counts[c], PALETTE.index(c)))
