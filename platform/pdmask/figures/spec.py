"""Figure specs: the typed shape of a ``dashboards/<name>.yaml`` file and its loader.

A spec says which MLflow runs feed a figure (sweep, delta, panels selected by the ``pdm.model`` and
``pdm.precision`` tags, methods), what is plotted (the evaluation metric pattern, smoothing, the
band over seeds), the paired comparison for the summary table and the companion diagnostics
figure. Files are read as sweeps are (``registry.yaml_source``: safe YAML, no Python tags,
duplicate keys refused, every field's line kept) and validated with pydantic;
every problem is reported at once, each naming the file, the field and, where known, the line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pdmask.errors import ConfigError, Problem, ValidationFailed, known_names, validation_problems
from pdmask.paths import project_root
from pdmask.registry.yaml_source import load_yaml, parse_yaml
from pdmask.tracking.metric_names import HEADLINE_PATTERN

SPEC_SUFFIXES = (".yaml", ".yml")


class _Strict(BaseModel):
    """Base for spec models: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SmoothingSpec(_Strict):
    """Smoothing applied to each seed's curve *before* the seeds are averaged."""

    kind: Literal["none", "ema", "rolling"] = Field(
        "none",
        description="none: raw points; ema: debiased exponential moving average over points "
        "(TensorBoard's smoothing); rolling: trailing mean over `window` points.",
    )
    weight: float = Field(
        0.6,
        ge=0.0,
        lt=1.0,
        description="ema only: weight on the past, in [0, 1); 0 means no smoothing.",
    )
    window: int = Field(5, ge=1, description="rolling only: number of points in the trailing mean.")

    def describe(self) -> str:
        if self.kind == "ema" and self.weight > 0:
            return f"EMA smoothing (weight {self.weight:g}) per seed"
        if self.kind == "rolling" and self.window > 1:
            return f"trailing mean over {self.window} points per seed"
        return ""


class BandSpec(_Strict):
    """The shaded band around the seed mean."""

    kind: Literal["sd", "bootstrap", "none"] = Field(
        "sd",
        description="sd: mean ± 1 sample standard deviation over seeds (ddof=1); bootstrap: a "
        "percentile bootstrap confidence interval of the mean over seeds; none: no band.",
    )
    level: float = Field(
        0.95, gt=0.0, lt=1.0, description="bootstrap only: confidence level of the interval."
    )
    resamples: int = Field(
        2000, ge=100, le=20_000, description="bootstrap only: number of resamples of the seeds."
    )
    seed: int = Field(0, description="bootstrap only: random seed, so a rebuild is identical.")

    def describe(self, seeds: str = "seeds") -> str:
        """Legend text of the band, e.g. '±1 sd over 3 seeds'."""
        if self.kind == "sd":
            return f"±1 sd over {seeds}"
        if self.kind == "bootstrap":
            return f"{self.level:.0%} bootstrap CI of the mean, {seeds}"
        return "no band"


class MetricSpec(_Strict):
    """The plotted evaluation metric: the mean over every dataset whose metric name matches."""

    pattern: str = Field(
        HEADLINE_PATTERN,
        description="MLflow metric name with exactly one `*` standing for the dataset name (one "
        "path segment). The plotted value at a step is the mean over the matching datasets "
        "present at that step. `@` is accepted and matched as MLflow's sanitised `_at_`.",
    )
    label: str = Field("avg@16", description="Y-axis label (datasets are appended).")
    dataset_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Display names of datasets in the axis label, e.g. aime24: AIME24.",
    )
    description: str = Field(
        f"the mean over datasets matching `{HEADLINE_PATTERN}`",
        description="One sentence saying what the y value is; copied into the manifest.",
    )


PRECISION_FIELD = "{precision}"
BEYOND_PAPER_MARK = "(beyond the paper)"  # after a `beyond_paper` method's name, wherever shown


class PanelSpec(_Strict):
    """One panel = one training setting, selected by the model and precision tags of the runs."""

    key: str = Field(description="Short id of the setting (e.g. 4b-bf16); used in the CSV files.")
    title: str = Field(
        description=f"Panel title as printed on the figure; `{PRECISION_FIELD}` in it becomes "
        "what the precision setting is on the backend that trained the panel's runs (the "
        "catalog's label: fp8-e2e is BF16 training with an FP8 rollout and KV cache on VeRL)."
    )
    model: str = Field(description="Runs whose `pdm.model` tag equals this (e.g. qwen3-4b-base).")
    precision: str = Field(
        description="Runs whose `pdm.precision` tag equals this (bf16, fp8-e2e, fp8-rollout)."
    )
    tags: dict[str, str] = Field(
        default_factory=dict, description="Further exact tag matches this panel's runs must have."
    )


class DiagnosticMetricSpec(_Strict):
    """One row of the diagnostics figure."""

    name: str = Field(description="MLflow metric name, e.g. actor/pdm/masked_frac.")
    label: str = Field(description="Row label printed on the y axis.")
    yscale: Literal["linear", "log", "symlog"] = Field(
        "linear", description="Y scale of the row; log suits fractions spanning decades."
    )


class DiagnosticsSpec(_Strict):
    """The companion figure: training diagnostics per method (lines) and setting (columns)."""

    metrics: list[DiagnosticMetricSpec] = Field(
        min_length=1, description="Rows of the figure, top to bottom."
    )
    smoothing: SmoothingSpec = Field(
        default_factory=lambda: SmoothingSpec(kind="ema", weight=0.8),
        description="Per-seed smoothing of the (noisy, per-step) training diagnostics.",
    )
    band: BandSpec | None = Field(
        None, description="Band over seeds; when omitted the main figure's band is used."
    )
    dpi: int = Field(
        200,
        ge=72,
        le=600,
        description="Resolution of this figure's PNG (it is large; its PDF is the print version).",
    )


class ControlSpec(_Strict):
    """A control series of the diagnostics figure: runs of ``method`` carrying ``tags`` (e.g. the
    embedded backend's lr = 0 mismatch control, tagged ``pdm.sim.lr``), drawn as their own line.
    Control runs never enter the main figure, its summary or the method lines."""

    key: str = Field(description="Id of the series in the CSV files (not a method name).")
    label: str = Field(description="Legend text, e.g. 'lr = 0 control'.")
    method: str = Field(description="The `pdm.method` tag of the control runs.")
    tags: dict[str, str] = Field(
        min_length=1,
        description="Exact tag matches that make a run of `method` a control run, e.g. "
        "{pdm.sim.lr: '0.0'}.",
    )
    color: str = Field("#444444", description="Line colour.")
    linestyle: str = Field("dotted", description="Matplotlib line style.")


class PairedSpec(_Strict):
    """The summary table's paired comparison: each method minus the baseline, seed by seed."""

    baseline: str = Field(description="Recipe name of the reference method (dppo-topk-kl).")
    methods: list[str] = Field(
        min_length=1, description="Recipe names compared against the baseline."
    )
    level: float = Field(
        0.95, gt=0.0, lt=1.0, description="Confidence level of the t-intervals in the summary."
    )


class LayoutSpec(_Strict):
    """Physical size and typography; the defaults suit a full-width figure in a paper."""

    columns: int = Field(4, ge=1, le=8, description="Panels per row.")
    panel_width: float = Field(1.9, gt=0.5, le=8.0, description="Width of one panel, inches.")
    panel_height: float = Field(1.7, gt=0.5, le=8.0, description="Height of one panel, inches.")
    font_size: float = Field(8.0, ge=5.0, le=16.0, description="Base font size, points.")
    dpi: int = Field(300, ge=72, le=600, description="Resolution of the PNG.")


class FigureSpec(_Strict):
    """A declarative figure: which runs, which metric, how they are drawn and summarised."""

    name: str = Field(description="Figure name; must equal the file name without .yaml.")
    title: str = Field("", description="Optional title printed above the panels.")
    description: str = Field("", description="What the figure shows; copied into the manifest.")
    sweep: str = Field(description="Default sweep (= MLflow experiment name) read by this figure.")
    delta: float | None = Field(
        None,
        gt=0.0,
        description="Keep runs whose `pdm.delta` tag equals this (numerically). Runs without "
        "a numeric delta tag (methods that have no delta) are kept.",
    )
    backend: str | None = Field(
        None, description="Keep only runs whose `pdm.backend` tag equals this (sim or verl)."
    )
    tags: dict[str, str] = Field(
        default_factory=dict, description="Further exact tag matches required of every run."
    )
    methods: list[str] = Field(
        min_length=1,
        description="Recipe names drawn, in legend order (the `pdm.method` tag). For a figure "
        "of the paper, the paper's methods: this list is their home.",
    )
    beyond_paper: list[str] = Field(
        default_factory=list,
        description="Methods a sweep runs beyond the paper's figure (e.g. pdm-gram). They stay "
        "out of this figure, so it can be read against the paper's line for line, and are "
        "drawn with `methods` in a figure of their own, `<name>-extended`, their legend "
        "entries marked 'beyond the paper'; the diagnostics figure and the summary hold them "
        "too, marked the same way.",
    )
    linestyles: dict[str, str] = Field(
        default_factory=dict,
        description="Optional matplotlib line style per method, e.g. pdm-uni: dashed, to tell "
        "apart methods expected to overlap.",
    )
    panels: list[PanelSpec] = Field(min_length=1, description="Panels, left to right.")
    metric: MetricSpec = Field(default_factory=MetricSpec, description="The plotted metric.")
    x_label: str = Field("Training step", description="X-axis label.")
    smoothing: SmoothingSpec = Field(
        default_factory=SmoothingSpec, description="Per-seed smoothing before averaging."
    )
    band: BandSpec = Field(default_factory=BandSpec, description="Band around the seed mean.")
    paired: PairedSpec | None = Field(
        None, description="Paired comparison against a baseline in the summary table."
    )
    diagnostics: DiagnosticsSpec | None = Field(
        None, description="Companion diagnostics figure; omitted when absent."
    )
    controls: list[ControlSpec] = Field(
        default_factory=list,
        description="Control series drawn in the diagnostics figure after the methods (e.g. the "
        "lr = 0 mismatch control of each setting).",
    )
    layout: LayoutSpec = Field(default_factory=LayoutSpec, description="Size and typography.")

    @property
    def all_methods(self) -> list[str]:
        """Every method the figure's files draw: the paper's, then those beyond it."""
        return [*self.methods, *self.beyond_paper]


_LINESTYLES = {"solid", "dashed", "dashdot", "dotted", "-", "--", "-.", ":"}


def _cross_field_problems(spec: FigureSpec, file: str) -> list[Problem]:
    """Consistency checks that span fields; all are collected, not just the first."""
    problems: list[Problem] = []
    if spec.name != Path(file).stem:
        problems.append(Problem(file, "name", f"is {spec.name!r} but the file is {file!r}"))
    seen: set[str] = set()
    for i, panel in enumerate(spec.panels):
        if panel.key in seen:
            problems.append(Problem(file, f"panels.{i}.key", f"duplicate panel key {panel.key!r}"))
        seen.add(panel.key)
    if len(set(spec.methods)) != len(spec.methods):
        problems.append(Problem(file, "methods", "lists a method twice"))
    for j, method in enumerate(spec.beyond_paper):
        if method in spec.methods or method in spec.beyond_paper[:j]:
            problems.append(
                Problem(file, f"beyond_paper.{j}", f"{method!r} is listed twice (or in `methods`)")
            )
    for method, style in spec.linestyles.items():
        if method not in spec.all_methods:
            problems.append(
                Problem(file, f"linestyles.{method}", "is not one of `methods`, `beyond_paper`")
            )
        if style not in _LINESTYLES:
            problems.append(
                Problem(file, f"linestyles.{method}", f"{style!r} is not one of {_LINESTYLES}")
            )
    if spec.metric.pattern.count("*") != 1:
        problems.append(
            Problem(file, "metric.pattern", "must contain exactly one `*` (the dataset name)")
        )
    if spec.paired is not None:
        if spec.paired.baseline not in spec.methods:
            problems.append(Problem(file, "paired.baseline", "is not one of `methods`"))
        for j, method in enumerate(spec.paired.methods):
            if method not in spec.all_methods:
                problems.append(
                    Problem(
                        file, f"paired.methods.{j}", f"{method!r} not in methods or beyond_paper"
                    )
                )
            if method == spec.paired.baseline:
                problems.append(Problem(file, f"paired.methods.{j}", "is the baseline itself"))
    control_keys: set[str] = set()
    for i, control in enumerate(spec.controls):
        if control.key in spec.all_methods or control.key in control_keys:
            problems.append(
                Problem(
                    file, f"controls.{i}.key", "must differ from the methods and other controls"
                )
            )
        control_keys.add(control.key)
        if control.linestyle not in _LINESTYLES:
            problems.append(
                Problem(file, f"controls.{i}.linestyle", f"not one of {sorted(_LINESTYLES)}")
            )
    if spec.delta is not None and not math.isfinite(spec.delta):
        problems.append(Problem(file, "delta", "must be a finite number"))
    return problems


def parse_spec(text: str, file: str) -> FigureSpec:
    """Validate the YAML text of a spec; raise ``ValidationFailed`` listing every problem."""
    src, file_problems = parse_yaml(text, Path(file))
    if src is None:
        raise ValidationFailed(file_problems)
    data = src.data
    if not isinstance(data, dict):
        raise ValidationFailed([Problem(file, "(top level)", "must be a mapping of fields")])
    data.setdefault("name", Path(file).stem)
    try:
        spec = FigureSpec.model_validate(data)
    except ValidationError as err:
        problems = validation_problems(err, file, line_of=src.line)
        raise ValidationFailed([*file_problems, *problems]) from None
    problems = _cross_field_problems(spec, file)
    for k, p in enumerate(problems):
        loc = tuple(int(s) if s.isdigit() else s for s in re.split(r"\.", p.field))
        problems[k] = Problem(p.file, p.field, p.message, src.line(loc))
    if file_problems or problems:
        raise ValidationFailed([*file_problems, *problems])
    return spec


def dashboards_dir() -> Path:
    """The project's ``dashboards/`` folder."""
    return project_root() / "dashboards"


def available_specs(directory: Path | None = None) -> list[str]:
    """Names of the figure specs in ``dashboards/`` (sorted)."""
    directory = directory or dashboards_dir()
    if not directory.is_dir():
        return []
    return sorted({p.stem for p in directory.iterdir() if p.suffix in SPEC_SUFFIXES})


def spec_path(name_or_path: str | Path, directory: Path | None = None) -> Path:
    """Resolve a figure name (``figure-1``) or a path to a spec file."""
    candidate = Path(name_or_path)
    if candidate.suffix in SPEC_SUFFIXES and candidate.is_file():
        return candidate
    directory = directory or dashboards_dir()
    if candidate.name != str(name_or_path) or candidate.name in ("", ".", ".."):
        # a name is looked up in dashboards/ only; `../sweeps/smoke` would read another folder
        raise ConfigError(
            f"{str(name_or_path)!r} is neither a figure name of dashboards/ (no folders in a "
            f"name) nor a path to a spec file ending in {' or '.join(SPEC_SUFFIXES)}"
        )
    for suffix in SPEC_SUFFIXES:
        path = directory / f"{name_or_path}{suffix}"
        if path.is_file():
            return path
    known = known_names(name_or_path, available_specs(directory))
    raise ConfigError(f"no figure spec named {str(name_or_path)!r} in dashboards/; {known}")


def load_spec(name_or_path: str | Path, directory: Path | None = None) -> FigureSpec:
    """Load and validate a figure spec by name (from ``dashboards/``) or by path."""
    path = spec_path(name_or_path, directory)
    try:
        shown = str(path.resolve().relative_to(project_root()))
    except ValueError:
        shown = str(path)
    return parse_spec(path.read_text(encoding="utf-8"), shown)


def figures_for_sweep(sweep: str, directory: Path | None = None) -> list[str]:
    """Names of the specs whose default sweep is ``sweep`` (what a sweep runner draws at its end)."""
    return [n for n in available_specs(directory) if load_spec(n, directory).sweep == sweep]


def _selects(spec: FigureSpec, trial) -> bool:
    """Whether the figure would draw a run of ``trial`` (the tag filters of ``select_runs``)."""
    delta_ok = (
        spec.delta is None
        or trial.delta is None
        or math.isclose(trial.delta, spec.delta, rel_tol=1e-6, abs_tol=1e-9)
    )
    return (
        delta_ok
        and (spec.backend is None or spec.backend == trial.backend)
        and trial.method in spec.all_methods
        and any(p.model == trial.model and p.precision == trial.precision for p in spec.panels)
    )


def sweep_fit_problems(
    name: str,
    *,
    trials: list,
    recipes: set[str],
    eval_metrics: list[str],
    directory: Path | None = None,
) -> list[Problem]:
    """Why dashboard ``name`` cannot draw the runs of a sweep's ``trials``: the spec is
    malformed, names a method that is no recipe, has a metric pattern that matches none of the
    evaluation metrics the backend logs (``eval_metrics``, as MLflow stores them), or selects
    none of the trials. Checked before a sweep launches, so a figure never fails after hours
    of training for a reason visible up front."""
    from pdmask.tracking.metric_names import match_datasets

    try:
        spec = load_spec(name, directory)
    except ValidationFailed as err:
        return list(err.problems)
    path = spec_path(name, directory)
    src, _ = load_yaml(path)  # load_spec read it without problems

    def problem(field: str, message: str) -> Problem:
        loc = tuple(int(s) if s.isdigit() else s for s in field.split("."))
        return Problem(str(path), field, message, src.line(loc))

    problems = [
        problem(f"{where}.{i}", f"{m!r} is not a recipe; {known_names(m, recipes)}")
        for where, methods in (("methods", spec.methods), ("beyond_paper", spec.beyond_paper))
        for i, m in enumerate(methods)
        if m not in recipes
    ]
    if eval_metrics and not match_datasets(spec.metric.pattern, eval_metrics):
        problems.append(
            problem(
                "metric.pattern",
                f"{spec.metric.pattern!r} matches none of the evaluation metrics the backend "
                f"logs ({', '.join(eval_metrics)}): the figure would have no data",
            )
        )
    if trials and not any(_selects(spec, t) for t in trials):
        problems.append(
            problem(
                "panels",
                f"selects none of the sweep's {len(trials)} trials (its methods, panels' model "
                "and precision, delta and backend filter them all out)",
            )
        )
    return problems
