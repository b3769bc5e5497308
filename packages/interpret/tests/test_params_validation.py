"""Bad ``InterpretParams`` values are rejected when the params are built, with an error
naming the field and what is accepted (they used to fail only at launch, obscurely)."""

import math

import pytest

from palladium.interpret import InterpretParams


@pytest.mark.parametrize("kwargs,match", [
    (dict(random_seed=-1), r"random_seed must be None or an int >= 0, got -1"),
    (dict(random_seed=True), r"random_seed must be None or an int >= 0, got True"),
    (dict(rendezvous_timeout=math.nan), r"rendezvous_timeout must be a finite number .* got nan"),
    (dict(rendezvous_timeout=math.inf), r"rendezvous_timeout must be a finite number .* got inf"),
    (dict(rendezvous_timeout=1e300), r"rendezvous_timeout must be .*at most "
                                     r"threading.TIMEOUT_MAX .* got 1e\+300"),
    (dict(rendezvous_timeout=True), r"rendezvous_timeout must be a finite number"),
    (dict(num_cores_or_threads=True), r"num_cores_or_threads must be an int, got the bool"),
    (dict(dma_order="random", dma_order_trials=True), r"dma_order_trials must be an int"),
    (dict(grid_point_recorder=lambda point: None),
     r"grid_point_recorder must accept \(token, grid_point, core_id\) .* or "
     r"\(grid_point, core_id\), got .* with signature \(point\)"),
    (dict(grid_point_recorder=lambda a, b, c, d: None), r"signature \(a, b, c, d\)"),
])
def test_bad_values_are_rejected_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InterpretParams(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(random_seed=0), dict(random_seed=2**40), dict(rendezvous_timeout=0.5),
    dict(rendezvous_timeout=3600), dict(grid_point_recorder=lambda point, core: None),
    dict(grid_point_recorder=lambda token, point, core: token),
    dict(grid_point_recorder=lambda *args: None), dict(grid_point_recorder=print),
])
def test_good_values_are_accepted(kwargs):
    params = InterpretParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value


@pytest.mark.parametrize("kwargs,match", [
    (dict(random_seed=2**70),
     r"^InterpretParams.random_seed must be None or an int in \[0, 2\*\*63\) \(jax.random.key "
     r"takes a signed 64-bit seed\), got 1180591620717411303424\. Reduce it modulo 2\*\*63\.$"),
    (dict(random_seed=2**63),
     r"random_seed must be None or an int in \[0, 2\*\*63\) .* got 9223372036854775808\."),
    (dict(random_seed=2**63 - 2, dma_order="random", dma_order_trials=3),
     r"^InterpretParams.random_seed \+ dma_order_trials must stay below 2\*\*63 \(the trials "
     r"run seeds random_seed\+1 \.\. random_seed\+dma_order_trials\), got random_seed="
     r"9223372036854775806 and dma_order_trials=3\.$"),
    (dict(num_cores_or_threads=1000),
     r"^InterpretParams.num_cores_or_threads must be at most 16 TensorCores per device \(a TPU "
     r"chip has 1 or 2\), got 1000\. To simulate more chips, run the kernel under shard_map "
     r"on more devices\.$"),
])
def test_out_of_range_values_are_config_errors(kwargs, match):
    """They used to be accepted: a seed past 64 bits then killed the launch with
    ``OverflowError`` inside jax.random, 1000 cores ran 1000 simulated cores."""
    from palladium.interpret import ConfigError

    with pytest.raises(ConfigError, match=match):
        InterpretParams(**kwargs)


def test_the_largest_accepted_values_run():
    params = InterpretParams(random_seed=2**63 - 1, num_cores_or_threads=16)
    assert (params.seed, params.num_cores_per_device) == (2**63 - 1, 16)
