"""`pdm data`: prepare the training and validation data for the VeRL backend.

    pdm data prepare --dapo PATH --aime24 PATH --aime25 PATH [--out DIR] [--decontaminate]

Each PATH is a ``.parquet``/``.jsonl``/``.json`` file or a folder of them, downloaded by the user
(e.g. ``BytedTsinghua-SIA/DAPO-Math-17k``, ``HuggingFaceH4/aime_2024``, ``yentinglin/aime_2025``);
each flag can be repeated (AIME 2025 often comes as two files, I and II). Writes
``dapo_math_train.parquet``, ``aime_val.parquet`` and ``manifest.json`` into ``--out`` (default:
``<state dir>/data``). What is filtered and why: ``pdmask.backends.verl.data``.
"""

from __future__ import annotations

import argparse

COMMAND = "data"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        COMMAND,
        help="prepare DAPO-Math-17k / AIME24 / AIME25 for the VeRL backend",
        description="Prepare training and validation data for the VeRL backend.",
    )
    parser.set_defaults(func=lambda _args: parser.print_help() or 0)
    sub = parser.add_subparsers(title="data commands", metavar="ACTION")
    prep = sub.add_parser(
        "prepare",
        help="convert downloaded DAPO-Math-17k and AIME files into VeRL RL parquet",
        description=(
            "Convert DAPO-Math-17k (training) and AIME24/AIME25 (validation) files you downloaded "
            "into VeRL's RL parquet format, with one prompt template for all. Training rows are "
            "filtered: empty problems, non-integer answers and duplicate problems are dropped, and "
            "the count of each is printed."
        ),
        epilog=(
            "Accepted columns (case-insensitive): a problem column (problem, question, prompt, query; "
            "a chat-message list or a string) and an answer column (reward_model.ground_truth, "
            "ground_truth, answer, final_answer, label, gt; or the last \\boxed{} of solution)."
        ),
    )
    prep.add_argument(
        "--dapo",
        action="append",
        default=[],
        metavar="PATH",
        help="DAPO-Math-17k file or folder (training set); repeatable",
    )
    prep.add_argument(
        "--aime24",
        action="append",
        default=[],
        metavar="PATH",
        help="AIME 2024 file or folder (validation, data_source=aime24); repeatable",
    )
    prep.add_argument(
        "--aime25",
        action="append",
        default=[],
        metavar="PATH",
        help="AIME 2025 file or folder (validation, data_source=aime25); repeatable",
    )
    prep.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="output folder (default: <state dir>/data, i.e. $PDM_HOME/data or <project>/.pdm/data)",
    )
    prep.add_argument(
        "--decontaminate",
        action="store_true",
        help="also drop training problems whose text equals an AIME problem given here",
    )
    prep.set_defaults(func=_prepare)
    return parser


def _prepare(args: argparse.Namespace) -> int:
    from pdmask.backends.verl.data import prepare

    result = prepare(
        dapo=args.dapo,
        aime24=args.aime24,
        aime25=args.aime25,
        out_dir=args.out,
        decontaminate=args.decontaminate,
    )
    for line in result.lines():
        print(line)
    return 0
