"""FastAPI dependencies; tests override ``get_services`` to plug in fakes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from modelless.api.services import Services
from modelless.auth import check_admin


# The dependencies that only read the request are ``async``: FastAPI runs a plain ``def``
# dependency in its thread pool, a hop per dependency on every query.
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def presented_key(
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> str | None:
    if x_api_key:
        return x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


KeyDep = Annotated[str | None, Depends(presented_key)]


def caller_app(services: ServicesDep, key: KeyDep) -> str:
    """The app the caller's key belongs to."""
    return services.keys.app_for_key(key)


def require_admin(services: ServicesDep, key: KeyDep) -> None:
    check_admin(services.settings.admin_key, key)


CallerAppDep = Annotated[str, Depends(caller_app)]
AdminDep = Annotated[None, Depends(require_admin)]
