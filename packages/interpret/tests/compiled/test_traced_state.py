"""The traced-state protocol of the one traced evaluator (``compiled/traced_state.py``):
the flags its optional parts raise, checked on small traced functions against what the
simulator decides (a read of an element nothing initialised, an access out of bounds),
and the parts a compiled segment's state has not (a DMA table, a grid) refused."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from palladium.interpret import _jax_compat as jc
from palladium.interpret.compiled.traced_eval import RULES
from palladium.interpret.compiled.traced_state import (
    FLAG_BOUNDS,
    FLAG_UNINIT,
    TracedState,
    TraceFacts,
    View,
    apply_indexers,
)
from palladium.interpret.errors import UnsupportedFeatureError

pytestmark = pytest.mark.timeout(120)


def _masked_state(contents):
    return TracedState([contents], jnp.int32(0), TraceFacts(),
                       masks={0: jnp.zeros(contents.shape, bool)})


@pytest.mark.parametrize("read_at, flag", [(0, 0), (4, 0), (5, FLAG_UNINIT)])
def test_a_read_of_an_element_no_store_marked_raises_the_uninitialised_flag(read_at, flag):
    def f(x, start):
        st = _masked_state(x)
        view, _ = apply_indexers(View.whole(x.shape), [jc.NDIndexer.from_indices_shape(
            (jc.Slice(0, 5),), x.shape)])
        st.check_access(0, view, write=True, reads=False)  # a store of x[0:5]
        read, ok = apply_indexers(View.whole(x.shape), [jc.NDIndexer.from_indices_shape(
            (start,), x.shape)])
        st.raise_flag(FLAG_BOUNDS, ~ok)
        st.check_access(0, read, write=False)
        return st.flag, st.masks[0]

    flag_out, mask = jax.jit(f)(np.arange(8, dtype=np.float32), np.int32(read_at))
    assert int(flag_out) == flag
    np.testing.assert_array_equal(mask, np.arange(8) < 5)


def test_an_index_out_of_bounds_raises_the_bounds_flag():
    def f(x, start):
        st = TracedState([x], jnp.int32(0), TraceFacts())
        _, ok = apply_indexers(View.whole(x.shape), [jc.NDIndexer.from_indices_shape(
            (jc.Slice(start, 4),), x.shape)])
        st.raise_flag(FLAG_BOUNDS, jnp.logical_not(ok))
        return st.flag

    x = np.zeros(8, np.float32)
    assert int(jax.jit(f)(x, np.int32(4))) == 0
    assert int(jax.jit(f)(x, np.int32(5))) == FLAG_BOUNDS
    assert int(jax.jit(f)(x, np.int32(-1))) == FLAG_BOUNDS


def test_a_state_without_a_grid_or_dma_table_refuses_program_ids_and_dmas():
    st = TracedState([np.zeros(4, np.float32)], np.int32(0), TraceFacts())
    with pytest.raises(UnsupportedFeatureError, match="program id outside a traced grid"):
        RULES[jc.program_id_p](types.SimpleNamespace(params={"axis": 0}), [], st)
    with pytest.raises(UnsupportedFeatureError, match="no DMA table"):
        RULES[jc.dma_wait_p](types.SimpleNamespace(params={}), [], st)
