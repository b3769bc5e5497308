"""palladium.interpret.hook: the jax hook: how a `pallas_call` reaches palladium, and a launch split over devices and processes."""
