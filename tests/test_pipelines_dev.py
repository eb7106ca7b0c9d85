"""`clinical-sync dev`: says where the UI is, starts without warnings, and stops with every
process it started."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from cli.commands import STOP_GRACE_SECONDS
from tests.dev_server import dev_server


@pytest.mark.e2e
def test_dev_prints_the_url_and_sigterm_leaves_no_process(tmp_path):
    with dev_server(tmp_path) as server:
        children = psutil.Process(server.proc.pid).children(recursive=True)
        assert len(children) >= 3  # sandbox, dagster dev, webserver, daemon, code server
        asked = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
        assert time.monotonic() - asked < STOP_GRACE_SECONDS  # nothing waited for a kill
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], [p.cmdline() for p in alive]
        text = server.text()
    assert f"Dagster UI: {server.url}" in text
    assert (server.home / "dagster.yaml").exists()  # the warehouse's own instance
    for noise in ("superseded", "Deprecat", "will not be used to configure Dagster"):
        assert noise not in text, text[-3000:]
