"""TPU fidelity checks: a kernel that runs clean under palladium.interpret also compiles
and fits on the TPU it simulates (its modules: docs/architecture.md, ``fidelity/``)."""
