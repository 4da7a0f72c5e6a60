"""The comparison preset `pdm ui` links: one view per setting of a sweep, as a Figure-1 panel.

A setting is a model x precision x delta of the sweep (a method without a delta, GRPO, belongs
to every delta of its model x precision, as in the figures). Its view, in MLflow's experiment
page, shows only that setting's runs, grouped by the method as tables show it
(``pdm.method_label``: an lr = 0 control says so). The link opens its chart view: the headline
metric's chart first, as wide as the page, each group drawn as its mean with its min-max band
and named whole in the legend. Its table view (one click) has the headline first, then the
method label in a column wide enough for the longest label, so a control never reads as a plain
run of its method. (MLflow shows a table's values as logged: no state rounds them.)

Why MLflow's *shared view state*: the experiment page reads only its search facets (filter,
order) and its chart/table mode from the URL; grouping, columns, widths and charts live in its
UI state, which it keeps in the browser's local storage (per browser, overwritten by the user's
first change) or loads from an experiment tag ``mlflow.sharedViewState.<key>`` named by the
URL's ``viewStateShareKey``: the state its own "Share" button saves (MLflow 3.17: the facets
``searchFilter``/``orderByKey``/``orderByAsc`` and the UI state's ``selectedColumns``,
``columnOrder``, ``columnWidths``, ``groupBy``, ``compareRunCharts``, ``compareRunSections``...).
That is a feature MLflow keeps for links people have shared, held in the store next to the runs
and opened by any browser, so it is what a pdm link uses; the key is the state's content hash,
so opening `pdm ui` again reuses the tag instead of adding one. ``tests/cli/test_ui.py`` opens
the link in a real browser and fails if a release stops reading it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from urllib.parse import quote

from pdmask.tracking.metric_names import is_core_accuracy

SHARED_STATE_TAG = "mlflow.sharedViewState."  # + the key (MLflow's own prefix)
SHARE_KEY_PARAM = "viewStateShareKey"
GROUP_TAG = "pdm.method_label"
# A sweep's runs table's columns after the headline metric, in order. The method as tables show it
# (Trial.method_label): a control or a varied parameter says so.
RUN_COLUMNS = ("pdm.method_label", "pdm.model", "pdm.precision", "pdm.delta", "pdm.seed")
RUN_NAME_COLUMN = "attributes.`Run Name`"
CHAR_PX = 8  # about one character of the table's font, in pixels
MIN_LABEL_PX = 160
HEADLINE_PX = 260
HEADLINE_CHART_PX = 520


def column(kind: str, key: str) -> str:
    """The runs table's column id of a metric, tag or param (MLflow's makeCanonicalSortKey)."""
    return f"{kind}.`{key}`"


@dataclass(frozen=True)
class Setting:
    """A panel of the figure: the runs of one model x precision (``pdm.setting``) and delta."""

    setting: str  # pdm.setting, e.g. ``4b-bf16``
    delta: str  # pdm.delta as tagged, "" for a sweep without one
    other_deltas: tuple[str, ...]  # the deltas of the same model x precision left out

    @property
    def name(self) -> str:
        return f"{self.setting} delta {float(self.delta):g}" if self.delta else self.setting

    def search_filter(self) -> str:
        """MLflow's search filter for the setting's runs. Its search has no OR nor IN for tags:
        a delta-less method (tag "") stays in every delta's panel by leaving out the other
        deltas rather than naming this one."""
        terms = [f"tags.`pdm.setting` = '{self.setting}'"]
        terms += [f"tags.`pdm.delta` != '{d}'" for d in self.other_deltas]
        return " AND ".join(terms)


def settings_of(runs) -> list[Setting]:
    """The settings among a sweep's runs (their ``pdm.setting`` and ``pdm.delta`` tags)."""
    deltas: dict[str, set[str]] = {}
    for run in runs:
        tags = run.data.tags
        if "pdm.setting" in tags:
            deltas.setdefault(tags["pdm.setting"], set()).add(tags.get("pdm.delta", ""))
    out = []
    for setting, found in sorted(deltas.items()):
        real = sorted(d for d in found if d) or [""]  # a delta-less method joins each delta
        out += [Setting(setting, d, tuple(o for o in real if o != d)) for d in real]
    return out


def headline_metrics(runs) -> list[str]:
    """The headline metrics the runs logged, one per dataset, sorted (``mean_at_16``, or the
    tiny VeRL profile's ``mean_at_2``)."""
    return sorted({m for run in runs for m in run.data.metrics if is_core_accuracy(m)})


def _label_px(runs) -> int:
    labels = [run.data.tags.get(GROUP_TAG, "") for run in runs]
    # the group's row reads "Group: <label>" beside its expander, colour chip and run count
    return max(MIN_LABEL_PX, CHAR_PX * (max(map(len, labels), default=0) + 16))


def view_state(setting: Setting, runs, headlines: list[str]) -> dict:
    """The shared view state of ``setting``: its runs only, grouped by method label, the
    headline metric first (column, order and chart, each group's mean with its min-max band)."""
    columns = [column("metrics", m) for m in headlines]
    columns += [column("tags", key) for key in RUN_COLUMNS]
    label_px = _label_px(runs)
    widths = {RUN_NAME_COLUMN: label_px, column("tags", GROUP_TAG): label_px}
    # a metric's header is its whole name; a group's cell adds "(average)" to the value
    widths.update({c: HEADLINE_PX for c in columns[: len(headlines)]})
    sections = [m.rsplit("/", 1)[0] for m in headlines]
    sections = list(dict.fromkeys(sections))
    section_ids = {name: f"pdm-section-{i}" for i, name in enumerate(sections)}
    charts = [
        {
            "uuid": f"pdm-chart-{i}",
            "type": "LINE",
            "metricKey": metric,
            "selectedMetricKeys": [metric],
            "metricSectionId": section_ids[metric.rsplit("/", 1)[0]],
            "isGenerated": True,
            "deleted": False,
            "runsCountToCompare": 100,
            "lineSmoothness": 0,
            "xAxisKey": "step",
            "xAxisScaleType": "linear",
            "scaleType": "linear",
            "selectedXAxisMetricKey": "",
            "yAxisKey": "metric",
            "yAxisExpressions": [],
            "ignoreOutliers": False,
            "useGlobalXaxisKey": True,
            "useGlobalLineSmoothing": True,
            "range": {},
        }
        for i, metric in enumerate(headlines)
    ]
    state = {
        "searchFilter": setting.search_filter(),
        "orderByKey": columns[0] if headlines else "attributes.start_time",
        "orderByAsc": False,
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, *columns],
        "columnWidths": widths,
        "groupBy": {
            "aggregateFunction": "average",
            "groupByKeys": [{"mode": "tag", "groupByData": GROUP_TAG}],
        },
        "groupsExpanded": {},
        "useGroupedValuesInCharts": True,  # a group's chart: its mean and min-max band
        "runsHiddenMode": "SHOW_ALL",  # MLflow charts only the first 10 runs by default
        # The runs list beside the charts is 295 px wide, a width no state sets: it would cut a
        # group's name before "(lr = 0 mismatch control)". The chart's legend, as wide as the
        # page, shows each label whole; the list is one click away (and always in the table).
        "runListHidden": True,
        "hideEmptyCharts": True,
        "isAccordionReordered": True,  # the headline's section stays first
        "compareRunCharts": charts,
        "compareRunSections": [
            {
                "uuid": section_ids[name],
                "name": name,
                "display": True,
                "isReordered": False,
                "deleted": False,
                "isGenerated": True,
                # the panel: one chart a row, tall enough for a legend line per method
                "columns": 1,
                "cardHeight": HEADLINE_CHART_PX,
            }
            for name in sections
        ],
    }
    return state


def share_key(state: dict) -> str:
    """The state's content hash: the same view always has the same key (and tag)."""
    text = json.dumps(state, sort_keys=True)
    return "pdm-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def publish(client, experiment_id: str, state: dict) -> str:
    """Store ``state`` as the experiment's shared view state; returns its key."""
    key = share_key(state)
    client.set_experiment_tag(experiment_id, SHARED_STATE_TAG + key, json.dumps(state))
    return key


def comparison_url(ui_url: str, experiment_id: str, key: str, charts: bool = True) -> str:
    """The link that opens the shared view ``key`` (its chart view unless ``charts`` is off)."""
    mode = "&compareRunsMode=CHART" if charts else ""
    return (
        f"{ui_url}/#/experiments/{experiment_id}/runs?{SHARE_KEY_PARAM}={quote(key)}"
        f"&workflowType=machine_learning{mode}"
    )


def comparison_links(client, ui_url: str, experiment_id: str) -> list[tuple[str, str]]:
    """``(setting name, link)`` for each setting of the experiment's runs, its view published."""
    from pdmask.tracking.runs import with_retry

    runs = with_retry(lambda: client.search_runs([experiment_id], max_results=5000))
    headlines = headline_metrics(runs)
    links = []
    for setting in settings_of(runs):
        mine = [r for r in runs if r.data.tags.get("pdm.setting") == setting.setting]
        state = view_state(setting, mine, headlines)
        key = with_retry(lambda state=state: publish(client, experiment_id, state))
        links.append((setting.name, comparison_url(ui_url, experiment_id, key)))
    return links
