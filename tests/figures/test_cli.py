"""`pdm figure` through the real CLI entry point."""

from __future__ import annotations

import pytest

from pdmask.cli import main

from .conftest import make_run


def _pdm(*argv) -> int:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    return info.value.code


def test_figure_command_writes_the_outputs(store, tmp_path, capsys):
    sweep, _ = store.new_sweep(
        [make_run(m, "4b-bf16", 0, range(3)) for m in ("pdm-agg", "dppo-topk-kl")]
    )
    out = tmp_path / "figs"
    code = _pdm(
        "figure", "figure-1", "--sweep", sweep, "--tracking-uri", store.uri, "--out", str(out)
    )
    printed = capsys.readouterr().out
    assert code == 0
    for name in (
        "figure-1.png",
        "figure-1.pdf",
        "figure-1.data.csv",
        "figure-1.manifest.json",
        "figure-1.summary.csv",
        "figure-1.summary.md",
        "figure-1-diagnostics.png",
    ):
        assert (out / name).is_file(), name
    assert "Paired difference" in printed and str(out / "figure-1.png") in printed


def test_default_output_goes_to_the_state_folder(store, state_home):
    sweep, _ = store.new_sweep([make_run("pdm-agg", "8b-bf16", 1, range(2))])
    argv = ["figure", "figure-1", "--sweep", sweep, "--tracking-uri", store.uri, "--quiet"]
    assert _pdm(*argv, "--no-diagnostics") == 0
    assert (state_home / "figures" / sweep / "figure-1" / "figure-1.png").is_file()


def test_bad_input_exits_2_with_a_reason(store, tmp_path, capsys):
    assert _pdm("figure", "figure-99", "--tracking-uri", store.uri) == 2
    assert "figure-1" in capsys.readouterr().err  # names the figures that exist
    assert _pdm("figure", "figure-1", "--sweep", "no-such-sweep", "--tracking-uri", store.uri) == 2
    assert "no-such-sweep" in capsys.readouterr().err
    missing = f"sqlite:///{tmp_path / 'absent.db'}"
    assert _pdm("figure", "figure-1", "--tracking-uri", missing) == 2
    assert "no MLflow store" in capsys.readouterr().err
    assert not (tmp_path / "absent.db").exists()  # a figure never creates a store


def test_list_shows_the_specs(capsys):
    assert _pdm("figure", "--list") == 0
    listing = capsys.readouterr().out
    assert "figure-1" in listing and "delta-ablation" in listing
