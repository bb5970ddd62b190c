/*
 * grpc.h: gRPC over HTTP/2 (nghttp2) on a libev loop: the wire framing
 * shared by the poller's client and the simulated worker's server, and
 * the client channel.
 *
 * Framing (workers.md §4): each message is a 5-byte prefix (compressed
 * flag, then the length as 32-bit big-endian) and the protobuf bytes; the
 * call's outcome is the grpc-status / grpc-message pair of the trailers
 * (or of the headers of a trailers-only response).
 *
 * A channel is one HTTP/2 connection to one server: h2c with prior
 * knowledge for grpc://, TLS with ALPN "h2" for grpcs://. It connects when
 * the first call is started; calls started while it connects wait for it.
 * When the connection fails or ends, every call on it ends with
 * UNAVAILABLE and the channel waits (backoff 100 ms doubling to 30 s,
 * back to 100 ms once a connection has been established) before it
 * connects again: calls started while it waits end with UNAVAILABLE at
 * once (fail fast; the callers' schedules retry). The first failure after
 * a working connection is logged at info, the repeats at debug.
 *
 * Everything runs on the caller's loop; nothing blocks except getaddrinfo
 * for a host that is not numeric.
 */
#ifndef SHARED_GRPC_H
#define SHARED_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>

struct tls_ctx;

/* The status codes of the gRPC protocol (any int passes through). */
enum grpc_code {
	GRPC_OK = 0,
	GRPC_CANCELLED = 1,
	GRPC_UNKNOWN = 2,
	GRPC_INVALID_ARGUMENT = 3,
	GRPC_DEADLINE_EXCEEDED = 4,
	GRPC_NOT_FOUND = 5,
	GRPC_ALREADY_EXISTS = 6,
	GRPC_PERMISSION_DENIED = 7,
	GRPC_RESOURCE_EXHAUSTED = 8,
	GRPC_FAILED_PRECONDITION = 9,
	GRPC_ABORTED = 10,
	GRPC_OUT_OF_RANGE = 11,
	GRPC_UNIMPLEMENTED = 12,
	GRPC_INTERNAL = 13,
	GRPC_UNAVAILABLE = 14,
	GRPC_DATA_LOSS = 15,
	GRPC_UNAUTHENTICATED = 16,
};

#define GRPC_PREFIX_LEN  5
#define GRPC_MESSAGE_MAX 256 /* grpc-message text kept, NUL included */
/* Default limit of one received message, as gRPC's own default. */
#define GRPC_DEFAULT_MAX_MESSAGE (4 * 1024 * 1024)

/* "UNAVAILABLE", ... or "UNKNOWN_CODE" for a code outside the table. */
const char *grpc_code_name(int code);
/* The gRPC code an HTTP status means when no grpc-status came. */
int grpc_code_from_http(int http_status);

/* Writes the 5-byte prefix of an uncompressed message of len bytes. */
void grpc_frame_prefix(uint8_t out[GRPC_PREFIX_LEN], uint32_t len);

/*
 * Formats a grpc-timeout header value for secs (> 0): at most 8 digits
 * and a unit (milliseconds when they fit, else seconds). len >= 16.
 */
void grpc_timeout_format(double secs, char *buf, size_t len);
/* Parses a grpc-timeout value; 0 and *secs, or -1 when malformed. */
int grpc_timeout_parse(const char *s, double *secs);

/* grpc-message is percent-encoded: decodes in (len bytes) into out
 * (NUL-terminated, truncated to outlen - 1; bad escapes copied as is). */
void grpc_message_decode(const char *in, size_t len, char *out, size_t outlen);
/* Percent-encodes in for a grpc-message header; truncated to outlen - 1. */
void grpc_message_encode(const char *in, char *out, size_t outlen);

/* Called for each complete message; msg is valid during the call only. */
typedef void (*grpc_message_cb)(void *arg, const uint8_t *msg, size_t len);

/*
 * Reassembles length-prefixed messages from a byte stream (the DATA of
 * one stream). Messages above the limit and compressed ones (no
 * compression is ever negotiated) are refused.
 */
struct grpc_reader {
	uint8_t gr_head[GRPC_PREFIX_LEN];
	size_t gr_head_len;
	uint8_t *gr_msg; /* body being collected, malloc'ed */
	size_t gr_msg_len; /* its length from the prefix */
	size_t gr_msg_have;
	size_t gr_max;
	bool gr_in_msg; /* the prefix is complete */
};

/* A reader for messages of at most max bytes. */
void grpc_reader_init(struct grpc_reader *r, size_t max);
/* Frees what a partial message holds; the reader can be init'ed again. */
void grpc_reader_clear(struct grpc_reader *r);
/*
 * Feeds len bytes; cb runs for each message completed. Returns GRPC_OK,
 * GRPC_RESOURCE_EXHAUSTED (a message above the limit), GRPC_INTERNAL (a
 * compressed message) or GRPC_RESOURCE_EXHAUSTED when memory runs out;
 * after an error the reader must not be fed again.
 */
int grpc_reader_feed(struct grpc_reader *r, const uint8_t *data, size_t len,
    grpc_message_cb cb, void *arg);
/* Whether a message has been started but not completed. */
bool grpc_reader_partial(const struct grpc_reader *r);

/* ------------------------------------------------------------ client */

struct grpc_channel;
struct grpc_call;

/* The outcome of a call; message never NULL, valid during the callback. */
struct grpc_status {
	int gs_code;
	const char *gs_message;
};

/* Called once when the call ends, whatever the reason; the call is gone
 * when it returns (do not cancel it). It may start and cancel other calls
 * and free the channel. */
typedef void (*grpc_close_cb)(void *arg, const struct grpc_status *st);

/*
 * A channel to url ("grpc://host:port" or "grpcs://host:port"; the port
 * is required, an IPv6 host is bracketed). grpcs:// uses tls (a client
 * context; ALPN "h2" is required of the server); without one grpcs://
 * calls fail with UNAVAILABLE. max_message bounds each received message
 * (0: GRPC_DEFAULT_MAX_MESSAGE). Returns NULL (logged) on a bad URL or no
 * memory. Nothing connects until a call starts.
 */
struct grpc_channel *grpc_channel_new(struct ev_loop *loop, const char *url,
    struct tls_ctx *tls, size_t max_message);
/* Ends every call without its callbacks and closes the connection. NULL
 * is a no-op. From inside a callback of one of its calls, the memory goes
 * once that callback's caller is done with it. */
void grpc_channel_free(struct grpc_channel *ch);
const char *grpc_channel_url(const struct grpc_channel *ch);

/*
 * Starts a call of path ("/package.Service/Method") sending the one
 * request message req (len bytes, protobuf, copied) and half-closing.
 * Each response message goes to on_message, then on_close ends the call;
 * on_close is never called before this function returns. timeout_secs > 0
 * bounds the whole call (grpc-timeout header and a local timer: then
 * DEADLINE_EXCEEDED); <= 0 lets it run (streams). api_key non-empty adds
 * "authorization: Bearer <key>". Returns NULL only when out of memory
 * (logged; no callback).
 */
struct grpc_call *grpc_call_start(struct grpc_channel *ch, const char *path,
    const char *api_key, const void *req, size_t len, double timeout_secs,
    grpc_message_cb on_message, grpc_close_cb on_close, void *arg);
/*
 * cb(arg) runs once when the server accepts the call (response headers
 * with status 200 that do not end it): for a server stream, the moment it
 * is established. Set right after grpc_call_start.
 */
void grpc_call_on_open(struct grpc_call *c, void (*cb)(void *arg));
/* Ends a call without its callbacks (RST_STREAM CANCEL). NULL: no-op. */
void grpc_call_cancel(struct grpc_call *c);

#endif /* SHARED_GRPC_H */
