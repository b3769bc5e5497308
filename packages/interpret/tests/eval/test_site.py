"""A core's ``Site`` (where an operation happened, as every message names it): the
evaluator builds it directly as a tuple, so its fields must come out as ``Site``'s own."""

import jax
import pytest

from palladium.interpret.eval.evaluator import CoreEvaluator
from palladium.interpret.eval.site import Site


class _Launch:
    kernel_name = "ring"
    memory = None
    params = None
    inherited_sources: dict = {}


def _eqn():
    (eqn,) = jax.make_jaxpr(lambda x: x + 1)(1.0).jaxpr.eqns
    return eqn


def test_the_evaluators_site_is_the_site_of_its_core_grid_point_and_equation():
    eqn = _eqn()
    site = CoreEvaluator(_Launch(), (3, 1)).at((2, 0)).site(eqn, "a DMA")
    assert type(site) is Site
    assert site == Site(kernel="ring", core=(3, 1), grid_point=(2, 0),
                        source_info=eqn.source_info, what="a DMA")
    assert site.out_of_bounds_headline is None
    assert str(site).startswith("kernel 'ring', a DMA, grid point (2, 0), device 3 core 1 "
                                "(test_site.py:")


def test_a_site_without_an_equation_names_no_line_and_cannot_change():
    site = CoreEvaluator(_Launch(), (0, 0)).site()
    assert site == Site(kernel="ring", core=(0, 0))
    assert str(site) == "kernel 'ring', device 0 core 0"
    with pytest.raises(AttributeError):
        site.kernel = "other"  # type: ignore[misc]
