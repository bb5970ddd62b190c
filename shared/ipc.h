/*
 * ipc.h: nng messaging for libev loops, and the envelope codec.
 *
 * Server side (broker): a PULL socket's receive poll fd is watched by an
 * ev_io; on readiness the loop drains with NNG_FLAG_NONBLOCK, no threads
 * involved. A REP socket cannot answer many concurrent requests that way
 * (one request at a time, and a non-blocking reply fails while the pipe is
 * still busy), so REP uses a pool of nng contexts whose completions are
 * queued to the loop like the client's; the caller's callback still runs
 * on the loop and never blocks it.
 *
 * Client side (frontends): ipc_client sends requests on nng contexts; nng
 * completes them on its own threads, whose callbacks only queue the result
 * under a mutex and ev_async_send the loop. The loop then calls the
 * caller's ipc_reply_cb. This file is the only one that touches threads.
 *
 * Codec: ipc_decode_* unpack an envelope, check the version and the size,
 * and return NULL for anything malformed (logged with the peer's name).
 */
#ifndef SHARED_IPC_H
#define SHARED_IPC_H

#include <stddef.h>
#include <stdint.h>

#include <ev.h>

#include "ipc.pb-c.h"

#define IPC_VERSION      1u
#define IPC_MAX_MSG      (16u * 1024 * 1024) /* NNG_OPT_RECVMAXSZ */
#define IPC_BROKER_SOCK  "broker.ipc"
#define IPC_REPORTS_SOCK "reports.ipc"

/* Builds "ipc://<run_dir>/<name>" into buf; -1 if it does not fit. */
int ipc_url(char *buf, size_t len, const char *run_dir, const char *name);

/* ---- server: REP (broker) or PULL (broker's report socket) ---- */

struct ipc_server;

/*
 * Called on the loop for each received message. For a REP server the
 * callback must set *reply and *reply_len to a malloc'ed buffer (ownership
 * passes to ipc) or leave *reply NULL to send nothing (REP then drops the
 * request and the client times out). For PULL, reply and reply_len are
 * NULL. The callback may call ipc_server_free on its own server.
 */
typedef void (*ipc_server_cb)(void *arg, const uint8_t *msg, size_t len,
    uint8_t **reply, size_t *reply_len);

enum ipc_server_kind {
	IPC_SERVER_REP = 0,
	IPC_SERVER_PULL,
};

/*
 * Listens on url; NULL (logged) on failure. Removes a stale ipc file, but
 * fails when another live process listens on it.
 */
struct ipc_server *ipc_server_new(struct ev_loop *loop, const char *url,
    enum ipc_server_kind kind, ipc_server_cb cb, void *arg);
void ipc_server_free(struct ipc_server *srv);

/* ---- client: REQ with contexts (frontend), or PUSH (poller) ---- */

struct ipc_client;

/*
 * Completion on the loop thread. status 0: reply holds len bytes, valid
 * only during the call. Otherwise status is an nng error (NNG_ETIMEDOUT,
 * NNG_ECLOSED, ...) and reply is NULL.
 */
typedef void (
    *ipc_reply_cb)(void *arg, int status, const uint8_t *reply, size_t len);

enum ipc_client_kind {
	IPC_CLIENT_REQ = 0,
	IPC_CLIENT_PUSH,
};

/*
 * Dials url without blocking; nng redials in the background, so the peer
 * may start later or restart at any time. max_inflight bounds concurrent
 * REQ contexts.
 */
struct ipc_client *ipc_client_new(struct ev_loop *loop, const char *url,
    enum ipc_client_kind kind, unsigned max_inflight);
/*
 * Cancels pending requests: each callback not yet run runs once with
 * NNG_ECLOSED, on the calling (loop) thread, before this returns. Safe to
 * call from an ipc_reply_cb; the remaining callbacks then run with
 * NNG_ECLOSED after it returns. ipc_client_free(NULL) is a no-op.
 * XXX nng 1.5.2 (Debian 12) can hang in nng_close on a REQ socket whose
 * pipe is still receiving replies (fixed upstream in nng 1.8); a process
 * that stops should let its requests finish (drain) before freeing.
 */
void ipc_client_free(struct ipc_client *cl);

/*
 * REQ: sends a copy of msg and calls cb once, with the reply or an error,
 * no later than timeout_ms. Returns 0, or -1 when no context is free (cb
 * is then not called). PUSH: sends without waiting; cb may be NULL;
 * returns -1 when the message cannot be queued (peer away and queue full);
 * cb is never called for PUSH. A REQ client redials by itself: a request
 * sent while the server is away waits for it until its deadline.
 */
int ipc_client_send(struct ipc_client *cl, const uint8_t *msg, size_t len,
    unsigned timeout_ms, ipc_reply_cb cb, void *arg);
/* Requests sent and not yet completed. */
unsigned ipc_client_inflight(struct ipc_client *cl);

/* ---- envelopes ---- */

/* Pack an envelope (version set by the caller or forced here); malloc'ed. */
uint8_t *ipc_pack_frontend(Smg__FrontendMsg *m, size_t *len);
uint8_t *ipc_pack_broker(Smg__BrokerReply *m, size_t *len);
uint8_t *ipc_pack_poller(Smg__PollerMsg *m, size_t *len);

/*
 * Unpack and validate (size <= IPC_MAX_MSG, version == IPC_VERSION, a body
 * set). NULL on failure with *why set to a static reason ("malformed",
 * "version", "too_large", "empty"). Free with the matching
 * smg__*__free_unpacked(m, NULL).
 */
Smg__FrontendMsg *ipc_decode_frontend(const uint8_t *buf, size_t len,
    const char **why);
Smg__BrokerReply *ipc_decode_broker(const uint8_t *buf, size_t len,
    const char **why);
Smg__PollerMsg *ipc_decode_poller(const uint8_t *buf, size_t len,
    const char **why);

/* A packed BrokerReply carrying ErrorReply{code, message}; malloc'ed. */
uint8_t *ipc_pack_error(const char *code, const char *message, size_t *len);

#endif /* SHARED_IPC_H */
