"""Time spans (start, end): merged, measured, intersected. For GPU trace events and for
how long each card was busy."""

from __future__ import annotations


def union(intervals: list[tuple[float, float]], join_gaps_under: float = 0.0) -> list[tuple[float, float]]:
    """The intervals merged where they touch or overlap (or lie less than join_gaps_under
    apart), in order."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1] + join_gaps_under:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total time two merged interval lists share."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
