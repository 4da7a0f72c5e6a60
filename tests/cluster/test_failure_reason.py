"""What a failed Ray job's reason says: the log's last exception on its first line (the line the
console prints), the log's end after it, within the MLflow tag's room."""

from __future__ import annotations

from pdmask.orchestration.jobs.cluster import (
    TAIL_CHARS,
    JobView,
    describe_failure,
    last_exception,
)

TRACEBACK = """\
(TaskRunner pid=4242) Traceback (most recent call last):
(TaskRunner pid=4242)   File "trainer.py", line 10, in fit
(TaskRunner pid=4242)     batch = self.replay_buffer.sample()
(TaskRunner pid=4242) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.
Traceback (most recent call last):
  File "main_ppo.py", line 3, in <module>
    ray.get(runner.run.remote(config))
ray.exceptions.RayTaskError(EngineDeadError): ray::TaskRunner.run() (pid=4242, ip=127.0.0.1)
"""


def _job(message="Job entrypoint command failed with exit code 1") -> JobView:
    return JobView("pdm-s-0123456789abcdef-a1", "FAILED", "run-1", message, 1, None)


def test_the_last_exception_is_found_with_or_without_rays_actor_prefix():
    assert last_exception(TRACEBACK).startswith("ray.exceptions.RayTaskError(EngineDeadError):")
    only_worker = "\n".join(TRACEBACK.splitlines()[:4])
    assert last_exception(only_worker).startswith("vllm.v1.engine.exceptions.EngineDeadError:")
    assert last_exception("all is well\nstep 3 done\n") is None


def test_the_first_line_names_status_exit_code_message_and_last_exception():
    reason = describe_failure(_job(), TRACEBACK)
    first = reason.splitlines()[0]
    assert first.startswith(
        "Ray job pdm-s-0123456789abcdef-a1 FAILED (exit code 1): Job entrypoint"
    )
    assert "; last exception: ray.exceptions.RayTaskError(EngineDeadError)" in first
    assert reason.rstrip().endswith("ray::TaskRunner.run() (pid=4242, ip=127.0.0.1)")


def test_rays_truncated_log_copy_is_not_part_of_the_message():
    message = 'Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n  File "/site-packages/'
    first = describe_failure(_job(message), TRACEBACK).splitlines()[0]
    assert first.endswith(
        "last exception: ray.exceptions.RayTaskError(EngineDeadError): "
        "ray::TaskRunner.run() (pid=4242, ip=127.0.0.1)"
    )
    assert "site-packages" not in first


def test_a_long_log_keeps_the_head_and_the_end_within_the_tag_room():
    log = "\n".join(f"line {i} " + "x" * 400 for i in range(200)) + "\n" + TRACEBACK
    reason = describe_failure(_job(), log)
    assert len(reason) <= TAIL_CHARS
    assert "last exception: ray.exceptions.RayTaskError" in reason.splitlines()[0]
    assert reason.rstrip().endswith("(pid=4242, ip=127.0.0.1)")
