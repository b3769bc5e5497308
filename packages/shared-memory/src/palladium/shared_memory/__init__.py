"""palladium.shared_memory: a model of a TPU slice's memory and its simulated cores.

HBM/VMEM/SMEM buffers per device and core, semaphores, local and remote DMAs, barriers,
and a seeded scheduler that runs the simulated cores one at a time and reports
deadlocks. numpy, ml_dtypes and ``palladium.race_detect`` only; never imports jax. The
contract is the package's API.md.
"""

from palladium.race_detect import DataRaceError
from palladium.shared_memory._version import __version__
from palladium.shared_memory.buffers import BufferRef, MemorySpace, is_float_dtype
from palladium.shared_memory.dma import DmaView
from palladium.shared_memory.errors import (
    ConfigError,
    DeadlockError,
    OutOfBoundsError,
    PalladiumError,
    PeerProcessError,
    SemaphoreLeakError,
    SimulationError,
    UninitializedReadError,
    UninitializedReadWarning,
    WatchdogError,
)
from palladium.shared_memory.observer import (
    BlockCopy,
    DmaEvent,
    Observer,
    ObserverSet,
    SemaphoreInfo,
)
from palladium.shared_memory.options import SimulationOptions
from palladium.shared_memory.partition import Partition, Transport
from palladium.shared_memory.regions import AccessPlan
from palladium.shared_memory.scheduler import interrupt_all
from palladium.shared_memory.semaphores import SemaphoreKind
from palladium.shared_memory.sim_state import UninitializedOrigin
from palladium.shared_memory.simulation import CoreId, Simulation
from palladium.shared_memory.snapshot import (
    BufferState,
    CoreState,
    DmaState,
    SemaphoreState,
    Snapshot,
)
from palladium.shared_memory.tpu_facts import (
    GENERATION_DEFAULT,
    TILING_DEFAULT,
    padded_shape,
    uninitialized_value,
)

__all__ = [
    "GENERATION_DEFAULT",
    "TILING_DEFAULT",
    "AccessPlan",
    "BlockCopy",
    "BufferState",
    "BufferRef",
    "ConfigError",
    "CoreId",
    "CoreState",
    "DataRaceError",
    "DeadlockError",
    "DmaEvent",
    "DmaState",
    "DmaView",
    "MemorySpace",
    "is_float_dtype",
    "Observer",
    "ObserverSet",
    "OutOfBoundsError",
    "Partition",
    "PalladiumError",
    "PeerProcessError",
    "SemaphoreInfo",
    "SemaphoreKind",
    "SemaphoreState",
    "SemaphoreLeakError",
    "Simulation",
    "SimulationOptions",
    "SimulationError",
    "Snapshot",
    "Transport",
    "UninitializedReadError",
    "UninitializedOrigin",
    "UninitializedReadWarning",
    "WatchdogError",
    "__version__",
    "interrupt_all",
    "padded_shape",
    "uninitialized_value",
]
