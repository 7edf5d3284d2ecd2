"""What callers send, read strictly and within limits: query bodies (``bodies``), ``.npy``/``.npz``
archives (``archives``), images (``preprocessing``) and the structured batch layout
(``tensors``).
"""
