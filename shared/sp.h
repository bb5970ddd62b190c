/*
 * sp.h: the SP protocol's REQ/REP conversation over a Unix stream socket,
 * driven by a libev loop with no thread in between, on nng's IPC wire:
 *
 *   connection header, each side, once: 0x00 'S' 'P' 0x00, the sender's
 *   16-bit big-endian protocol id (REQ0 0x30, REP0 0x31), two zero bytes;
 *   each side checks that the peer is the matching protocol.
 *   then frames: 0x01, 64-bit big-endian payload length, payload.
 *   REQ/REP payload: the backtrace (32-bit big-endian words, the last one,
 *   the request id, with its high bit set), then the body.
 *
 * Over TCP (nng's tcp:// wire, src/sp/transport/tcp/tcp.c) the header is
 * the same and a frame has no type byte: 64-bit big-endian payload
 * length, payload.
 *
 * A libnng REQ socket can query an sp_server and a libnng REP socket can
 * answer an sp_client (nng 1.5 src/sp/transport/ipc/ipc.c, tcp/tcp.c and
 * src/sp/protocol/reqrep0/). Completion statuses are nng error codes so
 * callers keep one vocabulary with the libnng sockets of ipc.c.
 */
#ifndef SHARED_SP_H
#define SHARED_SP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>

struct tls_ctx;

#define SP_PROTO_REQ0     0x30
#define SP_PROTO_REP0     0x31
#define SP_HEADER_LEN     8
#define SP_FRAME_HEAD     9 /* type byte + 64-bit length */
#define SP_TCP_FRAME_HEAD 8 /* 64-bit length */
#define SP_NAME_MAX       256 /* a socket path or host:port */
#define SP_MAX_HOPS       8 /* nng REP's default TTL */
#define SP_ID_FLAG        0x80000000u
#define SP_MAX_REQUEST    4096 /* requests in flight per client */

/* ---- wire codec (pure functions; the fuzz target drives these) ---- */

/* Writes the 8-byte connection header announcing protocol self. */
void sp_header_make(uint8_t h[SP_HEADER_LEN], uint16_t self);
/* 0 when h is a valid header from protocol peer, else -1. */
int sp_header_check(const uint8_t h[SP_HEADER_LEN], uint16_t peer);
/* Writes a frame head for a payload of len bytes. */
void sp_frame_head(uint8_t h[SP_FRAME_HEAD], uint64_t len);

enum sp_frame_status {
	SP_FRAME_NEED = 0, /* incomplete: read more */
	SP_FRAME_OK, /* a whole frame */
	SP_FRAME_BAD, /* not a message frame: close the connection */
	SP_FRAME_TOO_LARGE /* over max: close the connection */
};

/*
 * Looks at the bytes buf[0..len) received after the header. SP_FRAME_OK:
 * *payload and *plen give the first frame's payload and *used its size
 * (head included). SP_FRAME_NEED: *used is the size the whole frame will
 * have once its head is known (0 before), so the reader can make room.
 * A frame is refused as soon as its head says it is over max.
 */
enum sp_frame_status sp_frame_parse(const uint8_t *buf, size_t len, size_t max,
    const uint8_t **payload, size_t *plen, size_t *used);

/* The same over TCP: frames are the length and the payload. */
void sp_tcp_frame_head(uint8_t h[SP_TCP_FRAME_HEAD], uint64_t len);
enum sp_frame_status sp_tcp_frame_parse(const uint8_t *buf, size_t len,
    size_t max, const uint8_t **payload, size_t *plen, size_t *used);

/*
 * REP side: the length of the backtrace at the head of a request payload
 * (4 to 4 * SP_MAX_HOPS bytes, ending with the word whose high bit is
 * set). 0: more hops than SP_MAX_HOPS (drop the request, as nng does);
 * -1: malformed (shorter than a word: close the connection).
 */
int sp_backtrace_len(const uint8_t *p, size_t len);

/* ---- client: REQ ---- */

struct sp_client;

/*
 * Completion, on the loop. status 0: reply holds len bytes, valid only
 * during the call. Otherwise reply is NULL and status is NNG_ETIMEDOUT
 * (deadline passed), NNG_ECONNRESET (the connection carrying the request
 * was lost; it is not resent) or NNG_ECLOSED (client freed).
 */
typedef void (
    *sp_reply_cb)(void *arg, int status, const uint8_t *reply, size_t len);

/*
 * Connects to the Unix socket path without blocking and keeps connected:
 * a lost or refused connection is retried with backoff (20 ms doubling
 * to 500 ms), a handshake that does not finish in 2 s is dropped.
 * max_inflight (1..SP_MAX_REQUEST) bounds requests waiting for replies;
 * max_frame bounds a reply's frame payload (a larger one closes the
 * connection). NULL (logged) when path does not fit a socket address.
 */
struct sp_client *sp_client_new(struct ev_loop *loop, const char *path,
    unsigned max_inflight, size_t max_frame);
/*
 * The same over TCP to hostport ("host:port", "[v6]:port"), resolved once
 * here (a name that does not resolve: NULL, logged); TCP_NODELAY is set.
 */
struct sp_client *sp_client_new_tcp(struct ev_loop *loop, const char *hostport,
    unsigned max_inflight, size_t max_frame);
/*
 * The same inside TLS (nng's tls+tcp:// wire: the SP bytes of tcp:// in
 * a TLS stream). tls is a client context (shared/tls.h) that the caller
 * keeps until the client is freed; the server certificate must name the
 * host of hostport. A failed handshake counts as a lost connection.
 */
struct sp_client *sp_client_new_tls(struct ev_loop *loop, const char *hostport,
    struct tls_ctx *tls, unsigned max_inflight, size_t max_frame);
/*
 * Every request not yet completed completes once with NNG_ECLOSED before
 * this returns; called from an sp_reply_cb, the others complete after
 * the callback returns. sp_client_free(NULL) is a no-op.
 */
void sp_client_free(struct sp_client *cl);
/*
 * sp_client_free, then free(owner) once cl is gone: owner (the object that
 * holds cl) stays readable until the callbacks have run.
 */
void sp_client_free_with(struct sp_client *cl, void *owner);
/*
 * Queues a copy of msg and calls cb exactly once, never from within this
 * call, no later than timeout_ms (0 counts as 1). A request made while no
 * connection is up waits for one until its deadline. -1 (cb never called)
 * when every slot is busy, the message is over max_frame, or the client
 * is being freed.
 */
int sp_client_send(struct sp_client *cl, const uint8_t *msg, size_t len,
    unsigned timeout_ms, sp_reply_cb cb, void *arg);
/* Requests sent and not yet completed. */
unsigned sp_client_inflight(const struct sp_client *cl);
/*
 * 0 while a connection is up (headers exchanged); otherwise the seconds
 * since one was last up, or since the client was made.
 */
double sp_client_down_secs(const struct sp_client *cl);

/* ---- server: REP ---- */

struct sp_server;

/*
 * A request's body, on the loop. Set *reply and *reply_len to a malloc'ed
 * buffer (ownership passes to sp) to answer on the request's connection,
 * or leave *reply NULL to answer nothing. May call sp_server_free.
 */
typedef void (*sp_request_cb)(void *arg, const uint8_t *msg, size_t len,
    uint8_t **reply, size_t *reply_len);

/*
 * Listens on the Unix socket path, which must not exist (the caller
 * removes a stale one), and serves any number of REQ peers, each on its
 * own connection; several requests may be pipelined on one connection and
 * are answered in order, except those held (sp_server_hold), whose replies
 * go out when given, after any answered since. A frame over max_frame, a
 * malformed frame or a peer that does not read its replies closes only that
 * connection. NULL (logged) on failure.
 */
struct sp_server *sp_server_new(struct ev_loop *loop, const char *path,
    size_t max_frame, sp_request_cb cb, void *arg);
/*
 * The same on TCP: listens on hostport ("host:port"; host empty or "*":
 * every address; port 0: any, see sp_server_port) with SO_REUSEADDR.
 */
struct sp_server *sp_server_new_tcp(struct ev_loop *loop, const char *hostport,
    size_t max_frame, sp_request_cb cb, void *arg);
/*
 * The same inside TLS, with a server context (shared/tls.h) the caller
 * keeps until the server is freed; a context made with a CA requires
 * every peer's certificate (tls_ctx_new_server_mutual).
 */
struct sp_server *sp_server_new_tls(struct ev_loop *loop, const char *hostport,
    struct tls_ctx *tls, size_t max_frame, sp_request_cb cb, void *arg);
/* The TCP port a server listens on; -1 for a Unix socket. */
int sp_server_port(const struct sp_server *srv);
/*
 * Closes the listener and every connection (replies not yet written are
 * dropped) and removes the socket file if it is still ours. NULL: no-op.
 */
void sp_server_free(struct sp_server *srv);
/* Connections currently open. */
unsigned sp_server_nconns(const struct sp_server *srv);

/*
 * A deferred reply (a long poll). Called from an sp_request_cb, holds the
 * request being handled: the callback's *reply is then ignored (freed if
 * set), and the reply is given later with sp_held_reply, keyed by the
 * request's backtrace. Requests after it on the same connection are
 * answered meanwhile (an SP REQ peer matches replies by request id).
 * NULL outside a request callback or when already held. The handle is
 * the caller's until sp_held_reply or sp_held_drop, even after its
 * connection or server is gone.
 */
struct sp_held;
struct sp_held *sp_server_hold(void);
/* false once the held request's connection is gone (or being freed). */
bool sp_held_alive(const struct sp_held *h);
/*
 * Sends the malloc'ed reply (ownership passes) on the held request's
 * connection when it is still up, else drops it, and frees h. Never
 * calls back into the caller. NULL h: frees reply.
 */
void sp_held_reply(struct sp_held *h, uint8_t *reply, size_t len);
/* Frees h without answering (the peer's request times out). NULL: no-op. */
void sp_held_drop(struct sp_held *h);

#endif /* SHARED_SP_H */
