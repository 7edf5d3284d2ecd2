"""Benchmarks (``scripts/bench``): each part measures one claim and writes docs/bench/<part>.md.
Never shipped: not in the Lambda layer, the functions or the EC2 worker package."""
