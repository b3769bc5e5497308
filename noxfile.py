"""Developer sessions for the palladium monorepo.

    nox -s demo          run examples/demo.py
    nox -s lint tests    what CI runs (see .ci/run)
    nox -s matrix        every installed Python 3.11-3.13 x every supported jax
    nox -s bench         benchmarks against jax's own TPU interpret mode
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

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


@nox.session(python=False)
@nox.parametrize("python", PYTHONS)
def matrix(session: nox.Session, python: str) -> None:
    """Tests on one Python for every supported jax; the jax-free packages also with jax absent.

    A Python that is not installed is skipped, except in CI (CI=1), where it fails.
    """
    exe = _find_python(python)
    if exe is None:
        if os.environ.get("CI"):
            session.error(f"Python {python} is not installed")
        session.skip(f"Python {python} is not installed")
    venv_root = ROOT / ".nox" / f"matrix-{python}"
    uv = shutil.which("uv")

    def make_env(name: str, packages: list[str], extra: list[str]) -> Path:
        env = venv_root / name
        if uv:
            session.run(uv, "venv", "-q", "--allow-existing", "-p", exe, str(env), external=True)
            pip = [uv, "pip", "install", "-q", "-p", str(env / "bin" / "python")]
        else:
            session.run(exe, "-m", "venv", str(env), external=True)
            pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
        args = [a for p in packages for a in ("-e", p)]
        session.run(*pip, *args, *TEST_DEPS, *extra, external=True)
        return env

    # jax-free packages, with jax absent.
    env = make_env("nojax", JAX_FREE, [])
    session.run(
        str(env / "bin" / "python"), "-c",
        "import sys, palladium.race_detect, palladium.shared_memory;"
        "assert 'jax' not in sys.modules; import importlib.util as u;"
        "assert u.find_spec('jax') is None",
        external=True,
    )
    session.run(
        str(env / "bin" / "python"), "-m", "pytest", "-q",
        *[f"{p}/tests" for p in JAX_FREE], external=True,
    )
    for jax_version in SUPPORTED_JAX:
        env = make_env(
            f"jax-{jax_version}", ALL, [f"jax=={jax_version}", f"jaxlib=={jax_version}"]
        )
        session.run(
            str(env / "bin" / "python"), "-m", "pytest", "-q",
            *[f"{p}/tests" for p in ALL], "integration_tests", external=True,
        )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, mypy and the import-linter layer contracts."""
    _install_all(session, "ruff>=0.5", "mypy>=1.10", "import-linter>=2.0")
    session.run("ruff", "check", ".")
    session.run("mypy")
    session.run("lint-imports")


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
