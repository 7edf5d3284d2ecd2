"""Pipelines: DAGs of models under one end-to-end latency SLO (InferLine; docs/PIPELINES.md)."""
