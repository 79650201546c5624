"""The worker's progress throttle: a burst cannot flood the UI thread, yet the latest step a
job names reaches it. (Held back and dropped, a step's name was lost: "warm-up 1/5" right
after "loading" left the bar on "loading" for a whole generation on lavapipe.)"""

from __future__ import annotations

import time

from app.workers import Worker


def _run(qtbot, job) -> list[tuple[str, object]]:
    """The signals a worker sends for ``job``, in the order the UI thread gets them."""
    got: list[tuple[str, object]] = []
    worker = Worker(job, min_interval_s=0.05)
    worker.signals.progress.connect(lambda f, m: got.append(("progress", m)))
    worker.signals.returned.connect(lambda r: got.append(("returned", r)))
    with qtbot.waitSignal(worker.signals.finished, timeout=10_000):
        worker.start()
    qtbot.wait(200)  # a late timer would show up here
    return got


def test_a_step_named_right_after_another_reaches_the_ui(qtbot):
    def job(progress, cancel):
        progress(0.1, "loading")
        progress(0.2, "warm-up 1/5")  # within the interval: held, then sent
        time.sleep(1.0)  # the warm-up generation (a timer late by 0.95 s still lands)
        return 1

    got = _run(qtbot, job)
    assert got == [("progress", "loading"), ("progress", "warm-up 1/5"), ("returned", 1)]


def test_a_burst_is_throttled_and_its_last_report_kept(qtbot):
    def job(progress, cancel):
        for i in range(2000):
            progress(0.5 * i / 2000, f"writing tensor {i}")
        time.sleep(0.2)
        progress(0.9, "held")  # within the interval after the burst's last report...
        progress(0.95, "closing")
        return "ok"  # ...and the job returns first: nothing comes after the outcome

    got = _run(qtbot, job)
    messages = [m for kind, m in got if kind == "progress"]
    assert len(messages) < 40, len(messages)
    assert "writing tensor 1999" in messages  # the burst's last, sent when its interval ended
    assert got[-1] == ("returned", "ok")
