"""What the gateway reports of the queries it served: EMF metrics and its logger (``metrics``), the
Prometheus endpoint's counters (``prometheus``). Spans (``modelless.tracing``) stay below the
dispatcher, which opens them.
"""
