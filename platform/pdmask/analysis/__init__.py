"""Analyses of trust-region masks beyond training curves.

``pdm analyze tokens`` — the token-level mechanism table of the paper, on the embedded backend.
Per seed (one training run of the ``token-analysis`` sweep's setting, trained in process):

1. train ``train_steps`` RL steps; roll out one batch; train all its minibatches but the last
   (``state.py``): ``pi`` now lags ``mu`` as for a late minibatch of a training step;
2. on the last minibatch, per response token: ``D_t`` (top-K KL), ``r_t``, ``Ddot`` by the agg, uni
   and bucket estimators and exactly over the full vocabulary (``quantities.py``); out of region =
   ``D_t > delta`` and ``A_t != 0``; on the out-of-region tokens also the kernel-aware tests: the
   output-embedding Gram term, ``|h|^2 Ddot_agg + c gram`` and the exact own-gradient prediction
   through the whole network (``own_gradient.py``);
3. one real optimizer step per direction test (ratio, agg, uni, bucket, exact, the kernel-aware
   ones, and keep-all), each
   from the identical saved parameters and optimizer state, with AdamW as training left it and/or
   a plain SGD step (``steps.py``); re-measure every token's ``D_t``;
4. count unsafe keeps (kept out-of-region tokens whose ``D_t`` grew) and shrinking updates
   (``outcomes.py``), and check the derivative token by token with isolated single-token steps
   (``isolated.py``).

``runner.py`` runs seeds on a process pool with a per-seed cache (Ctrl-C and rerun resumes),
``summary.py`` pools them, ``report.py`` / ``tables.py`` / ``plot.py`` write the table next to the
paper's (``paper.py``), ``tracking.py`` logs the MLflow run.

Typical use::

    from pdmask.analysis import TokenAnalysisConfig, run_token_analysis
    result = run_token_analysis(TokenAnalysisConfig(seeds=4), jobs=2)
    print(result.paths["report"].read_text())
"""

from pdmask.analysis.config import TokenAnalysisConfig
from pdmask.analysis.runner import AnalysisResult, run_token_analysis

__all__ = ["AnalysisResult", "TokenAnalysisConfig", "run_token_analysis"]
