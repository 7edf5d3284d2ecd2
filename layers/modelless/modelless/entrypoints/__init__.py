"""What each Lambda function under ``functions/`` runs, one module per function: its Powertools
``logger`` and ``metrics``, and a class that builds the function's services from the settings
once per container (``from_settings``) and handles one event (``handle``): event routing,
metrics, replies. A function's ``app.py`` is its imports, its Powertools decorators and one call.

Each module imports only what its function's package holds (its ``lambda-NAME`` extra in
pyproject.toml and the layer's); this package's ``__init__`` imports nothing, so a light
function never pays for a heavy one.
"""
