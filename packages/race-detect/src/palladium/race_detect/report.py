"""Race reports: the two accesses, formatted for a kernel author."""

from __future__ import annotations

from dataclasses import dataclass

from palladium.race_detect.regions import Region, format_region


@dataclass(frozen=True)
class Access:
    """One read or write, as recorded by the detector.

    ``clock`` is the actor's vector clock at the access, as ``(actor name, time)`` pairs
    of its non-zero entries. ``masked`` says a mask restricted the region.
    """

    actor: str
    kind: str
    buffer: str
    region: Region
    site: object
    clock: tuple[tuple[str, int], ...]
    masked: bool = False

    def describe(self) -> str:
        """``write by 'core 0' to x[0:8, :] at kernel.py:41``."""
        where = "to" if self.kind == "write" else "of"
        mask = " (masked)" if self.masked else ""
        site = "an unknown site" if self.site is None else str(self.site)
        return (
            f"{self.kind} by {self.actor!r} {where} {self.buffer}"
            f"{format_region(self.region)}{mask} at {site}"
        )


def _format_clock(clock: tuple[tuple[str, int], ...]) -> str:
    return "{" + ", ".join(f"{name}: {time}" for name, time in clock) + "}"


@dataclass(frozen=True)
class RaceReport:
    """A data race: ``first`` (the earlier access) and ``second`` are not ordered.

    ``element`` is one element both touch (a buffer index), when known.
    """

    first: Access
    second: Access
    element: tuple[int, ...] | None = None

    def __str__(self) -> str:
        at = "" if self.element is None else f" at element {self.element}"
        return (
            f"data race on {self.second.buffer!r}{at}: {_kind_and_line(self.first)} and "
            f"{_kind_and_line(self.second)} are not ordered\n"
            f"  {self.first.describe()}\n"
            f"  {self.second.describe()}\n"
            f"  {CLOCKS_PREFIX} (vector clocks {_format_clock(self.first.clock)} and "
            f"{_format_clock(self.second.clock)})"
        )


# The last line of a report starts so: what orders accesses, then the two clocks (a
# report shown briefly, as pytest's plugin does without -v, keeps this part only).
CLOCKS_PREFIX = "no semaphore wait, barrier or join orders them"


def _kind_and_line(access: Access) -> str:
    """``read (kernel.py:41)``: the access's kind and its source line where the site
    knows one (interpret's sites: ``source_line``; a plain text site: itself)."""
    line = getattr(access.site, "source_line", None)
    if line is None and isinstance(access.site, str):
        line = access.site
    return f"{access.kind} ({line})" if line else access.kind
