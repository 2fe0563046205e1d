"""Point-to-point and collective transfer times between instances.

The reference profiled p2p latency on 10 Gb/s p3.2xlarge links (`cost.py load_profile_result`, §E.3); the
migration cost model and the analytic pipeline estimator both price bytes through this one table, so a
measured table (e.g. from the CPU trainer) replaces it in one place.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# bytes -> microseconds, profiled by the reference ("bw = 10Gb/s, profiling result is in us").
P3_P2P_US: tuple[tuple[int, float], ...] = (
    (4, 142.907),
    (8, 139.679),
    (16, 143.102),
    (32, 139.210),
    (64, 143.954),
    (128, 140.836),
    (256, 141.442),
    (512, 144.788),
    (1 * KiB, 137.372),
    (2 * KiB, 140.417),
    (4 * KiB, 141.651),
    (8 * KiB, 145.364),
    (16 * KiB, 154.935),
    (32 * KiB, 162.665),
    (64 * KiB, 194.492),
    (128 * KiB, 230.588),
    (256 * KiB, 385.104),
    (512 * KiB, 689.821),
    (1 * MiB, 1428.108),
    (2 * MiB, 3006.771),
    (4 * MiB, 5182.599),
    (8 * MiB, 9727.047),
    (16 * MiB, 18622.294),
    (32 * MiB, 38560.219),
    (64 * MiB, 74432.216),
    (128 * MiB, 153550.589),
    (256 * MiB, 305811.282),
    (512 * MiB, 601380.752),
    (1 * GiB, 1198255.900),
)


@dataclass(frozen=True)
class P2PTable:
    """Profiled p2p latency, interpolated linearly between points (the reference's `bisect_left` rule).

    Below the first point the first value holds (latency floor); above the last point time grows
    linearly from the origin through the last point (bandwidth-bound).
    """

    points: tuple[tuple[int, float], ...] = P3_P2P_US
    source: str = "Parcae reference cost.py load_profile_result: p3.2xlarge, 10 Gb/s, profiled in us (§E.3)"
    _sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = tuple(b for b, _ in self.points)
        if list(sizes) != sorted(set(sizes)) or not sizes:
            raise ValueError("p2p table sizes must be strictly increasing and non-empty")
        object.__setattr__(self, "_sizes", sizes)

    def ms(self, nbytes: float) -> float:
        """Milliseconds to send ``nbytes`` point to point."""
        if nbytes <= 0:
            return 0.0
        pts, sizes = self.points, self._sizes
        if nbytes <= sizes[0]:
            return pts[0][1] / 1000.0
        if nbytes >= sizes[-1]:
            return pts[-1][1] * nbytes / sizes[-1] / 1000.0
        i = bisect.bisect_left(sizes, nbytes)
        (b0, t0), (b1, t1) = pts[i - 1], pts[i]
        return (t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)) / 1000.0

    def allreduce_ms(self, nbytes: float, world: int, link_mib_per_ms: float = 1.25) -> float:
        """Ring all-reduce at link speed (the reference's `all_reduce_cost`, 10 Gb/s = 1.25 MiB/ms)."""
        if world <= 1 or nbytes <= 0:
            return 0.0
        return nbytes / MiB / link_mib_per_ms * 2 * (world - 1) / world


P3_P2P = P2PTable()


def p2p_ms(nbytes: float) -> float:
    """p2p time on the reference's p3.2xlarge network."""
    return P3_P2P.ms(nbytes)
