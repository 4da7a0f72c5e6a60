"""`pdm data`: prepare the training and validation data for the VeRL backend.

    pdm data prepare --dapo PATH --aime24 PATH --aime25 PATH [--out DIR] [--decontaminate]
    pdm data prepare --paper-set DIR [--aime24 PATH --aime25 PATH] [--out DIR]

Each PATH is a ``.parquet``/``.jsonl``/``.json`` file or a folder of them, downloaded by the user
(e.g. ``BytedTsinghua-SIA/DAPO-Math-17k``, ``HuggingFaceH4/aime_2024``, ``yentinglin/aime_2025``);
each flag can be repeated (AIME 2025 often comes as two files, I and II). ``--paper-set DIR`` is a
local copy of the paper's filtered training set ``Jiawei415/DPAO_filter`` (its ``train/`` shards;
its ``test/aime24``, ``test/aime25`` files unless ``--aime24``/``--aime25`` are given). Writes
``dapo_math_train.parquet``, ``aime_val.parquet`` and ``manifest.json`` into ``--out`` (default:
``<state dir>/data``). What is filtered and why: ``pdmask.backends.verl.data``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdmask.cli._options import DATA, StateDir, out_dir

COMMAND = "data"

app = typer.Typer(
    help="Prepare DAPO-Math-17k / AIME24 / AIME25 for the VeRL backend.",
    rich_help_panel=DATA,
    add_completion=False,
)


@app.callback(invoke_without_command=True)
def _group(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:  # `pdm data` alone: what it can do
        typer.echo(ctx.get_help())
        raise typer.Exit()


def _paths(help_text: str):
    return typer.Option(metavar="PATH", help=f"{help_text}; repeatable.", show_default=False)


@app.command(
    "prepare",
    epilog="Accepted columns (case-insensitive): a problem column (problem, question, prompt, "
    "query; a chat-message list or a string) and an answer column (reward_model.ground_truth, "
    "ground_truth, answer, final_answer, label, gt; or the last \\boxed{} of solution).",
)
def prepare(
    dapo: Annotated[
        list[Path] | None, _paths("DAPO-Math-17k file or folder (training set)")
    ] = None,
    paper_set: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="A local copy of the paper's filtered training set, Jiawei415/DPAO_filter "
            "(instead of --dapo; its test/ AIME files serve unless --aime24/--aime25 are given).",
            show_default=False,
        ),
    ] = None,
    aime24: Annotated[
        list[Path] | None, _paths("AIME 2024 file or folder (validation, data_source=aime24)")
    ] = None,
    aime25: Annotated[
        list[Path] | None, _paths("AIME 2025 file or folder (validation, data_source=aime25)")
    ] = None,
    out: Annotated[Path | None, out_dir("<state dir>/data")] = None,
    decontaminate: Annotated[
        bool,
        typer.Option(
            "--decontaminate",
            help="Also drop training problems whose text equals an AIME problem given.",
        ),
    ] = False,
    state_dir: StateDir = None,
) -> None:
    """Convert downloaded DAPO-Math-17k and AIME files into VeRL RL parquet.

    Converts DAPO-Math-17k or the paper's filtered copy of it (training) and AIME24/AIME25
    (validation) files you downloaded into VeRL's RL parquet format, with one prompt template
    for all. Training rows are filtered: empty problems, non-integer answers and duplicate
    problems are dropped, and the count of each is printed, with how the training set differs
    from the paper's.
    """
    from pdmask.backends.verl.data import prepare as prepare_data

    result = prepare_data(
        dapo=dapo or [],
        aime24=aime24 or [],
        aime25=aime25 or [],
        out_dir=out,
        decontaminate=decontaminate,
        paper_set=paper_set,
    )
    for line in result.lines():
        print(line)
