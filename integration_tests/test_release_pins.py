"""The four distributions are released in lock-step: one version for all, and every
dependency of one palladium distribution on another pinned to exactly that version, so
an install can never mix releases (pip would refuse it)."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = sorted((ROOT / "packages").glob("*/pyproject.toml"))


def _version(pyproject: pathlib.Path) -> str:
    data = tomllib.loads(pyproject.read_text())
    version_file = pyproject.parent / data["tool"]["hatch"]["version"]["path"]
    return re.search(r'__version__ = "([^"]+)"', version_file.read_text()).group(1)


def test_every_distribution_has_the_same_version():
    versions = {p.parent.name: _version(p) for p in PACKAGES}
    assert len(PACKAGES) == 4 and len(set(versions.values())) == 1, versions


def test_palladium_dependencies_are_pinned_to_that_version():
    version = _version(PACKAGES[0])
    pins = {}
    for p in PACKAGES:
        data = tomllib.loads(p.read_text())["project"]
        deps = list(data.get("dependencies", []))
        for extra in data.get("optional-dependencies", {}).values():
            deps += extra
        for dep in deps:
            if dep.startswith("palladium-"):
                pins[(p.parent.name, dep)] = re.fullmatch(
                    rf"palladium-[a-z-]+(\[[a-z,-]+\])?=={re.escape(version)}", dep) is not None
    assert pins and all(pins.values()), pins
