"""How a refused kernel start reaches the HTTP client and the log, on every route that starts a kernel.

A start is refused inside the provisioner (``QuotaUnavailable``, from ``QuotaManager.refuse``: a per-user limit, a
quota outside the rules, no room with ``on_full = "reject"``). jupyter_server answers it differently per route:
``POST /api/sessions`` wraps any failed start in a 500 with the message alone, ``POST /api/kernels`` passes the
error on without its rule; and jupyter_client logs the refusal's traceback twice on the way (the kernel manager's
``ready`` future and the multi-kernel manager's pending start). Here the routes answer the refusal's own status
(4xx for a rule) with its message, code and figures, like ``PATCH /api/gpushare/kernels/<id>``; and the log says
the refusal once, as the manager's ``refused`` event, without a traceback.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from jupyter_server.services.kernels.handlers import MainKernelHandler
from jupyter_server.services.sessions.handlers import SessionRootHandler
from tornado import web

from ...core.policy import PolicyError
from ..records import QuotaUnavailable


def refusal_in(error: BaseException | None) -> QuotaUnavailable | None:
    """The refused start behind an error (jupyter_server raises its own 500 ``from`` it), if there is one."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, QuotaUnavailable):
            return error
        seen.add(id(error))
        error = error.__cause__
    return None


def error_body(error: BaseException | None) -> dict[str, Any] | None:
    """Jupyter's JSON error for an HTTPError, with its message as written, and the code and figures of the rule
    that refused it (a PolicyError it was raised from), which the sidebar words itself. None for any other error."""
    if not isinstance(error, web.HTTPError) or not error.log_message:
        return None
    # tornado doubles every '%' of a message given without arguments ("0%%"), and jupyter-server sends it on as is
    body: dict[str, Any] = {"message": error.log_message % error.args, "reason": error.reason}
    rule = error.__cause__
    if isinstance(rule, PolicyError) and rule.code:
        body.update(code=rule.code, params=rule.params)
    return body


class RefusalErrors(web.RequestHandler):
    """A handler's errors as ``error_body`` says them (mixed in before jupyter_server's own handler class)."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        body = error_body((kwargs.get("exc_info") or (None, None))[1])
        if body is None:
            super().write_error(status_code, **kwargs)
            return
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


class SessionsHandler(RefusalErrors, SessionRootHandler):
    """jupyter_server's ``POST /api/sessions``, but a start refused by a rule answers 4xx, not 500."""

    async def post(self) -> None:
        try:
            await super().post()  # type: ignore[misc]  # (async, typed Awaitable | None)
        except web.HTTPError as e:
            refusal = refusal_in(e)
            if refusal is None or refusal is e:
                raise
            raise refusal from refusal.__cause__  # its status, its message and the rule behind it


class StartKernelHandler(RefusalErrors, MainKernelHandler):
    """jupyter_server's ``/api/kernels``: a refused ``POST`` says its rule's code and figures too."""


class QuietRefusals(logging.Filter):
    """Drops jupyter_client's tracebacks of a refused start: the manager logged the refusal once already (its
    'refused' event), and the client is told why in the reply. Any other error is logged as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return refusal_in(error) is None


def quiet_refusals(log: logging.Logger) -> QuietRefusals:
    """Install the filter on the server's log (jupyter_client's kernel managers log through it); return it, for
    removal at the extension's stop."""
    quiet = QuietRefusals()
    log.addFilter(quiet)
    return quiet
