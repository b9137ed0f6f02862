"""The broker's reading of the host's cards: what each process uses, as the driver says it.

Admission counts what processes without a reservation use as taken (ledger.outside), and the watchdog and the policy
on unleased processes judge each reading. The driver is read at most every ``ttl_s``, and once more before the next
request after leases were given back (``stale``): a reading from before a release still lists the kernel's process,
in no lease now, and its memory would count as taken until the next one."""

from __future__ import annotations

import logging
import math
import time

from ..host.gpu import DeviceSample, GpuBackend

SAMPLE_TTL_S = 1.0  # the driver is read at most this often for what processes without a reservation use


class CardReading:
    """The driver's last per-process reading, read again once older than asked for (none without a GPU)."""

    def __init__(self, backend: GpuBackend, log: logging.Logger, ttl_s: float = SAMPLE_TTL_S) -> None:
        self.backend, self.log, self.ttl_s = backend, log, ttl_s
        self._samples: tuple[DeviceSample, ...] = ()
        self._at = -math.inf  # when it was read (time.monotonic())

    def latest(self, max_age_s: float | None = None) -> tuple[DeviceSample, ...]:
        """The reading, at most ``max_age_s`` old (``ttl_s`` unless said)."""
        if time.monotonic() - self._at >= (self.ttl_s if max_age_s is None else max_age_s) * 0.9:
            try:
                self._samples = tuple(self.backend.sample())
            except Exception as e:  # a lost card, no NVML: reservations alone then
                self.log.debug("jupyter-gpushare broker: no GPU reading: %s", e)
                self._samples = ()
            self._at = time.monotonic()
        return self._samples

    def stale(self) -> None:
        """Leases were given back: the next request reads the driver again, so their room is granted at once."""
        self._at = -math.inf
