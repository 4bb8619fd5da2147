# cython: language_level=3
# The C types of the Thrift message walker (walk_c.py, a link to walk_py.py: one source,
# compiled with these declarations for _parser.pyx, run as Python for parser_py.py).
# Every state a walk keeps is a struct here; parser_py.py's classes have the same fields.

cimport cython
from libc.stdint cimport uint8_t, int32_t, int64_t, uint64_t
from proxy._wire cimport be16_at, be32s_at, i32, unzigzag, uvarint_at


cdef enum:
    NAME_MAX = 4096              # names.py: longest method name read
    CALL = 1                     # Thrift message types
    REPLY = 2
    EXCEPTION = 3
    ONEWAY = 4
    ST_OK = -1                   # statuses (names.py)
    ST_EXCEPTION = -2
    M_OK = 0                     # what a read found: done, more bytes wanted, malformed
    M_NEED = 1
    M_BAD = 2
    P_BINARY = 0                 # how the payload's message header is encoded
    P_COMPACT = 2
    P_PROTOBUF = 3
    MAX_DEPTH = 64               # nesting the unframed walk follows
    TT_META = 14                 # TTHeader / THeader: LENGTH, magic, flags, seq id, size
    PROTO_BINARY = 0             # header protocol ids (names.py)
    PROTO_COMPACT = 2
    PROTO_PROTOBUF = 3
    ZLIB = 1                     # transform ids
    SNAPPY = 3
    INFO_KEYVALUE = 0x01         # info ids
    INFO_INTKEYVALUE = 0x10
    INFO_ACL_TOKEN = 0x11
    TO_METHOD = 9                # INFO_INTKEYVALUE key of the method name
    X_NONE = 0                   # payload transforms, as far as reading goes
    X_ZLIB = 1
    X_OPAQUE = 2
    INFO_BATCH = 8               # key/values info_walk() hands over at once


cdef struct Msg:                 # what the message reader found
    int ptype                    # P_*: how the message header is encoded
    int mtype                    # CALL / REPLY / EXCEPTION / ONEWAY
    Py_ssize_t name_off          # method name within the buffer read
    Py_ssize_t name_len
    int32_t seq
    Py_ssize_t body              # first byte after the message header
    int64_t status               # ST_* or the TApplicationException type
    Py_ssize_t need              # M_NEED: bytes (index) wanted
    uint64_t var                 # last varint read


cdef struct Info:                # what the header's info section held
    int proto
    int xform                    # X_*
    Py_ssize_t tom_off           # TO_METHOD value, -1 none
    Py_ssize_t tom_len
    int err                      # 1: malformed (counted once, as bad_header)


cdef struct InfoWalk:            # info_walk(): where the info blocks' walk stopped
    Py_ssize_t i                 # next byte to read (0: the section's start)
    uint64_t left                # key/values left in the current block
    int iid                      # the block's id: INFO_KEYVALUE / INFO_INTKEYVALUE
    int kid[INFO_BATCH]          # the batch of key/values found: their block's id,
    int key[INFO_BATCH]          # INFO_INTKEYVALUE: the key
    Py_ssize_t ko[INFO_BATCH]    # INFO_KEYVALUE: the key at h[ko : ko + kl]
    Py_ssize_t kl[INFO_BATCH]
    Py_ssize_t vo[INFO_BATCH]    # the value at h[vo : vo + vl]
    Py_ssize_t vl[INFO_BATCH]


cdef struct XWalk:               # exception_status(): the field to go on from
    Py_ssize_t i                 # -1: not started (it begins at the message body)
    int64_t last                 # compact: the id of the field before it


cdef struct WLevel:              # walk_binary(): one open struct, map or list/set
    int64_t left                 # elements left (a map counts keys and values)
    uint8_t ft                   # 12 struct, 13 map, 14 list/set
    uint8_t kt                   # map key type, list/set element type
    uint8_t vt                   # map value type


cdef struct SkipWalk:            # walk_binary(): where an unframed message's walk stopped
    Py_ssize_t pos               # next byte to read
    int sp                       # open levels on stack (the outermost struct is level 0)
    int cur                      # type of the value that starts at pos, -1: none (the
                                 # top level's next field header or element comes next)
    WLevel* stack                # MAX_DEPTH + 1 levels (the parser allocates them)


cdef int chk(Msg* m, Py_ssize_t k, Py_ssize_t lim, Py_ssize_t fend) noexcept

@cython.locals(k=Py_ssize_t, v=uint64_t)
cdef (int, Py_ssize_t) uvar(Msg* m, const uint8_t* h, Py_ssize_t i, Py_ssize_t lim,
                            Py_ssize_t fend, int maxlen) noexcept

@cython.locals(r=int, n=int64_t, j=Py_ssize_t, b0=uint8_t)
cdef int read_message(Msg* m, const uint8_t* h, Py_ssize_t i, Py_ssize_t lim, Py_ssize_t fend,
                      bint allow_pb) noexcept

@cython.locals(r=int, fid=int64_t, b=uint8_t, j=Py_ssize_t)
cdef int reply_status(Msg* m, const uint8_t* h, Py_ssize_t i, Py_ssize_t lim,
                      Py_ssize_t fend) noexcept

cdef int BIN_FIXED[17]
cdef int CPT_FIXED[17]

cdef int bin_fixed(int ft) noexcept

cdef int cpt_fixed(int ft) noexcept

cdef int give_up(int r) noexcept

@cython.locals(r=int, ft=int, size=int, fid=int64_t, last=int64_t, n=int64_t, b=uint8_t,
               j=Py_ssize_t, i=Py_ssize_t, big=uint64_t)
cdef int exception_status(Msg* m, const uint8_t* h, XWalk* x, Py_ssize_t lim,
                          Py_ssize_t fend) noexcept

@cython.locals(i=Py_ssize_t, sp=int, t=int, size=int, vs=int, n=int64_t, k=int64_t, top=int,
               stack='WLevel*')
cdef Py_ssize_t walk_binary(Msg* m, const uint8_t* h, Py_ssize_t lim, SkipWalk* w) noexcept

cdef void xform(Info* hi, int t) noexcept

@cython.locals(i=Py_ssize_t, left=uint64_t, iid=int, key=int, ko=Py_ssize_t, kl=Py_ssize_t,
               vo=Py_ssize_t, vl=Py_ssize_t, r=int, room=uint64_t, nt=int, k=int, cnt=uint64_t,
               c=uint64_t, n=int)
cdef int info_walk(Info* hi, Msg* m, InfoWalk* w, const uint8_t* h, bint tt,
                   Py_ssize_t end, bint each) noexcept

cdef void info_scan(Info* hi, Msg* m, InfoWalk* w, const uint8_t* h, bint tt,
                    Py_ssize_t end) noexcept
