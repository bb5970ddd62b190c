/*
 * ipc.c: the processes' messaging on a libev loop: SP REQ/REP (sp.c) for
 * the decision conversation, libnng PUSH/PULL for reports, and the
 * envelope codec.
 */
#include "shared/ipc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>

#include "shared/log.h"
#include "shared/sp.h"
#include "shared/xmalloc.h"

#define IPC_DRAIN_MAX     1024 /* PULL messages per loop wakeup */
#define IPC_RECONN_MIN_MS 20
#define IPC_RECONN_MAX_MS 500
#define IPC_PUSH_SENDBUF  1024 /* messages queued while the peer is away */

/* Frame payload limits: the envelope plus its SP backtrace. */
#define IPC_FRAME_REQ (IPC_MAX_MSG + 4u * SP_MAX_HOPS)
#define IPC_FRAME_REP (IPC_MAX_MSG + 4u)

#define IPC_CONTAINER_OF(p, type, member)                                      \
	((type *)(void *)((char *)(p)-offsetof(type, member)))

struct ipc_server {
	struct ev_loop *srv_loop;
	enum ipc_server_kind srv_kind;
	struct sp_server *srv_sp; /* REP */
	nng_socket srv_sock; /* PULL */
	int srv_sock_open;
	ipc_server_cb srv_cb;
	void *srv_arg;
	ev_io srv_io; /* PULL: receive poll fd */
	int srv_dispatching;
	int srv_free_pending;
};

struct ipc_client {
	enum ipc_client_kind cl_kind;
	struct sp_client *cl_sp; /* REQ */
	nng_socket cl_sock; /* PUSH */
	int cl_sock_open;
	int cl_freeing;
};

static int ipc_remove_stale(const char *);
static const char *ipc_path(const char *);
static void ipc_srv_io_cb(struct ev_loop *, ev_io *, int);
static void ipc_srv_destroy(struct ipc_server *);
static uint8_t *ipc_pack_done(size_t, size_t *);
static void ipc_reject(const char *, const char *, size_t, const char **);

int
ipc_url(char *buf, size_t len, const char *run_dir, const char *name)
{
	struct sockaddr_un sun;
	int n;

	n = snprintf(buf, len, "ipc://%s/%s", run_dir, name);
	if (n < 0 || (size_t)n >= len)
		return -1;
	/* The path must fit a Unix socket address. */
	if ((size_t)n - strlen("ipc://") >= sizeof(sun.sun_path)) {
		log_warnx("%s: %s/%s is longer than a socket path allows",
		    __func__, run_dir, name);
		return -1;
	}
	return 0;
}

/* The file system path of an ipc:// URL, or NULL (logged). */
static const char *
ipc_path(const char *url)
{
	if (strncmp(url, "ipc://", 6) != 0 || url[6] == '\0') {
		log_warnx("%s: %s: not an ipc:// URL", __func__, url);
		return NULL;
	}
	return url + 6;
}

/*
 * An ipc:// path left by a process that died is removed; a path someone
 * still listens on is not, so two brokers never share a socket.
 */
static int
ipc_remove_stale(const char *url)
{
	struct sockaddr_un sun;
	struct stat st;
	const char *path;
	int fd, rv;

	if (strncmp(url, "ipc://", 6) != 0)
		return 0;
	path = url + 6;
	if (lstat(path, &st) == -1) {
		if (errno == ENOENT)
			return 0;
		log_warn("%s: %s", __func__, path);
		return -1;
	}
	if (!S_ISSOCK(st.st_mode)) {
		log_warnx("%s: %s exists and is not a socket", __func__, path);
		return -1;
	}
	if (strlen(path) >= sizeof(sun.sun_path)) {
		log_warnx("%s: %s: path too long", __func__, path);
		return -1;
	}
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, strlen(path) + 1);
	if ((fd = socket(AF_UNIX, SOCK_STREAM, 0)) == -1) {
		log_warn("%s: socket", __func__);
		return -1;
	}
	rv = connect(fd, (struct sockaddr *)&sun, sizeof(sun));
	if (rv == 0) {
		close(fd);
		log_warnx("%s: another process listens on %s", __func__, path);
		return -1;
	}
	if (errno != ECONNREFUSED && errno != ENOENT) {
		log_warn("%s: probing %s", __func__, path);
		close(fd);
		return -1;
	}
	close(fd);
	if (unlink(path) == -1 && errno != ENOENT) {
		log_warn("%s: unlink %s", __func__, path);
		return -1;
	}
	log_info("%s: removed stale socket %s", __func__, path);
	return 0;
}

/* ---------------------------------------------------------------- server */

struct ipc_server *
ipc_server_new(struct ev_loop *loop, const char *url, enum ipc_server_kind kind,
    ipc_server_cb cb, void *arg)
{
	struct ipc_server *srv;
	const char *path;
	int rv, fd;

	if (kind == IPC_SERVER_REP && strncmp(url, "tcp://", 6) == 0) {
		srv = xcalloc(1, sizeof(*srv));
		srv->srv_loop = loop;
		srv->srv_kind = kind;
		srv->srv_cb = cb;
		srv->srv_arg = arg;
		if ((srv->srv_sp = sp_server_new_tcp(loop, url + 6,
		         IPC_FRAME_REQ, cb, arg)) == NULL) {
			free(srv);
			return NULL;
		}
		return srv;
	}
	if ((path = ipc_path(url)) == NULL || ipc_remove_stale(url) == -1)
		return NULL;
	srv = xcalloc(1, sizeof(*srv));
	srv->srv_loop = loop;
	srv->srv_kind = kind;
	srv->srv_cb = cb;
	srv->srv_arg = arg;

	if (kind == IPC_SERVER_REP) {
		/* The decision conversation: SP on the loop (sp.h). */
		if ((srv->srv_sp = sp_server_new(loop, path, IPC_FRAME_REQ, cb,
		         arg)) == NULL)
			goto fail;
		return srv;
	}

	if ((rv = nng_pull0_open(&srv->srv_sock)) != 0) {
		log_warnx("%s: open: %s", __func__, nng_strerror(rv));
		goto fail;
	}
	srv->srv_sock_open = 1;
	if ((rv = nng_socket_set_size(srv->srv_sock, NNG_OPT_RECVMAXSZ,
	         IPC_MAX_MSG)) != 0) {
		log_warnx("%s: %s: %s", __func__, NNG_OPT_RECVMAXSZ,
		    nng_strerror(rv));
		goto fail;
	}
	if ((rv = nng_listen(srv->srv_sock, url, NULL, 0)) != 0) {
		log_warnx("%s: listen %s: %s", __func__, url, nng_strerror(rv));
		goto fail;
	}
	if ((rv = nng_socket_get_int(srv->srv_sock, NNG_OPT_RECVFD, &fd)) !=
	    0) {
		log_warnx("%s: %s: %s", __func__, NNG_OPT_RECVFD,
		    nng_strerror(rv));
		goto fail;
	}
	ev_io_init(&srv->srv_io, ipc_srv_io_cb, fd, EV_READ);
	ev_io_start(loop, &srv->srv_io);
	return srv;

fail:
	ipc_srv_destroy(srv);
	return NULL;
}

void
ipc_server_free(struct ipc_server *srv)
{
	if (srv == NULL || srv->srv_free_pending)
		return;
	if (srv->srv_dispatching) {
		srv->srv_free_pending = 1;
		return;
	}
	ipc_srv_destroy(srv);
}

static void
ipc_srv_destroy(struct ipc_server *srv)
{
	srv->srv_free_pending = 1;
	sp_server_free(srv->srv_sp);
	if (srv->srv_kind == IPC_SERVER_PULL)
		ev_io_stop(srv->srv_loop, &srv->srv_io);
	if (srv->srv_sock_open)
		nng_close(srv->srv_sock);
	free(srv);
}

static void
ipc_srv_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct ipc_server *srv;
	nng_msg *m;
	int i, rv;

	(void)loop;
	(void)revents;
	srv = IPC_CONTAINER_OF(w, struct ipc_server, srv_io);
	for (i = 0; i < IPC_DRAIN_MAX; i++) {
		rv = nng_recvmsg(srv->srv_sock, &m, NNG_FLAG_NONBLOCK);
		if (rv == NNG_EAGAIN)
			break;
		if (rv != 0) {
			log_warnx("%s: receive: %s", __func__,
			    nng_strerror(rv));
			break;
		}
		srv->srv_dispatching = 1;
		srv->srv_cb(srv->srv_arg, nng_msg_body(m), nng_msg_len(m), NULL,
		    NULL);
		srv->srv_dispatching = 0;
		nng_msg_free(m);
		if (srv->srv_free_pending) {
			ipc_srv_destroy(srv);
			return;
		}
	}
}

struct ipc_server *
ipc_server_new_tls(struct ev_loop *loop, const char *url, struct tls_ctx *tls,
    ipc_server_cb cb, void *arg)
{
	struct ipc_server *srv;

	if (strncmp(url, "tls+tcp://", 10) != 0 || tls == NULL) {
		log_warnx("%s: %s: not a tls+tcp:// URL", __func__, url);
		return NULL;
	}
	srv = xcalloc(1, sizeof(*srv));
	srv->srv_loop = loop;
	srv->srv_kind = IPC_SERVER_REP;
	srv->srv_cb = cb;
	srv->srv_arg = arg;
	if ((srv->srv_sp = sp_server_new_tls(loop, url + 10, tls, IPC_FRAME_REQ,
	         cb, arg)) == NULL) {
		free(srv);
		return NULL;
	}
	return srv;
}

int
ipc_server_port(const struct ipc_server *srv)
{
	return srv == NULL ? -1 : sp_server_port(srv->srv_sp);
}

/* ---------------------------------------------------------------- client */

struct ipc_client *
ipc_client_new_tls(struct ev_loop *loop, const char *url, struct tls_ctx *tls,
    unsigned max_inflight)
{
	struct ipc_client *cl;

	if (strncmp(url, "tls+tcp://", 10) != 0 || tls == NULL) {
		log_warnx("%s: %s: not a tls+tcp:// URL", __func__, url);
		return NULL;
	}
	cl = xcalloc(1, sizeof(*cl));
	cl->cl_kind = IPC_CLIENT_REQ;
	if ((cl->cl_sp = sp_client_new_tls(loop, url + 10, tls, max_inflight,
	         IPC_FRAME_REP)) == NULL) {
		free(cl);
		return NULL;
	}
	return cl;
}

struct ipc_client *
ipc_client_new(struct ev_loop *loop, const char *url, enum ipc_client_kind kind,
    unsigned max_inflight)
{
	struct ipc_client *cl;
	const char *path;
	int rv;

	if (kind == IPC_CLIENT_REQ && strncmp(url, "tcp://", 6) == 0) {
		cl = xcalloc(1, sizeof(*cl));
		cl->cl_kind = kind;
		if ((cl->cl_sp = sp_client_new_tcp(loop, url + 6, max_inflight,
		         IPC_FRAME_REP)) == NULL) {
			free(cl);
			return NULL;
		}
		return cl;
	}
	if ((path = ipc_path(url)) == NULL)
		return NULL;
	cl = xcalloc(1, sizeof(*cl));
	cl->cl_kind = kind;
	if (kind == IPC_CLIENT_REQ) {
		if ((cl->cl_sp = sp_client_new(loop, path, max_inflight,
		         IPC_FRAME_REP)) == NULL) {
			free(cl);
			return NULL;
		}
		return cl;
	}

	if ((rv = nng_push0_open(&cl->cl_sock)) != 0) {
		log_warnx("%s: open: %s", __func__, nng_strerror(rv));
		goto fail;
	}
	cl->cl_sock_open = 1;
	if ((rv = nng_socket_set_ms(cl->cl_sock, NNG_OPT_RECONNMINT,
	         IPC_RECONN_MIN_MS)) != 0 ||
	    (rv = nng_socket_set_ms(cl->cl_sock, NNG_OPT_RECONNMAXT,
	         IPC_RECONN_MAX_MS)) != 0 ||
	    (rv = nng_socket_set_int(cl->cl_sock, NNG_OPT_SENDBUF,
	         IPC_PUSH_SENDBUF)) != 0) {
		log_warnx("%s: options: %s", __func__, nng_strerror(rv));
		goto fail;
	}
	if ((rv = nng_dial(cl->cl_sock, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
		log_warnx("%s: dial %s: %s", __func__, url, nng_strerror(rv));
		goto fail;
	}
	return cl;

fail:
	ipc_client_free(cl);
	return NULL;
}

void
ipc_client_free(struct ipc_client *cl)
{
	if (cl == NULL || cl->cl_freeing)
		return;
	cl->cl_freeing = 1;
	if (cl->cl_sp != NULL) {
		/* Callbacks may still call us: cl lives until they ran. */
		sp_client_free_with(cl->cl_sp, cl);
		return;
	}
	if (cl->cl_sock_open)
		nng_close(cl->cl_sock);
	free(cl);
}

int
ipc_client_send(struct ipc_client *cl, const uint8_t *msg, size_t len,
    unsigned timeout_ms, ipc_reply_cb cb, void *arg)
{
	nng_msg *m;
	int rv;

	if (cl == NULL || cl->cl_freeing)
		return -1;
	if (len > IPC_MAX_MSG) {
		log_warnx("%s: %zu-byte message over the %u-byte limit",
		    __func__, len, IPC_MAX_MSG);
		return -1;
	}
	if (cl->cl_kind == IPC_CLIENT_REQ)
		return sp_client_send(cl->cl_sp, msg, len, timeout_ms, cb, arg);
	if ((rv = nng_msg_alloc(&m, len)) != 0) {
		log_warnx("%s: %s", __func__, nng_strerror(rv));
		return -1;
	}
	if (len > 0)
		memcpy(nng_msg_body(m), msg, len);
	if ((rv = nng_sendmsg(cl->cl_sock, m, NNG_FLAG_NONBLOCK)) != 0) {
		nng_msg_free(m);
		return -1;
	}
	return 0;
}

unsigned
ipc_client_inflight(struct ipc_client *cl)
{
	return cl == NULL ? 0 : sp_client_inflight(cl->cl_sp);
}

double
ipc_client_down_secs(struct ipc_client *cl)
{
	return cl == NULL ? 0. : sp_client_down_secs(cl->cl_sp);
}

/* ---------------------------------------------------------------- codec */

static uint8_t *
ipc_pack_done(size_t need, size_t *len)
{
	uint8_t *buf;

	/* malloc(0) may return NULL; an empty envelope is still a message. */
	if ((buf = malloc(need > 0 ? need : 1)) == NULL) {
		log_warnx("%s: out of memory (%zu bytes)", __func__, need);
		*len = 0;
		return NULL;
	}
	*len = need;
	return buf;
}

uint8_t *
ipc_pack_frontend(Smg__FrontendMsg *m, size_t *len)
{
	uint8_t *buf;

	m->version = IPC_VERSION;
	if ((buf = ipc_pack_done(smg__frontend_msg__get_packed_size(m), len)) !=
	    NULL)
		smg__frontend_msg__pack(m, buf);
	return buf;
}

uint8_t *
ipc_pack_broker(Smg__BrokerReply *m, size_t *len)
{
	uint8_t *buf;

	m->version = IPC_VERSION;
	if ((buf = ipc_pack_done(smg__broker_reply__get_packed_size(m), len)) !=
	    NULL)
		smg__broker_reply__pack(m, buf);
	return buf;
}

uint8_t *
ipc_pack_poller(Smg__PollerMsg *m, size_t *len)
{
	uint8_t *buf;

	m->version = IPC_VERSION;
	if ((buf = ipc_pack_done(smg__poller_msg__get_packed_size(m), len)) !=
	    NULL)
		smg__poller_msg__pack(m, buf);
	return buf;
}

uint8_t *
ipc_pack_error(const char *code, const char *message, size_t *len)
{
	Smg__BrokerReply rep = SMG__BROKER_REPLY__INIT;
	Smg__ErrorReply err = SMG__ERROR_REPLY__INIT;

	err.code = (char *)(code != NULL ? code : "");
	err.message = (char *)(message != NULL ? message : "");
	rep.body_case = SMG__BROKER_REPLY__BODY_ERROR;
	rep.error = &err;
	return ipc_pack_broker(&rep, len);
}

static void
ipc_reject(const char *who, const char *reason, size_t len, const char **why)
{
	log_warnx("%s: rejected %zu-byte message: %s", who, len, reason);
	if (why != NULL)
		*why = reason;
}

Smg__FrontendMsg *
ipc_decode_frontend(const uint8_t *buf, size_t len, const char **why)
{
	Smg__FrontendMsg *m;
	const char *reason;

	if (len > IPC_MAX_MSG) {
		ipc_reject(__func__, "too_large", len, why);
		return NULL;
	}
	if ((m = smg__frontend_msg__unpack(NULL, len, buf)) == NULL)
		reason = "malformed";
	else if (m->version != IPC_VERSION)
		reason = "version";
	else if (m->body_case == SMG__FRONTEND_MSG__BODY__NOT_SET)
		reason = "empty";
	else {
		if (why != NULL)
			*why = NULL;
		return m;
	}
	if (m != NULL)
		smg__frontend_msg__free_unpacked(m, NULL);
	ipc_reject(__func__, reason, len, why);
	return NULL;
}

Smg__BrokerReply *
ipc_decode_broker(const uint8_t *buf, size_t len, const char **why)
{
	Smg__BrokerReply *m;
	const char *reason;

	if (len > IPC_MAX_MSG) {
		ipc_reject(__func__, "too_large", len, why);
		return NULL;
	}
	if ((m = smg__broker_reply__unpack(NULL, len, buf)) == NULL)
		reason = "malformed";
	else if (m->version != IPC_VERSION)
		reason = "version";
	else if (m->body_case == SMG__BROKER_REPLY__BODY__NOT_SET)
		reason = "empty";
	else {
		if (why != NULL)
			*why = NULL;
		return m;
	}
	if (m != NULL)
		smg__broker_reply__free_unpacked(m, NULL);
	ipc_reject(__func__, reason, len, why);
	return NULL;
}

Smg__PollerMsg *
ipc_decode_poller(const uint8_t *buf, size_t len, const char **why)
{
	Smg__PollerMsg *m;
	const char *reason;

	if (len > IPC_MAX_MSG) {
		ipc_reject(__func__, "too_large", len, why);
		return NULL;
	}
	if ((m = smg__poller_msg__unpack(NULL, len, buf)) == NULL)
		reason = "malformed";
	else if (m->version != IPC_VERSION)
		reason = "version";
	else if (m->body_case == SMG__POLLER_MSG__BODY__NOT_SET)
		reason = "empty";
	else {
		if (why != NULL)
			*why = NULL;
		return m;
	}
	if (m != NULL)
		smg__poller_msg__free_unpacked(m, NULL);
	ipc_reject(__func__, reason, len, why);
	return NULL;
}
