"""A gateway alone, for registration tests over real HTTP: the API served by uvicorn (as the
embedded stack serves it) over an in-memory store and a local repository, the settings from the
environment (``MODELLESS_*``: the limits under test), and registration's background part never
started (it would build and profile variants of whatever a test uploads). The test measures this
process's memory while it takes an upload.

    python -m tests.functional.registration_gateway PORT REPOSITORY ADMIN_KEY
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn

from modelless.api import create_app
from modelless.api.services import build_services
from modelless.config import Settings
from modelless.metadata.memory import InMemoryMetadataStore


def main(argv: list[str]) -> None:
    port, repository, admin_key = argv
    settings = Settings(repository_url=repository, admin_key=admin_key, lambda_function="")
    services = build_services(settings, store=InMemoryMetadataStore())

    def queued_only(*args: Any, **kwargs: Any) -> None:
        """Registrations stay queued: their variants are not this test's subject."""

    services.registrar._background.submit = queued_only  # type: ignore[assignment,method-assign]
    uvicorn.run(create_app(services), host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
