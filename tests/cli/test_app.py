"""The typer app: every command is there, options show their env vars and the registry's choices,
errors map to exit codes, names complete in the shell."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pdmask import __version__
from pdmask.cli import command_apps
from pdmask.registry import BACKENDS, CLUSTERS, load_registry
from pdmask.registry.sweeps import SIM_PROFILES

from .conftest import ROOT, pdm

pytestmark = pytest.mark.processes

COMMANDS = {
    "recipes", "sweeps", "sweep", "validate", "ui", "figure", "analyze", "data", "schema",
    "runs", "logs", "clean", "cluster",
}  # fmt: skip
WIDE = {"COLUMNS": "200"}  # rich wraps help at the terminal's width


def test_every_command_is_listed_and_builds():
    assert set(command_apps()) == COMMANDS
    listing = pdm("--help", env=WIDE)
    assert listing.exit_code == 0
    for name in COMMANDS:
        assert f" {name} " in listing.stdout, name
    for panel in ("Run", "Registry", "Results", "Data"):
        assert f" {panel} " in listing.stdout, panel
    for argv in (
        ["recipes", "list"],
        ["sweeps", "list"],
        ["sweep"],
        ["validate"],
        ["ui"],
        ["figure"],
        ["analyze", "tokens"],
        ["data", "prepare"],
        ["schema"],
        ["runs"],
        ["logs"],
        ["clean"],
        ["cluster", "check"],
    ):
        helped = pdm(*argv, "--help", env=WIDE)
        assert helped.exit_code == 0, (argv, helped.output)
        assert "Usage: pdm " + " ".join(argv) in helped.stdout, argv


def test_version_and_bare_pdm():
    assert pdm("--version").stdout.strip() == f"pdmask {__version__}"
    bare = pdm(env=WIDE)  # `pdm` alone: the command list
    assert bare.exit_code == 0 and " sweep " in bare.stdout and " validate " in bare.stdout


def test_shared_options_show_their_environment_variables():
    for argv, expected in (
        (["sweep"], {"MLFLOW_TRACKING_URI", "PDM_HOME", "RAY_ADDRESS", "PDM_RAY_TOKEN_FILE"}),
        (["cluster", "check"], {"MLFLOW_TRACKING_URI", "RAY_ADDRESS", "PDM_RAY_TOKEN_FILE"}),
        (["ui"], {"MLFLOW_TRACKING_URI", "PDM_HOME"}),
        (["figure"], {"MLFLOW_TRACKING_URI", "PDM_HOME"}),
        (["analyze", "tokens"], {"MLFLOW_TRACKING_URI", "PDM_HOME"}),
        (["data", "prepare"], {"PDM_HOME"}),
    ):
        text = pdm(*argv, "--help", env=WIDE).stdout
        for var in expected:
            assert f"[env var: {var}]" in text, (argv, var)


def test_choices_are_the_registrys():
    text = pdm("sweep", "--help", env=WIDE).stdout
    assert f"<{'|'.join(sorted(BACKENDS))}>" in text
    assert f"<{'|'.join(SIM_PROFILES)}>" in text
    assert f"<{'|'.join(sorted(CLUSTERS))}>" in text
    assert f"<{'|'.join(SIM_PROFILES)}>" in pdm("analyze", "tokens", "--help", env=WIDE).stdout


def test_analysis_flags_show_the_configs_defaults():
    from pdmask.analysis.config import TokenAnalysisConfig

    text = pdm("analyze", "tokens", "--help", env=WIDE).stdout
    fields = TokenAnalysisConfig.model_fields
    for name in ("seeds", "train_steps", "prompts", "minibatches", "isolated_tokens"):
        assert f"[default: ({fields[name].default})]" in text, name
    assert fields["split"].description.split(":")[0] in text


def test_bad_input_exits_2_before_anything_runs(project):
    bad_choice = pdm("sweep", "smoke", "--backend", "tpu", "--dry-run", env=WIDE)
    assert bad_choice.exit_code == 2 and "'tpu' is not one of 'sim', 'verl'" in bad_choice.stderr
    unknown = pdm("sweep", "no-such-sweep", "--dry-run")
    assert unknown.exit_code == 2
    assert "no sweep 'no-such-sweep'" in unknown.stderr and "main-figure" in unknown.stderr
    assert pdm("sweep", "smoke", "--max-concurrent", "0").exit_code == 2
    store = pdm("ui", "--tracking-uri", "file:///nowhere")
    assert store.exit_code == 2 and "refuses the plain file store" in store.stderr
    recipe = pdm("recipes", "list", "pdm-nope")
    assert recipe.exit_code == 2 and "no recipe pdm-nope" in recipe.stderr
    assert not (project / ".pdm" / "mlflow.db").exists()


def test_a_missing_project_folder_is_named(project):
    gone = project / "no-such-project"
    for argv in (["sweeps", "list"], ["validate"], ["sweep", "smoke", "--dry-run"]):
        result = pdm(*argv, env={"PDM_PROJECT": str(gone)})
        assert result.exit_code == 2, (argv, result.output)
        assert f"PDM_PROJECT={gone}: {gone} does not exist" in result.stderr, argv
        assert "Traceback" not in result.output


def test_ctrl_c_exits_130(project, monkeypatch):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("pdmask.registry.load_registry", interrupted)
    result = pdm("validate")
    assert result.exit_code == 130 and "interrupted" in result.stderr


def test_environment_variables_and_flags_choose_the_store(project, tmp_path):
    missing = tmp_path / "elsewhere.db"
    by_env = pdm("figure", "figure-1", env={"MLFLOW_TRACKING_URI": f"sqlite:///{missing}"})
    assert by_env.exit_code == 2 and str(missing) in by_env.stderr
    flag = tmp_path / "flag.db"
    by_flag = pdm(
        "figure",
        "figure-1",
        "--tracking-uri",
        f"sqlite:///{flag}",
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{missing}"},
    )
    assert by_flag.exit_code == 2 and str(flag) in by_flag.stderr  # the flag wins


def test_state_dir_flag_is_where_pdmask_writes(project, tmp_path):
    fixtures = ROOT / "tests" / "fixtures" / "data"
    state = tmp_path / "state"
    done = pdm(
        "data",
        "prepare",
        "--dapo",
        str(fixtures / "dapo_mini.parquet"),
        "--aime24",
        str(fixtures / "aime24_verl_mini.parquet"),
        "--state-dir",
        str(state),
    )
    assert done.exit_code == 0, done.output
    assert (state / "data" / "dapo_math_train.parquet").is_file()
    assert not (project / ".pdm" / "data").exists()


def _complete(words: str) -> list[str]:
    """What bash completion offers for the last word of ``words`` (the real mechanism)."""
    env = {
        **os.environ,
        "_PDM_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pdmask"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_names_complete_from_the_registry():
    reg = load_registry(ROOT)
    assert _complete("pdm sweep sm") == [n for n in sorted(reg.sweeps) if n.startswith("sm")]
    assert set(_complete("pdm validate ")) == set(reg.sweeps)
    assert _complete("pdm recipes list pdm-") == sorted(
        n for n in reg.recipes if n.startswith("pdm-")
    )
    assert _complete("pdm figure fig") == sorted(n for n in reg.dashboards if n.startswith("fig"))
    assert _complete("pdm sweep smoke --backend ") == sorted(BACKENDS)
    assert "sweep" in _complete("pdm sw") and "sweeps" in _complete("pdm sw")


@pytest.mark.parametrize("argv", [["--help"], ["recipes", "list"]])
def test_quick_commands_import_neither_torch_nor_mlflow(argv):
    code = (
        "import sys\n"
        "from pdmask.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "heavy = sorted(m for m in ('torch', 'mlflow', 'ray', 'matplotlib') if m in sys.modules)\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HEAVY []" in done.stderr, done.stderr[-2000:]


def test_pdm_help_builds_no_command():
    """`pdm --help` lists the commands without building them: no registry import."""
    code = (
        "import sys\n"
        "from pdmask.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('REGISTRY', 'pdmask.registry' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "REGISTRY False" in done.stderr, done.stderr[-2000:]
