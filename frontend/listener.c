/*
 * listener.c: the frontend's listening sockets (main, metrics, health).
 * Each is bound with SO_REUSEPORT, so every frontend process binds the
 * same ports and the kernel spreads connections over them.
 */
#define _GNU_SOURCE /* accept4 */
#include <sys/socket.h>
#include <sys/types.h>

#include <errno.h>
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

#define LISTENER_MAX     8
#define LISTENER_BACKLOG 1024
#define LISTENER_BATCH   64 /* accepts per wakeup */

struct listener {
	ev_io l_io;
	enum listener_kind l_kind;
	int l_fd;
};

static struct listener *listeners[LISTENER_MAX];
static size_t nlisteners;

static void listener_accept_cb(struct ev_loop *, ev_io *, int);

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

	for (i = 0; i < nlisteners; i++) {
		ev_io_stop(fe->fe_loop, &listeners[i]->l_io);
		close(listeners[i]->l_fd);
		free(listeners[i]);
		listeners[i] = NULL;
	}
	nlisteners = 0;
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
			if (errno != EAGAIN && errno != EWOULDBLOCK &&
			    errno != EINTR && errno != ECONNABORTED)
				log_warn("%s: accept", __func__);
			return;
		}
		if (fe->fe_nconns >= FE_MAX_CONNS) {
			close(fd);
			continue;
		}
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
		conn_accept(fd, l->l_kind);
	}
}
