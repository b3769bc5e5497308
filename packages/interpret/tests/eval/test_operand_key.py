"""``operand_key`` (the structure an access's plan is cached by) over all of an access's
operands, or without a store's value (``skip``) or a masked access's trailing value, mask
and fill (``stop``): the key of exactly the operands that are part of the access."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from palladium.interpret.eval.access_path import operand_key
from palladium.interpret.eval.refs import MemRef, SemaphoreRef
from palladium.shared_memory import BufferRef, MemorySpace, SemaphoreKind

_REF = MemRef(BufferRef(1, MemorySpace.HBM, 0, 0, "o", (4, 8), np.dtype(np.float32)))
_SEMS = SemaphoreRef(np.arange(3), SemaphoreKind.DMA, "sems")
_STRUCTURED = {"ref": (_REF, ("m", (4, 8), np.dtype(np.float32), False, False)),
               "sems": (_SEMS, ("s", (3,))), "i32": (np.asarray(3, np.int32), 3),
               "int": (5, 5), "np_int": (np.int32(7), 7)}
_UNSTRUCTURED = {"array": np.ones(2), "str": "x", "float": 1.5}
_NAMES = sorted(_STRUCTURED) + sorted(_UNSTRUCTURED)


def _oracle(names):
    """The key of exactly ``names``: None if one of them has no structure."""
    if any(n in _UNSTRUCTURED for n in names):
        return None
    return tuple(_STRUCTURED[n][1] for n in names)


def _value(name):
    return _STRUCTURED[name][0] if name in _STRUCTURED else _UNSTRUCTURED[name]


@settings(max_examples=300, deadline=None)
@given(names=st.lists(st.sampled_from(_NAMES), max_size=7), cut=st.integers(-1, 8),
       which=st.sampled_from(["all", "skip", "stop"]))
def test_the_key_is_that_of_the_operands_of_the_access(names, cut, which):
    invals = [_value(n) for n in names]
    if which == "all":
        assert operand_key(invals) == _oracle(names)
    elif which == "skip":
        kept = [n for i, n in enumerate(names) if i != cut]
        assert operand_key(invals, skip=cut) == _oracle(kept)
    else:
        kept = names if cut < 0 else names[:cut]
        assert operand_key(invals, stop=cut) == _oracle(kept)
