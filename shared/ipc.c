/* ipc.c: nng sockets driven from a libev loop, and the envelope codec. */
#include "shared/ipc.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
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
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include "shared/log.h"
#include "shared/xmalloc.h"

#define IPC_SERVER_CONTEXTS 256 /* REP requests held at once */
#define IPC_SERVER_SEND_MS  5000 /* a reply a peer never drains */
#define IPC_DRAIN_MAX       1024 /* PULL messages per loop wakeup */
#define IPC_RECONN_MIN_MS   20
#define IPC_RECONN_MAX_MS   500
#define IPC_PUSH_SENDBUF    1024 /* messages queued while the peer is away */
#define IPC_CLIENT_MAX_CTX  4096

#define IPC_CONTAINER_OF(p, type, member)                                      \
	((type *)(void *)((char *)(p)-offsetof(type, member)))

enum ipc_op {
	IPC_OP_IDLE = 0,
	IPC_OP_SEND,
	IPC_OP_RECV,
};

/* One REP context: receive, hand to the loop, send the reply, repeat. */
struct ipc_srv_ctx {
	struct ipc_server *sx_srv;
	nng_ctx sx_ctx;
	nng_aio *sx_aio;
	enum ipc_op sx_op;
	int sx_status;
	nng_msg *sx_msg;
	struct ipc_srv_ctx *sx_next; /* completion queue */
};

struct ipc_server {
	struct ev_loop *srv_loop;
	enum ipc_server_kind srv_kind;
	nng_socket srv_sock;
	int srv_sock_open;
	ipc_server_cb srv_cb;
	void *srv_arg;
	ev_io srv_io; /* PULL: receive poll fd */
	ev_async srv_async; /* REP: completions from nng */
	int srv_async_started;
	pthread_mutex_t srv_mtx;
	struct ipc_srv_ctx *srv_done; /* LIFO, reversed on pop */
	struct ipc_srv_ctx *srv_ctxs;
	unsigned srv_nctx;
	int srv_dispatching;
	int srv_free_pending;
	_Atomic int srv_closing; /* read by nng threads */
};

/* One REQ context and its request. */
struct ipc_req {
	struct ipc_client *rq_cl;
	nng_ctx rq_ctx;
	nng_aio *rq_aio;
	enum ipc_op rq_op;
	nng_time rq_deadline;
	ipc_reply_cb rq_cb;
	void *rq_arg;
	int rq_status;
	nng_msg *rq_reply;
	int rq_busy; /* sent, callback not yet run (loop only) */
	struct ipc_req *rq_next; /* free list or completion queue */
};

struct ipc_client {
	struct ev_loop *cl_loop;
	enum ipc_client_kind cl_kind;
	nng_socket cl_sock;
	int cl_sock_open;
	ev_async cl_async;
	int cl_async_started;
	pthread_mutex_t cl_mtx;
	struct ipc_req *cl_done; /* LIFO, reversed on pop */
	struct ipc_req *cl_reqs;
	unsigned cl_nreq;
	struct ipc_req *cl_idle; /* loop only */
	unsigned cl_inflight;
	int cl_dispatching;
	int cl_free_pending;
	int cl_closing;
	_Atomic int cl_stopping; /* read by nng threads */
	nng_dialer cl_dialer;
	int cl_dialed;
};

static int ipc_remove_stale(const char *);
static void ipc_srv_ctx_cb(void *);
static void ipc_srv_recv(struct ipc_srv_ctx *);
static void ipc_srv_finish(struct ipc_server *, struct ipc_srv_ctx *);
static void ipc_srv_async_cb(struct ev_loop *, ev_async *, int);
static void ipc_srv_io_cb(struct ev_loop *, ev_io *, int);
static void ipc_srv_destroy(struct ipc_server *);
static struct ipc_srv_ctx *ipc_srv_take_done(struct ipc_server *);
static void ipc_req_cb(void *);
static void ipc_client_async_cb(struct ev_loop *, ev_async *, int);
static void ipc_client_complete(struct ipc_client *, struct ipc_req *, int);
static void ipc_client_destroy(struct ipc_client *);
static struct ipc_req *ipc_client_take_done(struct ipc_client *);
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
	struct ipc_srv_ctx *sx;
	unsigned i;
	int rv, fd;

	srv = xcalloc(1, sizeof(*srv));
	srv->srv_loop = loop;
	srv->srv_kind = kind;
	srv->srv_cb = cb;
	srv->srv_arg = arg;
	if (pthread_mutex_init(&srv->srv_mtx, NULL) != 0)
		fatalx("%s: pthread_mutex_init", __func__);

	rv = kind == IPC_SERVER_REP ? nng_rep0_open(&srv->srv_sock)
	                            : nng_pull0_open(&srv->srv_sock);
	if (rv != 0) {
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
	if (ipc_remove_stale(url) == -1)
		goto fail;
	if ((rv = nng_listen(srv->srv_sock, url, NULL, 0)) != 0) {
		log_warnx("%s: listen %s: %s", __func__, url, nng_strerror(rv));
		goto fail;
	}

	if (kind == IPC_SERVER_PULL) {
		if ((rv = nng_socket_get_int(srv->srv_sock, NNG_OPT_RECVFD,
		         &fd)) != 0) {
			log_warnx("%s: %s: %s", __func__, NNG_OPT_RECVFD,
			    nng_strerror(rv));
			goto fail;
		}
		ev_io_init(&srv->srv_io, ipc_srv_io_cb, fd, EV_READ);
		ev_io_start(loop, &srv->srv_io);
		return srv;
	}

	/*
	 * REP: a plain REP socket serves one request at a time and a
	 * non-blocking reply fails while the pipe is still sending the
	 * previous one, so many contexts receive in parallel instead and
	 * the loop answers each as it comes.
	 */
	ev_async_init(&srv->srv_async, ipc_srv_async_cb);
	ev_async_start(loop, &srv->srv_async);
	srv->srv_async_started = 1;
	srv->srv_ctxs = xcalloc(IPC_SERVER_CONTEXTS, sizeof(*srv->srv_ctxs));
	for (i = 0; i < IPC_SERVER_CONTEXTS; i++) {
		sx = &srv->srv_ctxs[i];
		sx->sx_srv = srv;
		if ((rv = nng_ctx_open(&sx->sx_ctx, srv->srv_sock)) != 0) {
			log_warnx("%s: ctx: %s", __func__, nng_strerror(rv));
			goto fail;
		}
		if ((rv = nng_aio_alloc(&sx->sx_aio, ipc_srv_ctx_cb, sx)) !=
		    0) {
			nng_ctx_close(sx->sx_ctx);
			log_warnx("%s: aio: %s", __func__, nng_strerror(rv));
			goto fail;
		}
		srv->srv_nctx++;
	}
	for (i = 0; i < srv->srv_nctx; i++)
		ipc_srv_recv(&srv->srv_ctxs[i]);
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
	struct ipc_srv_ctx *sx;
	unsigned i;

	srv->srv_free_pending = 1;
	atomic_store(&srv->srv_closing, 1);
	for (i = 0; i < srv->srv_nctx; i++)
		nng_aio_stop(srv->srv_ctxs[i].sx_aio);
	if (srv->srv_sock_open)
		nng_close(srv->srv_sock);
	while ((sx = ipc_srv_take_done(srv)) != NULL) {
		while (sx != NULL) {
			nng_msg_free(sx->sx_msg);
			sx->sx_msg = NULL;
			sx = sx->sx_next;
		}
	}
	for (i = 0; i < srv->srv_nctx; i++)
		nng_aio_free(srv->srv_ctxs[i].sx_aio);
	if (srv->srv_kind == IPC_SERVER_PULL)
		ev_io_stop(srv->srv_loop, &srv->srv_io);
	if (srv->srv_async_started)
		ev_async_stop(srv->srv_loop, &srv->srv_async);
	pthread_mutex_destroy(&srv->srv_mtx);
	free(srv->srv_ctxs);
	free(srv);
}

/* Loop (or a closing nng callback): wait for the next request. */
static void
ipc_srv_recv(struct ipc_srv_ctx *sx)
{
	sx->sx_op = IPC_OP_RECV;
	nng_aio_set_timeout(sx->sx_aio, NNG_DURATION_INFINITE);
	nng_ctx_recv(sx->sx_ctx, sx->sx_aio);
}

/* nng thread: a reply went out (receive again) or a request came in. */
static void
ipc_srv_ctx_cb(void *arg)
{
	struct ipc_srv_ctx *sx = arg;
	struct ipc_server *srv = sx->sx_srv;
	int rv;

	rv = nng_aio_result(sx->sx_aio);
	if (sx->sx_op == IPC_OP_SEND) {
		if (rv != 0) {
			/* A failed send leaves the message with us. */
			nng_msg_free(nng_aio_get_msg(sx->sx_aio));
			nng_aio_set_msg(sx->sx_aio, NULL);
		}
		/*
		 * A reply to a client that went away fails; the context
		 * still serves the next request unless we are closing.
		 */
		if (atomic_load(&srv->srv_closing) || rv == NNG_ECANCELED) {
			sx->sx_op = IPC_OP_IDLE;
			return;
		}
		ipc_srv_recv(sx);
		return;
	}
	sx->sx_status = rv;
	sx->sx_msg = NULL;
	if (rv == 0) {
		sx->sx_msg = nng_aio_get_msg(sx->sx_aio);
		nng_aio_set_msg(sx->sx_aio, NULL);
	}
	sx->sx_op = IPC_OP_IDLE;
	pthread_mutex_lock(&srv->srv_mtx);
	sx->sx_next = srv->srv_done;
	srv->srv_done = sx;
	pthread_mutex_unlock(&srv->srv_mtx);
	ev_async_send(srv->srv_loop, &srv->srv_async);
}

/* Pops every queued completion, oldest first. */
static struct ipc_srv_ctx *
ipc_srv_take_done(struct ipc_server *srv)
{
	struct ipc_srv_ctx *sx, *next, *out = NULL;

	pthread_mutex_lock(&srv->srv_mtx);
	sx = srv->srv_done;
	srv->srv_done = NULL;
	pthread_mutex_unlock(&srv->srv_mtx);
	for (; sx != NULL; sx = next) {
		next = sx->sx_next;
		sx->sx_next = out;
		out = sx;
	}
	return out;
}

static void
ipc_srv_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	struct ipc_server *srv;
	struct ipc_srv_ctx *sx, *next;

	(void)loop;
	(void)revents;
	srv = IPC_CONTAINER_OF(w, struct ipc_server, srv_async);
	srv->srv_dispatching = 1;
	for (sx = ipc_srv_take_done(srv); sx != NULL; sx = next) {
		next = sx->sx_next;
		if (srv->srv_free_pending) {
			nng_msg_free(sx->sx_msg);
			sx->sx_msg = NULL;
			continue;
		}
		ipc_srv_finish(srv, sx);
	}
	srv->srv_dispatching = 0;
	if (srv->srv_free_pending)
		ipc_srv_destroy(srv);
}

/* Loop: hand a request to the caller and send its reply. */
static void
ipc_srv_finish(struct ipc_server *srv, struct ipc_srv_ctx *sx)
{
	nng_msg *req = sx->sx_msg, *rep;
	uint8_t *reply = NULL;
	size_t reply_len = 0;
	int rv;

	sx->sx_msg = NULL;
	if (atomic_load(&srv->srv_closing) || sx->sx_status == NNG_ECANCELED)
		return;
	if (sx->sx_status != 0) {
		log_warnx("%s: receive: %s", __func__,
		    nng_strerror(sx->sx_status));
		ipc_srv_recv(sx);
		return;
	}
	srv->srv_cb(srv->srv_arg, nng_msg_body(req), nng_msg_len(req), &reply,
	    &reply_len);
	nng_msg_free(req);
	if (reply == NULL || srv->srv_free_pending) {
		free(reply);
		if (!srv->srv_free_pending)
			ipc_srv_recv(sx);
		return;
	}
	if ((rv = nng_msg_alloc(&rep, reply_len)) != 0) {
		log_warnx("%s: reply: %s", __func__, nng_strerror(rv));
		free(reply);
		ipc_srv_recv(sx);
		return;
	}
	if (reply_len > 0)
		memcpy(nng_msg_body(rep), reply, reply_len);
	free(reply);
	sx->sx_op = IPC_OP_SEND;
	nng_aio_set_msg(sx->sx_aio, rep);
	nng_aio_set_timeout(sx->sx_aio, IPC_SERVER_SEND_MS);
	nng_ctx_send(sx->sx_ctx, sx->sx_aio);
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

/* ---------------------------------------------------------------- client */

struct ipc_client *
ipc_client_new(struct ev_loop *loop, const char *url, enum ipc_client_kind kind,
    unsigned max_inflight)
{
	struct ipc_client *cl;
	struct ipc_req *rq;
	unsigned i;
	int rv;

	cl = xcalloc(1, sizeof(*cl));
	cl->cl_loop = loop;
	cl->cl_kind = kind;
	if (pthread_mutex_init(&cl->cl_mtx, NULL) != 0)
		fatalx("%s: pthread_mutex_init", __func__);

	rv = kind == IPC_CLIENT_PUSH ? nng_push0_open(&cl->cl_sock)
	                             : nng_req0_open(&cl->cl_sock);
	if (rv != 0) {
		log_warnx("%s: open: %s", __func__, nng_strerror(rv));
		goto fail;
	}
	cl->cl_sock_open = 1;
	if ((rv = nng_socket_set_size(cl->cl_sock, NNG_OPT_RECVMAXSZ,
	         IPC_MAX_MSG)) != 0 ||
	    (rv = nng_socket_set_ms(cl->cl_sock, NNG_OPT_RECONNMINT,
	         IPC_RECONN_MIN_MS)) != 0 ||
	    (rv = nng_socket_set_ms(cl->cl_sock, NNG_OPT_RECONNMAXT,
	         IPC_RECONN_MAX_MS)) != 0) {
		log_warnx("%s: options: %s", __func__, nng_strerror(rv));
		goto fail;
	}
	if (kind == IPC_CLIENT_PUSH &&
	    (rv = nng_socket_set_int(cl->cl_sock, NNG_OPT_SENDBUF,
	         IPC_PUSH_SENDBUF)) != 0) {
		log_warnx("%s: %s: %s", __func__, NNG_OPT_SENDBUF,
		    nng_strerror(rv));
		goto fail;
	}

	if (kind == IPC_CLIENT_REQ) {
		if (max_inflight == 0)
			max_inflight = 1;
		if (max_inflight > IPC_CLIENT_MAX_CTX)
			max_inflight = IPC_CLIENT_MAX_CTX;
		ev_async_init(&cl->cl_async, ipc_client_async_cb);
		ev_async_start(loop, &cl->cl_async);
		cl->cl_async_started = 1;
		cl->cl_reqs = xcalloc(max_inflight, sizeof(*cl->cl_reqs));
		for (i = 0; i < max_inflight; i++) {
			rq = &cl->cl_reqs[i];
			rq->rq_cl = cl;
			if ((rv = nng_ctx_open(&rq->rq_ctx, cl->cl_sock)) !=
			    0) {
				log_warnx("%s: ctx: %s", __func__,
				    nng_strerror(rv));
				goto fail;
			}
			if ((rv = nng_aio_alloc(&rq->rq_aio, ipc_req_cb, rq)) !=
			    0) {
				nng_ctx_close(rq->rq_ctx);
				log_warnx("%s: aio: %s", __func__,
				    nng_strerror(rv));
				goto fail;
			}
			cl->cl_nreq++;
		}
		/* Idle list in index order, so context 0 goes first. */
		for (i = cl->cl_nreq; i > 0; i--) {
			rq = &cl->cl_reqs[i - 1];
			rq->rq_next = cl->cl_idle;
			cl->cl_idle = rq;
		}
	}

	if ((rv = nng_dial(cl->cl_sock, url, &cl->cl_dialer,
	         NNG_FLAG_NONBLOCK)) != 0) {
		log_warnx("%s: dial %s: %s", __func__, url, nng_strerror(rv));
		goto fail;
	}
	cl->cl_dialed = 1;
	return cl;

fail:
	ipc_client_destroy(cl);
	return NULL;
}

void
ipc_client_free(struct ipc_client *cl)
{
	if (cl == NULL || cl->cl_closing || cl->cl_free_pending)
		return;
	if (cl->cl_dispatching) {
		cl->cl_free_pending = 1;
		return;
	}
	ipc_client_destroy(cl);
}

static void
ipc_client_destroy(struct ipc_client *cl)
{
	struct ipc_req *rq, *next;
	unsigned i;

	cl->cl_closing = 1;
	atomic_store(&cl->cl_stopping, 1);
	/*
	 * Callbacks see cl_stopping and queue instead of submitting the
	 * receive; after this no nng thread touches the client.
	 */
	for (i = 0; i < cl->cl_nreq; i++)
		nng_aio_stop(cl->cl_reqs[i].rq_aio);
	for (i = 0; i < cl->cl_nreq; i++)
		nng_ctx_close(cl->cl_reqs[i].rq_ctx);
	if (cl->cl_dialed)
		nng_dialer_close(cl->cl_dialer);
	if (cl->cl_sock_open)
		nng_close(cl->cl_sock);
	cl->cl_dispatching = 1;
	for (rq = ipc_client_take_done(cl); rq != NULL; rq = next) {
		next = rq->rq_next;
		ipc_client_complete(cl, rq, NNG_ECLOSED);
	}
	/*
	 * An operation a callback submitted on an aio being stopped is
	 * dropped by nng without another callback: finish those here.
	 */
	for (i = 0; i < cl->cl_nreq; i++) {
		rq = &cl->cl_reqs[i];
		if (!rq->rq_busy)
			continue;
		nng_msg_free(nng_aio_get_msg(rq->rq_aio));
		nng_aio_set_msg(rq->rq_aio, NULL);
		ipc_client_complete(cl, rq, NNG_ECLOSED);
	}
	for (i = 0; i < cl->cl_nreq; i++)
		nng_aio_free(cl->cl_reqs[i].rq_aio);
	if (cl->cl_async_started)
		ev_async_stop(cl->cl_loop, &cl->cl_async);
	pthread_mutex_destroy(&cl->cl_mtx);
	free(cl->cl_reqs);
	free(cl);
}

int
ipc_client_send(struct ipc_client *cl, const uint8_t *msg, size_t len,
    unsigned timeout_ms, ipc_reply_cb cb, void *arg)
{
	struct ipc_req *rq;
	nng_msg *m;
	int rv;

	if (cl == NULL || cl->cl_closing || cl->cl_free_pending)
		return -1;
	if (cl->cl_kind == IPC_CLIENT_REQ && cl->cl_idle == NULL)
		return -1;
	if ((rv = nng_msg_alloc(&m, len)) != 0) {
		log_warnx("%s: %s", __func__, nng_strerror(rv));
		return -1;
	}
	if (len > 0)
		memcpy(nng_msg_body(m), msg, len);

	if (cl->cl_kind == IPC_CLIENT_PUSH) {
		if ((rv = nng_sendmsg(cl->cl_sock, m, NNG_FLAG_NONBLOCK)) !=
		    0) {
			nng_msg_free(m);
			return -1;
		}
		return 0;
	}

	if (timeout_ms == 0)
		timeout_ms = 1;
	rq = cl->cl_idle;
	cl->cl_idle = rq->rq_next;
	rq->rq_next = NULL;
	rq->rq_cb = cb;
	rq->rq_arg = arg;
	rq->rq_status = 0;
	rq->rq_reply = NULL;
	rq->rq_op = IPC_OP_SEND;
	rq->rq_busy = 1;
	rq->rq_deadline = nng_clock() + timeout_ms;
	cl->cl_inflight++;
	nng_aio_set_msg(rq->rq_aio, m);
	nng_aio_set_timeout(rq->rq_aio, (nng_duration)timeout_ms);
	nng_ctx_send(rq->rq_ctx, rq->rq_aio);
	return 0;
}

unsigned
ipc_client_inflight(struct ipc_client *cl)
{
	return cl == NULL ? 0 : cl->cl_inflight;
}

/* nng thread: the request went out (now wait for the reply) or ended. */
static void
ipc_req_cb(void *arg)
{
	struct ipc_req *rq = arg;
	struct ipc_client *cl = rq->rq_cl;
	nng_time now;
	int rv;

	rv = nng_aio_result(rq->rq_aio);
	if (rq->rq_op == IPC_OP_SEND) {
		/* Sent: nng owns the message; do not start the receive. */
		if (rv == 0 && atomic_load(&cl->cl_stopping))
			rv = NNG_ECLOSED;
		else if (rv == 0) {
			now = nng_clock();
			if (now < rq->rq_deadline) {
				rq->rq_op = IPC_OP_RECV;
				nng_aio_set_timeout(rq->rq_aio,
				    (nng_duration)(rq->rq_deadline - now));
				nng_ctx_recv(rq->rq_ctx, rq->rq_aio);
				return;
			}
			rv = NNG_ETIMEDOUT;
		} else {
			nng_msg_free(nng_aio_get_msg(rq->rq_aio));
			nng_aio_set_msg(rq->rq_aio, NULL);
		}
	} else if (rv == 0) {
		rq->rq_reply = nng_aio_get_msg(rq->rq_aio);
		nng_aio_set_msg(rq->rq_aio, NULL);
	}
	rq->rq_status = rv;
	rq->rq_op = IPC_OP_IDLE;
	pthread_mutex_lock(&cl->cl_mtx);
	rq->rq_next = cl->cl_done;
	cl->cl_done = rq;
	pthread_mutex_unlock(&cl->cl_mtx);
	ev_async_send(cl->cl_loop, &cl->cl_async);
}

static struct ipc_req *
ipc_client_take_done(struct ipc_client *cl)
{
	struct ipc_req *rq, *next, *out = NULL;

	pthread_mutex_lock(&cl->cl_mtx);
	rq = cl->cl_done;
	cl->cl_done = NULL;
	pthread_mutex_unlock(&cl->cl_mtx);
	for (; rq != NULL; rq = next) {
		next = rq->rq_next;
		rq->rq_next = out;
		out = rq;
	}
	return out;
}

static void
ipc_client_async_cb(struct ev_loop *loop, ev_async *w, int revents)
{
	struct ipc_client *cl;
	struct ipc_req *rq, *next;

	(void)loop;
	(void)revents;
	cl = IPC_CONTAINER_OF(w, struct ipc_client, cl_async);
	cl->cl_dispatching = 1;
	for (rq = ipc_client_take_done(cl); rq != NULL; rq = next) {
		next = rq->rq_next;
		ipc_client_complete(cl, rq,
		    cl->cl_free_pending ? NNG_ECLOSED : rq->rq_status);
	}
	cl->cl_dispatching = 0;
	if (cl->cl_free_pending)
		ipc_client_destroy(cl);
}

/* Loop: return the context to the idle list, then tell the caller. */
static void
ipc_client_complete(struct ipc_client *cl, struct ipc_req *rq, int status)
{
	ipc_reply_cb cb = rq->rq_cb;
	void *arg = rq->rq_arg;
	nng_msg *reply = rq->rq_reply;

	rq->rq_cb = NULL;
	rq->rq_arg = NULL;
	rq->rq_reply = NULL;
	rq->rq_busy = 0;
	rq->rq_next = cl->cl_idle;
	cl->cl_idle = rq;
	cl->cl_inflight--;
	if (status == NNG_ECANCELED)
		status = NNG_ECLOSED;
	if (cb != NULL) {
		if (status == 0 && reply != NULL)
			cb(arg, 0, nng_msg_body(reply), nng_msg_len(reply));
		else
			cb(arg, status == 0 ? NNG_EINTERNAL : status, NULL, 0);
	}
	nng_msg_free(reply);
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
