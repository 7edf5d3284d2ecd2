"""The simulator: a discrete-event model of the whole system that runs the project's own policy,
batching, monitoring and scaler code. For sizing a deployment from a trace (``python -m sim``,
``sim.cli``) and for the cost study (``bench/costs.py``). Not shipped to Lambda or the workers."""
