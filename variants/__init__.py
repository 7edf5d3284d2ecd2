"""Variant generation and profiling: from one registered ONNX model to measured variants.

``generator`` builds the artifacts (graph optimisation levels, INT8 quantisation); ``profiler``
measures each one (load latency, latency per batch size, peak memory, accuracy). Both run in
child processes, never in the gateway.
"""
