"""What produced a run: the git commit (and whether the tree was dirty) and package versions.

The tree is dirty when a tracked file has changes, or when ``recipes/``, ``sweeps/`` or
``dashboards/`` hold files git does not track: a new recipe or sweep is exactly what a user adds
without committing, and it decides what trains. (Other untracked files -- scratch notes, outputs
-- do not count.) The recipe's own code is recorded per run anyway (``pdm.recipe_hash`` and the
``recipe/`` artifact).
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("pdmask", "torch", "ray", "mlflow", "verl", "vllm", "transformers")
REGISTRY_FOLDERS = ("recipes", "sweeps", "dashboards")  # untracked files here make the tree dirty


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=10
    ).stdout.strip()


def git_state(root: Path) -> tuple[str, bool]:
    """(commit sha or "unknown", dirty flag) of the project checkout."""
    try:
        sha = _git(root, "rev-parse", "HEAD")
        tracked = _git(root, "status", "--porcelain", "--untracked-files=no")
        untracked = _git(
            root, "ls-files", "--others", "--exclude-standard", "--", *REGISTRY_FOLDERS
        )
        return sha, bool(tracked or untracked)
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def provenance_tags(root: Path) -> dict[str, str]:
    sha, dirty = git_state(root)
    tags = {
        "pdm.git_sha": sha,
        "pdm.git_dirty": str(dirty).lower(),
        "mlflow.source.git.commit": sha,
    }
    tags.update({f"pdm.version.{k}": v for k, v in package_versions().items()})
    return tags
