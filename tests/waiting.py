import time

import pytest


def wait_for(probe, what: str, seconds: float = 60):
    """The first truthy value `probe()` returns, polling twice a second; fails the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"gave up waiting for {what}")
