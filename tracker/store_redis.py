"""The shared store: everything in Redis, so several tracker replicas serve one swarm view.

Peers live in per-torrent sorted sets scored by their expiry (milliseconds) plus a hash
of their addresses; every key gets a PEXPIRE of one peer TTL on each announce, so a dead
swarm vanishes by itself. An announce is one Lua script (one round trip, atomic).
Leases are `max_holders` slot keys taken with SET NX PX: a holder that dies simply lets
its key expire. Manifests and metainfo are plain keys without expiry (durable as far as
the Redis persistence configuration makes them), with an index by infohash (`ih:<infohash>`, what an
interop-passkey announce needs); a manifest write is one Lua script, so the
check against the set of published repos, the comparison with a stored manifest of the same
commit (a commit's files never change) and the write are atomic across replicas.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from tracker.errors import (
    ConfigError,
    ConflictError,
    ManifestConflictError,
    PublishedRepoError,
    QuarantinedMetainfoError,
    StoreUnavailableError,
)
from tracker.redis_scripts import ANNOUNCE, NOW, TRIM
from tracker.settings import ADDRESS_FULL, PEERS_FULL, SWARMS_FULL, TrackerSettings
from tracker.store import (
    UNREGISTERED,
    AnnounceResult,
    LeaseHolder,
    LeaseState,
    ModelEntry,
    OverLimitError,
    PeerAddr,
    QuarantineRecord,
    Store,
    StoreStats,
    SwarmCounts,
    UnregisteredTorrentError,
)

_LEASE_ACQUIRE = (
    NOW
    + """
-- KEYS[1]: the blob's progress hash (holder -> '<bytes>:<ms when they last changed>'); the rest: slots.
local prog, node, ttl, mode = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
local stale, progress, reclaim = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local function keep()
  if redis.call('PTTL', prog) < ttl then redis.call('PEXPIRE', prog, ttl) end
end
local function holders(granted, taken)
  local out = {granted, taken, now}
  for i = 2, #KEYS do
    local v = redis.call('GET', KEYS[i])
    if v then
      out[#out + 1] = v
      out[#out + 1] = redis.call('PTTL', KEYS[i])
      out[#out + 1] = redis.call('HGET', prog, v) or ''
    end
  end
  return out
end
local function started()
  redis.call('HSET', prog, node, '0:' .. now)
  keep()
end
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == node then
    redis.call('PEXPIRE', KEYS[i], ttl)
    if mode == 'renew' then
      local old = redis.call('HGET', prog, node)
      local had = old and string.match(old, '^(.-):')
      if progress == '' or had ~= progress then
        redis.call('HSET', prog, node, (progress ~= '' and progress or had or '') .. ':' .. now)
      end
      keep()
    else
      started()  -- the holder asking again has started over: its stall clock restarts (as SQLite's)
    end
    return holders(1, 0)
  end
end
if mode == 'renew' then
  for i = 2, math.min(#KEYS, reclaim + 1) do
    if redis.call('SET', KEYS[i], node, 'NX', 'PX', ttl) then
      redis.call('HSET', prog, node, (progress ~= '' and progress or '0') .. ':' .. now)
      keep()
      return holders(1, 0)
    end
  end
  return holders(0, 0)
end
for i = 2, #KEYS do
  if redis.call('SET', KEYS[i], node, 'NX', 'PX', ttl) then started(); return holders(1, 0) end
end
if stale > 0 then
  for i = 2, #KEYS do
    local v = redis.call('GET', KEYS[i])
    local rec = v and redis.call('HGET', prog, v)
    local at = rec and tonumber(string.match(rec, ':(%d+)$'))
    if at and now - at >= stale then
      redis.call('SET', KEYS[i], node, 'PX', ttl)
      redis.call('HDEL', prog, v)
      started()
      return holders(1, 1)
    end
  end
end
return holders(0, 0)
"""
)

_LEASE_RELEASE = """
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    redis.call('HDEL', KEYS[1], ARGV[1])
    return 1
  end
end
return 0
"""

_PUT_METAINFO = """
-- KEYS[3]: the infohash's entry in the index interop announces are checked against (the blob id), set
-- again with the same dict too: an agent registering its blobs again fills it in a store from before it.
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('SET', KEYS[3], ARGV[2])
  return 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[3], ARGV[2])
  return 0
end
return -2
"""

_QUARANTINE = """
local info = redis.call('GET', KEYS[1])
if not info or redis.sha1hex(info) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[4])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
redis.call('RPUSH', KEYS[3], ARGV[2])
redis.call('LTRIM', KEYS[3], -100, -1)
return 1
"""

_PUT_MANIFEST = """
local man, repos, commits, refs, published = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local repo, commit, body, revision, now, role = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local publisher = role == 'publisher'
if not publisher and redis.call('SISMEMBER', published, repo) == 1 then return -1 end
local function same(a, b)
  if #a ~= #b then return false end
  local by_path = {}
  for _, f in ipairs(a) do by_path[f.path] = f end
  for _, f in ipairs(b) do
    local o = by_path[f.path]
    if o == nil or o.size ~= f.size or o.blob_id ~= f.blob_id then return false end
  end
  return true
end
local old = redis.call('GET', man)
if old and not same(cjson.decode(old).files, cjson.decode(body).files) then return -2 end
if old and not publisher then return 0 end
if publisher then redis.call('SADD', published, repo) end
redis.call('SET', man, body)
redis.call('SADD', repos, repo)
if not old then redis.call('ZADD', commits, now, commit) end
if publisher and ARGV[7] == '1' then redis.call('HSET', refs, revision, commit) end
if old then return 0 end
return 1
"""

_REFUSED = {b"swarms": SWARMS_FULL, b"peers": PEERS_FULL, b"address": ADDRESS_FULL}
"""The announce script's refusals, as failure reasons."""

_TRIM_STEP = 1000
"""Expired members `sweep_expired` drops from each tracker-wide set per script call."""

_STATS_PAGE = 2000
"""Swarms whose seeders `stats` counts per round trip."""

_MAX_SLOTS = 64
"""Lease slots probed when reading holders: covers any --max-lease-holders a replica may use."""


class RedisStore(Store):
    def __init__(self, settings: TrackerSettings, prefix: str = "ws:") -> None:
        assert settings.redis_url is not None
        url = settings.redis_url
        try:
            # A synchronous ping at construction turns "wrong URL / Redis down" into one
            # line at startup rather than a failure on the first request.
            probe = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
            try:
                probe.ping()
            finally:
                probe.close()
            # One retry on a fresh connection: after a Redis restart every pooled connection is dead, and
            # without it each failed the request that drew it, at any time later (a seeder's announce
            # failing 40 s on; libtorrent's back-off then left it unlisted). Refused connects still fail
            # in a moment; a black-holed Redis costs twice the connect timeout.
            retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 1)
            self._r = aioredis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10, retry=retry)
        except ValueError as exc:
            raise ConfigError(f"bad --redis URL: {exc}") from None
        except redis.RedisError as exc:
            raise StoreUnavailableError(f"cannot reach Redis at {_redact(url)}: {exc}") from None
        self._p = prefix.encode()
        self._ttl_ms = int(settings.peer_ttl * 1000)
        self._announce = self._r.register_script(ANNOUNCE)
        self._lease = self._r.register_script(_LEASE_ACQUIRE)
        self._release = self._r.register_script(_LEASE_RELEASE)
        self._put_manifest = self._r.register_script(_PUT_MANIFEST)
        self._put_meta = self._r.register_script(_PUT_METAINFO)
        self._quarantine = self._r.register_script(_QUARANTINE)
        self._trim = self._r.register_script(TRIM)
        self._hold_ms = max(1, int(settings.quarantine_hold * 1000))
        self._limits = settings.swarm_limits

    def _k(self, kind: bytes, key: bytes | str) -> bytes:
        return self._p + kind + b":" + (key.encode() if isinstance(key, str) else key)

    # -- swarm ---------------------------------------------------------------------------
    async def announce(
        self, infohash: bytes, peer: PeerAddr, seeder: bool, event: str, numwant: int, agent: bool = True
    ) -> AnnounceResult:
        peer_id, ip, port = peer
        mine, theirs = (b"agent", b"interop") if agent else (b"interop", b"agent")
        keys = [
            self._k(b"s", infohash),
            self._k(b"l", infohash),
            self._k(b"a", infohash),
            self._k(b"d", infohash),
            self._p + b"torrents",
            self._p + b"addresses",
            self._k(b"held:" + mine, ip),
            self._k(b"entries", mine),
            self._k(b"entries", theirs),
            self._k(b"ih", infohash),
        ]
        limits = self._limits
        per_class, per_address = limits.peers_for(agent)
        args = [
            peer_id,
            ip + port.to_bytes(2, "big"),
            b"1" if seeder else b"0",
            event,
            numwant,
            self._ttl_ms,
            infohash,
            b"1" if agent else b"0",
            limits.swarms_for(agent),
            per_class,
            per_address,
            limits.max_peers,
        ]
        complete, incomplete, flat = await self._announce(keys=keys, args=args)
        if int(complete) < 0:
            if _b(incomplete) == b"unregistered":
                raise UnregisteredTorrentError(UNREGISTERED)
            raise OverLimitError(_REFUSED[_b(incomplete)])
        peers: list[PeerAddr] = []
        for i in range(0, len(flat), 2):
            addr = bytes(flat[i + 1])
            peers.append((bytes(flat[i]), addr[:-2], int.from_bytes(addr[-2:], "big")))
        return AnnounceResult(int(complete), int(incomplete), peers)

    async def scrape(self, infohashes: list[bytes]) -> dict[bytes, SwarmCounts]:
        now = await self._now_ms()
        async with self._r.pipeline(transaction=False) as pipe:
            for ih in infohashes:
                pipe.zcount(self._k(b"s", ih), f"({now}", "+inf")
                pipe.zcount(self._k(b"l", ih), f"({now}", "+inf")
                pipe.get(self._k(b"d", ih))
            raw = await pipe.execute()
        return {
            ih: SwarmCounts(int(raw[3 * i]), int(raw[3 * i + 1]), int(raw[3 * i + 2] or 0))
            for i, ih in enumerate(infohashes)
        }

    async def seeder_addresses(self, infohashes: list[bytes]) -> dict[bytes, list[tuple[bytes, int]]]:
        # The seeders' zset is scored by expiry (as scrape counts them); their addresses (packed ip +
        # 2-byte port) are in the swarm's hash. One seeder dropped between the two reads is skipped.
        now = await self._now_ms()
        async with self._r.pipeline(transaction=False) as pipe:
            for ih in infohashes:
                pipe.zrangebyscore(self._k(b"s", ih), f"({now}", "+inf")
            ids = await pipe.execute()
        async with self._r.pipeline(transaction=False) as pipe:
            for ih, peers in zip(infohashes, ids, strict=True):
                if peers:
                    pipe.hmget(self._k(b"a", ih), peers)
            found = iter(await pipe.execute())
        out: dict[bytes, list[tuple[bytes, int]]] = {}
        for ih, peers in zip(infohashes, ids, strict=True):
            addrs = {_b(a) for a in next(found) if a is not None} if peers else set()
            out[ih] = sorted((a[:-2], int.from_bytes(a[-2:], "big")) for a in addrs if len(a) > 2)
        return out

    async def stats(self) -> StoreStats:
        # Live counts by score, and the seeders a page of swarms at a time: never the whole set in this
        # process's memory, nor one long command in Redis's.
        now = await self._now_ms()
        live = (f"({now}", "+inf")
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.zcount(self._p + b"torrents", *live)
            pipe.zcount(self._k(b"entries", b"agent"), *live)
            pipe.zcount(self._k(b"entries", b"interop"), *live)
            torrents, agents, interop = await pipe.execute()
        seeders, start = 0, 0
        while True:
            page = await self._r.zrangebyscore(self._p + b"torrents", *live, start=start, num=_STATS_PAGE)
            if page:
                async with self._r.pipeline(transaction=False) as pipe:
                    for ih in page:
                        pipe.zcount(self._k(b"s", _b(ih)), *live)
                    seeders += sum(await pipe.execute())
            if len(page) < _STATS_PAGE:
                break
            start += _STATS_PAGE
        return StoreStats(int(torrents), int(agents) + int(interop), seeders)

    async def peer_addresses(self) -> list[bytes]:
        key = self._p + b"addresses"
        await self._r.zremrangebyscore(key, "-inf", await self._now_ms())
        return [_b(a) for a in await self._r.zrange(key, 0, -1)]

    async def sweep_expired(self) -> None:
        keys = [
            self._p + b"torrents",
            self._p + b"addresses",
            self._k(b"entries", b"agent"),
            self._k(b"entries", b"interop"),
        ]
        log = logging.getLogger("tracker")
        while True:
            try:
                full = int(await self._trim(keys=keys, args=[_TRIM_STEP])) >= _TRIM_STEP
            except redis.RedisError as exc:  # an outage: the next step tries again
                log.debug("sweep: %s", exc)
                full = False
            await asyncio.sleep(0 if full else 0.5)

    async def _now_ms(self) -> int:
        """Redis's clock, in ms (`tracker.redis_scripts.NOW`)."""
        seconds, micros = await self._r.time()
        return int(seconds) * 1000 + int(micros) // 1000

    # -- metainfo ------------------------------------------------------------------------
    async def put_metainfo(self, blob_id: str, infohash: str, info: bytes) -> bool:
        # One script: the quarantine check and the write are atomic with a report on another replica.
        keys = [
            self._k(b"meta", blob_id),
            self._k(b"quar", f"{blob_id}:{infohash}"),
            self._k(b"ih", bytes.fromhex(infohash)),
        ]
        outcome = int(await self._put_meta(keys=keys, args=[info, blob_id]))
        if outcome == -1:
            raise QuarantinedMetainfoError(blob_id, infohash)
        if outcome == -2:
            raise ConflictError(f"blob {blob_id} already has a different info dict")
        return outcome == 1

    async def get_metainfo(self, blob_id: str) -> tuple[str, bytes] | None:
        info = await self._r.get(self._k(b"meta", blob_id))
        return (hashlib.sha1(_b(info)).hexdigest(), _b(info)) if info is not None else None

    async def quarantine_metainfo(
        self, blob_id: str, infohash: str, reason: str, reporter: str | None, address: str | None
    ) -> bool:
        current = await self.get_metainfo(blob_id)
        if current is None or current[0] != infohash:
            return False
        record = {
            "infohash": infohash,
            "info": current[1].hex(),
            "reason": reason,
            "reporter": reporter,
            "address": address,
            "at": time.time(),
        }
        keys = [
            self._k(b"meta", blob_id),
            self._k(b"quar", f"{blob_id}:{infohash}"),
            self._k(b"qlog", blob_id),
            self._k(b"ih", bytes.fromhex(infohash)),
        ]
        # The script removes the dict only if it is still the reported one (sha1 = infohash).
        args: list[str | int] = [infohash, json.dumps(record), self._hold_ms]
        return bool(int(await self._quarantine(keys=keys, args=args)))

    async def quarantined(self, blob_id: str) -> list[QuarantineRecord]:
        out = []
        for raw in await self._r.lrange(self._k(b"qlog", blob_id), 0, -1):
            r = json.loads(_b(raw))
            info = bytes.fromhex(r["info"])
            out.append(
                QuarantineRecord(r["infohash"], info, r["reason"], r["reporter"], r["address"], r["at"])
            )
        return out

    # -- leases --------------------------------------------------------------------------
    def _slots(self, blob_id: str, n: int) -> list[bytes]:
        """The blob's lease progress hash, then its `n` lease slots (the scripts' KEYS)."""
        return [self._k(b"lprog", blob_id)] + [self._k(b"lease", f"{blob_id}:{i}") for i in range(n)]

    async def _lease_call(
        self,
        blob_id: str,
        node_id: str,
        ttl: float,
        slots: int,
        mode: str,
        stale_after: float | None = None,
        progress: int | None = None,
        reclaim: int = 0,
    ) -> LeaseState:
        args: list[str | int] = [
            node_id,
            int(ttl * 1000),
            mode,
            int(stale_after * 1000) if stale_after else 0,
            "" if progress is None else str(progress),
            reclaim,
        ]
        raw = await self._lease(keys=self._slots(blob_id, slots), args=args)
        holders = []
        now = int(raw[2])
        for i in range(3, len(raw), 3):
            done, _, at = _b(raw[i + 2]).decode().partition(":")
            holders.append(
                LeaseHolder(
                    _b(raw[i]).decode(),
                    round(max(int(raw[i + 1]), 0) / 1000, 3),
                    int(done) if done else None,
                    round(max(now - int(at), 0) / 1000, 3) if at else None,
                )
            )
        holders.sort(key=lambda h: h.expires_in)
        return LeaseState(bool(int(raw[0])), holders, taken_over=int(raw[1]))

    async def acquire_lease(
        self, blob_id: str, node_id: str, ttl: float, max_holders: int, stale_after: float | None = None
    ) -> LeaseState:
        return await self._lease_call(blob_id, node_id, ttl, max_holders, "acquire", stale_after=stale_after)

    async def renew_lease(
        self, blob_id: str, node_id: str, ttl: float, progress: int | None = None, reclaim: int = 0
    ) -> LeaseState:
        return await self._lease_call(
            blob_id, node_id, ttl, _MAX_SLOTS, "renew", progress=progress, reclaim=reclaim
        )

    async def release_lease(self, blob_id: str, node_id: str) -> bool:
        return bool(await self._release(keys=self._slots(blob_id, _MAX_SLOTS), args=[node_id]))

    async def lease_holders(self, blob_id: str) -> list[LeaseHolder]:
        state = await self._lease_call(blob_id, "\0", 1, _MAX_SLOTS, "renew")
        return state.holders

    # -- manifests -----------------------------------------------------------------------
    async def put_manifest(
        self,
        repo_id: str,
        commit: str,
        manifest: dict[str, Any],
        revision: str | None,
        *,
        publisher: bool = False,
    ) -> bool:
        # One script: the published check, the comparison and the write are atomic across replicas.
        keys = [
            self._k(b"man", f"{repo_id}@{commit}"),
            self._p + b"repos",
            self._k(b"commits", repo_id),
            self._k(b"refs", repo_id),
            self._p + b"published",
        ]
        args = [
            repo_id,
            commit,
            json.dumps({**manifest, "published": publisher}, sort_keys=True),
            revision or "",
            repr(time.time()),
            "publisher" if publisher else "agent",
            "1" if revision is not None else "0",
        ]
        outcome = int(await self._put_manifest(keys=keys, args=args))
        if outcome == -1:
            raise PublishedRepoError(repo_id)
        if outcome == -2:
            raise ManifestConflictError(repo_id, commit)
        return outcome == 1

    async def get_manifest(self, repo_id: str, commit: str) -> dict[str, Any] | None:
        body = await self._r.get(self._k(b"man", f"{repo_id}@{commit}"))
        return _manifest(body) if body is not None else None

    async def resolve(self, repo_id: str, revision: str) -> str | None:
        # Only the publisher moves refs; the check also hides refs agents wrote before that rule.
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.sismember(self._p + b"published", repo_id)
            pipe.hget(self._k(b"refs", repo_id), revision)
            published, commit = await pipe.execute()
        return _b(commit).decode() if published and commit is not None else None

    async def list_models(self) -> list[ModelEntry]:
        out = []
        published = {_b(r).decode() for r in await self._r.smembers(self._p + b"published")}
        for repo in sorted(_b(r).decode() for r in await self._r.smembers(self._p + b"repos")):
            commits = [_b(c).decode() for c in await self._r.zrange(self._k(b"commits", repo), 0, -1)]
            bodies = await self._r.mget([self._k(b"man", f"{repo}@{c}") for c in commits]) if commits else []
            refs = await self._r.hgetall(self._k(b"refs", repo))
            out.append(
                ModelEntry(
                    repo,
                    {_b(k).decode(): _b(v).decode() for k, v in refs.items()} if repo in published else {},
                    {c: _manifest(b) for c, b in zip(commits, bodies, strict=True) if b is not None},
                    published=repo in published,
                )
            )
        return out

    # -- lifecycle -----------------------------------------------------------------------
    async def ping(self) -> None:
        await self._r.ping()

    async def epoch(self) -> str:
        # The key lives as long as Redis keeps its data: a restart without persistence (or a flush)
        # loses it with the swarm state, and the first replica to ask writes a new one.
        key = self._p + b"epoch"
        await self._r.set(key, secrets.token_hex(8), nx=True)
        return _b(await self._r.get(key)).decode()

    async def close(self) -> None:
        await self._r.aclose()


T = TypeVar("T")


def _unavailable_on_redis_errors(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """A Redis that is down or restarting is the store being unavailable (503, a failure reason for
    announces), not an unexpected error: a 500 with a traceback per request while it restarts."""

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> T:
        try:
            return await method(*args, **kwargs)
        except redis.RedisError as exc:
            raise StoreUnavailableError(f"Redis unreachable: {exc}") from None

    return call


for _name in Store.__abstractmethods__ - {"close"}:
    setattr(RedisStore, _name, _unavailable_on_redis_errors(getattr(RedisStore, _name)))


def _b(value: Any) -> bytes:
    """Redis replies are bytes (decode_responses is off); typeshed only knows bytes | str."""
    return value if isinstance(value, bytes) else str(value).encode()


def _manifest(body: Any) -> dict[str, Any]:
    """A stored manifest; keys written before roles (or signatures) existed lack `published` (they
    were not) and `signature`."""
    manifest = dict(json.loads(_b(body)))
    manifest.setdefault("published", False)
    manifest.setdefault("signature", None)
    return manifest


def _redact(url: str) -> str:
    """The URL without its password (redis://:secret@host → redis://***@host)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url
