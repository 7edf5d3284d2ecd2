"""The embedded stack on one machine: gateway, worker processes, local Lambda containers, demo."""
