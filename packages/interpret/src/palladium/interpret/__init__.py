"""palladium.interpret: run Pallas TPU kernels on CPU.

``pl.pallas_call(..., interpret=InterpretParams(...))`` and ``pl.core_map(mesh,
interpret=InterpretParams(...))`` evaluate the kernel with one host callback per launch
against palladium's simulated TPU memory (``palladium.shared_memory``), with optional
race detection, deadlock detection, out-of-bounds and revisit checks.
"""

from palladium.interpret import errors
from palladium.interpret._version import __version__
from palladium.interpret.chip import CHIPS, ChipFacts, chip_facts
from palladium.interpret.errors import *  # noqa: F403  (the exception types: errors.__all__)
from palladium.interpret.eval import (  # noqa: F401  (registers the rules)
    rules_check,
    rules_control,
    rules_dma,
    rules_memory,
    rules_misc,
    rules_mxu,
    rules_unsupported,
)
from palladium.interpret.eval.registry import register_interpret_rule
from palladium.interpret.hook.jax_hook import (
    collect_race_reports,
    collected_race_reports,
    errors_as_raised,
    force_tpu_interpret_mode,
    install,
    reset_tpu_interpret_mode_state,
    set_tpu_interpret_mode,
)
from palladium.interpret.params import InterpretParams, LoggingMode
from palladium.interpret.perf import LaunchRecord, Timeline, timeline
from palladium.interpret.rule_plugins import InterpretRuleWarning, load_entry_point_rules
from palladium.interpret.state import process_state
from palladium.interpret.state.disk_cache import CacheInfo, cache_clear, cache_info
from palladium.interpret.state.process_state import STATE
from palladium.interpret.tune import (
    Measurement,
    Prediction,
    SweepResult,
    SweepRow,
    cost_estimate,
    measure,
    predict,
    sweep,
)
from palladium.shared_memory import Snapshot

install()
load_entry_point_rules()
STATE.mark_imported()  # what process_state.reset() goes back to

__all__ = [
    "CHIPS",
    "CacheInfo",
    "ChipFacts",
    "InterpretParams",
    "InterpretRuleWarning",
    "LaunchRecord",
    "LoggingMode",
    "Measurement",
    "Prediction",
    "Snapshot",
    "SweepResult",
    "SweepRow",
    "Timeline",
    "__version__",
    "cache_clear",
    "cache_info",
    "chip_facts",
    "collect_race_reports",
    "collected_race_reports",
    "cost_estimate",
    "errors_as_raised",
    "force_tpu_interpret_mode",
    "load_entry_point_rules",
    "measure",
    "predict",
    "process_state",
    "register_interpret_rule",
    "reset_tpu_interpret_mode_state",
    "set_tpu_interpret_mode",
    "sweep",
    "timeline",
]
__all__ += errors.__all__
