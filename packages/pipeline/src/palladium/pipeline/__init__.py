"""palladium.pipeline: the Pallas TPU software-pipeline emitter for jax 0.10.x.

A drop-in for ``pltpu.emit_pipeline`` with the features of newer jax releases:
N-buffering with ``(in, out)`` buffer pairs for input-output operands, lookahead,
prefetched inputs, all block-dim kinds with tile-rounded ragged blocks, megacore
partitioning, ``PipelineStep`` indices, ``output_wait_read_only``, and a tiling default
on CPU hosts. It depends on jax only and lowers to Mosaic like jax's own emitter.
"""

import os as _os

from palladium.pipeline import _jax_compat
from palladium.pipeline._jax_compat import (
    ARBITRARY,
    PARALLEL,
    GridDimensionSemantics,
    SemaphoreType,
)
from palladium.pipeline._version import __version__
from palladium.pipeline.buffered_ref import BufferedRef, BufferedRefBase
from palladium.pipeline.buffering import Buffered, BufferType
from palladium.pipeline.emit import (
    PipelineStep,
    emit_pipeline,
    emit_pipeline_with_allocations,
    map_brefs,
    map_inputs,
    map_outputs,
    sync_copy,
)
from palladium.pipeline.errors import (
    PipelineConfigError,
    PipelineError,
    PipelineNotImplementedError,
)
from palladium.pipeline.scheduler import Scheduler, fetch_with_lookahead
from palladium.pipeline.tiling import DEFAULT_TPU_GENERATION, Tiling, infer_tiling

# The DMAs and loops this package emits are attributed to the user's emit_pipeline call,
# not to palladium.pipeline's own lines, in jax's and interpreters' error messages.
_jax_compat.exclude_from_user_frames(_os.path.dirname(_os.path.abspath(__file__)) + _os.sep)

__all__ = [
    "ARBITRARY",
    "DEFAULT_TPU_GENERATION",
    "PARALLEL",
    "BufferType",
    "Buffered",
    "BufferedRef",
    "BufferedRefBase",
    "GridDimensionSemantics",
    "PipelineConfigError",
    "PipelineError",
    "PipelineNotImplementedError",
    "PipelineStep",
    "Scheduler",
    "SemaphoreType",
    "Tiling",
    "__version__",
    "emit_pipeline",
    "emit_pipeline_with_allocations",
    "fetch_with_lookahead",
    "infer_tiling",
    "map_brefs",
    "map_inputs",
    "map_outputs",
    "sync_copy",
]
