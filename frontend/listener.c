/*
 * listener.c: the frontend's listening sockets (main, metrics, health).
 * Each is bound with SO_REUSEPORT, so every frontend process binds the
 * same ports and the kernel spreads connections over them.
 *
 * Out of file descriptors (EMFILE, ENFILE), accept() fails while the
 * connection stays queued, so a level-triggered watcher would call it again
 * at once, forever. Instead every listener pauses: its watcher stops and a
 * timer restarts it after a backoff (LISTENER_PAUSE_MIN doubling to
 * LISTENER_PAUSE_MAX, back to the minimum once an accept succeeds). One
 * spare descriptor, held from startup, lets the pause answer the queued
 * connections with a 503 and close them rather than leave them hanging.
 * An episode of pauses logs one line when it starts and one when accepting
 * works again; each pause counts in smg_frontend_accept_paused_total.
 */
#define _GNU_SOURCE /* accept4 */
#include <sys/socket.h>
#include <sys/types.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "shared/log.h"
#include "shared/xmalloc.h"

#define LISTENER_MAX       8
#define LISTENER_BACKLOG   1024
#define LISTENER_BATCH     64 /* accepts per wakeup */
#define LISTENER_PAUSE_MIN 0.1 /* seconds */
#define LISTENER_PAUSE_MAX 0.5 /* a queued client waits at most this */
#define LISTENER_SHED_MAX  1024 /* connections answered 503 per pause */

struct listener {
	ev_io l_io;
	enum listener_kind l_kind;
	int l_fd;
};

static struct listener *listeners[LISTENER_MAX];
static size_t nlisteners;
static int listener_spare = -1; /* /dev/null, given up to shed */
static ev_timer listener_pause_timer;
static double listener_backoff = LISTENER_PAUSE_MIN;
static bool listener_paused;
static bool listener_episode; /* pauses since the last good accept */
static uint64_t listener_episode_pauses;
static uint64_t listener_episode_shed;

static void listener_accept_cb(struct ev_loop *, ev_io *, int);
static void listener_pause(int err);
static void listener_resume_cb(struct ev_loop *, ev_timer *, int);
static uint64_t listener_shed(void);
static void listener_reply_503(int fd);
static void listener_spare_open(void);
static void listener_take_backlog(struct listener *);

int
listener_open(const char *host, long port, enum listener_kind kind)
{
	struct addrinfo hints, *res, *ai;
	struct listener *l;
	char portstr[16];
	int fd = -1, on = 1, rv;

	if (nlisteners == LISTENER_MAX) {
		log_warnx("%s: too many listeners", __func__);
		return -1;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	snprintf(portstr, sizeof(portstr), "%ld", port);
	if ((rv = getaddrinfo(host, portstr, &hints, &res)) != 0) {
		log_warnx("%s: %s: %s", __func__, host, gai_strerror(rv));
		return -1;
	}
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family,
		    ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
		if (fd == -1)
			continue;
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) ==
		        -1 ||
		    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) ==
		        -1 ||
		    bind(fd, ai->ai_addr, ai->ai_addrlen) == -1 ||
		    listen(fd, LISTENER_BACKLOG) == -1) {
			log_warn("%s: %s:%ld", __func__, host, port);
			close(fd);
			fd = -1;
			continue;
		}
		break;
	}
	freeaddrinfo(res);
	if (fd == -1)
		return -1;
	if (nlisteners == 0) {
		ev_timer_init(&listener_pause_timer, listener_resume_cb, 0.,
		    0.);
		listener_spare_open();
	}
	l = xcalloc(1, sizeof(*l));
	l->l_fd = fd;
	l->l_kind = kind;
	ev_io_init(&l->l_io, listener_accept_cb, fd, EV_READ);
	ev_io_start(fe->fe_loop, &l->l_io);
	listeners[nlisteners++] = l;
	return 0;
}

void
listener_close_all(void)
{
	size_t i;

	ev_timer_stop(fe->fe_loop, &listener_pause_timer);
	listener_paused = false;
	if (listener_spare != -1) {
		close(listener_spare);
		listener_spare = -1;
	}
	for (i = 0; i < nlisteners; i++) {
		ev_io_stop(fe->fe_loop, &listeners[i]->l_io);
		/*
		 * With SO_REUSEPORT each frontend has its own accept queue,
		 * and closing the socket resets what waits in it: take those
		 * clients first (they are answered with Connection: close);
		 * new ones go to the other frontends from the close on.
		 */
		listener_take_backlog(listeners[i]);
		close(listeners[i]->l_fd);
		free(listeners[i]);
		listeners[i] = NULL;
	}
	nlisteners = 0;
}

static void
listener_take_backlog(struct listener *l)
{
	int fd, on = 1, n;

	for (n = 0; n < FE_MAX_CONNS && fe->fe_nconns < FE_MAX_CONNS; n++) {
		fd = accept4(l->l_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd == -1) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return;
		}
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
		conn_accept(fd, l->l_kind);
	}
}

static void
listener_spare_open(void)
{
	if (listener_spare == -1)
		listener_spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void
listener_accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct listener *l = (struct listener *)w;
	int fd, i, on = 1;

	(void)loop;
	(void)revents;
	for (i = 0; i < LISTENER_BATCH; i++) {
		fd = accept4(l->l_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd == -1) {
			if (errno == EMFILE || errno == ENFILE ||
			    errno == ENOBUFS || errno == ENOMEM) {
				listener_pause(errno);
				return;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK &&
			    errno != EINTR && errno != ECONNABORTED)
				log_warn("%s: accept", __func__);
			return;
		}
		if (listener_episode) {
			log_info("%s: accepting again after %" PRIu64
			         " pause(s), %" PRIu64 " connection(s) "
			         "refused with 503",
			    __func__, listener_episode_pauses,
			    listener_episode_shed);
			listener_episode = false;
			listener_backoff = LISTENER_PAUSE_MIN;
			listener_spare_open();
		}
		if (fe->fe_nconns >= FE_MAX_CONNS) {
			close(fd);
			continue;
		}
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
		conn_accept(fd, l->l_kind);
	}
}

/*
 * Stops every listener for the current backoff and answers what is queued
 * with 503 through the spare descriptor. Logs only the first pause of an
 * episode: a loaded process otherwise logs at the rate it fails.
 */
static void
listener_pause(int err)
{
	size_t i;
	uint64_t shed;

	if (listener_paused)
		return;
	listener_paused = true;
	for (i = 0; i < nlisteners; i++)
		ev_io_stop(fe->fe_loop, &listeners[i]->l_io);
	shed = listener_shed();
	stats_add("smg_frontend_accept_paused_total", "", 1);
	if (shed > 0)
		stats_add("smg_frontend_accept_shed_total", "", (int64_t)shed);
	if (!listener_episode) {
		log_warnx("%s: accept: %s; pausing accepts, answering queued "
		          "connections 503 (%u open connections)",
		    __func__, strerror(err), fe->fe_nconns);
		listener_episode = true;
		listener_episode_pauses = 0;
		listener_episode_shed = 0;
	}
	listener_episode_pauses++;
	listener_episode_shed += shed;
	ev_timer_set(&listener_pause_timer, listener_backoff, 0.);
	ev_timer_start(fe->fe_loop, &listener_pause_timer);
	listener_backoff *= 2;
	if (listener_backoff > LISTENER_PAUSE_MAX)
		listener_backoff = LISTENER_PAUSE_MAX;
}

static void
listener_resume_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	size_t i;

	(void)t;
	(void)revents;
	listener_paused = false;
	/* The spare went to a shed connection; take it back if we can. */
	listener_spare_open();
	for (i = 0; i < nlisteners; i++)
		ev_io_start(loop, &listeners[i]->l_io);
}

/*
 * Accepts queued connections on the spare descriptor's slot and answers
 * each 503; returns how many. Stops when the queues are empty, when the
 * slot is lost to another open, or at LISTENER_SHED_MAX.
 */
static uint64_t
listener_shed(void)
{
	uint64_t n = 0;
	size_t i;
	int fd;

	for (i = 0; i < nlisteners && n < LISTENER_SHED_MAX; i++) {
		while (n < LISTENER_SHED_MAX && listener_spare != -1) {
			close(listener_spare);
			listener_spare = -1;
			fd = accept4(listeners[i]->l_fd, NULL, NULL,
			    SOCK_NONBLOCK | SOCK_CLOEXEC);
			if (fd != -1) {
				listener_reply_503(fd);
				close(fd);
				n++;
			}
			listener_spare_open();
			if (fd == -1)
				break;
		}
	}
	return n;
}

/* Best effort: one non-blocking write into a fresh socket's buffer. */
static void
listener_reply_503(int fd)
{
	struct http_out o;
	ssize_t rv;

	http_out_init(&o);
	if (http_out_error(&o, 503, "too_many_connections",
	        "The gateway is out of file descriptors; retry shortly", NULL,
	        1, false) == 0) {
		rv = send(fd, o.ho_buf, o.ho_len, MSG_NOSIGNAL | MSG_DONTWAIT);
		(void)rv;
	}
	http_out_free(&o);
}
