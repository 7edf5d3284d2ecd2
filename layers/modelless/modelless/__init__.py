"""modelless: the shared library of the model-less inference backend (the Lambda layer).

Every function under ``functions/`` and every local process imports its domain from here:
selection, stores, pools, registration and the HTTP API.
"""

__version__ = "0.1.0"  # stated here only: pyproject.toml reads it (dynamic = ["version"])
