# cython: language_level=3
"""The pending-request tables, out of line (see _pending.pxd): growing and rehashing,
full tables, expiry walks, and the process's pending-memory budget.  framing_py.py's
FrameParser keeps the same tables in Python (the twin)."""

from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.string cimport memset
from libc.stdint cimport int32_t, int64_t, uint64_t

import os

# Memory of every connection's pending-request state (map and FIFO capacity, split-header
# buffers), against the process's budget ([proxy] max_pending_bytes, docs/design.md
# "Pending requests").
cdef int64_t _pending_bytes = 0
cdef int64_t _pending_budget = 1LL << 62
# one map slot: the entry and its request-ring slot (framing_common.MAP_ENTRY_BYTES)
cdef int64_t _MAP_SLOT_BYTES = sizeof(MapEntry) + sizeof(int32_t)

# Pending-map seeds: a secret drawn once per process, then one per map by splitmix64.
cdef uint64_t _seed_state = int.from_bytes(os.urandom(8), "little")


cdef uint64_t _next_seed() noexcept:
    global _seed_state
    cdef uint64_t z
    _seed_state += 0x9E3779B97F4A7C15ULL
    z = _seed_state
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


def set_pending_budget(int64_t budget):
    """Most bytes all connections' pending-request tables may hold together; a table
    that would grow past it stays as it is (the request is dropped and counted as
    in_flight_overflow, or a full map evicts its oldest expired entry)."""
    global _pending_budget
    _pending_budget = budget


def pending_bytes():
    """Bytes the pending-request tables of this process hold now."""
    return _pending_bytes


def pending_budget():
    return _pending_budget


cdef bint pending_fits(int64_t more) noexcept:
    return _pending_bytes + more <= _pending_budget


cdef void pending_charge(int64_t delta) noexcept:
    global _pending_bytes
    _pending_bytes += delta


cdef int pt_init(PendingTables* t, Py_ssize_t fifo_limit, Py_ssize_t map_limit) except -1:
    """Empty tables: a FIFO of 8 slots, no map yet (its first request allocates 64)."""
    global _pending_bytes
    memset(t, 0, sizeof(PendingTables))
    t.fifo_cap = 8
    t.fifo = <Pending*>PyMem_Malloc(t.fifo_cap * sizeof(Pending))
    if t.fifo is NULL:
        raise MemoryError()
    _pending_bytes += t.fifo_cap * sizeof(Pending)
    t.fifo_limit = fifo_limit
    t.map_seed = _next_seed()
    t.map_limit = map_limit
    return 0


cdef void pt_free(PendingTables* t) noexcept:
    global _pending_bytes
    if t.fifo is not NULL:
        _pending_bytes -= t.fifo_cap * sizeof(Pending)
    _pending_bytes -= t.map_cap * _MAP_SLOT_BYTES
    PyMem_Free(t.fifo)
    PyMem_Free(t.map)
    PyMem_Free(t.ring)
    t.fifo = NULL
    t.map = NULL
    t.ring = NULL
    t.fifo_cap = t.map_cap = 0


cdef int pt_map_reseed(PendingTables* t) except -1:
    """A probe passed MAP_PROBE_LIMIT: rehash the table, same size, under a new seed."""
    t.map_seed = _next_seed()
    t.map_reseeds += 1
    return pt_map_resize(t, t.map_cap)


cdef int pt_map_resize(PendingTables* t, Py_ssize_t new_cap) except -1:
    """Rehash into ``new_cap`` slots (0 frees the table; the map must be empty then),
    keeping the request order (the new ring holds no answered slots); 1 when growing
    would pass the pending budget."""
    global _pending_bytes
    cdef Py_ssize_t old_cap = t.map_cap, i, j, mask, omask = t.map_cap - 1
    cdef int64_t r, w = 0, live = -1
    cdef MapEntry* old = t.map
    cdef MapEntry* new = NULL
    cdef int32_t* ring = NULL
    if new_cap > old_cap and _pending_bytes + (new_cap - old_cap) * _MAP_SLOT_BYTES \
            > _pending_budget:
        return 1
    if new_cap:
        new = <MapEntry*>PyMem_Malloc(new_cap * sizeof(MapEntry))
        ring = <int32_t*>PyMem_Malloc(new_cap * sizeof(int32_t))
        if new is NULL or ring is NULL:
            PyMem_Free(new)
            PyMem_Free(ring)
            raise MemoryError()
        memset(new, 0, new_cap * sizeof(MapEntry))
    if t.ring_live < t.ring_head:
        t.ring_live = t.ring_head
    mask = new_cap - 1
    for r in range(t.ring_head, t.ring_tail):   # oldest first: the order is kept
        if r == t.ring_live:
            live = w
        i = t.ring[r & omask]
        if i < 0:
            continue                       # answered since
        j = _mix(t.map_seed, old[i].tag, <uint64_t>old[i].p.key) & mask
        while new[j].used:
            j = (j + 1) & mask
        new[j] = old[i]
        new[j].used = <int32_t>(w + 1)
        ring[w] = <int32_t>j
        w += 1
    t.ring_head = 0
    t.ring_tail = w
    t.ring_live = live if live >= 0 else w
    PyMem_Free(old)
    PyMem_Free(t.ring)
    t.map = new
    t.ring = ring
    t.map_cap = new_cap
    _pending_bytes += (new_cap - old_cap) * _MAP_SLOT_BYTES
    return 0


cdef void pt_ring_compact(PendingTables* t) noexcept:
    """The request ring is full: drop the answered slots at its head and, when that
    frees less than half, squeeze out the others, in place, keeping the order (the
    map holds at most map_cap / 2 entries, so half the ring frees)."""
    cdef Py_ssize_t mask = t.map_cap - 1
    cdef int64_t r, w, live = -1, h = t.ring_head, tl = t.ring_tail
    cdef int32_t i
    cdef int32_t* ring = t.ring
    # answers mostly come in request order: dropping the answered head is enough
    while h < tl and ring[h & mask] < 0:
        h += 1
    t.ring_head = h
    if t.ring_live < t.ring_head:
        t.ring_live = t.ring_head
    if (t.ring_tail - t.ring_head) * 2 <= t.map_cap:
        return
    w = t.ring_head
    for r in range(t.ring_head, t.ring_tail):
        if r == t.ring_live:
            live = w
        i = t.ring[r & mask]
        if i >= 0:
            t.ring[w & mask] = i
            t.map[i].used = <int32_t>((w & mask) + 1)
            w += 1
    t.ring_live = live if live >= 0 else w
    t.ring_tail = w


cdef bint pt_has_expired(PendingTables* t) noexcept:
    """Whether the map holds a request already counted as a timeout (the ring's
    answered head slots are dropped on the way)."""
    cdef Py_ssize_t rmask = t.map_cap - 1
    if t.map_cap == 0:
        return 0
    if t.ring_live < t.ring_head:
        t.ring_live = t.ring_head
    while t.ring_head < t.ring_live and t.ring[t.ring_head & rmask] < 0:
        t.ring_head += 1
    return t.ring_head < t.ring_live


cdef int pt_expect_key(PendingTables* t, int32_t tag, uint64_t key, Pending* req,
                       Pending* old) except -1:
    """A keyed request pt_insert_fast() left to decide: grows the table first (at most
    half full, budget permitting), replaces a request pending under the same key (the
    older one can never be answered now: PT_REPLACED, *old = it), evicts the oldest
    expired entry of a full table, else drops the request (PT_DROPPED)."""
    cdef Py_ssize_t i, mask, rmask, probes = 0
    cdef MapEntry* e
    cdef int32_t j
    cdef bint reseeded = 0
    if (t.map_len + 1) * 2 > t.map_cap and t.map_len < t.map_limit \
            and not pt_has_expired(t):
        pt_map_resize(t, t.map_cap * 2 if t.map_cap else 64)
        # (a table holding expired requests drops those first, below, instead of growing)
    if t.map_cap == 0:                     # map_limit <= 0 or no budget: nothing is tracked
        return PT_DROPPED
    mask = t.map_cap - 1
    i = _mix(t.map_seed, tag, key) & mask
    while t.map[i].used:                   # one probe: the key, or where it goes
        e = &t.map[i]
        if e.tag == tag and <uint64_t>e.p.key == key:
            old[0] = e.p
            e.p = req[0]
            t.ring[e.used - 1] = -1        # a new request: the newest entry
            pt_ring_push(t, i)
            return PT_REPLACED
        i = (i + 1) & mask
        probes += 1
        if probes == MAP_PROBE_LIMIT and not reseeded:
            reseeded = 1                   # see pt_insert_fast(): break a chosen cluster
            pt_map_reseed(t)
            i = _mix(t.map_seed, tag, key) & mask
            probes = 0
    if t.map_len >= t.map_limit or (t.map_len + 1) * 2 > t.map_cap:
        # full (the limit, or the budget refused to grow): the oldest expired entry
        # makes room, else the request is dropped
        rmask = t.map_cap - 1
        if not pt_has_expired(t):
            return PT_DROPPED
        j = t.ring[t.ring_head & rmask]
        t.ring[t.ring_head & rmask] = -1
        t.ring_head += 1
        pt_map_remove(t, j)
        i = _mix(t.map_seed, tag, key) & mask
        while t.map[i].used:
            i = (i + 1) & mask
    pt_map_insert(t, i, tag, req)
    return PT_INSERTED


cdef int pt_fifo_room(PendingTables* t, Pending* old) except -1:
    """The FIFO is full (its capacity or fifo_limit): double it (budget permitting),
    else give up on the oldest request (PT_PUSHED_OUT, *old = it: a timeout unless it
    expired already)."""
    cdef Pending* p
    if t.fifo_len == t.fifo_cap and t.fifo_len < t.fifo_limit:
        pt_fifo_resize(t, t.fifo_cap * 2)  # the pending budget may refuse
    if t.fifo_len >= t.fifo_limit or t.fifo_len == t.fifo_cap:
        p = &t.fifo[t.fifo_head]
        t.fifo_head = (t.fifo_head + 1) & (t.fifo_cap - 1)
        t.fifo_len -= 1
        old[0] = p[0]
        return PT_PUSHED_OUT
    return PT_INSERTED


cdef int pt_fifo_resize(PendingTables* t, Py_ssize_t new_cap) except -1:
    """Resize the FIFO ring; 1 when growing would pass the pending budget."""
    global _pending_bytes
    cdef Py_ssize_t i
    cdef Pending* p
    if new_cap > t.fifo_cap and _pending_bytes + (new_cap - t.fifo_cap) * \
            <int64_t>sizeof(Pending) > _pending_budget:
        return 1
    p = <Pending*>PyMem_Malloc(new_cap * sizeof(Pending))
    if p is NULL:
        raise MemoryError()
    for i in range(t.fifo_len):
        p[i] = t.fifo[(t.fifo_head + i) & (t.fifo_cap - 1)]
    PyMem_Free(t.fifo)
    _pending_bytes += (new_cap - t.fifo_cap) * <int64_t>sizeof(Pending)
    t.fifo = p
    t.fifo_head = 0
    t.fifo_cap = new_cap
    return 0


cdef int pt_shrink(PendingTables* t) except -1:
    """After a burst: tables at most 1/8 full are halved or more (map load at most
    1/4 afterwards, FIFO at most half full); never below 64 / 8 entries."""
    cdef Py_ssize_t cap
    if t.map_cap > 64 and t.map_len * 8 <= t.map_cap:
        cap = 64
        while cap < t.map_len * 4:
            cap *= 2
        pt_map_resize(t, cap)
    if t.fifo_cap > 8 and t.fifo_len * 8 <= t.fifo_cap:
        cap = 8
        while cap < t.fifo_len * 2:
            cap *= 2
        pt_fifo_resize(t, cap)
    return 0


cdef int pt_forget_all(PendingTables* t) except -1:
    """Empty both tables and give their memory back (a closed connection)."""
    t.fifo_len = 0
    t.fifo_head = 0
    t.map_len = 0
    t.ring_head = t.ring_live = t.ring_tail = 0
    pt_map_resize(t, 0)
    if t.fifo_cap > 8:
        pt_fifo_resize(t, 8)
    return 0


cdef Py_ssize_t pt_fifo_first_live(PendingTables* t) noexcept:
    """Offset of the first FIFO entry expiry has not counted (those before it are
    expired)."""
    cdef Py_ssize_t i
    if t.fifo_len and t.fifo_live > t.fifo[t.fifo_head].key:
        i = t.fifo_live - t.fifo[t.fifo_head].key
        if i > t.fifo_len:
            i = t.fifo_len
        # a request the fault engine dropped left a gap in the sequence numbers:
        # step back over entries not expired yet (one check when there is none)
        while i > 0 and not t.fifo[(t.fifo_head + i - 1) & (t.fifo_cap - 1)].flags \
                & P_EXPIRED:
            i -= 1
        return i
    return 0


cdef inline void _fifo_mark_live(PendingTables* t, Py_ssize_t i) noexcept:
    t.fifo_live = t.fifo_seq + 1 if i == t.fifo_len else (
        t.fifo[(t.fifo_head + i) & (t.fifo_cap - 1)].key)


cdef Pending* pt_expire_next(PendingTables* t, PendingWalk* w, int64_t now,
                             int64_t timeout_ns, int32_t* tag) noexcept:
    """The next request older than timeout_ns at ``now`` not counted yet (FIFO first,
    then the map, oldest first: both are in request order, so the walk stops at the
    first younger one), or NULL; the caller counts it (a timeout, which marks it
    P_EXPIRED).  Where the walk got to is kept (fifo_live, ring_live) after every step:
    a caller may stop early and come back with a new walk."""
    cdef Pending* p
    cdef Py_ssize_t i, mask
    if w.phase == 0:
        w.i = pt_fifo_first_live(t)
        w.phase = 1
        _fifo_mark_live(t, w.i)
    if w.phase == 1:
        while w.i < t.fifo_len:
            p = &t.fifo[(t.fifo_head + w.i) & (t.fifo_cap - 1)]
            if now - p.t_ns < timeout_ns:
                break                      # FIFO: everything after is younger
            w.i += 1
            _fifo_mark_live(t, w.i)
            if not p.flags & P_EXPIRED:
                tag[0] = 0
                return p
        _fifo_mark_live(t, w.i)
        w.phase = 2
        if t.ring_live < t.ring_head:
            t.ring_live = t.ring_head
    if w.phase == 2:
        mask = t.map_cap - 1
        while t.ring_live < t.ring_tail:
            i = t.ring[t.ring_live & mask]
            if i >= 0:                     # else answered since
                p = &t.map[i].p
                if now - p.t_ns < timeout_ns:
                    break                  # request order: everything after is younger
                t.ring_live += 1
                tag[0] = t.map[i].tag
                return p
            t.ring_live += 1
        w.phase = 3
    return NULL


cdef Pending* pt_live_next(PendingTables* t, PendingWalk* w, int32_t* tag) noexcept:
    """The next pending request not counted as a timeout yet (FIFO, then the map), or
    NULL: what a closed or abandoned connection leaves unanswered."""
    cdef Pending* p
    cdef Py_ssize_t i, mask
    if w.phase == 0:
        w.i = pt_fifo_first_live(t)
        w.phase = 1
    if w.phase == 1:
        while w.i < t.fifo_len:
            p = &t.fifo[(t.fifo_head + w.i) & (t.fifo_cap - 1)]
            w.i += 1
            if not p.flags & P_EXPIRED:
                tag[0] = 0
                return p
        w.phase = 2
        if t.ring_live < t.ring_head:
            t.ring_live = t.ring_head
        w.i = t.ring_live
    if w.phase == 2:
        mask = t.map_cap - 1
        while w.i < t.ring_tail:           # the expired ones were counted
            i = t.ring[w.i & mask]
            w.i += 1
            if i >= 0 and not t.map[i].p.flags & P_EXPIRED:
                tag[0] = t.map[i].tag
                return &t.map[i].p
        w.phase = 3
    return NULL
