"""A job tells who waits for it that it ended (agent.fetch.jobs `Job.on_end`: the API's long polls)."""

from __future__ import annotations

from agent.fetch.jobs import Job, JobKey


def test_a_job_calls_back_once_when_it_ends_and_never_a_callback_taken_back():
    job = Job(JobKey("acme/tiny", "main"))
    calls: list[str] = []

    def kept() -> None:
        calls.append("kept")

    def taken_back() -> None:
        calls.append("taken back")

    job.on_end(kept)
    job.on_end(taken_back)
    job.forget(taken_back)
    job.forget(taken_back)  # twice: a long poll that timed out after the job ended
    assert calls == []
    job.finish("/snapshots/x")
    assert calls == ["kept"]
    job.fail("after the end")  # no second call
    assert calls == ["kept"]
    job.on_end(lambda: calls.append("late"))  # asked after the end: called at once
    assert calls == ["kept", "late"]
