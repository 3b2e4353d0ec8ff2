"""Log a recurring failure loudly but not once per step: at most one line per reason per window.

An actor worker retrieves every few milliseconds; a library that keeps failing would otherwise
write thousands of identical lines and bury everything else. The first failure of a reason is
logged at once, repeats within `window_s` are counted, and the next line after the window says
how many were held back. The exact count of every failure is in the metrics, not the log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class LogLimiter:
    def __init__(self, logger: logging.Logger, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.window_s = window_s
        self.clock = clock
        self._last_logged: dict[str, float] = {}  # reason -> clock time of its last line
        self._suppressed: dict[str, int] = {}  # reason -> repeats held back since that line
        self._lock = threading.Lock()

    def warning(self, reason: str, message: str) -> bool:
        """Log `message` unless `reason` was logged within the window; True if a line was written."""
        now = self.clock()
        with self._lock:
            last = self._last_logged.get(reason)
            if last is not None and now - last < self.window_s:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
                return False
            suppressed = self._suppressed.pop(reason, 0)
            self._last_logged[reason] = now
        if suppressed:
            message += f" ({suppressed} more like it suppressed in the last {now - last:.0f} s)"
        self.logger.warning(message)
        return True
