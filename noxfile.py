"""Developer sessions for the palladium monorepo.

    nox -s demo          run examples/demo.py
    nox -s lint tests    what CI runs (see .ci/run)
    nox -s compiler      the TPU compiler's verdicts (installs libtpu)
    nox -s matrix        wheel installs on Python 3.11-3.13 x every supported jax, sdists
    nox -s dists         build the wheels and sdists (.nox/dist), twine check --strict
    nox -s bench         benchmarks against jax's own TPU interpret mode
    nox -s tpu           on a TPU VM: the pipeline compiled and run on the chip
    nox -s compiler      the tests that ask the TPU compiler itself (installs libtpu)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
JAX_FREE = ["packages/race-detect", "packages/shared-memory"]
JAX_PACKAGES = ["packages/interpret", "packages/pipeline"]
ALL = JAX_FREE + JAX_PACKAGES
SUPPORTED_JAX = ["0.10.0", "0.10.2"]
PYTHONS = ["3.11", "3.12", "3.13"]
TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.2", "pytest-xdist>=3.5", "hypothesis>=6.100"]


def _install_all(session: nox.Session, *extra: str) -> None:
    args: list[str] = []
    for pkg in ALL:
        args += ["-e", pkg]
    session.install(*args, *TEST_DEPS, *extra)


@nox.session
def tests(session: nox.Session) -> None:
    """Every package's tests and the integration tests, on the current Python."""
    _install_all(session)
    session.run(
        "pytest", "-q", *[f"{p}/tests" for p in ALL], "integration_tests", *session.posargs
    )


def _works(exe: str) -> bool:
    try:
        return subprocess.run([exe, "-c", "import sys"], capture_output=True).returncode == 0
    except OSError:
        return False


def _find_python(version: str) -> str | None:
    """A working python<version>: on PATH, or under $(pyenv root)/versions.

    pyenv's shims are on PATH for every version but fail unless that version is
    selected, so every candidate is tried before it is used.
    """
    candidates = []
    found = shutil.which(f"python{version}")
    if found:
        candidates.append(found)
    try:
        root = subprocess.run(
            ["pyenv", "root"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        root = os.path.expanduser("~/.pyenv")
    for cand in sorted(Path(root, "versions").glob(f"{version}.*"), reverse=True):
        candidates.append(str(cand / "bin" / f"python{version}"))
    return next((exe for exe in candidates if _works(exe)), None)


# What the matrix runs on an install from wheels (the full suite runs in `tests`, on the
# default Python with the newest jax, and from each sdist in `matrix` on MAIN_PYTHON): one
# representative file per area, each under a minute here.
SUBSET = {
    "interpret": [
        "packages/interpret/tests/test_smoke.py",
        "packages/interpret/tests/test_api.py",
        "packages/interpret/tests/test_errors.py",
        "packages/interpret/tests/hook/test_multi_device.py",
        "packages/interpret/tests/run/test_blas.py",
        "packages/interpret/tests/numpy_rules/test_quiet_rules.py",
    ],
    "pipeline": [
        "packages/pipeline/tests/test_smoke.py",
        "packages/pipeline/tests/test_basic_pipeline.py",
    ],
    "integration": ["integration_tests/test_readme.py"],
}
MAIN_PYTHON = "3.12"
DIST = ROOT / ".nox" / "dist"
_BUILT: list[Path] = []  # the dists built by this nox run (built once, used by every session)


def _uv(session: nox.Session) -> str:
    uv = shutil.which("uv")
    if uv is None:
        session.error("the wheel sessions need uv (python -m pip install uv)")
    return uv


def _dists(session: nox.Session) -> list[Path]:
    """Wheels and sdists of the four distributions in .nox/dist, checked by twine."""
    if _BUILT:
        return _BUILT
    uv = _uv(session)
    shutil.rmtree(DIST, ignore_errors=True)
    for pkg in ALL:
        session.run(uv, "build", "-q", "-o", str(DIST), pkg, external=True)
    built = sorted(DIST.glob("*.whl")) + sorted(DIST.glob("*.tar.gz"))
    if len(built) != 2 * len(ALL):
        session.error(f"expected a wheel and an sdist per distribution, got {built}")
    tools = ROOT / ".nox" / "twine"
    session.run(uv, "venv", "-q", "--allow-existing", str(tools), external=True)
    session.run(uv, "pip", "install", "-q", "-p", str(tools / "bin" / "python"), "twine>=6.1",
                external=True)
    session.run(str(tools / "bin" / "python"), "-m", "twine", "check", "--strict",
                *map(str, built), external=True)
    _BUILT.extend(built)
    return _BUILT


def _wheel(name: str) -> str:
    [wheel] = DIST.glob(f"palladium_{name.replace('-', '_')}-*.whl")
    return str(wheel)


@nox.session(python=False)
def dists(session: nox.Session) -> None:
    """Build every distribution's wheel and sdist into .nox/dist; `twine check --strict`."""
    for path in _dists(session):
        session.log(f"built {path.relative_to(ROOT)}")


def _pytest(session: nox.Session, env: Path, *args: str, cwd: Path = ROOT) -> None:
    # Run from a folder without the sources on sys.path: the installed wheels are tested.
    with session.chdir(cwd):
        session.run(str(env / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:randomly",
                    *args, external=True)


def _check_absent(session: nox.Session, env: Path, present: list[str], absent: list[str]) -> None:
    code = "; ".join(
        [f"import {m}" for m in present]
        + ["import importlib.util as u"]
        + [f"assert u.find_spec({m!r}) is None, {m!r}" for m in absent]
    )
    session.run(str(env / "bin" / "python"), "-c", code, external=True)


@nox.session(python=False)
@nox.parametrize("python", PYTHONS)
def matrix(session: nox.Session, python: str) -> None:
    """Installs from the wheels on one Python, for every supported jax.

    - the two jax-free distributions without jax: their full tests;
    - palladium-pipeline alone (with jax, without palladium-interpret): a subset;
    - palladium-interpret (pulling the two jax-free ones from the wheels) and pipeline,
      per supported jax: a subset of each package's tests and the README's examples;
    - on MAIN_PYTHON, each distribution's sdist with only its declared dependencies
      (and the test extra): its own full tests, run from the unpacked sdist.

    A Python that is not installed is skipped, except in CI (CI=1), where it fails.
    """
    exe = _find_python(python)
    if exe is None:
        if os.environ.get("CI"):
            session.error(f"Python {python} is not installed")
        session.skip(f"Python {python} is not installed")
    _dists(session)
    uv = _uv(session)
    venv_root = ROOT / ".nox" / f"matrix-{python}"

    def make_env(name: str, requirements: list[str]) -> Path:
        env = venv_root / name
        shutil.rmtree(env, ignore_errors=True)  # a fresh install each time
        session.run(uv, "venv", "-q", "-p", exe, str(env), external=True)
        # uv caches a --find-links wheel by its file name, as it would a registry's: a
        # palladium dependency pulled from .nox/dist (e.g. shared-memory under interpret)
        # would come from an earlier build of the same version in the same folder. So the
        # four are always read afresh.
        refresh = [arg for pkg in ALL for arg in ("--refresh-package", f"palladium-{Path(pkg).name}")]
        session.run(uv, "pip", "install", "-q", "-p", str(env / "bin" / "python"), *refresh,
                    "--find-links", str(DIST), *requirements, *TEST_DEPS, external=True)
        return env

    jax_free = ["race-detect", "shared-memory"]
    env = make_env("nojax", [_wheel(n) for n in jax_free])
    _check_absent(session, env, ["palladium.race_detect", "palladium.shared_memory"],
                  ["jax", "palladium.interpret", "palladium.pipeline"])
    _pytest(session, env, *[f"packages/{n}/tests" for n in jax_free])

    newest = SUPPORTED_JAX[-1]
    env = make_env("pipeline", [_wheel("pipeline"), f"jax=={newest}"])
    _check_absent(session, env, ["palladium.pipeline", "jax"],
                  ["palladium.interpret", "palladium.shared_memory", "palladium.race_detect"])
    _pytest(session, env, *SUBSET["pipeline"])

    for jax_version in SUPPORTED_JAX:
        env = make_env(f"jax-{jax_version}", [
            _wheel("interpret"), _wheel("pipeline"), f"jax=={jax_version}",
            f"jaxlib=={jax_version}",
        ])
        _pytest(session, env, *SUBSET["interpret"], *SUBSET["pipeline"], *SUBSET["integration"])

    if python == MAIN_PYTHON:
        for name in ALL:
            _test_sdist(session, make_env, Path(name).name)


def _test_sdist(session: nox.Session, make_env: Any, name: str) -> None:
    """Unpack the sdist, install it with its test extra only, run its tests from there."""
    [sdist] = DIST.glob(f"palladium_{name.replace('-', '_')}-*.tar.gz")
    unpacked = DIST / "unpacked"
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked, filter="data")
    folder = unpacked / sdist.name.removesuffix(".tar.gz")
    env = make_env(f"sdist-{name}", [f"{folder}[test]"])
    _pytest(session, env, "tests", cwd=folder)


@nox.session
def compiler(session: nox.Session) -> None:
    """With palladium-interpret[compiler] (libtpu): the TPU compiler's own verdicts
    (packages/interpret/tests/compiler, collected only where libtpu is installed) and the
    README's examples, compiler-only ones included."""
    args: list[str] = []
    for pkg in ALL:
        args += ["-e", f"{pkg}[compiler]" if pkg == "packages/interpret" else pkg]
    session.install(*args, *TEST_DEPS)
    # jax would otherwise try libtpu's TPU backend on this CPU box (and print its
    # warnings); the compiler compiles for a topology whatever the platforms are.
    session.run(
        "pytest", "-q", "packages/interpret/tests/compiler",
        "integration_tests/test_readme.py", *session.posargs,
        env={"JAX_PLATFORMS": "cpu"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, mypy and the import-linter layer contracts."""
    _install_all(session, "ruff>=0.5", "mypy>=1.10", "import-linter>=2.0")
    session.run("ruff", "check", ".")
    session.run("mypy")
    session.run("lint-imports")


@nox.session(venv_params=["--system-site-packages"])
def tpu(session: nox.Session) -> None:
    """On a TPU VM: the pipeline's kernels compiled by Mosaic and run on the chip (the
    ``tpu``-marked tests: against numpy and jax's own emit_pipeline), then its whole suite
    (the interpreters on the CPU device), with palladium-pipeline installed alone as TPU
    users install it; then palladium.interpret beside the chip. The machine's own jax and
    libtpu are used (the venv sees its site-packages; ``python -m pytest`` so that a pytest
    found there runs with the venv's palladium)."""
    session.install("-e", "packages/pipeline", *TEST_DEPS)
    session.run("python", "-c", "import jax, sys; sys.exit(jax.default_backend() != 'tpu' "
                "and 'nox -s tpu needs a TPU as the default backend of jax')")
    session.run("python", "-m", "pytest", "-q", "-p", "no:xdist", "-m", "tpu", "packages/pipeline/tests")
    session.run("python", "-m", "pytest", "-q", "-p", "no:xdist", "packages/pipeline/tests")
    _install_all(session)
    session.run("python", "-m", "pytest", "-q", "-p", "no:xdist",
                "integration_tests/test_jax_emit_pipeline_on_cpu.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: palladium vs jax's own implementations, as ratios."""
    _install_all(session)
    session.run("python", "benchmarks/run.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """Run the demo: a Pallas TPU kernel on this CPU, with race detection."""
    _install_all(session)
    session.run("python", "examples/demo.py")
