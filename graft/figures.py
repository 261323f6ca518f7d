"""How the report figures draw a method: one colour and marker per method, read from the registry's order, so the
Pareto plot and the KL plot agree and no two methods share a look; proposed points take their family's colour as a
star. Legends go outside the axes, where they cover no point."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from graft.atomic import atomic_file  # noqa: E402
from graft.registry import METHODS, PROPOSED_PREFIX  # noqa: E402

MARKERS = ("X", "o", "s", "D", "v", "^", "P", "h", "<", ">", "p", "d")
OTHER = "#777777"   # a method the registry does not name (a foreign table): grey, never a registry method's colour


def method_style(method: str) -> dict:
    """scatter() keywords for a method's points: its registry colour and marker; a proposed point is a star."""
    family = method[len(PROPOSED_PREFIX):] if method.startswith(PROPOSED_PREFIX) else method
    if family in METHODS:
        i = METHODS.index(family)
        colour, marker = plt.cm.tab10(i % 10), MARKERS[i % len(MARKERS)]
    else:
        colour, marker = OTHER, "."
    if method != family:
        return {"color": colour, "marker": "*", "s": 170, "edgecolors": "black", "linewidths": 0.6}
    if family == "post":   # the model everything is grafted onto: black, large
        return {"color": "black", "marker": marker, "s": 110}
    return {"color": colour, "marker": marker, "s": 40}


def legend_outside(fig, ax, fontsize: int = 8) -> None:
    """The axis's legend to the right of the whole figure: it covers no point."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.98), fontsize=fontsize, frameon=False)


def save_png(fig, path: Path) -> None:
    """The PNG written atomically, with the outside legend inside the image, and without matplotlib's version in
    its metadata (an upgrade that draws the same pixels writes the same bytes)."""
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
