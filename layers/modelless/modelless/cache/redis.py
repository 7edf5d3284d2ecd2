"""The prediction cache in Redis: shared by every gateway process and offline runner using it.

Each entry is a string key; a sorted set scores the keys by their last use on the cache's own
logical clock (a counter, so that machines' clocks never disagree about which is older), and a
hash keeps the bytes held and the counters. Lookups and writes are Lua scripts, each one atomic
round trip: a lookup reads the entries and marks the found ones used; a write stores its entries,
adds their size, then evicts the least recently used until the bytes held are within budget.

The scripts touch keys they are not handed (the evicted ones): fine on one Redis server or a
replicated one (ElastiCache without cluster mode), not on Redis Cluster.

An unreachable Redis raises ``StoreUnavailableError`` at once after the first failure, until a
probe finds it back (the metadata store's ``_Outage``): a stopped Redis costs a query one timeout,
not one per query; the caller answers such a query as a miss.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import ClassVar, TypeVar

import redis

from modelless.cache.base import CacheStats
from modelless.metadata.keys import KeySpace
from modelless.metadata.redis import _Outage, _where, connect, outage_checked

T = TypeVar("T")

# KEYS: lru, clock, then the entries. Returns each entry's value (nil where absent).
GET_SCRIPT = """
local found = {}
local tick = nil
for i = 3, #KEYS do
  local value = redis.call('GET', KEYS[i])
  if value then
    if not tick then tick = redis.call('INCR', KEYS[2]) end
    redis.call('ZADD', KEYS[1], tick, KEYS[i])
    found[i - 2] = value
  else
    found[i - 2] = false
  end
end
return found
"""

# KEYS: lru, clock, stats, then the entries; ARGV: max bytes, the length of the entries' key
# prefix (a key counts as the cache's own name for it, as in every backend), then the values.
# Returns how many entries were evicted.
PUT_SCRIPT = """
local budget = tonumber(ARGV[1])
local prefix = tonumber(ARGV[2])
local tick = redis.call('INCR', KEYS[2])
local used = tonumber(redis.call('HGET', KEYS[3], 'bytes') or '0')
for i = 4, #KEYS do
  local key = KEYS[i]
  local value = ARGV[i - 1]
  local old = redis.call('STRLEN', key)
  if old > 0 then used = used - old - (#key - prefix) end
  redis.call('SET', key, value)
  redis.call('ZADD', KEYS[1], tick, key)
  used = used + #value + (#key - prefix)
end
local evicted = 0
while used > budget do
  local oldest = redis.call('ZPOPMIN', KEYS[1])
  if #oldest == 0 then
    used = 0
    break
  end
  local key = oldest[1]
  local size = redis.call('STRLEN', key)
  if size > 0 then used = used - size - (#key - prefix) end
  redis.call('DEL', key)
  evicted = evicted + 1
end
if redis.call('ZCARD', KEYS[1]) == 0 then used = 0 end
redis.call('HSET', KEYS[3], 'bytes', used)
if evicted > 0 then redis.call('HINCRBY', KEYS[3], 'evictions', evicted) end
return evicted
"""


class RedisPredictionCache:
    kind: ClassVar[str] = "redis"

    def __init__(self, client: redis.Redis, max_bytes: int, keys: KeySpace | None = None) -> None:  # type: ignore[type-arg]
        self._redis = client
        self.max_bytes = max_bytes
        self.keys = keys or KeySpace()
        self._outage = _Outage(client, f"prediction cache at {_where(client)}")
        self._get = client.register_script(GET_SCRIPT)
        self._put = client.register_script(PUT_SCRIPT)

    @classmethod
    def from_url(cls, url: str, max_bytes: int) -> RedisPredictionCache:
        """``redis://host:port/db?prefix=name:``, as the metadata store reads it."""
        client, keys = connect(url)
        return cls(client, max_bytes, keys)

    def _fixed_keys(self) -> list[str]:
        return [self.keys.prediction_lru(), self.keys.prediction_clock()]

    @outage_checked
    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        found = self._get(keys=[*self._fixed_keys(), *(self.keys.prediction(k) for k in keys)])
        return [value if isinstance(value, bytes) else None for value in found]

    @outage_checked
    def put(self, entries: Mapping[str, bytes]) -> None:
        if not entries:
            return
        self._put(
            keys=[
                *self._fixed_keys(),
                self.keys.prediction_stats(),
                *(self.keys.prediction(k) for k in entries),
            ],
            args=[self.max_bytes, len(self.keys.prediction("").encode()), *entries.values()],
        )

    @outage_checked
    def record(self, hits: int, misses: int) -> None:
        with self._redis.pipeline(transaction=False) as pipe:
            if hits:
                pipe.hincrby(self.keys.prediction_stats(), "hits", hits)
            if misses:
                pipe.hincrby(self.keys.prediction_stats(), "misses", misses)
            pipe.execute()

    @outage_checked
    def stats(self) -> CacheStats:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self.keys.prediction_stats())
            pipe.zcard(self.keys.prediction_lru())
            counters, entries = pipe.execute()

        def counter(name: str) -> int:
            return int(counters.get(name.encode(), 0))

        return CacheStats(
            self.kind,
            counter("hits"),
            counter("misses"),
            counter("evictions"),
            int(entries),
            counter("bytes"),
            self.max_bytes,
        )

    @outage_checked
    def clear(self) -> None:
        entries = self.keys.prediction("*")
        for batch in _batched(self._redis.scan_iter(match=entries, count=1000), 1000):
            self._redis.delete(*batch)
        self._redis.delete(
            self.keys.prediction_lru(), self.keys.prediction_clock(), self.keys.prediction_stats()
        )

    def close(self) -> None:
        self._outage.close()
        self._redis.close()


def _batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
