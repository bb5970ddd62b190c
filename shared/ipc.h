/*
 * ipc.h: messaging between the processes on their libev loops, and the
 * envelope codec.
 *
 * REQ/REP (frontends -> broker, the decision conversation): nng's SP wire
 * over a Unix stream socket, driven by each side's own loop with no thread
 * in between (shared/sp.h); a libnng REQ or REP socket interoperates with
 * either end. The client keeps many requests in flight on one connection,
 * matches replies by request id and redials with backoff; the server
 * answers every peer on its own connection.
 *
 * PUSH/PULL (poller -> broker reports): libnng sockets. The server watches
 * the PULL socket's receive poll fd with an ev_io and drains it with
 * NNG_FLAG_NONBLOCK; the PUSH client sends without blocking.
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

struct tls_ctx;

#define IPC_VERSION 1u
/*
 * The largest envelope either side sends or accepts; a frame over it
 * closes the connection. The frontend keeps every RouteBatch under it:
 * each RouteRequest carries at most IPC_ROUTE_TEXT_MAX bytes of routing
 * text and IPC_ROUTE_TOKENS_MAX token ids (about 9 MiB packed), so one
 * request always fits beside a full backlog of outcomes, and batches are
 * split at the limit (docs/decisions.md).
 */
#define IPC_MAX_MSG          (16u * 1024 * 1024)
#define IPC_ROUTE_TEXT_MAX   (4u * 1024 * 1024)
#define IPC_ROUTE_TOKENS_MAX (1024u * 1024)
#define IPC_BROKER_SOCK      "broker.ipc"
#define IPC_REPORTS_SOCK     "reports.ipc"

/* Builds "ipc://<run_dir>/<name>" into buf; -1 if it does not fit. */
int ipc_url(char *buf, size_t len, const char *run_dir, const char *name);

/* ---- server: REP (broker) or PULL (broker's report socket) ---- */

struct ipc_server;

/*
 * Called on the loop for each received message. For a REP server the
 * callback must set *reply and *reply_len to a malloc'ed buffer (ownership
 * passes to ipc) or leave *reply NULL to send nothing (REP then drops the
 * request and the client times out), or hold the request and answer it
 * later (sp_server_hold, shared/sp.h: a REP server is an sp_server). For PULL,
 * reply and reply_len are NULL. The callback may call ipc_server_free on its
 * own server.
 */
typedef void (*ipc_server_cb)(void *arg, const uint8_t *msg, size_t len,
    uint8_t **reply, size_t *reply_len);

enum ipc_server_kind {
	IPC_SERVER_REP = 0,
	IPC_SERVER_PULL,
};

/*
 * Listens on url (ipc://path; a REP server also tcp://host:port, nng's
 * TCP wire); NULL (logged) on failure. Removes a stale socket file, but
 * fails when another live process listens on it.
 */
struct ipc_server *ipc_server_new(struct ev_loop *loop, const char *url,
    enum ipc_server_kind kind, ipc_server_cb cb, void *arg);
void ipc_server_free(struct ipc_server *srv);
/*
 * REP on tls+tcp://host:port: nng's TLS wire, with a server context
 * (shared/tls.h) that outlives the server. NULL (logged) on failure.
 */
struct ipc_server *ipc_server_new_tls(struct ev_loop *loop, const char *url,
    struct tls_ctx *tls, ipc_server_cb cb, void *arg);
/* The TCP port a tcp:// or tls+tcp:// REP server listens on; else -1. */
int ipc_server_port(const struct ipc_server *srv);

/* ---- client: REQ (frontend), or PUSH (poller) ---- */

struct ipc_client;

/*
 * Completion on the loop. status 0: reply holds len bytes, valid only
 * during the call. Otherwise reply is NULL and status is an nng error code:
 * NNG_ETIMEDOUT (deadline), NNG_ECONNRESET (the connection carrying the
 * request was lost), NNG_ECLOSED (client freed).
 */
typedef void (
    *ipc_reply_cb)(void *arg, int status, const uint8_t *reply, size_t len);

enum ipc_client_kind {
	IPC_CLIENT_REQ = 0,
	IPC_CLIENT_PUSH,
};

/*
 * Dials url (ipc://path; REQ also tcp://host:port) without blocking and redials
 * in the background, so the peer may start later or restart at any time.
 * max_inflight bounds REQ requests waiting for their replies. NULL (logged) on
 * failure.
 */
struct ipc_client *ipc_client_new(struct ev_loop *loop, const char *url,
    enum ipc_client_kind kind, unsigned max_inflight);
/* REQ to tls+tcp://host:port with a client context that outlives it. */
struct ipc_client *ipc_client_new_tls(struct ev_loop *loop, const char *url,
    struct tls_ctx *tls, unsigned max_inflight);
/*
 * Cancels pending requests: each callback not yet run runs once with
 * NNG_ECLOSED before this returns. Safe to call from an ipc_reply_cb; the
 * remaining callbacks then run with NNG_ECLOSED after it returns. cl must
 * not be used afterwards. ipc_client_free(NULL) is a no-op.
 */
void ipc_client_free(struct ipc_client *cl);

/*
 * REQ: sends a copy of msg and calls cb once, with the reply or an error,
 * no later than timeout_ms and never from within this call. Returns 0, or
 * -1 when every request slot is busy or len > IPC_MAX_MSG (cb is then not
 * called). A request sent while the server is away waits for it until its
 * deadline; one already written on a connection that is lost completes
 * with NNG_ECONNRESET (never resent). PUSH: sends without waiting; cb may
 * be NULL and is never called; -1 when the message cannot be queued (peer
 * away and queue full) or is over IPC_MAX_MSG.
 */
int ipc_client_send(struct ipc_client *cl, const uint8_t *msg, size_t len,
    unsigned timeout_ms, ipc_reply_cb cb, void *arg);
/* Requests sent and not yet completed. */
unsigned ipc_client_inflight(struct ipc_client *cl);
/*
 * REQ: 0 while connected to the server (headers exchanged), else the
 * seconds since it was last connected or since the client was made.
 * PUSH: always 0.
 */
double ipc_client_down_secs(struct ipc_client *cl);

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
