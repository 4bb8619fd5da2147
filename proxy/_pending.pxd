# cython: language_level=3
# The pending-request tables of one connection (docs/design.md, "Pending requests"):
# requests waiting for their responses, by correlation key (a hash map with a request
# ring) or in order (a FIFO).  The whole algorithm is here and in _pending.pyx; the
# framing core (proxy/_framing.pyx) owns a PendingTables per connection and does the
# counting and recording around it: a table never calls back into the core, it hands
# back the requests that time out or are pushed out, and the core counts those.
#
# Inline here (compiled into every parser, no call): the common cases of a request
# (pt_insert_fast, pt_push_fast) and of its answer (pt_take, pt_take_fifo).  Out of
# line in _pending.pyx: growing, rehashing, full tables, expiry walks, the memory budget.

from libc.stdint cimport uint8_t, int16_t, int32_t, int64_t, uint64_t

cdef enum:
    P_EXPIRED = 1            # Pending.flags: counted as a timeout; the late answer is not observed
    P_FIFO = 2               # from the FIFO (correlation id = sequence number)
    P_S2C = 4                # the request travelled server -> client

# Longest probe an insert walks before the map is rehashed under a new seed: at most half
# full, linear probing with a keyed hash makes a 128-slot chain vanishingly rare.
cdef enum:
    MAP_PROBE_LIMIT = 128

# pt_expect_key() / pt_fifo_room() results
cdef enum:
    PT_INSERTED = 0          # the request is pending
    PT_REPLACED = 1          # ... in place of an older one with its key (*old: time it out)
    PT_DROPPED = 2           # a full table: the request is not tracked (count an overflow)
    PT_PUSHED_OUT = 3        # a full FIFO gave up its oldest request (*old: time it out)


cdef struct Pending:         # 24 bytes
    int64_t t_ns             # monotonic time of the read that carried the request
    int64_t key              # correlation id (map) or request sequence number (FIFO)
    int32_t aux              # map: corr_hi (-1 none); FIFO: the parser's value (e.g. opcode)
    int16_t slot             # opcode slot of the request
    uint8_t flags            # P_*
    uint8_t spare

cdef struct MapEntry:        # 32 bytes; the key is p.key
    int32_t tag              # namespace of key (protocol-defined: direction, publisher id)
    int32_t used             # 0: empty; else 1 + the entry's slot in the request ring
    Pending p


# Correlation by key (RabbitMQ Stream, RocketMQ...): open addressing, linear probing,
# backward-shift deletion; at most map_limit pending entries.  The request ring (map_cap
# slots) holds the entries' indexes in the order their requests were read, -1 where the
# request was answered since (pt_take() only marks its slot; the ring is compacted when
# it fills up): ring_head..ring_live the expired ones, ring_live..ring_tail the live ones
# (ring_live may lag behind ring_head: pt_take() moves only the head; readers clamp it),
# so expiry walks only what expires (and the answered slots among them, once) and a full
# map evicts its oldest expired entry.  Positions count up; the slot is position &
# (map_cap - 1).  Then the FIFO of requests answered in order (a ring buffer, at most
# fifo_limit).
cdef struct PendingTables:
    MapEntry* map
    Py_ssize_t map_cap                  # power of two
    uint64_t map_seed                   # keys the hash (_mix): secret, per connection, new
                                        # when a probe passes MAP_PROBE_LIMIT (hash flooding)
    int64_t map_reseeds                 # times this map was rehashed under a new seed
    Py_ssize_t map_len
    Py_ssize_t map_limit
    int32_t* ring
    int64_t ring_head                   # oldest request still in the ring
    int64_t ring_live                   # oldest one expiry has not counted
    int64_t ring_tail                   # where the next request goes
    Pending* fifo
    Py_ssize_t fifo_head
    Py_ssize_t fifo_len
    Py_ssize_t fifo_cap                 # power of two (indexes wrap with & (fifo_cap - 1))
    Py_ssize_t fifo_limit
    int64_t fifo_seq                    # requests pushed so far (1-based correlation ids)
    int64_t fifo_live                   # sequence number of the oldest request expiry has
                                        # not counted (those before it are expired)


# A walk over pending requests (pt_expire_next, pt_live_next): start zeroed.
cdef struct PendingWalk:
    int phase                           # 0: not started; 1: FIFO; 2: map; 3: done
    Py_ssize_t i                        # FIFO offset


# ---- out of line (_pending.pyx) ------------------------------------------------------
cdef int pt_init(PendingTables* t, Py_ssize_t fifo_limit, Py_ssize_t map_limit) except -1
cdef void pt_free(PendingTables* t) noexcept
cdef int pt_map_resize(PendingTables* t, Py_ssize_t new_cap) except -1
cdef int pt_map_reseed(PendingTables* t) except -1
cdef int pt_fifo_resize(PendingTables* t, Py_ssize_t new_cap) except -1
cdef void pt_ring_compact(PendingTables* t) noexcept
cdef bint pt_has_expired(PendingTables* t) noexcept
cdef int pt_expect_key(PendingTables* t, int32_t tag, uint64_t key, Pending* req,
                       Pending* old) except -1
cdef int pt_fifo_room(PendingTables* t, Pending* old) except -1
cdef Pending* pt_expire_next(PendingTables* t, PendingWalk* w, int64_t now,
                             int64_t timeout_ns, int32_t* tag) noexcept
cdef Pending* pt_live_next(PendingTables* t, PendingWalk* w, int32_t* tag) noexcept
cdef Py_ssize_t pt_fifo_first_live(PendingTables* t) noexcept
cdef int pt_shrink(PendingTables* t) except -1
cdef int pt_forget_all(PendingTables* t) except -1
# the process's pending-memory budget ([proxy] max_pending_bytes), also charged by the
# core's split-header buffers
cdef bint pending_fits(int64_t more) noexcept
cdef void pending_charge(int64_t delta) noexcept


# ---- inline: the common cases -------------------------------------------------------

cdef inline uint64_t _mix(uint64_t seed, int32_t tag, uint64_t key) noexcept:
    # splitmix64 finalizer of the key under a secret per-map seed: spreads sequential ids
    # over the table, and a client cannot pick ids that share a probe chain without the
    # seed (the finalizer alone is invertible: colliding ids were found offline)
    cdef uint64_t z = (key ^ seed) + (<uint64_t>tag << 56) + 0x9E3779B97F4A7C15ULL
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline void pending_set(Pending* p, int64_t t_ns, uint64_t key, int slot,
                             int32_t aux, int fifo, int d) noexcept:
    p.t_ns = t_ns
    p.key = <int64_t>key
    p.slot = <int16_t>slot
    p.aux = aux
    p.flags = (P_FIFO if fifo else 0) | (P_S2C if d else 0)


cdef inline void pt_ring_push(PendingTables* t, Py_ssize_t i) noexcept:
    """Entry i (a live request) becomes the newest in the request ring."""
    cdef Py_ssize_t r
    if t.ring_tail - t.ring_head == t.map_cap:
        pt_ring_compact(t)                 # full: at least half its slots are answered
    r = <Py_ssize_t>t.ring_tail & (t.map_cap - 1)
    t.ring[r] = <int32_t>i
    t.map[i].used = <int32_t>(r + 1)
    t.ring_tail += 1


cdef inline void pt_map_remove(PendingTables* t, Py_ssize_t i) noexcept:
    """Delete entry i (its ring slot already marked -1): backward-shift deletion keeps
    probe chains intact without tombstones; a moved entry's ring slot follows it."""
    cdef Py_ssize_t j, k, mask = t.map_cap - 1
    j = i
    while True:
        j = (j + 1) & mask
        if not t.map[j].used:
            break
        k = _mix(t.map_seed, t.map[j].tag, <uint64_t>t.map[j].p.key) & mask
        if (j > i and (k <= i or k > j)) or (j < i and (k <= i and k > j)):
            t.map[i] = t.map[j]
            t.ring[t.map[i].used - 1] = <int32_t>i
            i = j
    t.map[i].used = 0
    t.map_len -= 1


cdef inline void pt_map_insert(PendingTables* t, Py_ssize_t i, int32_t tag,
                               Pending* req) noexcept:
    """A new pending request in free slot i of the map (the newest in request order)."""
    cdef MapEntry* e = &t.map[i]
    e.tag = tag
    t.map_len += 1
    e.p = req[0]
    pt_ring_push(t, i)


cdef inline int pt_insert_fast(PendingTables* t, int32_t tag, uint64_t key,
                               Pending* req) except -1:
    """The common case of a keyed request: a new key in a table with room.  Returns 0
    when req is pending now, 1 when pt_expect_key() must decide (the table must grow
    first or is full, the key is pending already, or a probe chain grew too long: then
    the map was rehashed under a new seed)."""
    cdef Py_ssize_t i, mask, probes = 0
    cdef MapEntry* e
    if (t.map_len + 1) * 2 > t.map_cap or t.map_len >= t.map_limit:
        return 1
    mask = t.map_cap - 1
    i = _mix(t.map_seed, tag, key) & mask
    while t.map[i].used:                   # one probe: the key, or where it goes
        e = &t.map[i]
        if e.tag == tag and <uint64_t>e.p.key == key:
            return 1
        i = (i + 1) & mask
        probes += 1
        if probes == MAP_PROBE_LIMIT:      # chosen colliding keys, or astronomically bad
            pt_map_reseed(t)               # luck: a new secret seed breaks the cluster
            return 1
    pt_map_insert(t, i, tag, req)
    return 0


cdef inline bint pt_take(PendingTables* t, int32_t tag, uint64_t key, Pending* out) noexcept:
    """Remove the request pending under (tag, key), copied to *out; 0 when none."""
    cdef Py_ssize_t i, mask
    cdef MapEntry* e
    if t.map_len == 0:
        return 0
    mask = t.map_cap - 1
    i = _mix(t.map_seed, tag, key) & mask
    while True:
        e = &t.map[i]
        if not e.used:
            return 0
        if e.tag == tag and <uint64_t>e.p.key == key:
            break
        i = (i + 1) & mask
    out[0] = e.p
    if e.used - 1 == (t.ring_head & mask):
        t.ring_head += 1                   # answered in request order: the ring moves on
    else:
        t.ring[e.used - 1] = -1            # answered: expiry and eviction skip it
    pt_map_remove(t, i)
    return 1


cdef inline Pending* pt_push_fast(PendingTables* t) noexcept:
    """The FIFO slot of a new request (pt_fifo_room() made room when full)."""
    cdef Pending* p = &t.fifo[(t.fifo_head + t.fifo_len) & (t.fifo_cap - 1)]
    t.fifo_len += 1
    return p


cdef inline Pending* pt_take_fifo(PendingTables* t) noexcept:
    """Remove the oldest request (valid until the next push), or NULL."""
    cdef Pending* p
    if t.fifo_len == 0:
        return NULL
    p = &t.fifo[t.fifo_head]
    t.fifo_head = (t.fifo_head + 1) & (t.fifo_cap - 1)
    t.fifo_len -= 1
    return p
