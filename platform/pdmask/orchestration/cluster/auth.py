"""Ray's token authentication from the submitting side: which token, and whether a job API needs it.

An open Ray job API is remote code execution for anyone who reaches its port, so a cluster
address whose job API answers without authentication is refused (exit 2) unless the user says
``--insecure``. A loopback head that pdm started itself (``local_head``) is never checked here:
it is not given as an address.

The token is found where Ray's own client looks, plus one pdm setting, in this order:
``RAY_AUTH_TOKEN``; the file ``--ray-token-file`` / ``PDM_RAY_TOKEN_FILE``; the file
``RAY_AUTH_TOKEN_PATH``; ``~/.ray/auth_token`` (what ``ray start`` writes on the head). It is sent
only to a job API that asks for it (an unauthenticated request answered 401), as
``Authorization: Bearer ...``, and never printed: messages name the setting it came from, and
``scrub`` removes it from any text pdm prints (the CLI's error path applies it).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from pdmask.errors import Problem

TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_FILE_ENV = "PDM_RAY_TOKEN_FILE"
RAY_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_FILE = Path("~/.ray/auth_token")
WHERE = "--address / RAY_ADDRESS"
TOKEN_SETTINGS = f"{TOKEN_ENV} / --ray-token-file ({TOKEN_FILE_ENV})"
PROBE_TIMEOUT_S = 5.0
PROBE_PATH = "/api/version"  # the job API's version: behind authentication when it is on


class TokenUnreadable(Exception):
    """A token file was named but cannot be read (its setting and path are the message)."""


def token_source(env=None) -> tuple[str, str] | None:
    """``(token, the setting it came from)``, or None when no token is configured."""
    env = os.environ if env is None else env
    if env.get(TOKEN_ENV, "").strip():
        return env[TOKEN_ENV].strip(), TOKEN_ENV
    for setting, raw, named in (
        (TOKEN_FILE_ENV, env.get(TOKEN_FILE_ENV), True),
        (RAY_TOKEN_PATH_ENV, env.get(RAY_TOKEN_PATH_ENV), True),
        ("~/.ray/auth_token", str(DEFAULT_TOKEN_FILE), False),
    ):
        if not raw:
            continue
        path = Path(raw).expanduser()
        if not named and not path.is_file():
            continue
        try:
            token = path.read_text().strip()
        except OSError as err:
            raise TokenUnreadable(
                f"{setting}: cannot read the token file {path}: {err.strerror or err}"
            ) from None
        if not token:
            if not named:
                continue
            raise TokenUnreadable(f"{setting}: the token file {path} is empty")
        return token, f"{setting} ({path})"
    return None


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _status(address: str, headers: dict[str, str]) -> int | str:
    """The HTTP status of the job API's version endpoint, or why there is none."""
    url = (address if "://" in address else f"http://{address}").rstrip("/") + PROBE_PATH
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError) as err:
        return str(getattr(err, "reason", None) or err)


def auth_problems(address: str, insecure: bool = False, env=None) -> list[Problem]:
    """Why pdm refuses to submit to the job API at ``address`` (empty: it may)."""
    status = _status(address, {})
    if status == 200:
        if insecure:
            return []
        return [
            Problem(
                WHERE,
                address,
                "its job API answers without authentication: anyone who reaches it can run code "
                "on the cluster. Start the cluster with Ray's token authentication "
                "(RAY_AUTH_MODE=token, docs/cluster.md) or keep its dashboard on loopback behind "
                "an SSH tunnel; --insecure submits anyway",
            )
        ]
    if status != 401:
        why = f"HTTP {status}" if isinstance(status, int) else status
        return [
            Problem(
                WHERE,
                address,
                f"no Ray job API answers at {PROBE_PATH} ({why}); give the head's dashboard "
                "address, e.g. http://HEAD:8265",
            )
        ]
    try:
        found = token_source(env)
    except TokenUnreadable as err:
        return [Problem(TOKEN_SETTINGS, "token file", str(err))]
    if found is None:
        return [
            Problem(
                TOKEN_SETTINGS,
                "(none)",
                f"the cluster at {address} requires Ray's authentication token and none is "
                f"set: export {TOKEN_ENV}, or pass --ray-token-file FILE (the file `ray start` "
                "wrote on the head, ~/.ray/auth_token)",
            )
        ]
    token, source = found
    answer = _status(address, bearer(token))
    if answer == 200:
        return []
    why = f"HTTP {answer}" if isinstance(answer, int) else answer
    return [
        Problem(
            TOKEN_SETTINGS,
            source,
            f"the cluster at {address} refuses this token ({why}): use the token of that "
            "cluster's head (`ray get-auth-token` there)",
        )
    ]


def headers_for(address: str, env=None) -> dict[str, str]:
    """What a client of ``address`` sends: the token when the job API asks for one, else nothing."""
    if _status(address, {}) != 401:
        return {}
    try:
        found = token_source(env)
    except TokenUnreadable:
        return {}
    return bearer(found[0]) if found else {}


def scrub(text: str, env=None) -> str:
    """``text`` with the configured token, wherever it appears, replaced by ``***``."""
    try:
        found = token_source(env)
    except TokenUnreadable:
        found = None
    if found is None or not found[0]:
        return text
    return text.replace(found[0], "***")
