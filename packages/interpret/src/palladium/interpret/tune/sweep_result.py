"""The table a :func:`palladium.interpret.sweep` returns: rows, ranking, CSV/JSON, a plot."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
from typing import Any

from palladium.interpret.errors import ConfigError
from palladium.interpret.tune.predict import Prediction

__all__ = ["SweepResult", "SweepRow", "config_label"]

#: The columns of the table, the CSV and the JSON (all simulated, the same every run,
#: except ``measured_us``: the chip's device time, with ``sweep(..., measure=True)``).
COLUMNS = (
    "rank",
    "config",
    "compiles",
    "verdict",
    "predicted_us",
    "measured_us",
    "bound",
    "exposed_dma_us",
    "vmem_mib",
    "vmem_limit_mib",
    "smem_bytes",
    "grid_steps",
    "checker",
    "reason",
)


def config_label(config: Any) -> str:
    """``bm=512, bk=1024`` for a dict config, else ``str(config)``."""
    if isinstance(config, dict):
        return ", ".join(f"{k}={v}" for k, v in config.items())
    return str(config)


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """One configuration: its prediction (None when jax or palladium refused to run it)
    and, when rejected, why."""

    config: Any
    prediction: Prediction | None
    reason: str | None = None
    error: str | None = None
    wall_seconds: float = 0.0
    measured_seconds: float | None = None  #: the chip's device time (``measure=True``)

    @property
    def accepted(self) -> bool:
        return self.prediction is not None and self.prediction.compiles

    @property
    def uncertain(self) -> str | None:
        """Why this row's verdict may not be the TPU compiler's (``Prediction.uncertain``)."""
        return self.prediction.uncertain if self.prediction is not None else None

    @property
    def verdict(self) -> str:
        """"compiles" or "rejected", with ", uncertain" where the approximation was near
        its limit."""
        word = "compiles" if self.accepted else "rejected"
        return f"{word}, uncertain" if self.uncertain else word

    @property
    def label(self) -> str:
        return config_label(self.config)

    @property
    def predicted_seconds(self) -> float | None:
        return self.prediction.predicted_seconds if self.prediction is not None else None

    def values(self, rank: int | None) -> dict[str, Any]:
        """The row's columns (``COLUMNS``)."""
        p = self.prediction
        ok = self.accepted and p is not None

        def num(x: float | None, scale: float) -> float | None:
            return None if x is None else round(x * scale, 3)

        return {
            "rank": rank,
            "config": self.label,
            "compiles": self.accepted,
            "verdict": self.verdict,
            "predicted_us": num(p.predicted_seconds, 1e6) if ok and p else None,
            "measured_us": num(self.measured_seconds, 1e6),
            "bound": p.bound if ok and p else None,
            "exposed_dma_us": num(p.exposed_dma_seconds, 1e6) if ok and p else None,
            "vmem_mib": num(p.vmem_bytes, 2.0**-20) if ok and p else None,
            "vmem_limit_mib": num(p.vmem_limit_bytes, 2.0**-20) if ok and p else None,
            "smem_bytes": p.smem_bytes if ok and p else None,
            "grid_steps": p.grid_steps if ok and p else None,
            "checker": p.checker if p is not None else None,
            "reason": self.uncertain if ok else (
                f"{self.error}: {self.reason}" if self.error else self.reason),
        }


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """Every configuration of a sweep, in the order given (``rows``); ``ranked``: the
    accepted ones, those whose verdict is sure first, fastest first within each (an
    uncertain one may not compile: ``Prediction.uncertain``); ``rejected``: the others,
    in the order given."""

    rows: tuple[SweepRow, ...]
    chip: str
    wall_seconds: float = 0.0  # what the whole sweep cost on this CPU

    @property
    def ranked(self) -> list[SweepRow]:
        order = {id(r): i for i, r in enumerate(self.rows)}
        ok = [r for r in self.rows if r.accepted]
        return sorted(ok, key=lambda r: (r.uncertain is not None, r.predicted_seconds,
                                         order[id(r)]))

    @property
    def rejected(self) -> list[SweepRow]:
        return [r for r in self.rows if not r.accepted]

    @property
    def best(self) -> SweepRow:
        """The fastest accepted configuration whose verdict is sure, else the fastest
        uncertain one (``ConfigError`` if none was accepted)."""
        ranked = self.ranked
        if not ranked:
            raise ConfigError(
                f"no configuration of the sweep compiles on TPU {self.chip}: "
                + "; ".join(f"{r.label}: {r.reason}" for r in self.rejected[:3])
            )
        return ranked[0]

    def records(self) -> list[dict[str, Any]]:
        """The table as dicts: ranked rows first, then the rejected."""
        out = [r.values(i + 1) for i, r in enumerate(self.ranked)]
        return out + [r.values(None) for r in self.rejected]

    @property
    def rank_agreement(self) -> float | None:
        """Kendall's tau between the predicted and the measured order of the rows that
        have both (1: the same order; None: fewer than two measured)."""
        pairs = [(r.predicted_seconds, r.measured_seconds) for r in self.rows
                 if r.accepted and r.measured_seconds is not None]
        if len(pairs) < 2:
            return None
        return kendall_tau([p for p, _ in pairs], [m for _, m in pairs])  # type: ignore[misc]

    def table(self, columns: tuple[str, ...] | None = None) -> str:
        """A markdown table (``columns`` from ``COLUMNS``; by default the rank, the
        configuration, the verdict, predicted and, when measured, measured time, the
        bound, exposed DMA, VMEM and the reason)."""
        if columns is None:
            measured = any(r.measured_seconds is not None for r in self.rows)
            columns = ("rank", "config", "verdict", "predicted_us",
                       *(("measured_us",) if measured else ()), "bound", "exposed_dma_us",
                       "vmem_mib", "reason")

        def cell(v: Any) -> str:
            if v is None:
                return ""
            return f"{v:,}" if isinstance(v, int | float) and not isinstance(v, bool) else str(v)

        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for rec in self.records():
            lines.append("| " + " | ".join(cell(rec[c]) for c in columns) + " |")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_csv(self, path: str) -> None:
        """Write the table (``COLUMNS``) as CSV."""
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
            writer.writeheader()
            writer.writerows(self.records())

    def to_json(self, path: str) -> None:
        """Write ``{"chip": ..., "rows": [...]}`` (``COLUMNS`` per row, the config as
        given when it is JSON)."""
        rows = self.records()
        by_label = {r.label: r.config for r in self.rows}
        for rec in rows:
            config = by_label.get(rec["config"])
            try:
                json.dumps(config)
                rec["config_value"] = config
            except TypeError:
                rec["config_value"] = rec["config"]
        with open(path, "w") as f:
            json.dump({"chip": self.chip, "rows": rows}, f, indent=1)
            f.write("\n")

    def plot(self, path: str, *, title: str | None = None) -> None:
        """Save a bar chart of predicted time per accepted configuration, in ``ranked``'s
        order, uncertain verdicts in orange (needs matplotlib: ``pip install 'palladium-interpret[tune]'``)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ConfigError(
                "SweepResult.plot needs matplotlib, which is not installed: pip install "
                "'palladium-interpret[tune]' (or matplotlib); to_csv / to_json / "
                "table() need nothing."
            ) from e
        ranked = self.ranked
        fig, ax = plt.subplots(figsize=(8, 0.35 * max(len(ranked), 2) + 1.2))
        labels = [r.label for r in ranked]
        times = [(r.predicted_seconds or 0.0) * 1e6 for r in ranked]
        colors = ["tab:orange" if r.uncertain else "tab:blue" for r in ranked]
        ax.barh(range(len(ranked)), times, color=colors)
        ax.set_yticks(range(len(ranked)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"predicted time on TPU {self.chip} (us)")
        ax.set_title(title or f"sweep: {len(ranked)} accepted, {len(self.rejected)} rejected")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def kendall_tau(predicted: list[float], measured: list[float]) -> float:
    """Kendall's tau (tau-a) of two orders of the same items: 1 the same order, -1 the
    reverse. At least two items."""
    concordant = discordant = 0
    for (p1, m1), (p2, m2) in itertools.combinations(zip(predicted, measured), 2):
        sign = (p1 - p2) * (m1 - m2)
        concordant += sign > 0
        discordant += sign < 0
    total = len(predicted) * (len(predicted) - 1) // 2
    return (concordant - discordant) / total
