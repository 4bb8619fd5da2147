/*
 * flyload — FlyMQ load generator and backend for frametap's benchmarks.
 *
 * Build:  gcc -O2 -o flyload flyload.c        (C99, Linux epoll, no deps)
 *
 *   flyload server --port P [--host H]
 *       A FlyMQ backend.  For every complete request frame it answers with a
 *       PRODUCE-style response frame: the request's opcode echoed, flags 0x01,
 *       and a fixed-size RecordMetadata-shaped payload (FlyMQ spec, "PRODUCE
 *       (0x01) Response").  Request payloads are never buffered: the parser
 *       keeps only the 8-byte header and a count of payload bytes still to
 *       skip, so any frame size up to MAX_MESSAGE_SIZE is fine.
 *
 *   flyload client --host H --port P --conns C --depth D --size S
 *                  --seconds T [--warmup W] [--opcode N]
 *       Opens C connections and keeps D pipelined PRODUCE requests (S-byte
 *       payload) in flight on each.  Every response completes the oldest
 *       request of its connection (per-connection FIFO ring of send times)
 *       and a replacement request is sent at once.  Latency goes into a
 *       1 us-resolution histogram up to 100 ms (plus an overflow count and the
 *       max).  The first W seconds are not counted.  Prints ONE JSON line:
 *       {"requests":..,"seconds":..,"rps":..,"p50_us":..,"p99_us":..,
 *        "client_cpu_s":..,"client_cpu_pct":.., ...}
 *
 * Wire format (docs/design.md, "FlyMQ"):
 *   magic 0xAF | version 0x01 | opcode u8 | flags u8 | length u32 BE
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define FLY_MAGIC 0xAF
#define FLY_VERSION 0x01
#define FLY_FLAG_BINARY 0x01
#define FLY_HEADER 8
#define FLY_MAX_PAYLOAD (32u * 1024u * 1024u) /* MAX_MESSAGE_SIZE */
#define OP_PRODUCE 0x01

#define READ_CHUNK (256 * 1024)
#define MAX_EVENTS 256
#define HIST_MAX_US 100000 /* 1 us buckets up to 100 ms, then overflow */

static void die(const char *what)
{
    perror(what);
    exit(2);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static void put_u16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);  p[3] = (uint8_t)v;
}
static void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}
static uint32_t get_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        die("fcntl");
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void write_header(uint8_t *p, uint8_t opcode, uint32_t len)
{
    p[0] = FLY_MAGIC;
    p[1] = FLY_VERSION;
    p[2] = opcode;
    p[3] = FLY_FLAG_BINARY;
    put_u32(p + 4, len);
}

/*
 * Streaming frame scanner shared by both modes.  Holds the header bytes seen
 * so far and the payload bytes still to skip; payloads are never copied.
 */
struct scanner {
    uint8_t hdr[FLY_HEADER];
    uint32_t hdr_have;  /* header bytes collected (0..8) */
    uint32_t skip;      /* payload bytes of the current frame still to come */
    int in_payload;     /* 1 while skipping a payload */
    uint8_t opcode;     /* opcode of the current frame */
    uint32_t length;    /* payload length of the current frame */
};

/*
 * Consume buf[0..n).  Calls on_frame(ctx, opcode, length) for every frame
 * whose last byte is in this chunk.  Returns frames completed, or -1 on a bad
 * header (wrong magic/version, or length over MAX_MESSAGE_SIZE).
 */
typedef void (*frame_cb)(void *ctx, uint8_t opcode, uint32_t length);

static long scan(struct scanner *s, const uint8_t *buf, size_t n, frame_cb cb, void *ctx)
{
    size_t pos = 0;
    long frames = 0;
    while (pos < n) {
        if (s->in_payload) {
            size_t take = n - pos < s->skip ? n - pos : s->skip;
            s->skip -= (uint32_t)take;
            pos += take;
            if (s->skip == 0) {
                s->in_payload = 0;
                frames++;
                if (cb) cb(ctx, s->opcode, s->length);
            }
            continue;
        }
        const uint8_t *h;
        if (s->hdr_have == 0 && n - pos >= FLY_HEADER) {
            h = buf + pos; /* fast path: header contiguous in this read */
            pos += FLY_HEADER;
        } else {
            size_t take = FLY_HEADER - s->hdr_have;
            if (take > n - pos) take = n - pos;
            memcpy(s->hdr + s->hdr_have, buf + pos, take);
            s->hdr_have += (uint32_t)take;
            pos += take;
            if (s->hdr_have < FLY_HEADER) break;
            s->hdr_have = 0;
            h = s->hdr;
        }
        if (h[0] != FLY_MAGIC || h[1] != FLY_VERSION) {
            fprintf(stderr, "flyload: bad header %02x %02x (expected af 01)\n", h[0], h[1]);
            return -1;
        }
        s->opcode = h[2];
        s->length = get_u32(h + 4);
        if (s->length > FLY_MAX_PAYLOAD) {
            fprintf(stderr, "flyload: frame length %u over limit %u\n", s->length, FLY_MAX_PAYLOAD);
            return -1;
        }
        if (s->length == 0) {
            frames++;
            if (cb) cb(ctx, s->opcode, 0);
        } else {
            s->skip = s->length;
            s->in_payload = 1;
        }
    }
    return frames;
}

/* ------------------------------------------------------------------------ */
/* server                                                                    */
/* ------------------------------------------------------------------------ */

#define RESP_TOPIC "bench"
#define RESP_TOPIC_LEN 5
/* RecordMetadata: topic(string) partition(i32) offset(u64) timestamp(i64)
 * key_size(i32) value_size(i32) -> 2+5+4+8+8+4+4 = 35 bytes */
#define RESP_PAYLOAD (2 + RESP_TOPIC_LEN + 4 + 8 + 8 + 4 + 4)
#define RESP_FRAME (FLY_HEADER + RESP_PAYLOAD)
#define SRV_OUT_HIGH (4 * 1024 * 1024) /* stop reading while this much is unsent */

struct sconn {
    int fd;
    struct scanner sc;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    int want_out;   /* EPOLLOUT registered */
    int reading;    /* EPOLLIN registered */
};

static uint64_t srv_offset;
static uint64_t srv_ts_ms;

static void srv_on_frame(void *ctx, uint8_t opcode, uint32_t length)
{
    struct sconn *c = ctx;
    if (c->out_len + RESP_FRAME > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap * 2 : 64 * 1024;
        while (cap < c->out_len + RESP_FRAME) cap *= 2;
        c->out = realloc(c->out, cap);
        if (!c->out) die("realloc");
        c->out_cap = cap;
    }
    uint8_t *p = c->out + c->out_len;
    write_header(p, opcode, RESP_PAYLOAD);
    p += FLY_HEADER;
    put_u16(p, RESP_TOPIC_LEN); p += 2;
    memcpy(p, RESP_TOPIC, RESP_TOPIC_LEN); p += RESP_TOPIC_LEN;
    put_u32(p, 0); p += 4;                       /* partition */
    put_u64(p, srv_offset++); p += 8;            /* offset */
    put_u64(p, srv_ts_ms); p += 8;               /* timestamp */
    put_u32(p, 0xFFFFFFFFu); p += 4;             /* key_size -1 */
    put_u32(p, length);                          /* value_size (request size) */
    c->out_len += RESP_FRAME;
}

static void srv_update_events(int ep, struct sconn *c)
{
    int want_out = c->out_off < c->out_len;
    int reading = (c->out_len - c->out_off) < SRV_OUT_HIGH;
    if (want_out == c->want_out && reading == c->reading) return;
    struct epoll_event ev = {0};
    ev.events = (reading ? EPOLLIN : 0) | (want_out ? EPOLLOUT : 0);
    ev.data.ptr = c;
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl mod");
    c->want_out = want_out;
    c->reading = reading;
}

static void srv_close(int ep, struct sconn *c)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->out);
    free(c);
}

/* Returns -1 if the connection failed. */
static int srv_flush(struct sconn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return -1;
        }
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
    return 0;
}

static int run_server(const char *host, int port)
{
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0) die("socket");
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "flyload: bad IPv4 address %s\n", host);
        return 2;
    }
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0) die("bind");
    if (listen(lfd, 1024) < 0) die("listen");
    set_nonblock(lfd);

    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    struct epoll_event ev = {0};
    ev.events = EPOLLIN;
    ev.data.ptr = NULL; /* NULL marks the listener */
    if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0) die("epoll_ctl listen");

    fprintf(stdout, "flyload server listening on %s:%d\n", host, port);
    fflush(stdout);

    uint8_t *rbuf = malloc(READ_CHUNK);
    if (!rbuf) die("malloc");
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(ep, evs, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        srv_ts_ms = (uint64_t)rt.tv_sec * 1000ull + (uint64_t)rt.tv_nsec / 1000000ull;
        for (int i = 0; i < n; i++) {
            struct sconn *c = evs[i].data.ptr;
            if (c == NULL) {
                for (;;) {
                    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0) break;
                    set_nodelay(fd);
                    struct sconn *nc = calloc(1, sizeof *nc);
                    if (!nc) die("calloc");
                    nc->fd = fd;
                    nc->reading = 1;
                    struct epoll_event cev = {0};
                    cev.events = EPOLLIN;
                    cev.data.ptr = nc;
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev) < 0) die("epoll_ctl add");
                }
                continue;
            }
            int dead = 0;
            if (evs[i].events & EPOLLOUT) {
                if (srv_flush(c) < 0) dead = 1;
            }
            if (!dead && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                ssize_t r = read(c->fd, rbuf, READ_CHUNK);
                if (r == 0) {
                    dead = 1; /* peer closed; pending responses are moot */
                } else if (r < 0) {
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) dead = 1;
                } else {
                    if (scan(&c->sc, rbuf, (size_t)r, srv_on_frame, c) < 0) dead = 1;
                    else if (srv_flush(c) < 0) dead = 1;
                }
            }
            if (dead) srv_close(ep, c);
            else srv_update_events(ep, c);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* client                                                                    */
/* ------------------------------------------------------------------------ */

struct cconn {
    int fd;
    int idx;
    struct scanner sc;
    uint64_t *ring;     /* send time (ns) per in-flight request, FIFO */
    uint32_t head;      /* oldest in-flight request */
    uint32_t count;     /* requests in flight */
    size_t unsent;      /* bytes of issued requests not yet written */
    size_t send_pos;    /* bytes written so far, modulo frame size */
    int want_out;
    int completed_now;  /* completions in the current read (callback scratch) */
};

static uint32_t g_depth;
static size_t g_frame;       /* bytes per request frame */
static uint8_t *g_pattern;   /* (depth+1) request frames back to back */
static uint64_t *g_hist;     /* 1 us buckets [0, HIST_MAX_US) */
static uint64_t g_overflow, g_max_ns, g_sum_ns, g_recorded;
static int g_recording;
static uint64_t g_now_ns;    /* clock for the current readiness event */
static uint64_t g_completed_total;

static void cli_on_frame(void *ctx, uint8_t opcode, uint32_t length)
{
    (void)opcode; (void)length;
    struct cconn *c = ctx;
    if (c->count == 0) {
        fprintf(stderr, "flyload: conn %d: response with no request in flight\n", c->idx);
        exit(3);
    }
    uint64_t sent = c->ring[c->head];
    c->head = (c->head + 1) % g_depth;
    c->count--;
    c->completed_now++;
    g_completed_total++;
    if (g_recording) {
        uint64_t lat = g_now_ns - sent;
        uint64_t us = lat / 1000;
        if (us < HIST_MAX_US) g_hist[us]++;
        else g_overflow++;
        if (lat > g_max_ns) g_max_ns = lat;
        g_sum_ns += lat;
        g_recorded++;
    }
}

/* Queue k new requests stamped with the current time. */
static void cli_issue(struct cconn *c, uint32_t k)
{
    for (uint32_t i = 0; i < k; i++) {
        c->ring[(c->head + c->count) % g_depth] = g_now_ns;
        c->count++;
    }
    c->unsent += (size_t)k * g_frame;
}

/* Write as much of the unsent bytes as the socket takes, in one write() when
 * it can: the pattern holds depth+1 identical frames, so any run of up to
 * depth frames starting at any offset within a frame is contiguous. */
static int cli_flush(struct cconn *c)
{
    while (c->unsent > 0) {
        ssize_t w = write(c->fd, g_pattern + c->send_pos, c->unsent);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            return -1;
        }
        c->unsent -= (size_t)w;
        c->send_pos = (c->send_pos + (size_t)w) % g_frame;
    }
    return 0;
}

static void cli_update_events(int ep, struct cconn *c)
{
    int want = c->unsent > 0;
    if (want == c->want_out) return;
    struct epoll_event ev = {0};
    ev.events = EPOLLIN | (want ? EPOLLOUT : 0);
    ev.data.ptr = c;
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl mod");
    c->want_out = want;
}

static int connect_to(const char *host, int port)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "flyload: %s: %s\n", host, gai_strerror(rc));
        exit(2);
    }
    int fd = -1;
    for (int attempt = 0; attempt < 50 && fd < 0; attempt++) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
            close(fd);
            fd = -1;
        }
        if (fd < 0) usleep(100000);
    }
    freeaddrinfo(res);
    if (fd < 0) {
        fprintf(stderr, "flyload: cannot connect to %s:%d: %s\n", host, port, strerror(errno));
        exit(2);
    }
    set_nodelay(fd);
    set_nonblock(fd);
    return fd;
}

static uint64_t hist_percentile(double q)
{
    if (g_recorded == 0) return 0;
    uint64_t rank = (uint64_t)(q * (double)g_recorded);
    if (rank >= g_recorded) rank = g_recorded - 1;
    uint64_t seen = 0;
    for (uint32_t us = 0; us < HIST_MAX_US; us++) {
        seen += g_hist[us];
        if (seen > rank) return us;
    }
    return g_max_ns / 1000; /* in the overflow: best we know is the max */
}

static int run_client(const char *host, int port, int conns, int depth, int size,
                      double seconds, double warmup, int opcode)
{
    signal(SIGPIPE, SIG_IGN);
    if (conns < 1 || depth < 1 || size < 0 || seconds <= 0 || warmup < 0) {
        fprintf(stderr, "flyload: need conns>=1 depth>=1 size>=0 seconds>0 warmup>=0\n");
        return 2;
    }
    if ((uint32_t)size > FLY_MAX_PAYLOAD) {
        fprintf(stderr, "flyload: --size %d over MAX_MESSAGE_SIZE %u\n", size, FLY_MAX_PAYLOAD);
        return 2;
    }
    g_depth = (uint32_t)depth;
    g_frame = FLY_HEADER + (size_t)size;
    g_hist = calloc(HIST_MAX_US, sizeof *g_hist);
    g_pattern = malloc(g_frame * (g_depth + 1));
    if (!g_hist || !g_pattern) die("malloc");

    /* One PRODUCE request (spec "PRODUCE (0x01) Request") when it fits:
     * topic "bench", no key, value filling the rest, partition -1. */
    uint8_t *f = g_pattern;
    write_header(f, (uint8_t)opcode, (uint32_t)size);
    memset(f + FLY_HEADER, 'x', (size_t)size);
    const size_t overhead = 2 + 5 + 4 + 4 + 4;
    if ((size_t)size >= overhead) {
        uint8_t *p = f + FLY_HEADER;
        put_u16(p, 5); memcpy(p + 2, "bench", 5); p += 7;
        put_u32(p, 0); p += 4;
        put_u32(p, (uint32_t)(size - overhead)); p += 4;
        p += size - overhead;
        put_u32(p, 0xFFFFFFFFu);
    }
    for (uint32_t i = 1; i <= g_depth; i++)
        memcpy(g_pattern + i * g_frame, g_pattern, g_frame);

    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1");
    struct cconn *cs = calloc((size_t)conns, sizeof *cs);
    if (!cs) die("calloc");
    for (int i = 0; i < conns; i++) {
        cs[i].fd = connect_to(host, port);
        cs[i].idx = i;
        cs[i].ring = calloc(g_depth, sizeof(uint64_t));
        if (!cs[i].ring) die("calloc");
        struct epoll_event ev = {0};
        ev.events = EPOLLIN;
        ev.data.ptr = &cs[i];
        if (epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev) < 0) die("epoll_ctl add");
    }

    uint8_t *rbuf = malloc(READ_CHUNK);
    if (!rbuf) die("malloc");

    uint64_t t0 = now_ns();
    uint64_t t_measure = t0 + (uint64_t)(warmup * 1e9);
    uint64_t t_end = t_measure + (uint64_t)(seconds * 1e9);
    double cpu_start = 0, cpu_end = 0;
    uint64_t measured_start = 0, measured_end = 0;
    uint64_t requests = 0;
    int alive = conns, errors = 0;

    g_now_ns = t0;
    if (warmup <= 0) {
        g_recording = 1;
        cpu_start = cpu_s();
        measured_start = now_ns();
    }
    /* All D initial requests of a connection in one write. */
    for (int i = 0; i < conns; i++) {
        cli_issue(&cs[i], g_depth);
        if (cli_flush(&cs[i]) < 0) die("write");
        cli_update_events(ep, &cs[i]);
    }

    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        uint64_t now = now_ns();
        if (!g_recording && now >= t_measure) {
            g_recording = 1;
            cpu_start = cpu_s();
            measured_start = now;
        }
        if (now >= t_end) break;
        int timeout_ms = (int)((t_end - now) / 1000000ull) + 1;
        int n = epoll_wait(ep, evs, MAX_EVENTS, timeout_ms);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        g_now_ns = now_ns();
        for (int i = 0; i < n; i++) {
            struct cconn *c = evs[i].data.ptr;
            if (c->fd < 0) continue;
            int dead = 0;
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
                ssize_t r = read(c->fd, rbuf, READ_CHUNK);
                if (r == 0) {
                    fprintf(stderr, "flyload: conn %d closed by peer\n", c->idx);
                    dead = 1;
                } else if (r < 0) {
                    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                        fprintf(stderr, "flyload: conn %d read: %s\n", c->idx, strerror(errno));
                        dead = 1;
                    }
                } else {
                    c->completed_now = 0;
                    if (scan(&c->sc, rbuf, (size_t)r, cli_on_frame, c) < 0) {
                        dead = 1;
                    } else if (c->completed_now > 0) {
                        if (g_recording) requests += (uint64_t)c->completed_now;
                        /* replacements for this event's completions: one write */
                        cli_issue(c, (uint32_t)c->completed_now);
                    }
                }
            }
            if (!dead && c->unsent > 0 && cli_flush(c) < 0) {
                fprintf(stderr, "flyload: conn %d write: %s\n", c->idx, strerror(errno));
                dead = 1;
            }
            if (dead) {
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
                errors++;
                if (--alive == 0) goto done;
            } else {
                cli_update_events(ep, c);
            }
        }
    }
done:
    measured_end = now_ns();
    cpu_end = cpu_s();
    if (!g_recording) {
        fprintf(stderr, "flyload: run ended before the warmup did\n");
        measured_start = measured_end;
        cpu_start = cpu_end;
    }
    double secs = (double)(measured_end - measured_start) * 1e-9;
    double cpu = cpu_end - cpu_start;
    double rps = secs > 0 ? (double)requests / secs : 0.0;
    double mean_us = g_recorded ? (double)g_sum_ns / (double)g_recorded / 1000.0 : 0.0;
    printf("{\"requests\":%llu,\"seconds\":%.6f,\"rps\":%.1f,"
           "\"p50_us\":%llu,\"p90_us\":%llu,\"p99_us\":%llu,\"p999_us\":%llu,"
           "\"max_us\":%.1f,\"mean_us\":%.1f,\"hist_overflow\":%llu,"
           "\"client_cpu_s\":%.4f,\"client_cpu_pct\":%.1f,"
           "\"conns\":%d,\"depth\":%d,\"size\":%d,\"errors\":%d,\"completed_total\":%llu}\n",
           (unsigned long long)requests, secs, rps,
           (unsigned long long)hist_percentile(0.50), (unsigned long long)hist_percentile(0.90),
           (unsigned long long)hist_percentile(0.99), (unsigned long long)hist_percentile(0.999),
           (double)g_max_ns / 1000.0, mean_us, (unsigned long long)g_overflow,
           cpu, secs > 0 ? 100.0 * cpu / secs : 0.0,
           conns, depth, size, errors, (unsigned long long)g_completed_total);
    fflush(stdout);
    for (int i = 0; i < conns; i++)
        if (cs[i].fd >= 0) close(cs[i].fd);
    return errors == conns ? 1 : 0;
}

/* ------------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr,
            "usage: flyload server --port P [--host 127.0.0.1]\n"
            "       flyload client --host H --port P --conns C --depth D --size S\n"
            "                      --seconds T [--warmup W] [--opcode N]\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) { usage(); return 2; }
    const char *mode = argv[1];
    const char *host = "127.0.0.1";
    int port = 0, conns = 1, depth = 1, size = 64, opcode = OP_PRODUCE;
    double seconds = 5, warmup = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) { fprintf(stderr, "flyload: %s needs a value\n", a); usage(); return 2; }
        const char *v = argv[++i];
        if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--port")) port = atoi(v);
        else if (!strcmp(a, "--conns")) conns = atoi(v);
        else if (!strcmp(a, "--depth")) depth = atoi(v);
        else if (!strcmp(a, "--size")) size = atoi(v);
        else if (!strcmp(a, "--seconds")) seconds = atof(v);
        else if (!strcmp(a, "--warmup")) warmup = atof(v);
        else if (!strcmp(a, "--opcode")) opcode = (int)strtol(v, NULL, 0);
        else { fprintf(stderr, "flyload: unknown option %s\n", a); usage(); return 2; }
    }
    if (port <= 0 || port > 65535) { fprintf(stderr, "flyload: --port required\n"); usage(); return 2; }
    if (!strcmp(mode, "server")) return run_server(host, port);
    if (!strcmp(mode, "client"))
        return run_client(host, port, conns, depth, size, seconds, warmup, opcode);
    usage();
    return 2;
}
