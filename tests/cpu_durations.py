"""`--cpu-durations=N`: the N tests that cost the most CPU time, beside pytest's wall-clock
--durations. On a machine of few cores the suite is CPU-bound (its runners wait for cores, not for
sleeps), so CPU seconds, not wall seconds, show what makes it long.

A test's CPU is its runner's own plus that of the child processes reaped while it ran: a server it
started and stopped, with that server's children, but also whatever else was reaped then. A
session-scoped fixture's set-up shows on the first test that asks for it and its server (its whole
life) on the last test of its runner; a process that an earlier test left for the subprocess module
to reap shows on the test that next starts one. So a figure far above what a test does points at
its neighbours; and processes that no runner reaps (containers under podman) are missed.
"""
import resource

import pytest

PROPERTY = "cpu_seconds"


def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N tests that used the most CPU (their own process and reaped children)")


def _cpu_seconds():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


STARTED = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[STARTED] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The test's cost, setup to teardown, on its teardown report (which pytest -n sends on)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "teardown" and item.config.getoption("cpu_durations") is not None:
        report.user_properties.append((PROPERTY, _cpu_seconds() - item.stash[STARTED]))


def pytest_terminal_summary(terminalreporter, config):
    count = config.getoption("cpu_durations")
    if count is None:
        return
    costs = sorted(((value, report.nodeid) for reports in terminalreporter.stats.values() for report in reports
                    if getattr(report, "when", None) == "teardown"
                    for name, value in report.user_properties if name == PROPERTY), reverse=True)
    terminalreporter.section(f"most CPU: {len(costs[:count])} of {len(costs)} tests, "
                             f"{sum(value for value, _ in costs):.0f} CPU s in all")
    for value, nodeid in costs[:count]:
        terminalreporter.write_line(f"{value:8.2f}s cpu  {nodeid}")
