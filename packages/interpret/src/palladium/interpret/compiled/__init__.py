"""Compiled launches: a hot kernel's whole launch as one XLA executable, the simulator
its oracle (``compiled_launch.py``)."""
