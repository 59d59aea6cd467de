"""The store for many machines: entries as Redis hashes, each change one Lua script."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from fluid_build.copilot.health.budget import (
    IDLE_FORGET,
    BudgetSpec,
    BudgetState,
    Reservation,
    _Book,
)
from fluid_build.copilot.health.store import (
    LONGEST,
    MAX_ENTRIES,
    MOST,
    StoreEntry,
    sane_entry,
    valid_seconds,
    without_password,
)

if TYPE_CHECKING:
    import redis

__all__ = ["RedisBudgetLedger", "RedisCooldownStore"]


# Each entry is a Redis hash: its end (``until``, wall-clock seconds, as every
# store keeps it), when it began, a counter, a lease owner and a note. Every
# change is one Lua script, so it is atomic across the fleet. The key's Redis
# TTL only cleans up: it outlives ``until`` by a minute, for readers whose
# clocks run a little behind. ARGV[1] is always the caller's ``now``.
#
# Every script reads its entry through ``read``: a key under fluid's prefix that is
# not a hash, or a hash whose end or counter is not a number fluid writes (text,
# nan, inf, past a day ahead, a negative count), is not fluid's entry: it is
# deleted and the script goes on as if nothing were there.
_READ: Final = f"""
local function read(key, now)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then return 0 end
  if kind ~= 'hash' then redis.call('DEL', key) return 0 end
  local til = tonumber(redis.call('HGET', key, 'until') or '')
  local n = redis.call('HGET', key, 'n')
  local count = tonumber(n or '0')
  if til == nil or til ~= til or til > now + {LONGEST!r} or til < -{LONGEST!r} * 1e6
     or count == nil or count ~= count or count < 0 or count > {MOST}
     or math.floor(count) ~= count then
    redis.call('DEL', key)
    return 0
  end
  return til
end
"""
_REDIS_EXTEND: Final = (
    _READ
    + """
local now = tonumber(ARGV[1])
local want = now + tonumber(ARGV[2])
local til = read(KEYS[1], now)
if til <= now then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'since', ARGV[1])
  til = 0
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'note', ARGV[3]) end
if til >= want then return tostring(til - now) end
redis.call('HSET', KEYS[1], 'until', tostring(want))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 60000)
return tostring(want - now)
"""
)
_REDIS_CAP: Final = (
    _READ
    + """
local now = tonumber(ARGV[1])
local want = now + tonumber(ARGV[2])
local til = read(KEYS[1], now)
if til > want then
  redis.call('HSET', KEYS[1], 'until', tostring(want))
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 60000)
end
return 0
"""
)
_REDIS_INCR: Final = (
    _READ
    + """
local now = tonumber(ARGV[1])
local til = read(KEYS[1], now)
if til <= now or redis.call('HEXISTS', KEYS[1], 'owner') == 1 then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'since', ARGV[1])
end
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'note', ARGV[3]) end
redis.call('HSET', KEYS[1], 'until', tostring(now + tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 60000)
return n
"""
)
_REDIS_ACQUIRE: Final = (
    _READ
    + """
local now = tonumber(ARGV[1])
local til = read(KEYS[1], now)
local held = redis.call('HGET', KEYS[1], 'owner')
if til > now and held and held ~= ARGV[3] then return 0 end
if not (til > now and held == ARGV[3]) then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'owner', ARGV[3], 'since', ARGV[1])
end
redis.call('HSET', KEYS[1], 'until', tostring(now + tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 60000)
return 1
"""
)
# ARGV: now, amount, limit ('' for none), ttl. Returns {granted, left}; left -1: unknown.
_REDIS_TAKE: Final = (
    _READ
    + """
local now = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
local til = read(KEYS[1], now)
if til <= now then
  if ARGV[3] == '' or amount < 0 then return {1, -1} end
  local left = math.max(tonumber(ARGV[3]) - amount, 0)
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'since', ARGV[1], 'n', left,
             'until', tostring(now + tonumber(ARGV[4])))
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[4]) * 1000) + 60000)
  return {1, left}
end
local held = tonumber(redis.call('HGET', KEYS[1], 'n') or '0') or 0
if amount > held then return {0, held} end
local left = held - amount
if ARGV[3] ~= '' and amount < 0 then left = math.min(left, math.max(tonumber(ARGV[3]), 0)) end
redis.call('HSET', KEYS[1], 'n', left)
return {1, left}
"""
)
# ARGV: now, value, ttl. Never raises a live budget; returns what is left.
_REDIS_PUT: Final = (
    _READ
    + """
local now = tonumber(ARGV[1])
local value = tonumber(ARGV[2])
local til = read(KEYS[1], now)
if til > now then
  value = math.min(tonumber(redis.call('HGET', KEYS[1], 'n') or '0') or 0, value)
else
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'since', ARGV[1])
end
redis.call('HSET', KEYS[1], 'n', value, 'until', tostring(now + tonumber(ARGV[3])))
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000) + 60000)
return value
"""
)
_REDIS_RELEASE: Final = """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return redis.call('DEL', KEYS[1]) end
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# A read found something that is not fluid's entry: delete it, unless a writer
# replaced it meanwhile. ARGV[1]: the ``until`` text read, or _WRONG_TYPE.
_REDIS_PURGE: Final = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then return 0 end
if kind ~= 'hash' then return redis.call('DEL', KEYS[1]) end
if ARGV[1] ~= '' and (redis.call('HGET', KEYS[1], 'until') or '') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_WRONG_TYPE: Final = ""


class RedisCooldownStore:
    """Entries as Redis hashes, shared by every machine on one Redis.

    Like the other stores it keeps each entry's end in wall-clock seconds, so
    the machines' clocks should agree (NTP); a skewed writer can never make
    a reader wait past the cap the reader applies (see :func:`trusted`).
    """

    # Before entries were hashes with a lifetime; ``clear`` removes these too.
    LEGACY_PREFIX: Final = "fluid:cooldown:"

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        prefix: str = "fluid:health:",
        timeout: float = 0.5,
    ) -> None:
        owned = client is None  # a client it made is its own to close; a given one is not
        if client is None:
            import redis as redis_lib  # only a Redis store needs it

            if url is None:
                raise ValueError("RedisCooldownStore needs a url or a client")
            client = redis_lib.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout
            )
        self._client = client
        self._owned = owned
        self._prefix = prefix
        scripts = (
            _REDIS_EXTEND,
            _REDIS_CAP,
            _REDIS_INCR,
            _REDIS_ACQUIRE,
            _REDIS_RELEASE,
            _REDIS_TAKE,
            _REDIS_PUT,
            _REDIS_PURGE,
        )
        (
            self._extend,
            self._cap,
            self._incr,
            self._acquire,
            self._release,
            self._take,
            self._put,
            self._purge,
        ) = (client.register_script(script) for script in scripts)
        self._url = without_password(url) if url else repr(client)
        self._ledger: RedisBudgetLedger | None = None

    def remaining(self, key: str, now: float) -> float:
        return self.peek([key], now)[0][0]

    def close(self) -> None:
        """Close the connections of the Redis client this store made from its URL (a
        later operation opens new ones); a client passed in is left to its owner."""
        if self._owned:
            self._client.close()

    def peek(self, keys: Sequence[str], now: float) -> list[tuple[float, int]]:
        import redis as redis_lib

        replies: list[Any]
        if len(keys) == 1:
            try:
                replies = [self._client.hmget(self._prefix + keys[0], "until", "n")]
            except redis_lib.ResponseError as exc:  # WRONGTYPE: not a hash
                replies = [exc]
        else:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(self._prefix + key, "until", "n")
            replies = pipe.execute(raise_on_error=False)
        out = []
        for key, reply in zip(keys, replies, strict=True):
            if isinstance(reply, Exception):
                self._drop(key, reply)
                out.append((0.0, 0))
                continue
            until, n = (_text(value) for value in reply)
            if until is None:
                out.append((0.0, 0))
                continue
            end, count = _float(until, math.nan), _count(n)
            if count is None or not sane_entry(end, now, count, now):
                self._drop(key, until)
                out.append((0.0, 0))
                continue
            out.append((end - now, count) if end > now else (0.0, 0))
        return out

    def _drop(self, key: str, seen: str | Exception) -> None:
        """Delete what a read found at ``key`` that is not fluid's entry (skipped meanwhile)."""
        if isinstance(seen, Exception) and "WRONGTYPE" not in str(seen):
            raise seen
        mark = _WRONG_TYPE if isinstance(seen, Exception) else seen
        self._purge(keys=[self._prefix + key], args=[mark])

    def extend(self, key: str, seconds: float, now: float, note: str = "") -> float:
        if not valid_seconds(seconds):
            return self.remaining(key, now)
        left = self._extend(keys=[self._prefix + key], args=[repr(now), repr(seconds), note])
        return max(_float(_text(left), 0.0), 0.0)

    def cap(self, key: str, seconds: float, now: float) -> None:
        self._cap(keys=[self._prefix + key], args=[repr(now), repr(max(seconds, 0.0))])

    def incr(self, key: str, ttl: float, now: float, note: str = "") -> int:
        ttl = max(ttl, 0.001)
        return int(self._incr(keys=[self._prefix + key], args=[repr(now), repr(ttl), note]))

    def count(self, key: str, now: float) -> int:
        return self.peek([key], now)[0][1]

    def take(
        self, key: str, amount: int, limit: int | None, ttl: float, now: float
    ) -> tuple[bool, int | None]:
        args = [repr(now), str(int(amount)), "" if limit is None else str(int(limit))]
        granted, left = self._take(keys=[self._prefix + key], args=[*args, repr(max(ttl, 0.001))])
        return bool(granted), None if int(left) < 0 else int(left)

    def put(self, key: str, value: int, ttl: float, now: float) -> int:
        if not valid_seconds(ttl):
            return self.count(key, now)
        args = [repr(now), str(max(int(value), 0)), repr(ttl)]
        return int(self._put(keys=[self._prefix + key], args=args))

    def acquire(self, key: str, owner: str, ttl: float, now: float) -> bool:
        ttl = max(ttl, 0.001)
        return bool(self._acquire(keys=[self._prefix + key], args=[repr(now), repr(ttl), owner]))

    def release(self, key: str, owner: str) -> None:
        self._release(keys=[self._prefix + key], args=[owner])

    def delete(self, *keys: str) -> None:
        if keys:
            self._client.delete(*(self._prefix + key for key in keys))

    def _scan(self, prefix: str) -> list[bytes]:
        pattern = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in prefix) + "*"
        found: list[bytes] = []
        for name in self._client.scan_iter(match=pattern, count=1000):
            found.append(name)
            if len(found) >= MAX_ENTRIES:
                break
        return found

    def entries(self, now: float) -> list[StoreEntry]:
        names = self._scan(self._prefix)
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        replies = pipe.execute(raise_on_error=False) if names else []
        out: list[StoreEntry] = []
        sane_now = max(now, time.time())  # ``now`` may be -1: every entry, ended ones too
        for name, fields in zip(names, replies, strict=True):
            key = (_text(name) or "")[len(self._prefix) :]
            if isinstance(fields, Exception):
                self._drop(key, fields)
                continue
            text = {_text(k) or "": _text(v) for k, v in fields.items()}
            until = _float(text.get("until"), math.nan)
            since = _float(text.get("since"), math.nan)
            count = _count(text.get("n"))
            if count is None or not sane_entry(until, since, count, sane_now):
                self._drop(key, text.get("until") or "")
                continue
            if until <= now:
                continue
            owner, note = text.get("owner"), text.get("note") or ""
            out.append(StoreEntry(key, until, since, count, owner, note))
        return sorted(out, key=lambda entry: entry.key)

    def clear(self) -> int:
        names = self._scan(self._prefix) + self._scan(self.LEGACY_PREFIX)
        if names:
            self._client.delete(*names)
        return len(names)

    def budget_ledger(self) -> RedisBudgetLedger:
        """The budgets kept on this Redis, under their own prefix (see :mod:`.budget`)."""
        if self._ledger is None:
            self._ledger = RedisBudgetLedger(self._client)
        return self._ledger

    def __repr__(self) -> str:
        return f"RedisCooldownStore({self._url!r})"


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _count(text: str | None) -> int | None:
    """A counter as stored (absent: 0), or None when it is not a whole number fluid writes."""
    if text is None:
        return 0
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 <= value <= MOST else None


def _float(text: str | None, default: float) -> float:
    try:
        value = float(text) if text is not None else default
    except ValueError:
        return default
    return value if math.isfinite(value) else default


# Budgets are hashes under their own prefix (``fluid:budget:<name>``): a budget
# lasts a month or until reset, so the one-day sanity cap and the entry cap of
# ``fluid:health:`` never touch them. Fields: lim, win, ends ('' for none), spent,
# and one ``h:<id>`` = "<amount> <expires>" per live reservation. Amounts are
# whole micro-USD (exact in Lua's doubles up to 2^53).
#
# Every time here is the Redis server's (TIME), never a host's: a host whose clock
# is slow or fast must not end the others' holds early or start a window anew
# for the whole fleet. A window's end is computed in the script from that time,
# on the UTC calendar as :func:`~fluid_build.copilot.health.budget.window_end` does.
_BUDGET_BOOK: Final = f"""
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m > 2) and (m - 3) or (m + 9)
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
local function window_end(win, now)
  if win == 'hour' then return (math.floor(now / 3600) + 1) * 3600 end
  if win == 'day' then return (math.floor(now / 86400) + 1) * 86400 end
  if win ~= 'month' then return nil end
  local z = math.floor(now / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  if m <= 2 then y = y + 1 end
  if m == 12 then y, m = y + 1, 1 else m = m + 1 end
  return days_from_civil(y, m, 1) * 86400
end
local function fresh_end(win, now)
  local ends = window_end(win, now)
  if ends == nil then return '' end
  return string.format('%d', ends)
end
local function book(key, now, win)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= 'hash' then redis.call('DEL', key) end
  local spent = tonumber(redis.call('HGET', key, 'spent') or '')
  if spent == nil or spent ~= spent or spent < 0 or spent > {MOST}
     or math.floor(spent) ~= spent then
    redis.call('DEL', key)
    return nil
  end
  local ends = redis.call('HGET', key, 'ends') or ''
  if win ~= nil then
    if (redis.call('HGET', key, 'win') or '') ~= win then
      redis.call('HSET', key, 'win', win, 'ends', fresh_end(win, now))
    elseif ends ~= '' and now >= tonumber(ends) then
      redis.call('HSET', key, 'spent', 0, 'ends', fresh_end(win, now))
      spent = 0
    end
  end
  local reserved = 0
  local fields = redis.call('HGETALL', key)
  for i = 1, #fields, 2 do
    local name = fields[i]
    if string.sub(name, 1, 2) == 'h:' then
      local amount, expires = string.match(fields[i + 1], '^(%d+) (%S+)$')
      if amount == nil or tonumber(expires) == nil then
        redis.call('HDEL', key, name)
      elseif tonumber(expires) <= now then
        -- A hold that outlived its call is spent whole: its request may have been billed.
        redis.call('HDEL', key, name)
        spent = math.min(spent + tonumber(amount), {MOST})
      else
        reserved = reserved + tonumber(amount)
      end
    end
  end
  redis.call('HSET', key, 'spent', spent)
  return spent, reserved
end
"""
# ARGV: limit, window, amount, hold id, the hold's seconds to live. Returns granted, spent,
# reserved, ends, and the server's time.
_BUDGET_RESERVE: Final = (
    _BUDGET_BOOK
    + """
local now = server_now()
local spent, reserved = book(KEYS[1], now, ARGV[2])
if spent == nil then
  redis.call('HSET', KEYS[1], 'spent', 0, 'win', ARGV[2], 'ends', fresh_end(ARGV[2], now))
  spent, reserved = 0, 0
end
redis.call('HSET', KEYS[1], 'lim', ARGV[1])
local ends = redis.call('HGET', KEYS[1], 'ends') or ''
-- Every budget expires: a day after its window ends, or IDLE_FORGET after its last call.
if ends ~= '' then
  redis.call('PEXPIRE', KEYS[1], math.ceil((tonumber(ends) - now + 86400) * 1000))
else
  redis.call('PEXPIRE', KEYS[1], {IDLE_MS})
end
local stamp = string.format('%.6f', now)
local amount = tonumber(ARGV[3])
if spent + reserved + amount > tonumber(ARGV[1]) then
  return {0, spent, reserved, ends, stamp}
end
local expires = string.format('%.6f', now + tonumber(ARGV[5]))
redis.call('HSET', KEYS[1], 'h:' .. ARGV[4], ARGV[3] .. ' ' .. expires)
return {1, spent, reserved + amount, ends, stamp}
"""
).replace("{IDLE_MS}", str(int(IDLE_FORGET * 1000)))
# ARGV: hold id, amount spent. A hold already gone was counted whole when it ended.
_BUDGET_SETTLE: Final = (
    _BUDGET_BOOK
    + """
local now = server_now()
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local live = redis.call('HEXISTS', KEYS[1], 'h:' .. ARGV[1])
if live == 1 then redis.call('HDEL', KEYS[1], 'h:' .. ARGV[1]) end
local win = redis.call('HGET', KEYS[1], 'win') or ''
local spent = book(KEYS[1], now, win)
if spent == nil or live == 0 then return 0 end
redis.call('HSET', KEYS[1], 'spent', math.min(spent + tonumber(ARGV[2]), {MOST}))
return 1
"""
).replace("{MOST}", str(MOST))


class RedisBudgetLedger:
    """Budgets as Redis hashes under ``fluid:budget:``, each change one Lua script.

    Times are the Redis server's: the ``now`` and ``expires`` a caller passes only
    say how long a hold lives (``expires - now``), so no host's clock decides a
    window or when another host's hold ends.
    """

    def __init__(self, client: redis.Redis, *, prefix: str = "fluid:budget:") -> None:
        self._client = client
        self._prefix = prefix
        self._reserve = client.register_script(_BUDGET_RESERVE)
        self._settle = client.register_script(_BUDGET_SETTLE)

    def reserve(
        self, spec: BudgetSpec, amount: int, hold: str, expires: float, now: float
    ) -> Reservation:
        lives = max(expires - now, 0.0) if math.isfinite(expires - now) else 0.0
        args = [str(spec.limit), spec.window, str(amount), hold, repr(lives)]
        granted, spent, reserved, ends, _ = self._reserve(
            keys=[self._prefix + spec.name], args=args
        )
        end_text = _text(ends) or ""
        state = BudgetState(
            spec.name,
            spec.limit,
            int(spent),
            int(reserved),
            spec.window,
            float(end_text) if end_text else None,
        )
        return Reservation(bool(granted), state)

    def settle(self, name: str, hold: str, amount: int, now: float) -> None:
        self._settle(keys=[self._prefix + name], args=[hold, str(amount)])

    def server_time(self) -> float:
        """The Redis server's clock (wall-clock seconds), which every budget here is kept on."""
        seconds, micros = self._client.time()
        return int(seconds) + int(micros) / 1_000_000

    def states(self, now: float) -> list[BudgetState]:
        now = self.server_time()  # the budgets' own clock, whatever this host's says
        pattern = "".join("\\" + ch if ch in "*?[]\\" else ch for ch in self._prefix) + "*"
        out = []
        for raw in self._client.scan_iter(match=pattern, count=1000):
            name = (_text(raw) or "")[len(self._prefix) :]
            if _text(self._client.type(raw)) != "hash":
                continue  # not a budget fluid wrote
            got = self._client.hgetall(raw).items()
            fields = {_text(k) or "": _text(v) or "" for k, v in got}
            lim, spent = _count(fields.get("lim")), _count(fields.get("spent"))
            if lim is None or spent is None:
                continue
            holds = {}
            for field_name, value in fields.items():
                amount, _, expires = value.partition(" ")
                if field_name.startswith("h:") and amount.isdigit():
                    holds[field_name[2:]] = (int(amount), _float(expires, 0.0))
            ends = _float(fields["ends"], 0.0) if fields.get("ends") else None
            book = _Book(lim, fields.get("win", ""), ends, spent, holds)
            book.roll(book.window, now)
            out.append(book.state(name))
        return sorted(out, key=lambda state: state.name)

    def reset(self, name: str) -> bool:
        return bool(self._client.delete(self._prefix + name))

    def __repr__(self) -> str:
        return f"RedisBudgetLedger({self._client!r})"
