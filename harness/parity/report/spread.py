"""Where the heatmap's suite labels go when some suites are too short to hold their own.

Why: each suite's name is written upright beside its band of rows, centred on it. A band of three
rows (the sparse suite's) is far shorter than its name, so two short neighbours' names were drawn
over each other. Labels are moved apart just enough to clear each other, inside the axis.
"""

from __future__ import annotations


def spread(centres: list[float], extents: list[float], low: float, high: float) -> list[float]:
    """Label centres, in the order given (increasing ``centres``), moved the least so that labels
    of the given ``extents`` (same units) do not overlap and stay within ``[low, high]`` where
    they fit there at all. A label that clears its neighbours keeps its centre."""
    placed = list(centres)
    for i in range(1, len(placed)):  # push down past the one above
        placed[i] = max(placed[i], placed[i - 1] + (extents[i - 1] + extents[i]) / 2)
    if placed:  # then back up from the bottom edge, and the top edge wins where all cannot fit
        placed[-1] = min(placed[-1], high - extents[-1] / 2)
        for i in range(len(placed) - 2, -1, -1):
            placed[i] = min(placed[i], placed[i + 1] - (extents[i] + extents[i + 1]) / 2)
        placed[0] = max(placed[0], low + extents[0] / 2)
    return placed
