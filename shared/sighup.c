/* sighup.c: the one SIGHUP handler of every smg-c process (a no-op). */
#include "shared/sighup.h"

#include <signal.h>

#include "shared/log.h"

static ev_signal sighup_watcher;

static void sighup_cb(struct ev_loop *, ev_signal *, int);

static void
sighup_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	log_info("%s: SIGHUP ignored (no reload; restart to change flags)",
	    __func__);
}

void
sighup_ignore(struct ev_loop *loop)
{
	ev_signal_init(&sighup_watcher, sighup_cb, SIGHUP);
	ev_signal_start(loop, &sighup_watcher);
	/* A no-op must not change when the loop has nothing left to do. */
	ev_unref(loop);
}
