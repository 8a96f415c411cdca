"""QuietLog: one warning line per kind every `every` seconds, each saying how many it left out."""
import logging

from encoder_server.server.quiet_log import QuietLog


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_one_line_per_kind_per_period_each_counting_what_was_left_out(caplog):
    clock = Clock()
    quiet = QuietLog(logging.getLogger("quiet-test"), every=10, clock=clock)
    with caplog.at_level(logging.WARNING, logger="quiet-test"):
        for number in range(5):
            quiet.warning("bad request", "bad request from %s: %d", "10.0.0.1", number)
        quiet.warning("termination", "refused TERMINATION from %s", "10.0.0.2")  # another kind: its own line
        clock.now += 9.9
        quiet.warning("bad request", "bad request from %s: %d", "10.0.0.1", 5)
        clock.now += 0.1
        quiet.warning("bad request", "bad request from %s: %d", "10.0.0.1", 6)
        clock.now += 10
        quiet.warning("bad request", "bad request from %s: %d", "10.0.0.1", 7)
    assert [record.getMessage() for record in caplog.records] == [
        "bad request from 10.0.0.1: 0 (one such line per 10s)",
        "refused TERMINATION from 10.0.0.2 (one such line per 10s)",
        "bad request from 10.0.0.1: 6 (one such line per 10s; 5 more left out before this one)",
        "bad request from 10.0.0.1: 7 (one such line per 10s)",
    ]
    assert all(record.levelno == logging.WARNING for record in caplog.records)
