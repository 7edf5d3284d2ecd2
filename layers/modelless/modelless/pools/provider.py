"""What the pool providers share: how the scaler's plan becomes running workers.

The interface the scaler drives is ``modelless.scaling.provider.PoolProvider``; its two backends
are ``modelless.pools.local`` (real worker processes on this machine) and ``modelless.pools.aws``
(an EC2 Auto Scaling group per pool, driven through its desired capacity, scale-in choosing which
instances leave). Both make the workers hold the plan's variant instances the same way:
``InstancePlacer`` calls each worker's own HTTP API (``GET /stats``, ``POST /unload``,
``POST /load`` of ``modelless.worker.server``) at the address the worker advertises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
from aws_lambda_powertools import Logger

from modelless.types import InstanceStats, VariantProfile, WorkerState

logger = Logger(service="pools")


# How long one ``POST /unload`` waits for the instance's queries to finish before it answers
# "draining" (its slot is then freed a little later, and loaded on a later tick). Queries on an
# instance take milliseconds to a few hundred; a plan is applied every scaler period.
DRAIN_WAIT_S = 2.0


class InstancePlacer:
    """Makes a pool's workers hold a plan's instances, through each worker's HTTP API."""

    def __init__(self, timeout_s: float = 30.0, drain_wait_s: float = DRAIN_WAIT_S) -> None:
        self._client = httpx.Client(timeout=max(timeout_s, drain_wait_s + 5.0))
        self._drain_wait_s = drain_wait_s

    def place(
        self,
        addresses: Mapping[str, str],
        instances: Mapping[str, int],
        profiles: Mapping[str, VariantProfile],
    ) -> dict[str, int]:
        """Make the workers at ``addresses`` (worker id -> ``http://host:port``) hold ``instances``
        (variant id -> instances): unload the instances the plan does not want, busy or not, the
        least busy first, then load what is missing into the workers with the most free slots.
        Returns what could not be placed (variant id -> instances short).

        A busy instance is drained, not dropped: its worker stops taking queries for it (they
        are retried elsewhere), finishes those it holds, then frees the slot. When that takes
        longer than ``drain_wait_s`` the slot is not free yet: what the plan wants there is
        loaded by a later call. The plan is what decides (the scaler already holds an instance it
        no longer wants for at least its load time): waiting for an instance to go idle would
        wait forever under model-less traffic, which reaches every loaded instance."""
        workers = {worker_id: self.stats(address) for worker_id, address in addresses.items()}
        live = {worker_id: stats for worker_id, stats in workers.items() if stats is not None}
        have: dict[str, int] = {}
        for stats in live.values():
            for instance in stats.instances:
                have[instance.variant_id] = have.get(instance.variant_id, 0) + 1
        free = {worker_id: stats.free_slots for worker_id, stats in live.items()}
        # Where each worker says it is reached (its advertised address), as the dispatcher reaches it.
        reach = {worker_id: stats.address or addresses[worker_id] for worker_id, stats in live.items()}

        def busyness(held: tuple[str, InstanceStats]) -> tuple[int, float, float, str]:
            worker_id, instance = held
            return (instance.queue_length, instance.qps, instance.utilisation, worker_id)

        surplus = sorted(
            (
                (worker_id, instance)
                for worker_id, stats in live.items()
                for instance in stats.instances
                if have[instance.variant_id] > instances.get(instance.variant_id, 0)
            ),
            key=busyness,
        )
        # The freed slots are for the plan's missing instances, if any: the worker then keeps a
        # drained variant from taking its slot back on demand (queries sent from older views).
        reserve = any(
            have.get(variant_id, 0) < wanted and variant_id in profiles
            for variant_id, wanted in instances.items()
        )
        for worker_id, instance in surplus:
            variant_id = instance.variant_id
            if have[variant_id] <= instances.get(variant_id, 0):
                continue  # enough of its kind already leaving
            body = {"variant_id": variant_id, "wait_s": self._drain_wait_s, "reserve": reserve}
            reply = self._post(reach[worker_id], "/unload", body)
            if reply is None:
                continue
            have[variant_id] -= 1
            if not reply.get("draining"):
                free[worker_id] += 1

        holders = {worker_id: {i.variant_id for i in stats.instances} for worker_id, stats in live.items()}
        short: dict[str, int] = {}
        for variant_id, wanted in sorted(instances.items()):
            profile = profiles.get(variant_id)
            while have.get(variant_id, 0) < wanted and profile is not None:
                room = [w for w in live if free[w] > 0 and variant_id not in holders[w]]
                if not room:
                    break
                target = max(room, key=lambda w: (free[w], w))
                if self._post(reach[target], "/load", {"variant": profile.to_json()}) is None:
                    free[target] = 0  # it refused (full, or going away): try the next worker
                    continue
                have[variant_id] = have.get(variant_id, 0) + 1
                free[target] -= 1
                holders[target].add(variant_id)
            if have.get(variant_id, 0) < wanted:
                short[variant_id] = wanted - have.get(variant_id, 0)
        return short

    def stats(self, address: str) -> WorkerState | None:
        """The worker's own view of itself (``GET /stats``); None when it does not answer."""
        try:
            response = self._client.get(f"{address}/stats")
            response.raise_for_status()
            return WorkerState.from_json(response.json()["state"])
        except (httpx.HTTPError, KeyError, ValueError) as error:
            logger.warning("worker stats unavailable", extra={"address": address, "error": str(error)})
            return None

    def _post(self, address: str, path: str, body: Mapping[str, object]) -> dict[str, Any] | None:
        """The worker's reply to a POST, or None when it did not answer or refused."""
        try:
            response = self._client.post(f"{address}{path}", json=body)
        except httpx.HTTPError as error:
            logger.warning(
                "worker did not answer", extra={"address": address, "path": path, "error": str(error)}
            )
            return None
        if response.status_code >= 400:
            logger.warning(
                "worker refused", extra={"address": address, "path": path, "status": response.status_code}
            )
            return None
        try:
            reply = response.json()
        except ValueError:
            return {}
        return reply if isinstance(reply, dict) else {}

    def close(self) -> None:
        self._client.close()
