"""One log line per reason per window, with the count of the lines held back (a fake clock)."""

import logging

from actors.log_limiter import LogLimiter


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_repeats_within_the_window_are_counted_and_reported_by_the_next_line(caplog):
    clock = Clock()
    limiter = LogLimiter(logging.getLogger("limiter-test"), window_s=30.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="limiter-test"):
        assert limiter.warning("error:ValueError", "first") is True  # t=100: logged
        clock.now = 110.0
        assert limiter.warning("error:ValueError", "second") is False  # 10 s later: held back (1)
        assert limiter.warning("unavailable", "other reason") is True  # its own window
        clock.now = 129.9
        assert limiter.warning("error:ValueError", "third") is False  # 29.9 s: still held back (2)
        clock.now = 130.0
        assert limiter.warning("error:ValueError", "fourth") is True  # 30 s after the first line
        clock.now = 170.0
        assert limiter.warning("error:ValueError", "fifth") is True  # nothing held back since
    assert [record.getMessage() for record in caplog.records] == [
        "first",
        "other reason",
        "fourth (2 more like it suppressed in the last 30 s)",
        "fifth",
    ]
