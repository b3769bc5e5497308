"""Run jax's own Pallas TPU interpret-mode test suites against palladium.

The suites live only in jax's repository (not in its wheel), and are never copied into
this repository: this script extracts them at a tag into a temporary directory outside
the checkout, drops ``conftest_plugin.py`` next to them as ``conftest.py`` (it rebinds
``pltpu.InterpretParams`` & co. to palladium's before the test modules are imported),
rewrites ``interpret=True`` in tpu_pallas_test.py's ``*InterpretTest`` classes to
``interpret=pltpu.InterpretParams()``, and runs pytest with a per-test timeout.

    python tools/upstream_conformance/run.py --jax-repo /path/to/jax          # all three
    python tools/upstream_conformance/run.py --suite interpret -- -k races    # one suite

Without ``--jax-repo`` (or ``$JAX_REPO``) the tag is cloned from GitHub (shallow).
See README.md in this folder for the recorded totals.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
DEFAULT_TAG = "jax-v0.10.2"
JAX_URL = "https://github.com/jax-ml/jax"

# suite name -> (file under tests/pallas, pytest -k expression selecting its tests, number
# of CPU devices: tpu_pallas_interpret_test.py skips everything on more than one,
# the distributed suite needs at least four)
SUITES: dict[str, tuple[str, str | None, int]] = {
    "tpu": ("tpu_pallas_test.py", "InterpretTest", 1),
    "interpret": ("tpu_pallas_interpret_test.py", None, 1),
    "distributed": ("tpu_pallas_interpret_distributed_test.py", None, 4),
}

_CLASS = re.compile(r"^class (\w+)\b")


def rewrite_interpret_true(source: str) -> str:
    """``interpret=True`` -> ``interpret=pltpu.InterpretParams()`` inside the classes
    whose name ends in ``InterpretTest`` (the TPU-interpret variants of the tests)."""
    out, in_interpret_class = [], False
    for line in source.splitlines(keepends=True):
        match = _CLASS.match(line)
        if match:
            in_interpret_class = match.group(1).endswith("InterpretTest")
        if in_interpret_class:
            line = line.replace("interpret=True", "interpret=pltpu.InterpretParams()")
        out.append(line)
    return "".join(out)


def extract(jax_repo: Path | None, tag: str, dest: Path) -> None:
    """Write the three suites at ``tag`` into ``dest`` (never inside this repository)."""
    if jax_repo is None:
        jax_repo = dest / "jax-src"
        subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", tag, "--no-checkout",
                        JAX_URL, str(jax_repo)], check=True)
    for file, _, _ in SUITES.values():
        text = subprocess.run(
            ["git", "-C", str(jax_repo), "show", f"{tag}:tests/pallas/{file}"],
            check=True, capture_output=True, text=True).stdout
        if file == "tpu_pallas_test.py":
            text = rewrite_interpret_true(text)
        (dest / file).write_text(text)
    # tpu_pallas_test.py imports jax._src.pallas.pallas_test_util, which the wheel lacks;
    # the conftest registers this copy under that name.
    helper = subprocess.run(
        ["git", "-C", str(jax_repo), "show", f"{tag}:jax/_src/pallas/pallas_test_util.py"],
        capture_output=True, text=True)
    if helper.returncode == 0:
        (dest / "_pallas_test_util.py").write_text(helper.stdout)
    shutil.copy(HERE / "conftest_plugin.py", dest / "conftest.py")
    # An empty ini makes dest the rootdir: this repository's pytest.ini is not picked up.
    (dest / "pytest.ini").write_text("[pytest]\n")


def summarise(xml_path: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures: list[tuple[str, str]] = []
    for case in ET.parse(xml_path).iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            first = (bad.get("message") or "").strip().splitlines()
            failures.append((name, first[0][:300] if first else ""))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failures


def _pytest_cmd(file: str, select: str | None, timeout: int, xml: Path,
               extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", file, "-q", "-p", "no:cacheprovider", "--tb=short",
           "-rN", f"--timeout={timeout}", f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    if select:
        cmd += ["-k", select]
    return cmd + extra


def _suite_env(devices: int) -> dict[str, str]:
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if "xla_force_host_platform_device_count" not in f]
    return {**os.environ,
            "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])}


def _run_isolated(file: str, select: str | None, timeout: int, dest: Path, env: dict[str, str],
                  extra: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """One pytest process per test, killed after ``timeout`` + 60 s: a hang inside a host
    callback (a C++ wait that no Python signal interrupts) then costs one test, not the run."""
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", file, "-q", "--collect-only", "-p", "no:cacheprovider",
         *(["-k", select] if select else []), *extra],
        cwd=dest, env=env, capture_output=True, text=True).stdout
    ids = [line for line in listing.splitlines() if "::" in line]
    counts = {"passed": 0, "failed": 0, "skipped": 0, "hung": 0}
    failures: list[tuple[str, str]] = []
    for n, test_id in enumerate(ids):
        xml = dest / f"isolated-{n}.xml"
        cmd = _pytest_cmd(test_id, None, timeout, xml, [])
        proc = subprocess.Popen(cmd, cwd=dest, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if not xml.exists():
            counts["hung"] += 1
            failures.append((test_id.split("::", 1)[1], f"hung (killed after {timeout + 60} s)"))
            print(f"HUNG {test_id}", flush=True)
            continue
        one, bad = summarise(xml)
        for key, value in one.items():
            counts[key] += value
        failures += bad
        print(f"{'FAILED' if bad else 'ok'} {test_id}", flush=True)
    return counts, failures


def run_suite(name: str, dest: Path, timeout: int, extra: list[str], isolate: bool) -> int:
    file, select, devices = SUITES[name]
    env = _suite_env(devices)
    if isolate:
        counts, failures = _run_isolated(file, select, timeout, dest, env, extra)
        code = int(bool(failures))
    else:
        xml = dest / f"{name}.xml"
        cmd = _pytest_cmd(file, select, timeout, xml, extra)
        print("$", " ".join(cmd), flush=True)
        code = subprocess.run(cmd, cwd=dest, env=env).returncode
        if not xml.exists():
            return code
        counts, failures = summarise(xml)
    for test, message in failures:
        print(f"FAILED {test}: {message}")
    hung = f", {counts['hung']} hung" if "hung" in counts else ""
    print(f"== {name} ({file}): {counts['passed']} passed, {counts['failed']} failed{hung}, "
          f"{counts['skipped']} skipped", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jax-repo", type=Path, default=os.environ.get("JAX_REPO"),
                        help="a local jax git checkout or mirror holding the tag "
                             "(default: $JAX_REPO, else a shallow clone of the tag)")
    parser.add_argument("--tag", default=DEFAULT_TAG)
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    parser.add_argument("--timeout", type=int, default=120, help="per-test timeout (s)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="extract into this directory (outside the repository) and keep it")
    parser.add_argument("--isolate", choices=["auto", "yes", "no"], default="auto",
                        help="one process per test (auto: for the distributed suite, whose "
                             "hangs no pytest timeout interrupts)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    dest = args.keep or Path(tempfile.mkdtemp(prefix="palladium-upstream-"))
    dest = dest.resolve()
    if dest.is_relative_to(REPO_ROOT):
        parser.error(f"{dest} is inside the repository; jax's tests must stay outside it")
    dest.mkdir(parents=True, exist_ok=True)
    extract(args.jax_repo, args.tag, dest)
    print(f"extracted {args.tag} suites into {dest}", flush=True)
    names = list(SUITES) if args.suite == "all" else [args.suite]
    try:
        codes = [run_suite(name, dest, args.timeout, args.pytest_args,
                           args.isolate == "yes" or (args.isolate == "auto"
                                                     and name == "distributed"))
                 for name in names]
    finally:
        if args.keep is None:
            shutil.rmtree(dest, ignore_errors=True)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
