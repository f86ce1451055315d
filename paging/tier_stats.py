"""Per-tier counters a store reports in `stats()`: what a user watches to size its tiers."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TierCounters:
    """hits / misses: lookups this tier answered or passed on; bytes_read: payload bytes it served;
    evictions: copies (host, device) or documents (LMDB) it dropped to stay under its cap."""

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    evictions: int = 0

    def hit(self, nbytes: int = 0) -> None:
        self.hits += 1
        self.bytes_read += nbytes

    def miss(self) -> None:
        self.misses += 1

    def to_dict(self) -> dict[str, int | float]:
        looked = self.hits + self.misses
        return {**asdict(self), "hit_rate": round(self.hits / looked, 4) if looked else 0.0}
