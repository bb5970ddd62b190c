/*
 * upstream.c: the HTTP/1.1 client: pooled keep-alive connections to
 * workers (and other HTTP servers), plain or TLS, driven by the caller's
 * libev loop.
 *
 * Name resolution: a literal IPv4/IPv6 host is parsed with inet_pton and
 * never touches DNS. A host name is resolved with getaddrinfo, which blocks
 * the loop, only when its pool is created and again after every cached
 * address of the pool failed to connect (the worker may have moved); all
 * other requests use the cached addresses. Register workers by IP to keep
 * lookups off the request path entirely.
 *
 * Nothing here calls back into the caller from inside upstream_request:
 * a reused connection is written on the next loop turn (ev_feed_event), and
 * a request that cannot start fails from a zero-delay timer.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ev.h>
#include <http_parser.h>
#include <xxhash.h>

#include "shared/http.h"
#include "shared/log.h"
#include "shared/tls.h"
#include "shared/upstream.h"
#include "shared/url.h"
#include "shared/xmalloc.h"

#ifndef container_of
#define container_of(ptr, type, member)                                        \
	((type *)(void *)((char *)(ptr)-offsetof(type, member)))
#endif

#define UPSTREAM_NBUCKETS    64 /* pool hash buckets, power of two */
#define UPSTREAM_MAX_POOLS   256 /* past this, unused pools are dropped */
#define UPSTREAM_MAX_ADDRS   8
#define UPSTREAM_MAX_HOST    255
#define UPSTREAM_READ_SIZE   16384
#define UPSTREAM_MAX_HEAD    65536 /* response header bytes kept */
#define UPSTREAM_MAX_HEADERS 128
#define UPSTREAM_MAX_CA      8

enum up_conn_state {
	UPC_CONNECTING = 0,
	UPC_HANDSHAKE,
	UPC_SENDING,
	UPC_RECEIVING,
	UPC_IDLE,
};

/* What one step of a request's state machine left behind. */
enum up_step {
	UPS_AGAIN = 0, /* waiting on the fd: update the watcher */
	UPS_NEXT, /* state advanced: run the next step now */
	UPS_DONE, /* request ended or moved: touch nothing */
};

struct up_pool {
	struct upstream *pl_up;
	LIST_ENTRY(up_pool) pl_link;
	char *pl_key; /* scheme://host:port, lowercase */
	char *pl_host; /* no brackets: SNI, verification, getaddrinfo */
	uint16_t pl_port;
	bool pl_tls;
	bool pl_literal; /* IP literal: never resolved */
	bool pl_stale; /* resolve again before the next connect */
	struct sockaddr_storage pl_addrs[UPSTREAM_MAX_ADDRS];
	socklen_t pl_addrlens[UPSTREAM_MAX_ADDRS];
	unsigned pl_naddrs;
	unsigned pl_addr_pref; /* index that connected last */
	TAILQ_HEAD(, up_conn) pl_idle; /* most recently used first */
	unsigned pl_nidle;
	LIST_HEAD(, up_conn) pl_conns; /* every connection */
	unsigned pl_nconns;
	unsigned pl_nreqs; /* requests referring to the pool */
};

struct up_conn {
	struct up_pool *cn_pool;
	LIST_ENTRY(up_conn) cn_link;
	TAILQ_ENTRY(up_conn) cn_idle_link;
	struct upstream_req *cn_req;
	int cn_fd;
	struct tls_conn *cn_tls;
	enum up_conn_state cn_state;
	int cn_want; /* EV_READ/EV_WRITE the current step waits for */
	int cn_io_events; /* what cn_io is started with, 0 = stopped */
	bool cn_io_fdset; /* cn_io already refers to cn_fd */
	unsigned cn_tried; /* addresses tried by this connect */
	unsigned cn_addr;
	bool cn_reused; /* taken from the idle list */
	ev_io cn_io;
	ev_timer cn_timer; /* connect deadline, then idle timeout */
};

struct up_hdr_span {
	size_t hs_name_off;
	size_t hs_name_len;
	size_t hs_value_off;
	size_t hs_value_len;
};

struct upstream_req {
	struct upstream *rq_up;
	LIST_ENTRY(upstream_req) rq_link;
	struct up_pool *rq_pool;
	struct up_conn *rq_conn;
	struct upstream_cbs rq_cbs;
	void *rq_arg;
	char *rq_out; /* request head and body, sent with one write */
	size_t rq_out_len;
	size_t rq_out_off;
	size_t rq_out_cap; /* streamed upload: allocated size of rq_out */
	size_t rq_tls_wlen; /* length of a TLS write to repeat */
	bool rq_stream; /* streamed upload: body comes through body_write */
	bool rq_notify; /* streamed upload: call on_writable when sent */
	uint64_t rq_body_left; /* streamed upload: bytes still to come */
	ev_timer rq_wnotify; /* runs on_writable from the loop */
	ev_timer rq_timer; /* request deadline, or a deferred failure */
	enum upstream_error rq_deferred;
	http_parser rq_parser;
	char *rq_hbuf; /* response header names and values */
	size_t rq_hbuf_len;
	size_t rq_hbuf_cap;
	struct up_hdr_span *rq_hdrs;
	size_t rq_nhdrs;
	size_t rq_hdrs_cap;
	bool rq_in_value;
	bool rq_interim; /* parsing a 1xx response */
	bool rq_head_done;
	bool rq_complete;
	bool rq_got_bytes;
	bool rq_paused;
	bool rq_cancelled;
	bool rq_in_parse;
	bool rq_resent;
	const char *rq_reason; /* finer text of a failure, or NULL */
	struct upstream_fetch *rq_fetch; /* the fetch this request serves */
	size_t rq_rlen;
	size_t rq_roff;
	char rq_rbuf[UPSTREAM_READ_SIZE];
};

/* One upstream_fetch: the response collected for one callback. */
struct upstream_fetch {
	struct upstream *uf_up;
	struct upstream_req *uf_req; /* NULL once ended */
	upstream_fetch_cb uf_cb;
	void *uf_arg;
	ev_timer uf_fail; /* reports a request that could not start */
	const char *uf_reason;
	int uf_status;
	char *uf_body;
	size_t uf_len;
	size_t uf_cap;
	size_t uf_max;
	bool uf_truncated;
};

struct upstream {
	struct ev_loop *up_loop;
	double up_idle_timeout;
	double up_connect_timeout;
	double up_request_timeout;
	unsigned up_max_idle;
	char *up_ca_paths[UPSTREAM_MAX_CA + 1];
	char *up_cert_path;
	char *up_key_path;
	struct tls_ctx *up_tls;
	bool up_tls_failed;
	LIST_HEAD(, up_pool) up_buckets[UPSTREAM_NBUCKETS];
	unsigned up_npools;
	LIST_HEAD(, upstream_req) up_reqs;
	unsigned up_nidle;
	unsigned long up_send_retries;
};

struct up_url {
	struct url uu_url; /* the fields below point into it */
	bool uu_tls;
	const char *uu_host; /* without brackets */
	size_t uu_host_len;
	bool uu_v6;
	uint16_t uu_port;
	const char *uu_authority; /* Host header value */
	size_t uu_authority_len;
	const char *uu_prefix; /* base path without trailing '/' */
	size_t uu_prefix_len;
};

static int up_url_split(const char *base_url, struct up_url *u);
static bool token_ok(const char *s, size_t len);
static bool field_ok(const char *s, size_t len);
static bool path_ok(const char *path);
static bool header_owned(const struct upstream_header *h);
static int pool_key(const struct up_url *, char *, size_t);
static struct up_pool *pool_get(struct upstream *up, const struct up_url *u);
static int pool_resolve(struct up_pool *pl);
static void pool_free(struct up_pool *pl);
static void pool_evict(struct upstream *up);
static struct tls_ctx *up_tls_ctx(struct upstream *up);
static struct up_conn *conn_take_idle(struct up_pool *pl);
static int conn_open(struct up_conn *c);
static void conn_drop_fd(struct up_conn *c);
static void conn_close(struct up_conn *c);
static void conn_release(struct up_conn *c, bool keep);
static void conn_set_io(struct up_conn *c);
static void conn_io_cb(struct ev_loop *loop, ev_io *w, int revents);
static void conn_timer_cb(struct ev_loop *loop, ev_timer *w, int revents);
static char *req_build(const struct up_url *u, const char *method,
    const char *path, const struct upstream_header *headers, size_t nheaders,
    const char *body, size_t body_len, bool stream, uint64_t stream_len,
    size_t *lenp);
static struct upstream_req *up_start(struct upstream *up, const char *base_url,
    const char *method, const char *path, const struct upstream_header *headers,
    size_t nheaders, const char *body, size_t body_len, bool stream,
    uint64_t stream_len, double timeout, const struct upstream_cbs *cbs,
    void *arg);
static void fetch_on_head(void *arg, int status,
    const struct upstream_header *headers, size_t nheaders);
static void fetch_on_body(void *arg, const char *data, size_t len);
static void fetch_on_done(void *arg, enum upstream_error err);
static void fetch_fail_cb(struct ev_loop *loop, ev_timer *w, int revents);
static void fetch_deliver(struct upstream_fetch *f, enum upstream_error err);
static void req_wnotify_cb(struct ev_loop *loop, ev_timer *w, int revents);
static enum upstream_error req_attach(struct upstream_req *req, bool fresh);
static void req_defer_failure(struct upstream_req *req,
    enum upstream_error err);
static void req_run(struct upstream_req *req);
static enum up_step req_connected(struct upstream_req *req);
static enum up_step req_handshake(struct upstream_req *req);
static enum up_step req_send(struct upstream_req *req);
static enum up_step req_receive(struct upstream_req *req);
static enum up_step req_parse(struct upstream_req *req);
static enum up_step req_eof(struct upstream_req *req);
static enum up_step req_broken(struct upstream_req *req);
static enum up_step req_pre_response_failure(struct upstream_req *req);
static void req_reset_response(struct upstream_req *req);
static void req_fail(struct upstream_req *req, enum upstream_error err);
static void req_finish(struct upstream_req *req);
static void req_end(struct upstream_req *req, enum upstream_error err);
static void req_free(struct upstream_req *req);
static void req_timer_cb(struct ev_loop *loop, ev_timer *w, int revents);
static int hbuf_append(struct upstream_req *req, const char *at, size_t len,
    bool lower);
static int rp_on_message_begin(http_parser *p);
static int rp_on_header_field(http_parser *p, const char *at, size_t len);
static int rp_on_header_value(http_parser *p, const char *at, size_t len);
static int rp_on_headers_complete(http_parser *p);
static int rp_on_body(http_parser *p, const char *at, size_t len);
static int rp_on_message_complete(http_parser *p);

static const http_parser_settings rp_settings = {
	.on_message_begin = rp_on_message_begin,
	.on_header_field = rp_on_header_field,
	.on_header_value = rp_on_header_value,
	.on_headers_complete = rp_on_headers_complete,
	.on_body = rp_on_body,
	.on_message_complete = rp_on_message_complete,
};

/* Headers this file writes itself; the caller's copies are dropped. */
static const char *const owned_headers[] = {
	"host",
	"content-length",
	"connection",
	"transfer-encoding",
	"keep-alive",
	"upgrade",
	"te",
};

struct upstream *
upstream_new(struct ev_loop *loop, const struct upstream_config *cfg)
{
	struct upstream *up;
	size_t i;

	up = xcalloc(1, sizeof(*up));
	up->up_loop = loop;
	up->up_idle_timeout = cfg->uc_idle_timeout_secs;
	up->up_connect_timeout = cfg->uc_connect_timeout_secs;
	up->up_request_timeout = cfg->uc_request_timeout_secs;
	up->up_max_idle = cfg->uc_max_idle_per_worker;
	for (i = 0; i < UPSTREAM_MAX_CA && cfg->uc_ca_paths[i] != NULL; i++)
		up->up_ca_paths[i] = xstrdup(cfg->uc_ca_paths[i]);
	if (cfg->uc_client_cert_path != NULL)
		up->up_cert_path = xstrdup(cfg->uc_client_cert_path);
	if (cfg->uc_client_key_path != NULL)
		up->up_key_path = xstrdup(cfg->uc_client_key_path);
	for (i = 0; i < UPSTREAM_NBUCKETS; i++)
		LIST_INIT(&up->up_buckets[i]);
	LIST_INIT(&up->up_reqs);

	/* Files named on the command line are checked at startup. */
	if (up->up_ca_paths[0] != NULL || up->up_cert_path != NULL ||
	    up->up_key_path != NULL) {
		if (up_tls_ctx(up) == NULL) {
			upstream_free(up);
			return NULL;
		}
	}
	return up;
}

void
upstream_free(struct upstream *up)
{
	struct upstream_req *req;
	struct up_pool *pl;
	size_t i;

	if (up == NULL)
		return;
	while ((req = LIST_FIRST(&up->up_reqs)) != NULL) {
		if (req->rq_conn != NULL)
			conn_close(req->rq_conn);
		req_free(req);
	}
	for (i = 0; i < UPSTREAM_NBUCKETS; i++) {
		while ((pl = LIST_FIRST(&up->up_buckets[i])) != NULL)
			pool_free(pl);
	}
	tls_ctx_free(up->up_tls);
	for (i = 0; up->up_ca_paths[i] != NULL; i++)
		free(up->up_ca_paths[i]);
	free(up->up_cert_path);
	free(up->up_key_path);
	free(up);
}

unsigned
upstream_idle_connections(struct upstream *up)
{
	return up->up_nidle;
}

unsigned long
upstream_send_retries(struct upstream *up)
{
	return up->up_send_retries;
}

static struct tls_ctx *
up_tls_ctx(struct upstream *up)
{
	if (up->up_tls == NULL && !up->up_tls_failed) {
		up->up_tls =
		    tls_ctx_new_client((const char *const *)up->up_ca_paths,
		        up->up_cert_path, up->up_key_path);
		if (up->up_tls == NULL) {
			log_warnx("%s: https workers are unreachable",
			    __func__);
			up->up_tls_failed = true;
		}
	}
	return up->up_tls;
}

/* http://host[:port][/prefix] or https://...; no userinfo, query, fragment. */
static int
up_url_split(const char *base_url, struct up_url *u)
{
	struct url *pu = &u->uu_url;
	size_t i;

	memset(u, 0, sizeof(*u));
	if (url_parse(base_url, pu) == -1 || pu->u_userinfo ||
	    pu->u_rank >= 0 || pu->u_query_len > 0 || pu->u_fragment)
		return -1;
	if (url_scheme_is(pu, "http"))
		u->uu_tls = false;
	else if (url_scheme_is(pu, "https"))
		u->uu_tls = true;
	else
		return -1;
	if (pu->u_port == 0)
		return -1;
	u->uu_host = pu->u_host;
	u->uu_host_len = strlen(pu->u_host);
	u->uu_v6 = pu->u_ipv6;
	u->uu_port = pu->u_port;
	u->uu_authority = pu->u_authority;
	u->uu_authority_len = pu->u_authority_len;
	u->uu_prefix = pu->u_path;
	u->uu_prefix_len = pu->u_path_len;
	while (
	    u->uu_prefix_len > 0 && u->uu_prefix[u->uu_prefix_len - 1] == '/')
		u->uu_prefix_len--;
	for (i = 0; i < u->uu_prefix_len; i++) {
		if ((unsigned char)u->uu_prefix[i] <= ' ')
			return -1;
	}
	return 0;
}

/* An HTTP token (method, header name). */
static bool
token_ok(const char *s, size_t len)
{
	size_t i;
	unsigned char ch;

	if (len == 0)
		return false;
	for (i = 0; i < len; i++) {
		ch = (unsigned char)s[i];
		if (ch <= ' ' || ch >= 0x7f ||
		    strchr("()<>@,;:\\\"/[]?={}", ch))
			return false;
	}
	return true;
}

/* A header value or request path: no CR, LF or NUL (no injection). */
static bool
field_ok(const char *s, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++) {
		if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
			return false;
	}
	return true;
}

/* An origin-form request target: no space or control character. */
static bool
path_ok(const char *path)
{
	const unsigned char *p = (const unsigned char *)path;

	if (*p != '/')
		return false;
	for (; *p != '\0'; p++) {
		if (*p <= ' ' || *p == 0x7f)
			return false;
	}
	return true;
}

static bool
header_owned(const struct upstream_header *h)
{
	size_t i;

	for (i = 0; i < sizeof(owned_headers) / sizeof(owned_headers[0]); i++) {
		if (strlen(owned_headers[i]) == h->uh_name_len &&
		    strncasecmp(owned_headers[i], h->uh_name, h->uh_name_len) ==
		        0)
			return true;
	}
	return false;
}

static int
pool_key(const struct up_url *u, char *key, size_t size)
{
	const char *scheme = u->uu_tls ? "https://" : "http://";
	size_t sl = strlen(scheme), n, i;
	char port[12], *p = port + sizeof(port);
	unsigned v = u->uu_port;

	do {
		*--p = (char)('0' + v % 10);
		v /= 10;
	} while (v != 0);
	n = sl + u->uu_host_len + (u->uu_v6 ? 2 : 0) + 1 +
	    (size_t)(port + sizeof(port) - p);
	if (n >= size)
		return -1;
	memcpy(key, scheme, sl);
	n = sl;
	if (u->uu_v6)
		key[n++] = '[';
	for (i = 0; i < u->uu_host_len; i++) {
		key[n] = u->uu_host[i];
		if (key[n] >= 'A' && key[n] <= 'Z')
			key[n] = (char)(key[n] - 'A' + 'a');
		n++;
	}
	if (u->uu_v6)
		key[n++] = ']';
	key[n++] = ':';
	memcpy(key + n, p, (size_t)(port + sizeof(port) - p));
	n += (size_t)(port + sizeof(port) - p);
	key[n] = '\0';
	return (int)n;
}

static struct up_pool *
pool_get(struct upstream *up, const struct up_url *u)
{
	char key[UPSTREAM_MAX_HOST + 32];
	struct up_pool *pl;
	struct sockaddr_in *sin;
	struct sockaddr_in6 *sin6;
	uint64_t h;
	int n;

	/* "scheme://host:port", host lower-cased (once per request: no
	 * printf). */
	if ((n = pool_key(u, key, sizeof(key))) == -1)
		return NULL;
	h = XXH3_64bits(key, (size_t)n);
	LIST_FOREACH(pl, &up->up_buckets[h & (UPSTREAM_NBUCKETS - 1)], pl_link)
	{
		if (strcmp(pl->pl_key, key) == 0)
			return pl;
	}

	if (up->up_npools >= UPSTREAM_MAX_POOLS)
		pool_evict(up);
	if ((pl = calloc(1, sizeof(*pl))) == NULL ||
	    (pl->pl_key = strdup(key)) == NULL ||
	    (pl->pl_host = strndup(u->uu_host, u->uu_host_len)) == NULL) {
		log_warn("%s: allocation", __func__);
		if (pl != NULL) {
			free(pl->pl_key);
			free(pl);
		}
		return NULL;
	}
	pl->pl_up = up;
	pl->pl_port = u->uu_port;
	pl->pl_tls = u->uu_tls;
	TAILQ_INIT(&pl->pl_idle);
	LIST_INIT(&pl->pl_conns);
	LIST_INSERT_HEAD(&up->up_buckets[h & (UPSTREAM_NBUCKETS - 1)], pl,
	    pl_link);
	up->up_npools++;

	sin = (struct sockaddr_in *)&pl->pl_addrs[0];
	sin6 = (struct sockaddr_in6 *)&pl->pl_addrs[0];
	if (inet_pton(AF_INET, pl->pl_host, &sin->sin_addr) == 1) {
		sin->sin_family = AF_INET;
		sin->sin_port = htons(pl->pl_port);
		pl->pl_addrlens[0] = sizeof(*sin);
		pl->pl_naddrs = 1;
		pl->pl_literal = true;
	} else if (inet_pton(AF_INET6, pl->pl_host, &sin6->sin6_addr) == 1) {
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons(pl->pl_port);
		pl->pl_addrlens[0] = sizeof(*sin6);
		pl->pl_naddrs = 1;
		pl->pl_literal = true;
	} else
		pl->pl_stale = true; /* resolved by the first connect */
	return pl;
}

static int
pool_resolve(struct up_pool *pl)
{
	struct addrinfo hints, *res, *ai;
	char port[8];
	int rv;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	snprintf(port, sizeof(port), "%u", (unsigned)pl->pl_port);
	if ((rv = getaddrinfo(pl->pl_host, port, &hints, &res)) != 0) {
		log_warnx("%s: %s: %s", __func__, pl->pl_key, gai_strerror(rv));
		return -1;
	}
	pl->pl_naddrs = 0;
	pl->pl_addr_pref = 0;
	for (ai = res; ai != NULL && pl->pl_naddrs < UPSTREAM_MAX_ADDRS;
	     ai = ai->ai_next) {
		if (ai->ai_addrlen > sizeof(pl->pl_addrs[0]))
			continue;
		memcpy(&pl->pl_addrs[pl->pl_naddrs], ai->ai_addr,
		    ai->ai_addrlen);
		pl->pl_addrlens[pl->pl_naddrs] = ai->ai_addrlen;
		pl->pl_naddrs++;
	}
	freeaddrinfo(res);
	if (pl->pl_naddrs == 0) {
		log_warnx("%s: %s: no usable address", __func__, pl->pl_key);
		return -1;
	}
	pl->pl_stale = false;
	return 0;
}

static void
pool_free(struct up_pool *pl)
{
	struct up_conn *c;

	while ((c = LIST_FIRST(&pl->pl_conns)) != NULL)
		conn_close(c);
	LIST_REMOVE(pl, pl_link);
	pl->pl_up->up_npools--;
	free(pl->pl_key);
	free(pl->pl_host);
	free(pl);
}

/* Drops pools that no connection or request uses (removed workers). */
static void
pool_evict(struct upstream *up)
{
	struct up_pool *pl, *next;
	size_t i;

	for (i = 0; i < UPSTREAM_NBUCKETS; i++) {
		for (pl = LIST_FIRST(&up->up_buckets[i]); pl != NULL;
		     pl = next) {
			next = LIST_NEXT(pl, pl_link);
			if (pl->pl_nconns == 0 && pl->pl_nreqs == 0)
				pool_free(pl);
		}
	}
}

/*
 * The most recently used idle connection. One the worker closed while it
 * sat in the pool was already dropped by its read watcher (conn_io_cb);
 * one closed since the loop last polled is not probed here (that would
 * cost a syscall per request): the request then fails before any response
 * byte and goes out once more on a new connection.
 */
static struct up_conn *
conn_take_idle(struct up_pool *pl)
{
	struct up_conn *c;

	if ((c = TAILQ_FIRST(&pl->pl_idle)) == NULL)
		return NULL;
	TAILQ_REMOVE(&pl->pl_idle, c, cn_idle_link);
	pl->pl_nidle--;
	pl->pl_up->up_nidle--;
	ev_timer_stop(pl->pl_up->up_loop, &c->cn_timer);
	c->cn_state = UPC_SENDING;
	c->cn_reused = true;
	return c;
}

/* Starts a non-blocking connect to the next untried address. */
static int
conn_open(struct up_conn *c)
{
	struct up_pool *pl = c->cn_pool;
	const struct sockaddr *sa;
	unsigned idx;
	int fd, one = 1;

	while (c->cn_tried < pl->pl_naddrs) {
		idx = (pl->pl_addr_pref + c->cn_tried) % pl->pl_naddrs;
		c->cn_tried++;
		sa = (const struct sockaddr *)&pl->pl_addrs[idx];
		fd = socket(sa->sa_family,
		    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd == -1) {
			log_warn("%s: socket", __func__);
			return -1;
		}
		if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
		        sizeof(one)) == -1)
			log_warn("%s: TCP_NODELAY", __func__);
		if (connect(fd, sa, pl->pl_addrlens[idx]) == -1 &&
		    errno != EINPROGRESS) {
			log_debug("%s: %s: connect: %s", __func__, pl->pl_key,
			    strerror(errno));
			close(fd);
			continue;
		}
		c->cn_fd = fd;
		c->cn_addr = idx;
		c->cn_state = UPC_CONNECTING;
		c->cn_want = EV_WRITE;
		return 0;
	}
	return -1;
}

static void
conn_drop_fd(struct up_conn *c)
{
	struct ev_loop *loop = c->cn_pool->pl_up->up_loop;

	ev_io_stop(loop, &c->cn_io);
	c->cn_io_events = 0;
	c->cn_io_fdset = false;
	tls_conn_free(c->cn_tls);
	c->cn_tls = NULL;
	if (c->cn_fd != -1)
		close(c->cn_fd);
	c->cn_fd = -1;
}

static void
conn_close(struct up_conn *c)
{
	struct up_pool *pl = c->cn_pool;
	struct upstream *up = pl->pl_up;

	if (c->cn_state == UPC_IDLE) {
		TAILQ_REMOVE(&pl->pl_idle, c, cn_idle_link);
		pl->pl_nidle--;
		up->up_nidle--;
	}
	if (c->cn_req != NULL)
		c->cn_req->rq_conn = NULL;
	ev_timer_stop(up->up_loop, &c->cn_timer);
	conn_drop_fd(c);
	LIST_REMOVE(c, cn_link);
	pl->pl_nconns--;
	free(c);
}

/* The request on c ended cleanly: keep c for the next one, or close it. */
static void
conn_release(struct up_conn *c, bool keep)
{
	struct up_pool *pl = c->cn_pool;
	struct upstream *up = pl->pl_up;

	c->cn_req = NULL;
	if (!keep || up->up_max_idle == 0 || up->up_idle_timeout <= 0 ||
	    pl->pl_nidle >= up->up_max_idle) {
		conn_close(c);
		return;
	}
	c->cn_state = UPC_IDLE;
	c->cn_want = EV_READ;
	TAILQ_INSERT_HEAD(&pl->pl_idle, c, cn_idle_link);
	pl->pl_nidle++;
	up->up_nidle++;
	ev_timer_stop(up->up_loop, &c->cn_timer);
	ev_timer_set(&c->cn_timer, up->up_idle_timeout, 0.);
	ev_timer_start(up->up_loop, &c->cn_timer);
	conn_set_io(c);
}

/*
 * Watches what the current step waits for. The fd is set once per socket;
 * later changes only swap the events (ev_io_modify), so libev issues one
 * EPOLL_CTL_MOD when the mask really changes and nothing otherwise.
 */
static void
conn_set_io(struct up_conn *c)
{
	struct ev_loop *loop = c->cn_pool->pl_up->up_loop;
	int events = c->cn_want;

	if (c->cn_state == UPC_RECEIVING && c->cn_req != NULL &&
	    c->cn_req->rq_paused)
		events = 0;
	if (events == c->cn_io_events)
		return;
	ev_io_stop(loop, &c->cn_io);
	c->cn_io_events = events;
	if (events == 0)
		return;
	if (c->cn_io_fdset) {
		ev_io_modify(&c->cn_io, events);
	} else {
		ev_io_set(&c->cn_io, c->cn_fd, events);
		c->cn_io_fdset = true;
	}
	ev_io_start(loop, &c->cn_io);
}

static void
conn_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct up_conn *c = container_of(w, struct up_conn, cn_io);

	(void)loop;
	(void)revents;
	if (c->cn_state == UPC_IDLE) {
		/* EOF, or bytes nobody asked for: either way unusable. */
		log_debug("%s: %s: idle connection closed", __func__,
		    c->cn_pool->pl_key);
		conn_close(c);
		return;
	}
	if (c->cn_req != NULL)
		req_run(c->cn_req);
}

static void
conn_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct up_conn *c = container_of(w, struct up_conn, cn_timer);

	(void)loop;
	(void)revents;
	if (c->cn_state == UPC_IDLE) {
		conn_close(c);
		return;
	}
	log_debug("%s: %s: connect timeout", __func__, c->cn_pool->pl_key);
	if (c->cn_req != NULL)
		req_fail(c->cn_req, UPSTREAM_TIMEOUT);
	else
		conn_close(c);
}

struct upstream_req *
upstream_request(struct upstream *up, const char *base_url, const char *method,
    const char *path, const struct upstream_header *headers, size_t nheaders,
    const char *body, size_t body_len, const struct upstream_cbs *cbs,
    void *arg)
{
	return up_start(up, base_url, method, path, headers, nheaders, body,
	    body_len, false, 0, up->up_request_timeout, cbs, arg);
}

struct upstream_req *
upstream_request_stream(struct upstream *up, const char *base_url,
    const char *method, const char *path, const struct upstream_header *headers,
    size_t nheaders, uint64_t body_len, const struct upstream_cbs *cbs,
    void *arg)
{
	return up_start(up, base_url, method, path, headers, nheaders, NULL, 0,
	    true, body_len, up->up_request_timeout, cbs, arg);
}

static struct upstream_req *
up_start(struct upstream *up, const char *base_url, const char *method,
    const char *path, const struct upstream_header *headers, size_t nheaders,
    const char *body, size_t body_len, bool stream, uint64_t stream_len,
    double timeout, const struct upstream_cbs *cbs, void *arg)
{
	struct upstream_req *req;
	struct up_url u;
	struct up_pool *pl;
	enum upstream_error err;
	size_t i;

	if (up_url_split(base_url, &u) == -1) {
		log_warnx("%s: bad worker URL \"%s\"", __func__, base_url);
		return NULL;
	}
	if (!token_ok(method, strlen(method)) || !path_ok(path)) {
		log_warnx("%s: bad method or path", __func__);
		return NULL;
	}
	for (i = 0; i < nheaders; i++) {
		if (!token_ok(headers[i].uh_name, headers[i].uh_name_len) ||
		    !field_ok(headers[i].uh_value, headers[i].uh_value_len)) {
			log_warnx("%s: bad header %.*s", __func__,
			    (int)headers[i].uh_name_len, headers[i].uh_name);
			return NULL;
		}
	}
	if ((pl = pool_get(up, &u)) == NULL)
		return NULL;
	/* The read buffer is written before it is read: zeroing its 16 KB
	 * per request cost more than the rest of the request (measured). */
	if ((req = malloc(sizeof(*req))) == NULL) {
		log_warn("%s: malloc", __func__);
		return NULL;
	}
	memset(req, 0, offsetof(struct upstream_req, rq_rbuf));
	req->rq_out = req_build(&u, method, path, headers, nheaders, body,
	    body_len, stream, stream_len, &req->rq_out_len);
	if (req->rq_out == NULL) {
		free(req);
		return NULL;
	}
	req->rq_out_cap = req->rq_out_len;
	req->rq_stream = stream;
	req->rq_body_left = stream_len;
	req->rq_up = up;
	req->rq_pool = pl;
	pl->pl_nreqs++;
	req->rq_cbs = *cbs;
	req->rq_arg = arg;
	http_parser_init(&req->rq_parser, HTTP_RESPONSE);
	req->rq_parser.data = req;
	LIST_INSERT_HEAD(&up->up_reqs, req, rq_link);
	ev_timer_init(&req->rq_timer, req_timer_cb, 0., 0.);
	ev_timer_init(&req->rq_wnotify, req_wnotify_cb, 0., 0.);
	if (timeout > 0) {
		ev_timer_set(&req->rq_timer, timeout, 0.);
		ev_timer_start(up->up_loop, &req->rq_timer);
	}
	/* A streamed body cannot be sent twice: always a new connection,
	 * so a lost one is the caller's failure, never re-sent here. */
	if ((err = req_attach(req, stream)) != UPSTREAM_OK)
		req_defer_failure(req, err);
	return req;
}

/* Request line, Host, caller headers, Content-Length, Connection, body. */
static char *
req_build(const struct up_url *u, const char *method, const char *path,
    const struct upstream_header *headers, size_t nheaders, const char *body,
    size_t body_len, bool stream, uint64_t stream_len, size_t *lenp)
{
	static const char conn_hdr[] = "Connection: keep-alive\r\n\r\n";
	char clen[48];
	size_t mlen, plen, size, i;
	bool with_clen;
	char *out, *p;
	int n;

	mlen = strlen(method);
	plen = strlen(path);
	with_clen = stream || body_len > 0 ||
	    (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0);
	n = 0;
	if (with_clen) {
		memcpy(clen, "Content-Length: ", 16);
		n = 16 +
		    (int)http_fmt_u64(clen + 16,
		        stream ? (uint64_t)stream_len : (uint64_t)body_len);
		memcpy(clen + n, "\r\n", 3);
		n += 2;
	}
	clen[n] = '\0';
	size = mlen + 1 + u->uu_prefix_len + plen + sizeof(" HTTP/1.1\r\n") +
	    sizeof("Host: \r\n") + u->uu_authority_len + (size_t)n +
	    sizeof(conn_hdr) + body_len;
	for (i = 0; i < nheaders; i++)
		size += headers[i].uh_name_len + headers[i].uh_value_len + 4;
	if ((out = malloc(size)) == NULL) {
		log_warn("%s: malloc", __func__);
		return NULL;
	}
	p = out;
#define PUT(s, l)                                                              \
	do {                                                                   \
		memcpy(p, (s), (l));                                           \
		p += (l);                                                      \
	} while (0)
	PUT(method, mlen);
	PUT(" ", 1);
	PUT(u->uu_prefix, u->uu_prefix_len);
	PUT(path, plen);
	PUT(" HTTP/1.1\r\nHost: ", sizeof(" HTTP/1.1\r\nHost: ") - 1);
	PUT(u->uu_authority, u->uu_authority_len);
	PUT("\r\n", 2);
	for (i = 0; i < nheaders; i++) {
		if (header_owned(&headers[i]))
			continue;
		PUT(headers[i].uh_name, headers[i].uh_name_len);
		PUT(": ", 2);
		PUT(headers[i].uh_value, headers[i].uh_value_len);
		PUT("\r\n", 2);
	}
	PUT(clen, (size_t)n);
	PUT(conn_hdr, sizeof(conn_hdr) - 1);
	if (body_len > 0)
		PUT(body, body_len);
#undef PUT
	*lenp = (size_t)(p - out);
	return out;
}

/* Puts req on a pooled connection (unless fresh) or a new one. */
static enum upstream_error
req_attach(struct upstream_req *req, bool fresh)
{
	struct up_pool *pl = req->rq_pool;
	struct upstream *up = req->rq_up;
	struct up_conn *c;

	if (!fresh && (c = conn_take_idle(pl)) != NULL) {
		c->cn_req = req;
		req->rq_conn = c;
		c->cn_state = UPC_SENDING;
		c->cn_want = EV_WRITE;
		conn_set_io(c);
		/* Write on the next loop turn, never from inside the caller. */
		ev_feed_event(up->up_loop, &c->cn_io, EV_WRITE);
		return UPSTREAM_OK;
	}
	if (pl->pl_stale && !pl->pl_literal && pool_resolve(pl) == -1) {
		req->rq_reason = "cannot resolve host";
		return UPSTREAM_CONNECT_FAILED;
	}
	if (pl->pl_tls && up_tls_ctx(up) == NULL) {
		req->rq_reason = "https not available";
		return UPSTREAM_CONNECT_FAILED;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL) {
		log_warn("%s: calloc", __func__);
		return UPSTREAM_CONNECT_FAILED;
	}
	c->cn_pool = pl;
	c->cn_fd = -1;
	ev_init(&c->cn_io, conn_io_cb);
	ev_timer_init(&c->cn_timer, conn_timer_cb, 0., 0.);
	LIST_INSERT_HEAD(&pl->pl_conns, c, cn_link);
	pl->pl_nconns++;
	if (conn_open(c) == -1) {
		log_debug("%s: %s: no address accepted the connection",
		    __func__, pl->pl_key);
		if (!pl->pl_literal)
			pl->pl_stale = true;
		conn_close(c);
		return UPSTREAM_CONNECT_FAILED;
	}
	c->cn_req = req;
	req->rq_conn = c;
	if (up->up_connect_timeout > 0) {
		ev_timer_set(&c->cn_timer, up->up_connect_timeout, 0.);
		ev_timer_start(up->up_loop, &c->cn_timer);
	}
	conn_set_io(c);
	return UPSTREAM_OK;
}

static void
req_defer_failure(struct upstream_req *req, enum upstream_error err)
{
	struct ev_loop *loop = req->rq_up->up_loop;

	req->rq_deferred = err;
	ev_timer_stop(loop, &req->rq_timer);
	ev_timer_set(&req->rq_timer, 0., 0.);
	ev_timer_start(loop, &req->rq_timer);
}

/* Runs the request's state machine until it has to wait or ends. */
static void
req_run(struct upstream_req *req)
{
	struct up_conn *c;
	enum up_step st;

	for (;;) {
		c = req->rq_conn;
		switch (c->cn_state) {
		case UPC_CONNECTING:
			st = req_connected(req);
			break;
		case UPC_HANDSHAKE:
			st = req_handshake(req);
			break;
		case UPC_SENDING:
			st = req_send(req);
			break;
		case UPC_RECEIVING:
			st = req_receive(req);
			break;
		default:
			log_warnx("%s: request on an idle connection",
			    __func__);
			req_fail(req, UPSTREAM_PROTOCOL);
			return;
		}
		if (st == UPS_DONE)
			return;
		if (st == UPS_AGAIN) {
			conn_set_io(req->rq_conn);
			return;
		}
	}
}

static enum up_step
req_connected(struct upstream_req *req)
{
	struct up_conn *c = req->rq_conn;
	struct up_pool *pl = c->cn_pool;
	socklen_t len = sizeof(int);
	int err = 0;

	if (getsockopt(c->cn_fd, SOL_SOCKET, SO_ERROR, &err, &len) == -1)
		err = errno;
	if (err == EINPROGRESS || err == EALREADY)
		return UPS_AGAIN;
	if (err != 0) {
		log_debug("%s: %s: connect: %s", __func__, pl->pl_key,
		    strerror(err));
		conn_drop_fd(c);
		if (conn_open(c) == 0)
			return UPS_AGAIN;
		if (!pl->pl_literal)
			pl->pl_stale = true;
		req_fail(req, UPSTREAM_CONNECT_FAILED);
		return UPS_DONE;
	}
	pl->pl_addr_pref = c->cn_addr;
	if (pl->pl_tls) {
		c->cn_tls = tls_conn_new_client(pl->pl_up->up_tls, c->cn_fd,
		    pl->pl_host);
		if (c->cn_tls == NULL) {
			req->rq_reason = "tls handshake failed";
			req_fail(req, UPSTREAM_CONNECT_FAILED);
			return UPS_DONE;
		}
		c->cn_state = UPC_HANDSHAKE;
		return UPS_NEXT;
	}
	ev_timer_stop(pl->pl_up->up_loop, &c->cn_timer);
	c->cn_state = UPC_SENDING;
	return UPS_NEXT;
}

static enum up_step
req_handshake(struct upstream_req *req)
{
	struct up_conn *c = req->rq_conn;

	switch (tls_conn_handshake(c->cn_tls)) {
	case TLS_OK:
		ev_timer_stop(c->cn_pool->pl_up->up_loop, &c->cn_timer);
		c->cn_state = UPC_SENDING;
		return UPS_NEXT;
	case TLS_WANT_READ:
		c->cn_want = EV_READ;
		return UPS_AGAIN;
	case TLS_WANT_WRITE:
		c->cn_want = EV_WRITE;
		return UPS_AGAIN;
	default:
		log_warnx("%s: %s: TLS handshake failed", __func__,
		    c->cn_pool->pl_key);
		req->rq_reason = "tls handshake failed";
		req_fail(req, UPSTREAM_CONNECT_FAILED);
		return UPS_DONE;
	}
}

static enum up_step
req_send(struct upstream_req *req)
{
	struct up_conn *c = req->rq_conn;
	const char *p;
	size_t left;
	ssize_t n;

	while (req->rq_out_off < req->rq_out_len) {
		p = req->rq_out + req->rq_out_off;
		left = req->rq_out_len - req->rq_out_off;
		if (c->cn_tls != NULL) {
			/* mbedTLS wants a write it deferred repeated as is. */
			if (req->rq_tls_wlen != 0)
				left = req->rq_tls_wlen;
			n = tls_conn_write(c->cn_tls, p, left);
			if (n == TLS_WANT_READ || n == TLS_WANT_WRITE) {
				req->rq_tls_wlen = left;
				c->cn_want =
				    n == TLS_WANT_READ ? EV_READ : EV_WRITE;
				return UPS_AGAIN;
			}
			req->rq_tls_wlen = 0;
			if (n < 0)
				return req_pre_response_failure(req);
		} else {
			n = send(c->cn_fd, p, left, MSG_NOSIGNAL);
			if (n == -1) {
				if (errno == EINTR)
					continue;
				if (errno == EAGAIN || errno == EWOULDBLOCK) {
					c->cn_want = EV_WRITE;
					return UPS_AGAIN;
				}
				log_debug("%s: %s: send: %s", __func__,
				    c->cn_pool->pl_key, strerror(errno));
				return req_pre_response_failure(req);
			}
		}
		req->rq_out_off += (size_t)n;
	}
	if (req->rq_stream && req->rq_body_left > 0) {
		/* Everything given is sent: wait for the next piece. */
		req->rq_out_off = req->rq_out_len = 0;
		c->cn_want = 0;
		if (req->rq_notify) {
			req->rq_notify = false;
			ev_timer_start(req->rq_up->up_loop, &req->rq_wnotify);
		}
		return UPS_AGAIN;
	}
	c->cn_state = UPC_RECEIVING;
	c->cn_want = EV_READ;
	return UPS_NEXT;
}

static enum up_step
req_receive(struct upstream_req *req)
{
	struct up_conn *c = req->rq_conn;
	ssize_t n;

	for (;;) {
		if (req->rq_paused)
			return UPS_AGAIN;
		if (req->rq_roff == req->rq_rlen) {
			if (c->cn_tls != NULL) {
				n = tls_conn_read(c->cn_tls, req->rq_rbuf,
				    sizeof(req->rq_rbuf));
				if (n == TLS_WANT_READ) {
					c->cn_want = EV_READ;
					return UPS_AGAIN;
				}
				if (n == TLS_WANT_WRITE) {
					c->cn_want = EV_WRITE;
					return UPS_AGAIN;
				}
				if (n == TLS_CLOSED)
					return req_eof(req);
				if (n < 0)
					return req_broken(req);
			} else {
				n = read(c->cn_fd, req->rq_rbuf,
				    sizeof(req->rq_rbuf));
				if (n == -1) {
					if (errno == EINTR)
						continue;
					if (errno == EAGAIN ||
					    errno == EWOULDBLOCK) {
						c->cn_want = EV_READ;
						return UPS_AGAIN;
					}
					log_debug("%s: %s: read: %s", __func__,
					    c->cn_pool->pl_key,
					    strerror(errno));
					return req_broken(req);
				}
				if (n == 0)
					return req_eof(req);
			}
			req->rq_rlen = (size_t)n;
			req->rq_roff = 0;
			req->rq_got_bytes = true;
		}
		if (req_parse(req) == UPS_DONE)
			return UPS_DONE;
		/* A plain socket signals again; TLS may hold a record. */
		if (req->rq_roff == req->rq_rlen &&
		    (c->cn_tls == NULL || tls_conn_pending(c->cn_tls) == 0)) {
			c->cn_want = EV_READ;
			return UPS_AGAIN;
		}
	}
}

static enum up_step
req_parse(struct upstream_req *req)
{
	http_parser *p = &req->rq_parser;
	enum http_errno herr;
	size_t n;

	req->rq_in_parse = true;
	n = http_parser_execute(p, &rp_settings, req->rq_rbuf + req->rq_roff,
	    req->rq_rlen - req->rq_roff);
	req->rq_in_parse = false;
	req->rq_roff += n;
	if (req->rq_cancelled) {
		if (req->rq_conn != NULL)
			conn_close(req->rq_conn);
		req_free(req);
		return UPS_DONE;
	}
	herr = HTTP_PARSER_ERRNO(p);
	if (herr == HPE_PAUSED) {
		http_parser_pause(p, 0);
		if (req->rq_complete) {
			req_finish(req);
			return UPS_DONE;
		}
		return UPS_NEXT; /* paused by the caller */
	}
	if (herr != HPE_OK) {
		log_warnx("%s: %s: bad response: %s", __func__,
		    req->rq_pool->pl_key, http_errno_description(herr));
		req_fail(req, UPSTREAM_PROTOCOL);
		return UPS_DONE;
	}
	return UPS_NEXT;
}

/* The worker closed its side. */
static enum up_step
req_eof(struct upstream_req *req)
{
	http_parser *p = &req->rq_parser;

	if (!req->rq_got_bytes)
		return req_pre_response_failure(req);
	/* A body without length or chunking ends here. */
	req->rq_in_parse = true;
	(void)http_parser_execute(p, &rp_settings, NULL, 0);
	req->rq_in_parse = false;
	if (req->rq_complete) {
		if (req->rq_conn != NULL)
			conn_close(req->rq_conn);
		req_end(req, UPSTREAM_OK);
		return UPS_DONE;
	}
	return req_broken(req);
}

/* The transport failed (reset, TLS error, truncated response). */
static enum up_step
req_broken(struct upstream_req *req)
{
	if (!req->rq_got_bytes)
		return req_pre_response_failure(req);
	log_debug("%s: %s: connection lost mid-response", __func__,
	    req->rq_pool->pl_key);
	req_fail(req,
	    req->rq_head_done ? UPSTREAM_RESET_MIDSTREAM : UPSTREAM_PROTOCOL);
	return UPS_DONE;
}

/*
 * Nothing of the response arrived. A pooled connection may have been
 * closed by the worker just as it was reused: send once more on a new
 * connection. A new connection failing is the caller's to handle.
 */
static enum up_step
req_pre_response_failure(struct upstream_req *req)
{
	enum upstream_error err;

	if (req->rq_resent || !req->rq_conn->cn_reused) {
		log_debug("%s: %s: connection lost before the response",
		    __func__, req->rq_pool->pl_key);
		req_fail(req, UPSTREAM_SEND_FAILED);
		return UPS_DONE;
	}
	log_debug("%s: %s: reused connection lost before the response, "
	          "resending",
	    __func__, req->rq_pool->pl_key);
	req->rq_resent = true;
	req->rq_up->up_send_retries++;
	conn_close(req->rq_conn);
	req_reset_response(req);
	if ((err = req_attach(req, true)) != UPSTREAM_OK)
		req_fail(req, err);
	return UPS_DONE;
}

static void
req_reset_response(struct upstream_req *req)
{
	req->rq_out_off = 0;
	req->rq_tls_wlen = 0;
	req->rq_rlen = req->rq_roff = 0;
	req->rq_hbuf_len = 0;
	req->rq_nhdrs = 0;
	req->rq_in_value = false;
	req->rq_interim = false;
	req->rq_head_done = false;
	req->rq_complete = false;
	req->rq_got_bytes = false;
	http_parser_init(&req->rq_parser, HTTP_RESPONSE);
	req->rq_parser.data = req;
}

static void
req_fail(struct upstream_req *req, enum upstream_error err)
{
	if (req->rq_conn != NULL)
		conn_close(req->rq_conn);
	req_end(req, err);
}

/* The response is complete: pool the connection when it is clean. */
static void
req_finish(struct upstream_req *req)
{
	struct up_conn *c = req->rq_conn;
	bool keep;

	keep = http_should_keep_alive(&req->rq_parser) &&
	    req->rq_roff == req->rq_rlen &&
	    (c->cn_tls == NULL || tls_conn_pending(c->cn_tls) == 0);
	req->rq_conn = NULL;
	conn_release(c, keep);
	req_end(req, UPSTREAM_OK);
}

/* Frees req, then tells the caller; nothing of req is touched after. */
static void
req_end(struct upstream_req *req, enum upstream_error err)
{
	void (*on_done)(void *, enum upstream_error) = req->rq_cbs.on_done;
	void *arg = req->rq_arg;

	if (req->rq_fetch != NULL)
		req->rq_fetch->uf_reason = req->rq_reason;
	req_free(req);
	if (on_done != NULL)
		on_done(arg, err);
}

static void
req_free(struct upstream_req *req)
{
	ev_timer_stop(req->rq_up->up_loop, &req->rq_timer);
	ev_timer_stop(req->rq_up->up_loop, &req->rq_wnotify);
	LIST_REMOVE(req, rq_link);
	req->rq_pool->pl_nreqs--;
	free(req->rq_out);
	free(req->rq_hbuf);
	free(req->rq_hdrs);
	free(req);
}

static void
req_timer_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct upstream_req *req =
	    container_of(w, struct upstream_req, rq_timer);

	(void)loop;
	(void)revents;
	if (req->rq_deferred != UPSTREAM_OK) {
		req_fail(req, req->rq_deferred);
		return;
	}
	log_debug("%s: %s: request deadline", __func__, req->rq_pool->pl_key);
	req_fail(req, UPSTREAM_TIMEOUT);
}

static void
req_wnotify_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct upstream_req *req =
	    container_of(w, struct upstream_req, rq_wnotify);

	(void)loop;
	(void)revents;
	if (req->rq_cbs.on_writable != NULL)
		req->rq_cbs.on_writable(req->rq_arg);
}

ssize_t
upstream_body_write(struct upstream_req *req, const char *data, size_t len)
{
	struct up_conn *c = req->rq_conn;
	size_t pending, cap;
	char *nb;

	if (!req->rq_stream || len > req->rq_body_left)
		return -1;
	pending = req->rq_out_len - req->rq_out_off;
	if (req->rq_out_off > 0 && req->rq_tls_wlen == 0) {
		memmove(req->rq_out, req->rq_out + req->rq_out_off, pending);
		req->rq_out_off = 0;
		req->rq_out_len = pending;
	}
	if (req->rq_out_len + len > req->rq_out_cap) {
		cap = req->rq_out_cap < 4096 ? 4096 : req->rq_out_cap;
		while (cap < req->rq_out_len + len)
			cap *= 2;
		if ((nb = realloc(req->rq_out, cap)) == NULL) {
			log_warn("%s: realloc", __func__);
			return -1;
		}
		req->rq_out = nb;
		req->rq_out_cap = cap;
	}
	memcpy(req->rq_out + req->rq_out_len, data, len);
	req->rq_out_len += len;
	req->rq_body_left -= len;
	pending = req->rq_out_len - req->rq_out_off;
	if (pending > UPSTREAM_BODY_HIGH)
		req->rq_notify = true;
	if (c != NULL && c->cn_state == UPC_SENDING && c->cn_want == 0) {
		/* It was waiting for this piece; send from the loop. */
		c->cn_want = EV_WRITE;
		conn_set_io(c);
		ev_feed_event(req->rq_up->up_loop, &c->cn_io, EV_WRITE);
	}
	return (ssize_t)pending;
}

void
upstream_pause(struct upstream_req *req)
{
	if (req->rq_paused)
		return;
	req->rq_paused = true;
	if (req->rq_in_parse) {
		if (HTTP_PARSER_ERRNO(&req->rq_parser) == HPE_OK)
			http_parser_pause(&req->rq_parser, 1);
	} else if (req->rq_conn != NULL)
		conn_set_io(req->rq_conn);
}

void
upstream_resume(struct upstream_req *req)
{
	struct up_conn *c = req->rq_conn;

	if (!req->rq_paused)
		return;
	req->rq_paused = false;
	if (req->rq_in_parse) {
		if (HTTP_PARSER_ERRNO(&req->rq_parser) == HPE_PAUSED &&
		    !req->rq_cancelled)
			http_parser_pause(&req->rq_parser, 0);
		return;
	}
	if (c == NULL || c->cn_state != UPC_RECEIVING)
		return;
	conn_set_io(c);
	/* Bytes already read (or inside TLS) would not wake the fd. */
	if (req->rq_roff < req->rq_rlen ||
	    (c->cn_tls != NULL && tls_conn_pending(c->cn_tls) > 0))
		ev_feed_event(req->rq_up->up_loop, &c->cn_io, EV_READ);
}

void
upstream_cancel(struct upstream_req *req)
{
	if (req->rq_in_parse) {
		/* Inside our own callback: req_parse finishes the job. */
		req->rq_cancelled = true;
		if (HTTP_PARSER_ERRNO(&req->rq_parser) == HPE_OK)
			http_parser_pause(&req->rq_parser, 1);
		return;
	}
	if (req->rq_conn != NULL)
		conn_close(req->rq_conn);
	req_free(req);
}

static int
hbuf_append(struct upstream_req *req, const char *at, size_t len, bool lower)
{
	size_t cap, i;
	char *nb;

	if (len == 0)
		return 0;
	if (req->rq_hbuf_len + len > UPSTREAM_MAX_HEAD) {
		log_warnx("%s: %s: response head too large", __func__,
		    req->rq_pool->pl_key);
		return -1;
	}
	if (req->rq_hbuf_len + len > req->rq_hbuf_cap) {
		cap = req->rq_hbuf_cap == 0 ? 1024 : req->rq_hbuf_cap;
		while (cap < req->rq_hbuf_len + len)
			cap *= 2;
		if ((nb = realloc(req->rq_hbuf, cap)) == NULL) {
			log_warn("%s: realloc", __func__);
			return -1;
		}
		req->rq_hbuf = nb;
		req->rq_hbuf_cap = cap;
	}
	nb = req->rq_hbuf + req->rq_hbuf_len;
	memcpy(nb, at, len);
	if (lower) {
		for (i = 0; i < len; i++) {
			if (nb[i] >= 'A' && nb[i] <= 'Z')
				nb[i] = (char)(nb[i] - 'A' + 'a');
		}
	}
	req->rq_hbuf_len += len;
	return 0;
}

static int
rp_on_message_begin(http_parser *p)
{
	struct upstream_req *req = p->data;

	req->rq_hbuf_len = 0;
	req->rq_nhdrs = 0;
	req->rq_in_value = false;
	return 0;
}

static int
rp_on_header_field(http_parser *p, const char *at, size_t len)
{
	struct upstream_req *req = p->data;
	struct up_hdr_span *hs, *nh;
	size_t cap;

	if (req->rq_nhdrs == 0 || req->rq_in_value) {
		if (req->rq_nhdrs == UPSTREAM_MAX_HEADERS) {
			log_warnx("%s: %s: too many response headers", __func__,
			    req->rq_pool->pl_key);
			return -1;
		}
		if (req->rq_nhdrs == req->rq_hdrs_cap) {
			cap = req->rq_hdrs_cap == 0 ? 16 : req->rq_hdrs_cap * 2;
			if ((nh = reallocarray(req->rq_hdrs, cap,
			         sizeof(*nh))) == NULL) {
				log_warn("%s: reallocarray", __func__);
				return -1;
			}
			req->rq_hdrs = nh;
			req->rq_hdrs_cap = cap;
		}
		hs = &req->rq_hdrs[req->rq_nhdrs++];
		hs->hs_name_off = req->rq_hbuf_len;
		hs->hs_name_len = 0;
		hs->hs_value_off = req->rq_hbuf_len;
		hs->hs_value_len = 0;
		req->rq_in_value = false;
	}
	hs = &req->rq_hdrs[req->rq_nhdrs - 1];
	if (hbuf_append(req, at, len, true) == -1)
		return -1;
	hs->hs_name_len += len;
	hs->hs_value_off = req->rq_hbuf_len;
	return 0;
}

static int
rp_on_header_value(http_parser *p, const char *at, size_t len)
{
	struct upstream_req *req = p->data;
	struct up_hdr_span *hs;

	if (req->rq_nhdrs == 0)
		return -1;
	hs = &req->rq_hdrs[req->rq_nhdrs - 1];
	if (!req->rq_in_value) {
		hs->hs_value_off = req->rq_hbuf_len;
		req->rq_in_value = true;
	}
	if (hbuf_append(req, at, len, false) == -1)
		return -1;
	hs->hs_value_len += len;
	return 0;
}

static int
rp_on_headers_complete(http_parser *p)
{
	struct upstream_req *req = p->data;
	struct upstream_header *hdrs = NULL;
	const struct up_hdr_span *hs;
	size_t i;

	if (p->status_code / 100 == 1) {
		/* 101 would switch protocols, which nobody asked for. */
		if (p->status_code == 101) {
			log_warnx("%s: %s: unexpected 101", __func__,
			    req->rq_pool->pl_key);
			return -1;
		}
		req->rq_interim = true;
		return 0;
	}
	req->rq_head_done = true;
	if (req->rq_nhdrs > 0 &&
	    (hdrs = calloc(req->rq_nhdrs, sizeof(*hdrs))) == NULL) {
		log_warn("%s: calloc", __func__);
		return -1;
	}
	for (i = 0; i < req->rq_nhdrs; i++) {
		hs = &req->rq_hdrs[i];
		hdrs[i].uh_name = req->rq_hbuf + hs->hs_name_off;
		hdrs[i].uh_name_len = hs->hs_name_len;
		hdrs[i].uh_value = req->rq_hbuf + hs->hs_value_off;
		hdrs[i].uh_value_len = hs->hs_value_len;
	}
	if (req->rq_cbs.on_head != NULL)
		req->rq_cbs.on_head(req->rq_arg, (int)p->status_code, hdrs,
		    req->rq_nhdrs);
	free(hdrs);
	return 0;
}

static int
rp_on_body(http_parser *p, const char *at, size_t len)
{
	struct upstream_req *req = p->data;

	if (!req->rq_interim && !req->rq_cancelled &&
	    req->rq_cbs.on_body != NULL)
		req->rq_cbs.on_body(req->rq_arg, at, len);
	return 0;
}

static int
rp_on_message_complete(http_parser *p)
{
	struct upstream_req *req = p->data;

	if (req->rq_interim) {
		req->rq_interim = false;
		return 0;
	}
	req->rq_complete = true;
	if (HTTP_PARSER_ERRNO(p) == HPE_OK)
		http_parser_pause(p, 1);
	return 0;
}

const char *
upstream_strerror(enum upstream_error err)
{
	switch (err) {
	case UPSTREAM_OK:
		return "ok";
	case UPSTREAM_CONNECT_FAILED:
		return "connect failed";
	case UPSTREAM_SEND_FAILED:
		return "connection error";
	case UPSTREAM_TIMEOUT:
		return "timeout";
	case UPSTREAM_PROTOCOL:
		return "malformed response";
	case UPSTREAM_RESET_MIDSTREAM:
		return "connection lost mid-response";
	case UPSTREAM_BAD_REQUEST:
		return "bad url or request";
	}
	return "unknown error";
}

struct upstream_fetch *
upstream_fetch(struct upstream *up, const char *base_url, const char *path,
    const struct upstream_header *headers, size_t nheaders, double timeout_secs,
    size_t body_max, upstream_fetch_cb cb, void *arg)
{
	static const struct upstream_cbs fetch_cbs = {
		.on_head = fetch_on_head,
		.on_body = fetch_on_body,
		.on_done = fetch_on_done,
	};
	struct upstream_fetch *f;

	if ((f = calloc(1, sizeof(*f))) == NULL) {
		log_warn("%s: calloc", __func__);
		return NULL;
	}
	f->uf_up = up;
	f->uf_cb = cb;
	f->uf_arg = arg;
	f->uf_max = body_max;
	ev_timer_init(&f->uf_fail, fetch_fail_cb, 0., 0.);
	f->uf_req = up_start(up, base_url, "GET", path, headers, nheaders, NULL,
	    0, false, 0, timeout_secs, &fetch_cbs, f);
	if (f->uf_req == NULL)
		ev_timer_start(up->up_loop, &f->uf_fail);
	else
		f->uf_req->rq_fetch = f;
	return f;
}

void
upstream_fetch_cancel(struct upstream_fetch *f)
{
	if (f == NULL)
		return;
	if (f->uf_req != NULL)
		upstream_cancel(f->uf_req);
	ev_timer_stop(f->uf_up->up_loop, &f->uf_fail);
	free(f->uf_body);
	free(f);
}

static void
fetch_on_head(void *arg, int status, const struct upstream_header *headers,
    size_t nheaders)
{
	struct upstream_fetch *f = arg;

	(void)headers;
	(void)nheaders;
	f->uf_status = status;
}

static void
fetch_on_body(void *arg, const char *data, size_t len)
{
	struct upstream_fetch *f = arg;
	struct upstream_req *req;
	size_t cap;
	char *nb;

	if (len > f->uf_max - f->uf_len) {
		/* Over the cap: keep what fits, the rest is not read. */
		len = f->uf_max - f->uf_len;
		f->uf_truncated = true;
	}
	if (f->uf_len + len + 1 > f->uf_cap) {
		cap = f->uf_cap == 0 ? 1024 : f->uf_cap;
		while (cap < f->uf_len + len + 1)
			cap *= 2;
		if ((nb = realloc(f->uf_body, cap)) == NULL) {
			log_warn("%s: realloc", __func__);
			f->uf_reason = "out of memory";
			req = f->uf_req;
			f->uf_req = NULL;
			upstream_cancel(req);
			fetch_deliver(f, UPSTREAM_PROTOCOL);
			return;
		}
		f->uf_body = nb;
		f->uf_cap = cap;
	}
	memcpy(f->uf_body + f->uf_len, data, len);
	f->uf_len += len;
	f->uf_body[f->uf_len] = '\0';
	if (f->uf_truncated) {
		req = f->uf_req;
		f->uf_req = NULL;
		upstream_cancel(req);
		fetch_deliver(f, UPSTREAM_OK);
	}
}

static void
fetch_on_done(void *arg, enum upstream_error err)
{
	struct upstream_fetch *f = arg;

	f->uf_req = NULL;
	fetch_deliver(f, err);
}

static void
fetch_fail_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct upstream_fetch *f =
	    container_of(w, struct upstream_fetch, uf_fail);

	(void)loop;
	(void)revents;
	fetch_deliver(f, UPSTREAM_BAD_REQUEST);
}

/* Tells the caller once, then frees f. */
static void
fetch_deliver(struct upstream_fetch *f, enum upstream_error err)
{
	struct upstream_result res;

	memset(&res, 0, sizeof(res));
	res.ur_error = err;
	res.ur_reason = err == UPSTREAM_OK || f->uf_reason == NULL
	    ? upstream_strerror(err)
	    : f->uf_reason;
	res.ur_body = "";
	if (err == UPSTREAM_OK) {
		res.ur_status = f->uf_status;
		if (f->uf_body != NULL)
			res.ur_body = f->uf_body;
		res.ur_body_len = f->uf_len;
		res.ur_truncated = f->uf_truncated;
	}
	f->uf_cb(f->uf_arg, &res);
	ev_timer_stop(f->uf_up->up_loop, &f->uf_fail);
	free(f->uf_body);
	free(f);
}
