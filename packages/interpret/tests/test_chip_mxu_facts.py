"""chip.py keeps the MXU counts of jax 0.10.2's tpu_info for jax 0.10.0 (whose TpuInfo lacks
them): where jax has them, they must be jax's."""

import pytest

from palladium.interpret import _jax_compat as jc
from palladium.interpret.chip import _JAX_CHIP_VERSIONS, CHIPS, MXU_FACTS_OF_JAX_0_10_2, chip_facts


def test_every_chip_has_mxu_facts():
    assert set(CHIPS) <= set(MXU_FACTS_OF_JAX_0_10_2)


@pytest.mark.parametrize("chip", CHIPS)
def test_the_kept_mxu_facts_are_jaxs_where_jax_states_them(chip):
    info = jc.tpu_info_for_chip(_JAX_CHIP_VERSIONS[chip])
    facts = chip_facts(chip)
    if not hasattr(info, "num_mxus"):  # jax 0.10.0: the kept values stand in
        assert (facts.num_mxus, facts.num_accumulators) == MXU_FACTS_OF_JAX_0_10_2[chip]
        return
    assert (info.num_mxus, info.num_accumulators) == MXU_FACTS_OF_JAX_0_10_2[chip]
    assert (facts.num_mxus, facts.num_accumulators) == MXU_FACTS_OF_JAX_0_10_2[chip]
