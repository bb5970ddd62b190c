/*
 * sighup.h: SIGHUP is a logged no-op in every smg-c process.
 *
 * smg-c has no configuration reload: flags are read once (config.h), and a
 * change means a restart. A SIGHUP (a closed terminal, an operator's
 * habitual "kill -HUP") must therefore neither stop a process nor be
 * passed on: the launcher, smg-frontend, smg-broker and smg-poller each
 * call sighup_ignore() from main, and each SIGHUP received logs one line.
 */
#ifndef SHARED_SIGHUP_H
#define SHARED_SIGHUP_H

#include <ev.h>

/*
 * Starts a watcher on loop that logs "SIGHUP ignored" at info level for
 * each SIGHUP and does nothing else. The watcher does not keep ev_run
 * going. Call once per process (the watcher is static), after log_init.
 */
void sighup_ignore(struct ev_loop *loop);

#endif /* SHARED_SIGHUP_H */
