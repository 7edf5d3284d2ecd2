"""The serving core: an ``Invocation`` from the wire (``wire``, ``invocation``) to onnxruntime
(``runtime``, with ``batching``) and back as a ``Reply``; the worker's live monitor
(``monitoring``).
"""
