/*
 * upstream.h: the HTTP/1.1 client of every process (the frontend's
 * requests to workers, the poller's probes and polls), on pooled keep-alive
 * HTTP/1.1 connections (TLS through mbedTLS for https:// workers).
 *
 * One pool per worker base URL; idle connections close after
 * --upstream-pool-idle-timeout-secs. A request is sent, its response head
 * is parsed (http-parser, response mode), and the body is handed over
 * chunk by chunk as it arrives, already de-chunked, so the caller can relay
 * SSE events unchanged. Nothing is buffered beyond one read.
 *
 * Flow control: when the caller cannot take more (its client is slow) it
 * calls upstream_pause; reading the worker stops until upstream_resume.
 *
 * Every callback runs on the loop given to upstream_new. After on_done
 * (exactly once per started request, unless cancelled) the request handle
 * is gone.
 * upstream_cancel drops the connection (the engine sees the disconnect and
 * aborts the generation) and no callback runs afterwards.
 */
#ifndef SHARED_UPSTREAM_H
#define SHARED_UPSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <ev.h>

struct upstream; /* all pools of one process */
struct upstream_req; /* one in-flight request */

struct upstream_header {
	const char *uh_name; /* lowercase */
	size_t uh_name_len;
	const char *uh_value;
	size_t uh_value_len;
};

enum upstream_error {
	UPSTREAM_OK = 0,
	UPSTREAM_CONNECT_FAILED, /* refused, unreachable, TLS handshake */
	UPSTREAM_SEND_FAILED, /* reset before any response byte */
	UPSTREAM_TIMEOUT, /* connect or request deadline */
	UPSTREAM_PROTOCOL, /* unparsable response */
	UPSTREAM_RESET_MIDSTREAM, /* closed after the head was received */
	UPSTREAM_BAD_REQUEST, /* upstream_fetch only: could not start */
};

struct upstream_cbs {
	/* Status and headers (hop-by-hop ones included; caller filters). */
	void (*on_head)(void *arg, int status,
	    const struct upstream_header *headers, size_t nheaders);
	/* A piece of the (de-chunked) body; valid only during the call. */
	void (*on_body)(void *arg, const char *data, size_t len);
	/* End of the response (err UPSTREAM_OK) or failure. */
	void (*on_done)(void *arg, enum upstream_error err);
	/* Optional, streamed uploads only: every body byte given so far has
	 * been sent, after upstream_body_write had returned more than
	 * UPSTREAM_BODY_HIGH. Runs from the loop. */
	void (*on_writable)(void *arg);
};

/* Streamed uploads: buffered body bytes above which the caller should
 * stop reading its client until on_writable. */
#define UPSTREAM_BODY_HIGH (256 * 1024)

struct upstream_config {
	double uc_idle_timeout_secs; /* pooled connection lifetime idle */
	double uc_connect_timeout_secs; /* per connect + TLS handshake */
	double uc_request_timeout_secs; /* whole request */
	const char *uc_ca_paths[8]; /* NULL-terminated; none = system */
	const char *uc_client_cert_path; /* mTLS, optional */
	const char *uc_client_key_path;
	unsigned uc_max_idle_per_worker; /* pooled idle connections kept */
};

/*
 * The config is copied. When CA paths or a client certificate are given
 * they are loaded now: NULL (logged) if they cannot be; otherwise the
 * system CA store is loaded on the first https:// request. Timeouts <= 0
 * mean none; idle timeout <= 0 or max idle 0 mean no connection is kept.
 */
struct upstream *upstream_new(struct ev_loop *loop,
    const struct upstream_config *cfg);
/* Closes every connection; pending requests get no callbacks. Not to be
 * called from inside an upstream callback; pending fetches are cancelled
 * by their owners first. */
void upstream_free(struct upstream *up);

/*
 * Starts `method path` on base_url (http://host:port or https://...).
 * headers are sent as given (the caller adds authorization, content-type,
 * x-request-id, ...); Host, Content-Length (always, except for a GET or
 * HEAD without body) and Connection are added here, and the caller's
 * host, content-length, connection, transfer-encoding, keep-alive,
 * upgrade and te are dropped. body is copied before return. Returns the
 * handle, or NULL when the request cannot even be started (bad URL, a
 * method, path or header with CR/LF or illegal characters, out of
 * memory): no callback runs then. No callback ever runs from inside this
 * call; a request that cannot connect fails from the loop.
 *
 * A pooled connection lost before any response byte (the worker closed
 * it as it was reused) is re-sent once on a new connection, invisibly to
 * the caller (counted by upstream_send_retries). A new connection lost
 * before any response byte gives UPSTREAM_SEND_FAILED: the spec's single
 * immediate re-send is the caller's. Lost after some bytes but
 * before the whole head: UPSTREAM_PROTOCOL; after the head:
 * UPSTREAM_RESET_MIDSTREAM. A body delimited by EOF ends with
 * UPSTREAM_OK at EOF.
 */
struct upstream_req *upstream_request(struct upstream *up, const char *base_url,
    const char *method, const char *path, const struct upstream_header *headers,
    size_t nheaders, const char *body, size_t body_len,
    const struct upstream_cbs *cbs, void *arg);
/*
 * upstream_request with a streamed body (gateway.md §6.4): the head says
 * "Content-Length: body_len" and the body follows through
 * upstream_body_write as the caller receives it. Always on a new
 * connection; a connection lost before any response byte is
 * UPSTREAM_SEND_FAILED and must not be sent again (the body is gone).
 */
struct upstream_req *upstream_request_stream(struct upstream *up,
    const char *base_url, const char *method, const char *path,
    const struct upstream_header *headers, size_t nheaders, uint64_t body_len,
    const struct upstream_cbs *cbs, void *arg);
/*
 * Queues len more bytes of a streamed body (copied). Returns the bytes
 * given but not yet sent, or -1 when req is no streamed request, len is
 * more than the declared length still allows, or out of memory (the
 * caller then cancels). Never runs a callback.
 */
ssize_t upstream_body_write(struct upstream_req *req, const char *data,
    size_t len);
void upstream_pause(struct upstream_req *req);
void upstream_resume(struct upstream_req *req);
void upstream_cancel(struct upstream_req *req);

/*
 * A whole small response in one callback, for probes and polls: GET
 * base_url+path with the caller's headers, bounded by timeout_secs (> 0;
 * it replaces the request timeout of upstream_new), the body kept up to
 * body_max bytes (beyond that the response ends there, ur_truncated set,
 * and the connection is dropped).
 */
struct upstream_result {
	enum upstream_error ur_error; /* UPSTREAM_OK: a response came */
	/* Finer text for logs and reports ("tls handshake failed", "cannot
	 * resolve host", ...); static. */
	const char *ur_reason;
	int ur_status; /* ur_error UPSTREAM_OK only */
	const char *ur_body; /* NUL-terminated, never NULL */
	size_t ur_body_len;
	bool ur_truncated;
};

/* Called once, from the loop; res and its body are valid only during the
 * call, and the fetch handle is gone once it returns. */
typedef void (*upstream_fetch_cb)(void *arg, const struct upstream_result *res);

struct upstream_fetch;

/*
 * Starts the GET. cb is never called before this returns: a request that
 * cannot start (bad URL, path or header) fails from the loop with
 * UPSTREAM_BAD_REQUEST. Returns NULL (logged) only when out of memory;
 * cb is then never called.
 */
struct upstream_fetch *upstream_fetch(struct upstream *up, const char *base_url,
    const char *path, const struct upstream_header *headers, size_t nheaders,
    double timeout_secs, size_t body_max, upstream_fetch_cb cb, void *arg);
/* Drops a pending fetch; its callback is not called. NULL: no-op. */
void upstream_fetch_cancel(struct upstream_fetch *f);

/* Static text for an error ("timeout", "connect failed", ...). */
const char *upstream_strerror(enum upstream_error err);

/* Statistics for tests and metrics. */
unsigned upstream_idle_connections(struct upstream *up);
/* Requests re-sent internally because a reused connection was lost
 * before any response byte, cumulative. */
unsigned long upstream_send_retries(struct upstream *up);

#endif /* SHARED_UPSTREAM_H */
