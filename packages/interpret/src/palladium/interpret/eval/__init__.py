"""The eager jaxpr evaluator and its table of primitive rules."""
