/*
 * fxload — fleximq load generator and backend for frametap's proxy benchmark
 * (bench/fleximq_bench.py).
 *
 * Build:  gcc -O2 -std=gnu99 -o fxload fxload.c        (Linux epoll, no deps)
 *
 *   fxload server --port P
 *       Answers every REQ with a REP that routes back to the sender and carries
 *       the REQ's reqrep.id (found as the MessagePack bytes a2 'i' 'd' ba + 26
 *       bytes, the shape fxload client writes), status 200.  Headers are scanned
 *       from a per-connection buffer; payloads are skipped, never buffered.
 *
 *   fxload client --port P --conns C --depth D --size S --seconds T [--warmup W]
 *       C connections, D pipelined REQs in flight on each (~100-byte MessagePack
 *       header, S-byte payload); every REP completes the oldest REQ of its
 *       connection and a new one is sent.  Prints one JSON line:
 *       {"requests":..,"seconds":..,"rps":..,"p50_us":..,"p99_us":..,"errors":..}
 *
 *   --ws-key K (client) / --ws-accept A (server): fleximq over WebSocket
 *       (bench/ws_bench.py --timed): the client sends "GET /fx" with
 *       Sec-WebSocket-Key K and each REQ as one masked binary frame (mask key 0,
 *       so the bytes stay readable); the server answers the upgrade with
 *       Sec-WebSocket-Accept A (computed by the caller: no SHA-1 here) and each
 *       REP as one unmasked binary frame; both strip frame headers (and unmask)
 *       before reading fleximq frames.
 *
 * Frame (docs/design.md, "fleximq"): version u8 | type u8 | client_id u32 |
 * 16 reserved | header_length u32 | payload_length u64 | header | payload.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PREFIX 34
#define ID_LEN 26
#define BUF (256 * 1024)
#define HIST_US 100000

static void die(const char *m) { perror(m); exit(2); }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }
static uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }
static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static void put64(uint8_t *p, uint64_t v) { put32(p, v >> 32); put32(p + 4, (uint32_t)v); }

/* {"routing":[{"client_id":CID,"path":"/api/users/get"}],"reqrep":{"type":T,"id":ID}} */
static size_t header(uint8_t *h, uint32_t cid, int rep, const uint8_t *id)
{
    size_t n = 0;
    h[n++] = rep ? 0x83 : 0x82;
    h[n++] = 0xa7; memcpy(h + n, "routing", 7); n += 7;
    h[n++] = 0x91; h[n++] = 0x82;
    h[n++] = 0xa9; memcpy(h + n, "client_id", 9); n += 9;
    h[n++] = 0xce; put32(h + n, cid); n += 4;
    h[n++] = 0xa4; memcpy(h + n, "path", 4); n += 4;
    h[n++] = 0xae; memcpy(h + n, "/api/users/get", 14); n += 14;
    h[n++] = 0xa6; memcpy(h + n, "reqrep", 6); n += 6;
    h[n++] = 0x82;
    h[n++] = 0xa4; memcpy(h + n, "type", 4); n += 4;
    if (rep) { h[n++] = 0xab; memcpy(h + n, "correlation", 11); n += 11; }
    else { h[n++] = 0xa7; memcpy(h + n, "request", 7); n += 7; }
    h[n++] = 0xa2; memcpy(h + n, "id", 2); n += 2;
    h[n++] = 0xa0 | ID_LEN; memcpy(h + n, id, ID_LEN); n += ID_LEN;
    if (rep) { h[n++] = 0xa6; memcpy(h + n, "status", 6); n += 6; h[n++] = 0xcc; h[n++] = 200; }
    return n;
}

static size_t frame(uint8_t *out, int type, uint32_t cid, const uint8_t *h, size_t hl, size_t pl)
{
    out[0] = 1; out[1] = type; put32(out + 2, cid); memset(out + 6, 0, 16);
    put32(out + 22, (uint32_t)hl); put64(out + 26, pl);
    memcpy(out + PREFIX, h, hl);
    if (pl) { out[PREFIX + hl] = 0xc5; out[PREFIX + hl + 1] = (pl - 3) >> 8; out[PREFIX + hl + 2] = (pl - 3) & 0xff; memset(out + PREFIX + hl + 3, 'x', pl - 3); }
    return PREFIX + hl + pl;
}

struct conn {
    int fd;
    int ws_open;                      /* WebSocket: the HTTP head is done */
    uint8_t hb[4096]; size_t hhave;   /* ... the head read so far */
    uint8_t wh[14]; size_t whave;     /* a WebSocket frame header being read */
    uint64_t wrem, wpos; uint8_t wmask[4]; int wmasked;
    uint8_t in[BUF]; size_t have;     /* prefix + header of the frame being read */
    uint64_t skip;                    /* payload bytes still to skip */
    uint8_t *out; size_t olen, ocap;  /* pending output */
    double *sent; int head, n;        /* client: FIFO of send times */
    uint64_t seq;
};

static void queue(struct conn *c, const uint8_t *p, size_t n)
{
    if (c->olen + n > c->ocap) { c->ocap = (c->olen + n) * 2; c->out = realloc(c->out, c->ocap); if (!c->out) die("realloc"); }
    memcpy(c->out + c->olen, p, n); c->olen += n;
}

static int flush(struct conn *c)
{
    size_t off = 0;
    while (off < c->olen) {
        ssize_t w = write(c->fd, c->out + off, c->olen - off);
        if (w < 0) { if (errno == EAGAIN) break; return -1; }
        off += w;
    }
    memmove(c->out, c->out + off, c->olen - off); c->olen -= off;
    return 0;
}

typedef void (*on_frame_fn)(struct conn *, const uint8_t *, size_t);

static const char *ws_key, *ws_accept;    /* --ws-key (client) / --ws-accept (server) */

/* one WebSocket binary frame around p (masked with key 0 for the client side) */
static void queue_ws(struct conn *c, const uint8_t *p, size_t n, int masked)
{
    uint8_t h[14]; size_t hl = 2;
    h[0] = 0x82;
    if (n < 126) h[1] = n;
    else if (n < 65536) { h[1] = 126; h[2] = n >> 8; h[3] = n & 0xff; hl = 4; }
    else { h[1] = 127; put64(h + 2, n); hl = 10; }
    if (masked) { h[1] |= 0x80; memset(h + hl, 0, 4); hl += 4; }
    queue(c, h, hl);
    queue(c, p, n);
}

/* the server's answer to the upgrade */
static void ws_head_done(struct conn *c)
{
    char r[256];
    if (!ws_accept) return;                    /* the client: the 101 arrived */
    int n = snprintf(r, sizeof r, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", ws_accept);
    queue(c, (const uint8_t *)r, n);
}

/* WebSocket: the read's payload bytes, compacted in place to its front (HTTP head and
   frame headers dropped, payload unmasked); returns how many */
static size_t ws_strip(struct conn *c, uint8_t *rb, size_t r)
{
    size_t i = 0, o = 0;
    while (!c->ws_open && i < r) {
        if (c->hhave == sizeof c->hb) die("websocket head too long");
        c->hb[c->hhave++] = rb[i++];
        if (c->hhave >= 4 && !memcmp(c->hb + c->hhave - 4, "\r\n\r\n", 4)) {
            c->ws_open = 1;
            ws_head_done(c);
        }
    }
    while (i < r) {
        if (c->wrem) {
            size_t t = (uint64_t)(r - i) < c->wrem ? r - i : (size_t)c->wrem;
            for (size_t k = 0; k < t; k++)
                rb[o + k] = c->wmasked ? rb[i + k] ^ c->wmask[(c->wpos + k) & 3] : rb[i + k];
            o += t; i += t; c->wrem -= t; c->wpos += t;
            continue;
        }
        c->wh[c->whave++] = rb[i++];
        size_t need = 2;
        if (c->whave >= 2) {
            int l7 = c->wh[1] & 0x7f;
            need = 2 + (l7 == 126 ? 2 : l7 == 127 ? 8 : 0) + (c->wh[1] & 0x80 ? 4 : 0);
        }
        if (c->whave < need) continue;
        int l7 = c->wh[1] & 0x7f;
        size_t m = 2;
        if (l7 == 126) { c->wrem = (uint64_t)c->wh[2] << 8 | c->wh[3]; m = 4; }
        else if (l7 == 127) { c->wrem = be64(c->wh + 2); m = 10; }
        else c->wrem = l7;
        c->wmasked = c->wh[1] & 0x80;
        if (c->wmasked) memcpy(c->wmask, c->wh + m, 4);
        c->wpos = 0; c->whave = 0;
        if ((c->wh[0] & 0x0f) != 2 && (c->wh[0] & 0x0f) != 0) die("websocket: not a binary frame");
    }
    return o;
}

/* read what is there; call on_frame(prefix+header) per complete frame */
static int pump(struct conn *c, on_frame_fn on_frame)
{
    static uint8_t rb[BUF];
    for (;;) {
        ssize_t r = read(c->fd, rb, sizeof rb);
        if (r == 0) return -1;
        if (r < 0) return errno == EAGAIN ? 0 : -1;
        if (ws_key || ws_accept) r = ws_strip(c, rb, r);
        size_t i = 0;
        while (i < (size_t)r) {
            if (c->skip) { uint64_t t = (uint64_t)r - i < c->skip ? (uint64_t)r - i : c->skip; c->skip -= t; i += t; continue; }
            size_t need = PREFIX;
            if (c->have >= PREFIX) need = PREFIX + be32(c->in + 22);
            if (need > BUF) return -1;
            size_t t = need - c->have; if (t > (size_t)r - i) t = (size_t)r - i;
            memcpy(c->in + c->have, rb + i, t); c->have += t; i += t;
            if (c->have == PREFIX && be32(c->in + 22)) continue;
            if (c->have < PREFIX || c->have < PREFIX + be32(c->in + 22)) continue;
            on_frame(c, c->in, c->have);
            c->skip = be64(c->in + 26);
            c->have = 0;
        }
    }
}

static void server_frame(struct conn *c, const uint8_t *f, size_t n)
{
    static uint8_t h[256], out[512];
    static const uint8_t zero[ID_LEN];
    if (f[1] != 1) return;
    const uint8_t *id = zero;
    for (size_t i = PREFIX; i + 4 + ID_LEN <= n; i++)
        if (f[i] == 0xa2 && f[i + 1] == 'i' && f[i + 2] == 'd' && f[i + 3] == (0xa0 | ID_LEN)) { id = f + i + 4; break; }
    size_t hl = header(h, be32(f + 2), 1, id);
    if (ws_accept) queue_ws(c, out, frame(out, 2, 1001, h, hl, 0), 0);
    else queue(c, out, frame(out, 2, 1001, h, hl, 0));
}

static long hist[HIST_US + 1];
static uint64_t done, errors;
static int counting;
static size_t req_size;

static void send_req(struct conn *c)
{
    static uint8_t h[256], out[70000];
    uint8_t id[ID_LEN + 1];
    snprintf((char *)id, sizeof id, "%026llu", (unsigned long long)++c->seq);
    size_t hl = header(h, 1001, 0, id);
    if (ws_key) queue_ws(c, out, frame(out, 1, 1000, h, hl, req_size), 1);
    else queue(c, out, frame(out, 1, 1000, h, hl, req_size));
}

static int depth;
static void client_frame(struct conn *c, const uint8_t *f, size_t n)
{
    (void)n;
    if (f[1] != 2 || c->n == 0) { errors++; return; }
    double dt = now_s() - c->sent[c->head];
    c->head = (c->head + 1) % depth; c->n--;
    if (counting) {
        long us = (long)(dt * 1e6);
        hist[us > HIST_US ? HIST_US : us]++;
        done++;
    }
    c->sent[(c->head + c->n) % depth] = now_s(); c->n++;
    send_req(c);
}

static int nb(int fd) { int one = 1; setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); return fd; }

int main(int argc, char **argv)
{
    int port = 0, conns = 16, seconds = 5, warmup = 1; size_t size = 256; depth = 32;
    if (argc < 2) { fprintf(stderr, "usage: fxload server|client --port P ...\n"); return 2; }
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--conns")) conns = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--depth")) depth = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--size")) size = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ws-key")) ws_key = argv[i + 1];
        else if (!strcmp(argv[i], "--ws-accept")) ws_accept = argv[i + 1];
        else { fprintf(stderr, "fxload: unknown option %s\n", argv[i]); return 2; }
    }
    if (size < 3) size = 3;
    if (size > 65000) size = 65000;
    req_size = size;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ep = epoll_create1(0);
    struct epoll_event ev, evs[256];
    if (!strcmp(argv[1], "server")) {
        int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1024)) die("listen");
        ev.events = EPOLLIN; ev.data.ptr = NULL; epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
        for (;;) {
            int n = epoll_wait(ep, evs, 256, -1);
            for (int i = 0; i < n; i++) {
                struct conn *c = evs[i].data.ptr;
                if (!c) {
                    int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0) continue;
                    c = calloc(1, sizeof *c); c->fd = nb(fd);
                    ev.events = EPOLLIN; ev.data.ptr = c; epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
                    continue;
                }
                if (pump(c, server_frame) < 0 || flush(c) < 0) { close(c->fd); free(c->out); free(c); continue; }
                if (c->olen) { ev.events = EPOLLIN | EPOLLOUT; ev.data.ptr = c; epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev); }
                else if (evs[i].events & EPOLLOUT) { ev.events = EPOLLIN; ev.data.ptr = c; epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev); }
            }
        }
    }
    struct conn **cs = calloc(conns, sizeof *cs);
    for (int k = 0; k < conns; k++) {
        struct conn *c = cs[k] = calloc(1, sizeof *c);
        c->fd = nb(socket(AF_INET, SOCK_STREAM, 0));
        if (connect(c->fd, (struct sockaddr *)&a, sizeof a)) die("connect");
        if (ws_key) {                            /* the upgrade, blocking */
            char q[512], b[4096]; size_t got = 0;
            int n = snprintf(q, sizeof q, "GET /fx HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                             "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s"
                             "\r\nSec-WebSocket-Version: 13\r\n\r\n", port, ws_key);
            if (write(c->fd, q, n) != n) die("write upgrade");
            while (got < 4 || memcmp(b + got - 4, "\r\n\r\n", 4)) {
                if (got == sizeof b || read(c->fd, b + got, 1) != 1) die("read upgrade");
                got++;
            }
            if (memcmp(b, "HTTP/1.1 101", 12)) { fprintf(stderr, "fxload: upgrade refused: %.60s\n", b); exit(2); }
            c->ws_open = 1;
        }
        c->sent = calloc(depth, sizeof(double));
        for (int j = 0; j < depth; j++) { c->sent[j] = now_s(); send_req(c); }
        c->n = depth;
        if (flush(c) < 0) die("write");
        ev.events = c->olen ? EPOLLIN | EPOLLOUT : EPOLLIN; ev.data.ptr = c;
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    }
    for (int k = 0; k < conns; k++)              /* non-blocking from here */
        fcntl(cs[k]->fd, F_SETFL, fcntl(cs[k]->fd, F_GETFL) | O_NONBLOCK);
    double start = now_s(), t0 = start + warmup, end = t0 + seconds;
    for (;;) {
        double now = now_s();
        if (!counting && now >= t0) counting = 1;
        if (now >= end) break;
        int n = epoll_wait(ep, evs, 256, 50);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (pump(c, client_frame) < 0 || flush(c) < 0) { errors++; epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL); continue; }
            /* EPOLLOUT only while output waits: no busy loop on a writable socket */
            ev.events = c->olen ? EPOLLIN | EPOLLOUT : EPOLLIN; ev.data.ptr = c;
            epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        }
    }
    double secs = now_s() - t0;
    uint64_t acc = 0; long p50 = -1, p99 = -1;
    for (long us = 0; us <= HIST_US; us++) {
        acc += hist[us];
        if (p50 < 0 && acc * 2 >= done) p50 = us;
        if (p99 < 0 && acc * 100 >= done * 99) { p99 = us; break; }
    }
    printf("{\"requests\":%llu,\"seconds\":%.3f,\"rps\":%.1f,\"p50_us\":%ld,\"p99_us\":%ld,\"errors\":%llu}\n",
           (unsigned long long)done, secs, done / secs, p50, p99, (unsigned long long)errors);
    return 0;
}
