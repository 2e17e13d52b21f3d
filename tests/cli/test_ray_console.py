"""Ray's own warnings do not put tracebacks among sentsim's progress lines."""

import importlib
import io
import logging

import pytest

from sentsim.runtime import COORDINATOR_LOGGERS, one_line_coordinator_warnings


@pytest.mark.parametrize("name", COORDINATOR_LOGGERS)
def test_a_coordinator_timeout_is_one_line_on_the_console(name):
    """Ray's autoscaling-coordinator clients warn with a traceback when their 5 s call times out on
    an overloaded CPU (CI printed one from the TrainController while two harvests shared its cores);
    the warning stays, on one line with the exception's type and message."""
    module = importlib.import_module(name)
    assert module.logger.name == name  # the module still logs there: a Ray upgrade that moves it fails here

    one_line_coordinator_warnings()
    one_line_coordinator_warnings()  # idempotent: one filter, however often a process calls it
    log = logging.getLogger(name)
    assert sum(type(f).__name__ == "_ExceptionOnOneLine" for f in log.filters) == 1

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log.addHandler(handler)
    try:
        try:
            raise TimeoutError("Get timed out: some object(s) not ready.\nsecond line")
        except TimeoutError:
            log.warning("Failed to send resource request for %s.", "train-run", exc_info=True)
        log.warning("plain %s", "warning")
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines == ["Failed to send resource request for train-run. "
                     "(TimeoutError: Get timed out: some object(s) not ready.)", "plain warning"]


def test_the_notice_that_progress_bars_are_off_is_muted_where_sentsim_turns_them_off():
    """sentsim turns Ray Data's progress bars off on purpose; Ray Data's once-a-process warning that they
    are off (printed by the driver, every Train worker and split coordinator) is muted with them."""
    from ray.data import DataContext
    from ray.data._internal import progress

    from sentsim.runtime import DATA_PROGRESS_LOGGER, no_data_progress_bars

    assert progress.logger.name == DATA_PROGRESS_LOGGER  # a Ray upgrade that moves the warning fails here
    ctx = DataContext.get_current()
    before = ctx.enable_progress_bars, progress.logger.level
    try:
        no_data_progress_bars()
        assert ctx.enable_progress_bars is False
        assert not progress.logger.isEnabledFor(logging.WARNING) and progress.logger.isEnabledFor(logging.ERROR)
    finally:
        ctx.enable_progress_bars, _ = before
        progress.logger.setLevel(before[1])
