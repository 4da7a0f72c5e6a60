"""What produced a run: the git commit (and whether the tree was dirty) and package versions."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("pdmask", "torch", "ray", "mlflow", "verl", "vllm", "transformers")


def git_state(root: Path) -> tuple[str, bool]:
    """(commit sha or "unknown", dirty flag) of the project checkout."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout.strip()
        )
        return sha, dirty
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
