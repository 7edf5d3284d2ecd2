"""How a created job gets run: in AWS, an asynchronous invoke of the offline function
(``LambdaLauncher``), which runs the job with its remaining time and hands what is left to its
next invocation; in the embedded stack, background threads of the gateway process
(``ThreadLauncher``), each running its job in the thread or in a child process
(``child_processes.ChildProcessRunner``), and a supervisor that resumes unfinished jobs nobody
holds (a crashed runner, a restart).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from aws_lambda_powertools import Logger

from modelless.exceptions import ServiceUnavailableError, first_line
from modelless.offline.child_processes import ChildProcessRunner
from modelless.offline.run_state import RunReport
from modelless.outages import RepeatedFailures

logger = Logger(service="offline", child=True)


class JobLauncher(Protocol):
    def launch(self, job_id: str) -> None:
        """Have the job run (again) somewhere; a no-op when it is already queued here."""

    def close(self) -> None: ...


class LambdaLauncher:
    """AWS: an asynchronous invoke of the offline function with ``{"jobId": …}``."""

    def __init__(self, function_name: str, client: Any | None = None) -> None:
        self._function = function_name
        self._lambda = client  # made on first launch: a gateway's cold start does not pay for it

    def launch(self, job_id: str) -> None:
        if self._lambda is None:
            from modelless import aws_clients

            self._lambda = aws_clients.client("lambda")
        self._lambda.invoke(
            FunctionName=self._function, InvocationType="Event", Payload=json.dumps({"jobId": job_id})
        )

    def close(self) -> None:
        pass


class ThreadLauncher:
    """The embedded stack: jobs run from background threads of this process (in the thread
    itself, or in a child process per job when ``run`` is a ``ChildProcessRunner``). A supervisor
    thread (``start_supervisor``) resumes every unfinished job whose lease nobody holds: one whose
    runner crashed, or every unfinished job after a restart."""

    def __init__(
        self,
        run: Callable[[str], RunReport],
        resumable: Callable[[], list[str]],
        concurrency: int = 1,
        resume_every_s: float = 1.0,
    ) -> None:
        self._run = run
        self._resumable = resumable
        self._resume_every_s = resume_every_s
        self._pool = ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="offline-job")
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None

    def launch(self, job_id: str) -> None:
        with self._lock:
            if job_id in self._queued or self._stop.is_set():
                return
            self._queued.add(job_id)
        self._pool.submit(self._work, job_id)

    def _work(self, job_id: str) -> None:
        try:
            report = self._run(job_id)
            logger.info("offline run ended", extra={"job_id": job_id, "outcome": report.outcome.value})
        except ServiceUnavailableError as error:
            # A part down (the store): nothing to debug; the supervisor resumes the job after it.
            logger.warning(
                "offline run stopped: a part it needs is down; the supervisor resumes the job",
                extra={"job_id": job_id, "error": first_line(error)},
            )
        except Exception:
            logger.exception("offline run failed; the supervisor resumes the job", extra={"job_id": job_id})
        finally:
            with self._lock:
                self._queued.discard(job_id)

    def start_supervisor(self) -> None:
        if self._supervisor is not None:
            return

        # A store outage fails every round alike: a line when it starts, a reminder a minute and
        # one when it ends, not a traceback a round; anything else is a bug, logged in full.
        outage = RepeatedFailures(
            logger,
            "could not look for offline jobs to resume; retrying",
            "looking for offline jobs to resume again",
        )

        def loop() -> None:
            while True:
                try:
                    for job_id in self._resumable():
                        self.launch(job_id)
                    outage.succeeded()
                except ServiceUnavailableError as error:
                    outage.failed(error)
                except Exception:
                    logger.exception("could not look for offline jobs to resume")
                if self._stop.wait(self._resume_every_s):
                    return

        self._supervisor = threading.Thread(target=loop, name="offline-supervisor", daemon=True)
        self._supervisor.start()

    def close(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        # A job running in a thread stops when the process ends; its lease then expires and the
        # next start resumes it. Queued ones are simply not started.
        self._pool.shutdown(wait=False, cancel_futures=True)
        if isinstance(self._run, ChildProcessRunner):
            self._run.close()
