"""Fair shares of the broker: per-user connection caps, request rates counted in work, and rate-limited logging.

One student holding a thousand connections must not leave the broker without file descriptors, and one
flooding it with requests must not slow anyone else's kernel start, nor fill the disk with its log.
Callers are counted by a key: ``uid:<n>`` on the Unix socket, ``hub:<name>`` once a TCP caller has
authenticated, ``peer:<address>`` before that. Root and the broker's own user are trusted and not limited.
"""

from __future__ import annotations

import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass, field


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (a broker serves many connections); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


@dataclass
class _Bucket:
    tokens: float
    last: float


@dataclass
class Guard:
    """Connections open and requests made, per caller key."""

    per_user: int = 64  # connections one user may hold open
    total: int = 4096  # connections in all (kept below the open-file limit)
    rate: float = 200.0  # requests per second, per user, on average
    burst: float = 400.0  # requests a user may make at once before being slowed down
    open: Counter = field(default_factory=Counter)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def enter(self, key: str, trusted: bool = False) -> str | None:
        """Count a new connection of ``key``; the reason it is refused (and not counted), or None."""
        if sum(self.open.values()) >= self.total:
            return f"The GPU broker serves {self.total} connections already; try again in a moment."
        if not trusted and self.open[key] >= self.per_user:
            who = key.partition(":")[2] or key
            return (
                f"Too many connections to the GPU broker from {who} ({self.per_user} are open; "
                "GpuShareBroker.max_connections_per_user). Close the ones your own programs opened."
            )
        self.open[key] += 1
        return None

    def leave(self, key: str) -> None:
        self.open[key] -= 1
        if self.open[key] <= 0:
            del self.open[key]

    def rekey(self, old: str, new: str, trusted: bool = False) -> str | None:
        """Move a connection from ``old`` to ``new`` (a TCP caller that authenticated); refused as in enter."""
        self.leave(old)
        reason = self.enter(new, trusted)
        if reason is not None:
            self.open[old] += 1  # still counted as it was until it closes
        return reason

    def delay(self, key: str, trusted: bool = False, now: float | None = None, size: int = 0) -> float:
        """Seconds this request must wait before it is answered (0 within the user's rate). A request costs one
        token and one more per KiB of its ``size``: reading, parsing and answering a large one is work, and a
        user's share of the broker is counted in work, not in lines."""
        if trusted or self.rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.last) * self.rate) - 1 - size // 1024
        bucket.last = now
        if len(self._buckets) > 10_000:  # forget users who have been quiet long enough to be full again
            full = [k for k, b in self._buckets.items() if b.tokens + (now - b.last) * self.rate >= self.burst]
            for k in full:
                del self._buckets[k]
        return max(0.0, -bucket.tokens / self.rate)

    def charge(self, key: str, trusted: bool = False, seconds: float = 0.0, size: int = 0) -> None:
        """Charge a request's answer to its caller, once it is known: one token per millisecond the broker spent
        on it and one per KiB of its reply. A request is counted by the work it cost, not as one line: a ``view``
        that reads 2,000 rows costs its caller a hundred times a ``reserve``, and the next request of a caller who
        spent their share waits (``delay``)."""
        bucket = self._buckets.get(key)
        if trusted or self.rate <= 0 or bucket is None:
            return
        bucket.tokens -= seconds * 1000 + size // 1024


@dataclass
class LogLimiter:
    """At most ``per_window`` messages of one kind per window; then one line saying how many were left out."""

    log: logging.Logger
    per_window: int = 10
    window_s: float = 60.0
    _seen: dict[str, list[float]] = field(default_factory=dict)  # kind -> [window start, count]

    def __call__(self, kind: str, level: int, message: str, *args: object, exc_info: bool = False) -> None:
        now = time.monotonic()
        start, count = self._seen.get(kind, [now, 0])
        if now - start >= self.window_s:
            if count > self.per_window:
                self.log.warning("(%d more '%s' messages in the last %.0f s were left out)", count - self.per_window, kind, now - start)  # fmt: skip
            start, count = now, 0
        count += 1
        self._seen[kind] = [start, count]
        if count <= self.per_window:
            self.log.log(level, message, *args, exc_info=exc_info)
        elif count == self.per_window + 1:
            self.log.warning("More '%s' messages follow; they are left out for %.0f s.", kind, self.window_s)
