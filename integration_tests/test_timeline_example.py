"""examples/timeline.py without matplotlib: it says so before simulating and writes the
Chrome trace instead of failing after the simulation."""

import json

import pytest
import timeline  # examples/timeline.py (integration_tests/conftest.py)


@pytest.mark.timeout(120)
def test_without_matplotlib_the_example_writes_the_trace(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(timeline.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else object())
    written = timeline.main(str(tmp_path / "timeline.png"))
    assert written == str(tmp_path / "timeline.json")
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first == ("matplotlib is not installed (pip install 'palladium-interpret[timeline]' "
                     f"draws the picture): writing the Chrome trace {written} instead")
    events = json.loads((tmp_path / "timeline.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(e.get("ph") == "X" for e in events)  # spans of the two launches
    assert not (tmp_path / "timeline.png").exists()
