"""A plain install: the wheel holds every package and the shipped examples, and its
`evidence demo` runs from an empty directory with no source checkout in sight."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

from tests.helpers import build_wheel

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_list_is_every_package_in_the_tree() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = find_packages(str(ROOT), include=["ledger*", "projections*", "commands*"])
    assert sorted(config["packages"]) == sorted([*found, "commands.examples", "commands.docs"])
    assert config["package-dir"] == {"commands.examples": "examples", "commands.docs": "docs"}


@pytest.mark.slow  # builds a wheel and a virtualenv
def test_a_wheel_installed_in_a_fresh_venv_runs_the_demo(tmp_path: Path) -> None:
    venv, empty = tmp_path / "venv", tmp_path / "empty"
    empty.mkdir()
    wheel = build_wheel(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    # The dependencies come from this environment (no download); the package itself
    # only from the wheel: a .pth file is read in site-packages, not in what it adds,
    # so this environment's editable install of the checkout stays out of sight.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EVIDENCE_DB")}
    demo = subprocess.run(
        [str(venv / "bin" / "evidence"), "demo"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "plan green-after-fix: applied (outcome pass)" in demo.stdout
    where = subprocess.run(
        [str(python), "-c", "import commands; print(commands.__file__)"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(site), where  # the wheel's copy ran, not the checkout
    # The docs every --help names ship in the wheel: `evidence docs NAME`.
    page = subprocess.run(
        [str(venv / "bin" / "evidence"), "docs", "cli", "--path"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert page.returncode == 0, page.stderr
    assert page.stdout.startswith(site) and Path(page.stdout.strip()).is_file(), page.stdout
    assert list(empty.iterdir()) == []
    # The README's commands from the wheel in an empty directory: the examples copied out
    # first (there is no checkout), then the plan file run and the Python walk-through.
    readme = tmp_path / "readme"
    readme.mkdir()
    bin_ = venv / "bin"
    for argv in (
        [str(bin_ / "evidence"), "examples"],
        [str(bin_ / "evidence"), "run", "examples/green-after-fix/plan.yaml"],
        [str(python), "examples/quickstart.py"],
        [str(bin_ / "evidence"), "verify"],
    ):
        done = subprocess.run(
            argv, cwd=readme, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    assert (readme / "examples" / "green-after-fix" / "plan.yaml").is_file()
