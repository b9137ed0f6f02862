"""What the JupyterHub says about a user, for the broker: who a Hub API token belongs to, their Hub
groups and whether they are a Hub admin (stdlib HTTP; the broker calls it off its event loop).

Two requests: ``GET {api}/user`` with the caller's token (every Hub token may identify its owner:
name, groups and the admin flag) and, for users who connect over the Unix socket,
``GET {api}/users/{name}`` with the broker's own token, which needs the scopes
``read:users:name`` and ``read:users:groups`` (docs/multi-user.md). Lookups by name are cached for ``cache_s``; when the
Hub cannot be reached the last answer is used, and a user never seen has no Hub groups.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

log = logging.getLogger("jupyter_gpushare.host.hub")


class HubError(RuntimeError):
    """A token the Hub does not accept, or a Hub that cannot be asked. The message says which."""


@dataclass(frozen=True)
class HubUser:
    name: str
    groups: tuple[str, ...] = ()
    admin: bool = False


class HubClient:
    def __init__(self, api_url: str, token: str = "", cache_s: float = 60.0, timeout: float = 10.0):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.cache_s = cache_s
        self.timeout = timeout
        self._cache: dict[str, tuple[float, HubUser | None]] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def _get(self, path: str, token: str) -> dict | None:
        """GET a Hub API path; None for 404. HubError for anything but 200."""
        req = urllib.request.Request(f"{self.api_url}/{path}", headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            if e.code in (401, 403):
                raise HubError(f"the Hub at {self.api_url} does not accept this token (expired or revoked?)") from e
            raise HubError(f"the Hub at {self.api_url} answered {e.code} {e.reason} to GET /{path}") from e
        except (OSError, ValueError) as e:
            raise HubError(f"the Hub at {self.api_url} cannot be reached ({e})") from e

    def whoami(self, token: str) -> HubUser:
        """The user a Hub API token belongs to (a single-user server's JUPYTERHUB_API_TOKEN, say)."""
        if not token:
            raise HubError("no JupyterHub API token was sent")
        model = self._get("user", token)
        if not model or model.get("kind", "user") != "user" or not model.get("name"):
            raise HubError(f"the token belongs to a {(model or {}).get('kind', 'unknown')}, not to a Hub user")
        return HubUser(model["name"], tuple(sorted(model.get("groups") or ())), bool(model.get("admin")))

    def user(self, name: str) -> HubUser | None:
        """A Hub user's groups and admin flag, asked with the broker's token (cached); None if unknown."""
        if not self.token:
            return None
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(name)
        if cached and now - cached[0] < self.cache_s:
            return cached[1]
        try:
            model = self._get(f"users/{urllib.parse.quote(name, safe='')}", self.token)
        except HubError as e:
            if name not in self._warned:
                self._warned.add(name)
                log.warning(
                    "jupyter-gpushare broker: cannot look up Hub user %r (%s); using %s. The broker's service "
                    "needs the scopes read:users:name and read:users:groups.", name, e, "the last answer" if cached else "no Hub groups",
                )  # fmt: skip
            return cached[1] if cached else None
        found = (
            None if model is None else HubUser(name, tuple(sorted(model.get("groups") or ())), bool(model.get("admin")))
        )
        with self._lock:
            self._cache[name] = (now, found)
        self._warned.discard(name)
        return found
