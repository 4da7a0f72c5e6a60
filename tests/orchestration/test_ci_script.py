"""CI runs README's test command verbatim, then the numeric tests again on one thread, another
hash seed (the real-VeRL tests and the tests marked ``processes`` only in the first pass)."""

from __future__ import annotations

import re

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.processes


def test_ci_runs_the_readme_command_then_a_one_thread_pass():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("Set up and run the tests", 1)[1]
    command = re.search(r"```\n(.+?)\n```", section, re.S).group(1).strip()
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in lines  # verbatim, as its own line
    second = [ln for ln in lines[lines.index(command) + 1 :] if "python -m pytest -q" in ln]
    assert len(second) == 1, second
    assert "-m 'not processes and not verl_e2e'" in second[0], second[0]
    assert "--ignore" not in second[0], second[0]  # what it leaves out is marked, in the tests
    settings = dict(re.findall(r"(\w+)=(\S+)", second[0]))
    assert settings["OMP_NUM_THREADS"] == settings["PDM_TEST_TORCH_THREADS"] == "1"
    assert settings["PYTHONHASHSEED"] not in ("", "0", "random")
