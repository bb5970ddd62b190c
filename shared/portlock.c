/* portlock.c: the host:port claim, an abstract unix socket (portlock.h). */
#define _GNU_SOURCE /* accept4 */
#include "shared/portlock.h"
#include "shared/log.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PORTLOCK_BACKLOG 16
#define PORTLOCK_TRIES   3 /* bind/connect races with a dying holder */

static ev_io portlock_io;
static int portlock_fd = -1;
static char portlock_line[PATH_MAX + 32];
static size_t portlock_linelen;

static socklen_t portlock_addr(struct sockaddr_un *, const char *, long);
static void portlock_accept_cb(struct ev_loop *, ev_io *, int);
static enum portlock_state portlock_ask(const struct sockaddr_un *, socklen_t,
    const char *, struct portlock_owner *);
static int portlock_same_dir(const char *, const char *);

/* The abstract address of host:port; returns its length. */
static socklen_t
portlock_addr(struct sockaddr_un *sun, const char *host, long port)
{
	int n;

	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	/* sun_path[0] stays NUL: the abstract namespace. A host name too
	 * long for the address is cut: such names do not occur in practice. */
	n = snprintf(sun->sun_path + 1, sizeof(sun->sun_path) - 1,
	    "smg-c/port/%ld/%s", port, host != NULL ? host : "");
	if (n < 0)
		n = 0;
	if ((size_t)n > sizeof(sun->sun_path) - 2)
		n = (int)sizeof(sun->sun_path) - 2;
	return (
	    socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Two run dirs name the same directory (by path when one is missing). */
static int
portlock_same_dir(const char *a, const char *b)
{
	char ra[PATH_MAX], rb[PATH_MAX];

	if (realpath(a, ra) == NULL)
		snprintf(ra, sizeof(ra), "%s", a);
	if (realpath(b, rb) == NULL)
		snprintf(rb, sizeof(rb), "%s", b);
	return strcmp(ra, rb) == 0;
}

/*
 * Connects to the holder and reads its line. PORTLOCK_FREE when nobody
 * listens; PORTLOCK_ERROR (errno set) when the holder does not answer
 * with a well-formed line within a second.
 */
static enum portlock_state
portlock_ask(const struct sockaddr_un *sun, socklen_t len, const char *run_dir,
    struct portlock_owner *owner)
{
	struct timeval tv = { .tv_sec = 1, .tv_usec = 0 };
	char buf[PATH_MAX + 32], *sp, *nl, *end;
	size_t got = 0;
	ssize_t n;
	int fd;

	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) == -1)
		return PORTLOCK_ERROR;
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (const struct sockaddr *)sun, len) == -1) {
		close(fd);
		return errno == ECONNREFUSED || errno == ENOENT
		    ? PORTLOCK_FREE
		    : PORTLOCK_ERROR;
	}
	while (got < sizeof(buf) - 1) {
		n = read(fd, buf + got, sizeof(buf) - 1 - got);
		if (n == -1 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
		if (memchr(buf, '\n', got) != NULL)
			break;
	}
	close(fd);
	buf[got] = '\0';
	if ((nl = strchr(buf, '\n')) == NULL ||
	    (sp = strchr(buf, ' ')) == NULL || sp > nl) {
		errno = EPROTO;
		return PORTLOCK_ERROR;
	}
	*nl = '\0';
	*sp = '\0';
	errno = 0;
	owner->po_pid = strtol(buf, &end, 10);
	if (errno != 0 || *end != '\0' || owner->po_pid <= 0) {
		errno = EPROTO;
		return PORTLOCK_ERROR;
	}
	snprintf(owner->po_run_dir, sizeof(owner->po_run_dir), "%s", sp + 1);
	return portlock_same_dir(owner->po_run_dir, run_dir) ? PORTLOCK_SAME
	                                                     : PORTLOCK_OTHER;
}

enum portlock_state
portlock_query(const char *host, long port, const char *run_dir,
    struct portlock_owner *owner)
{
	struct sockaddr_un sun;
	socklen_t len;

	len = portlock_addr(&sun, host, port);
	return portlock_ask(&sun, len, run_dir, owner);
}

enum portlock_state
portlock_take(struct ev_loop *loop, const char *host, long port,
    const char *run_dir, struct portlock_owner *owner)
{
	struct sockaddr_un sun;
	enum portlock_state st;
	socklen_t len;
	int fd, i;

	if (portlock_fd != -1) {
		errno = EALREADY;
		return PORTLOCK_ERROR;
	}
	len = portlock_addr(&sun, host, port);
	for (i = 0; i < PORTLOCK_TRIES; i++) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0);
		if (fd == -1)
			return PORTLOCK_ERROR;
		if (bind(fd, (struct sockaddr *)&sun, len) == 0) {
			if (listen(fd, PORTLOCK_BACKLOG) == -1) {
				close(fd);
				return PORTLOCK_ERROR;
			}
			break;
		}
		close(fd);
		fd = -1;
		if (errno != EADDRINUSE)
			return PORTLOCK_ERROR;
		/* Held: ask whom; a holder exiting meanwhile frees it. */
		st = portlock_ask(&sun, len, run_dir, owner);
		if (st != PORTLOCK_FREE)
			return st;
	}
	if (fd == -1) {
		errno = EADDRINUSE;
		return PORTLOCK_ERROR;
	}
	portlock_fd = fd;
	portlock_linelen = (size_t)snprintf(portlock_line,
	    sizeof(portlock_line), "%ld %s\n", (long)getpid(), run_dir);
	if (portlock_linelen >= sizeof(portlock_line))
		portlock_linelen = sizeof(portlock_line) - 1;
	ev_io_init(&portlock_io, portlock_accept_cb, fd, EV_READ);
	ev_io_start(loop, &portlock_io);
	/* The claim alone must not keep a stopping loop running. */
	ev_unref(loop);
	return PORTLOCK_TAKEN;
}

/* Answers every queued query with the owner line and closes it. */
static void
portlock_accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	ssize_t n;
	int fd;

	(void)loop;
	(void)revents;
	while ((fd = accept4(w->fd, NULL, NULL,
	            SOCK_CLOEXEC | SOCK_NONBLOCK)) != -1) {
		/* A fresh unix socket's buffer always takes one short line. */
		n = send(fd, portlock_line, portlock_linelen, MSG_NOSIGNAL);
		(void)n;
		close(fd);
	}
}

void
portlock_release(struct ev_loop *loop)
{
	if (portlock_fd == -1)
		return;
	ev_ref(loop);
	ev_io_stop(loop, &portlock_io);
	close(portlock_fd);
	portlock_fd = -1;
}

void
portlock_claim(struct ev_loop *loop, const char *host, long port,
    const char *run_dir)
{
	struct portlock_owner o;

	switch (portlock_take(loop, host, port, run_dir, &o)) {
	case PORTLOCK_TAKEN:
	case PORTLOCK_SAME:
	case PORTLOCK_FREE:
		return;
	case PORTLOCK_OTHER:
		log_error(
		    "%s: %s:%ld is already served by the smg-c gateway of "
		    "pid %ld (run dir %s); not starting",
		    __func__, host, port, o.po_pid, o.po_run_dir);
		exit(2);
	case PORTLOCK_ERROR:
		break;
	}
	fatal("%s: cannot claim %s:%ld", __func__, host, port);
}
