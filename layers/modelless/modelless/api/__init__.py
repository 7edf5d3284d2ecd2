"""The HTTP API (FastAPI, "bigger applications" layout): routers, dependencies, error mapping.

The same app serves the embedded stack (uvicorn) and the gateway Lambda function (Mangum).
"""

from modelless.api.app import create_app

__all__ = ["create_app"]
