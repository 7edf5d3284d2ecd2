"""The gateway's dispatch of online queries, in the parts Ray Serve splits a router into:

- ``router``: the ``Dispatcher``, which selects (the policy of ``modelless.selection``, a pure
  function, over the two views below) and hands the decision to the attempt loop; warm-ups;
- ``profiles``: the profile cache (parsed profiles, per-target candidate lists, input contracts);
- ``live_view``: the live view of the workers (the store's snapshot, this gateway's recent
  variant loads and queries in flight laid over it, workers held out after a failure);
- ``attempts``: a query's clock, its attempts, retries and deadline, and their errors' messages.

The router counts each query for its group in ``modelless.query_load`` (outside this package: the
scaler reads those groups and must not import the gateway's router).

"Load" alone means a variant's load onto a worker; query traffic is "query load".
"""

from modelless.dispatch.attempts import ATTEMPT_GRACE_S, DEADLINE_GRACE_S, MAX_INVOKE_TIMEOUT_S
from modelless.dispatch.live_view import LIVE_STATE_TTL_S, SATURATED_IN_FLIGHT
from modelless.dispatch.router import Dispatcher, QueryResult

__all__ = [
    "ATTEMPT_GRACE_S",
    "DEADLINE_GRACE_S",
    "LIVE_STATE_TTL_S",
    "MAX_INVOKE_TIMEOUT_S",
    "SATURATED_IN_FLIGHT",
    "Dispatcher",
    "QueryResult",
]
