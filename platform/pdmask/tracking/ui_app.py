"""The MLflow server app `pdm ui` runs: MLflow's own, with its UI kept on training runs.

MLflow 3's UI picks its view per page: the URL's ``workflowType`` when present, else the value it
keeps in the browser's local storage (``mlflow.workflowType_v1``), else its GenAI view. Its own
links (a run, Compare) drop the URL parameter, so a click on a run of a sweep opened from `pdm ui`'s
deep link lands in "Evaluations", and no server option sets the default. The page MLflow serves for
every UI route (``index.html``) is therefore given a script, before MLflow's bundles, that

- stores the training view as the browser's choice (every page load: a pdm store holds training
  runs only; the UI's own switch still works until the next load);
- gives each pdm sweep's runs table its columns (the method's label, model, precision, delta,
  seed and the headline metric; MLflow's own columns show each run's status and duration) the first time the browser opens that experiment; later choices are the
  user's, kept by MLflow as before (and keeps MLflow's LLM assistant from opening itself on a
  first visit: no model serves it here);
- puts the headline metric's chart section first on a run page's "Model metrics" tab. MLflow sorts
  the sections by name (``actor/...`` before ``val-core/...``) unless the page's saved chart state
  says the user reordered them; a run page that has no saved state yet reads one that holds only
  the headline sections, reordered, and MLflow files every other chart after them as usual (its
  ``updateChartAndSectionConfigs``). The run's id is in the storage key, so the browser's
  ``localStorage.getItem`` answers for the keys it has never stored instead of the script writing
  one entry per run.

Nothing else of MLflow's server changes: the app is MLflow's FastAPI app under one ASGI
middleware, started by ``mlflow server --app-name pdm-training`` (the ``mlflow.app`` entry point
in ``pyproject.toml``), so MLflow's options, security checks and workers are its own. The storage
keys are MLflow 3.17's UI's (``server/js``: ``useLocalStorage`` writes ``<key>_v<version>``, the
experiment page's state lives under ``MLflowLocalStorage-1.1-ExperimentPage-<ids>-
ReactComponentState``); the browser test in ``tests/cli/test_ui.py`` fails if a release moves them.
"""

from __future__ import annotations

import json
import os

from pdmask.tracking.comparison_view import RUN_COLUMNS, column
from pdmask.tracking.metric_names import is_headline
from pdmask.tracking.store import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND

WORKFLOW_KEY = "mlflow.workflowType_v1"
TRAINING_WORKFLOW = "machine_learning"
# MLflow's LLM assistant opens itself on a browser's first visit; nothing here serves it.
ASSISTANT_OPENED_KEY = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
PAGE_STATE_KEY = "MLflowLocalStorage-1.1-ExperimentPage-{}-ReactComponentState"
# A run page's "Model metrics" charts: MLflowLocalStorage-1.1-RunPage-<run id>-model-chartUIState.
RUN_CHARTS_KEY = r"^MLflowLocalStorage-1\.1-RunPage-[0-9a-f]+-model-chartUIState$"
_NO_CONDITIONAL = {b"if-none-match", b"if-modified-since"}  # the page is rewritten: never a 304


def training_columns(client) -> dict[str, list[str]]:
    """Each pdm experiment's default runs-table columns, by experiment id."""
    experiments = client.search_experiments(
        filter_string=f"tags.`{EXPERIMENT_KIND_TAG}` = '{MODEL_TRAINING_KIND}'"
    )
    out = {}
    for exp in experiments:
        columns = [column("tags", key) for key in RUN_COLUMNS]
        runs = client.search_runs([exp.experiment_id], max_results=1, order_by=["start_time DESC"])
        for run in runs:
            columns += [column("metrics", m) for m in sorted(run.data.metrics) if is_headline(m)]
        out[exp.experiment_id] = columns
    return out


def headline_sections(columns: dict[str, list[str]]) -> list[str]:
    """The chart sections (a metric's name up to its last ``/``) of the headline metrics among
    the experiments' columns, in order: the sections a run page shows first."""
    metrics = [c for cs in columns.values() for c in cs if c.startswith("metrics.")]
    names = [m.removeprefix("metrics.`").removesuffix("`") for m in metrics]
    return list(dict.fromkeys(n.rsplit("/", 1)[0] for n in names if "/" in n))


def run_charts_state(sections: list[str]) -> dict:
    """A run page's saved chart state holding only ``sections``, marked as the user's order."""
    return {
        "isAccordionReordered": True,
        "compareRunCharts": [],
        "compareRunSections": [
            {
                "uuid": f"pdm-section-{i}",
                "name": name,
                "display": True,
                "isReordered": False,
                "deleted": False,
                "isGenerated": True,
            }
            for i, name in enumerate(sections)
        ],
        "autoRefreshEnabled": True,
        "globalLineChartConfig": {
            "xAxisKey": "step",
            "lineSmoothness": 0,
            "selectedXAxisMetricKey": "",
        },
    }


def page_script(columns: dict[str, list[str]]) -> bytes:
    """The script put first into the UI's page (see the module docstring)."""
    defaults: dict = {
        PAGE_STATE_KEY.format(json.dumps([i])): {"selectedColumns": c} for i, c in columns.items()
    }
    defaults[ASSISTANT_OPENED_KEY] = True
    body = (
        "(function(){try{var s=window.localStorage;"
        f"s.setItem({json.dumps(WORKFLOW_KEY)},{json.dumps(json.dumps(TRAINING_WORKFLOW))});"
        f"var d={json.dumps(defaults)};"
        "for(var k in d){if(s.getItem(k)===null){s.setItem(k,JSON.stringify(d[k]));}}"
    )
    sections = headline_sections(columns)
    if sections:
        body += (
            f"var r=new RegExp({json.dumps(RUN_CHARTS_KEY)}),"
            f"c={json.dumps(json.dumps(run_charts_state(sections)))},"
            "g=Storage.prototype.getItem;"
            "Storage.prototype.getItem=function(k){var v=g.call(this,k);"
            "return v===null&&r.test(k)?c:v;};"
        )
    body += "}catch(e){}})();"
    return f"<script>{body}</script>".encode()


def _store_client():
    from mlflow.server.constants import BACKEND_STORE_URI_ENV_VAR
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=os.environ[BACKEND_STORE_URI_ENV_VAR])


class TrainingView:
    """ASGI middleware: injects :func:`page_script` into the HTML page MLflow serves at ``/``."""

    def __init__(self, app, columns=None):
        self.app = app
        self.columns = columns or (lambda: training_columns(_store_client()))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _NO_CONDITIONAL]
        scope = {**scope, "headers": headers}
        start, chunks = {}, []

        async def buffered(message):
            if message["type"] == "http.response.start":
                start.update(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            await self._send_page(send, start, b"".join(chunks))

        await self.app(scope, receive, buffered)

    async def _send_page(self, send, start, body: bytes) -> None:
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in _DROPPED]
        kind = dict((k.lower(), v) for k, v in headers).get(b"content-type", b"")
        if start.get("status") == 200 and kind.startswith(b"text/html"):
            try:
                script = page_script(self.columns())
            except Exception:  # a store it cannot read: MLflow's page shows the error itself
                script = page_script({})
            head = body.find(b"<head>")
            at = head + len(b"<head>") if head >= 0 else 0
            body = body[:at] + script + body[at:]
            headers.append((b"cache-control", b"no-store"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


_DROPPED = {b"content-length", b"etag", b"last-modified", b"cache-control"}


def create_app():
    """The ``mlflow.app`` factory: MLflow's server app, its UI kept on training runs."""
    from mlflow.server.fastapi_app import app

    return TrainingView(app)
