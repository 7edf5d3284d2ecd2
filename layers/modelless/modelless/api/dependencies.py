"""FastAPI dependencies; tests override ``get_services`` to plug in fakes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from modelless.api.services import Services
from modelless.auth import check_admin


# The dependencies that only read the request are ``async``: FastAPI runs a plain ``def``
# dependency in its thread pool, a hop per dependency on every query.
async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


# The two ways a key is sent, as OpenAPI security schemes (either one will do). Neither refuses a
# request itself (auto_error=False): the routes answer a missing or unknown key 401 in the API's
# error shape, and some take the app's key or the admin key.
API_KEY_HEADER = APIKeyHeader(
    name="X-Api-Key",
    scheme_name="ApiKey",
    description="an app's API key (from POST /v1/apps), or the admin key where a call needs it",
    auto_error=False,
)
BEARER_KEY = HTTPBearer(
    scheme_name="BearerKey",
    description="the same key as 'Authorization: Bearer <key>'",
    auto_error=False,
)


async def presented_key(
    request: Request,
    x_api_key: Annotated[str | None, Security(API_KEY_HEADER)],
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER_KEY)],
) -> str | None:
    if x_api_key:
        return x_api_key
    # Read here rather than from HTTPBearer's credentials: "Bearer  key" (more spaces) is accepted.
    authorization = request.headers.get("authorization")
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
