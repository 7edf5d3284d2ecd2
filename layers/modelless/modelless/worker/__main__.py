"""``python -m modelless.worker``: one pool worker process (``modelless.worker.server.main``)."""

from modelless.worker.server import main

main()
