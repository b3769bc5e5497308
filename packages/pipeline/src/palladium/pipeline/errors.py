"""Exception types of palladium.pipeline.

They subclass the builtin types jax's emitter raises (``ValueError``,
``NotImplementedError``), so code written against ``pltpu.emit_pipeline`` that catches
those keeps working.
"""

from __future__ import annotations


class PipelineError(Exception):
    """Base class of every error palladium.pipeline raises."""


class PipelineConfigError(PipelineError, ValueError):
    """A pipeline was configured wrongly (grid, block spec, buffer count, memory space)."""


class PipelineNotImplementedError(PipelineError, NotImplementedError):
    """A feature the emitter does not implement (RevisitMode, dynamic core counts, ...)."""
