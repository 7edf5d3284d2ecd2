"""Local infrastructure: worker-pool hosts, the local Lambda tier's containers, the embedded stack."""
