/*
 * logsetup.h: the logging flags of every smg-c process (--log-json,
 * --log-dir, --log-level), applied the same way everywhere.
 */
#ifndef SHARED_LOGSETUP_H
#define SHARED_LOGSETUP_H

#include <ev.h>

#include "shared/config.h"

/*
 * Sets the level and the JSON form, and with --log-dir sends stderr to
 * <dir>/<role>.log (the directory is made if missing; failure is fatal)
 * and reopens that file on each SIGUSR1 (logrotate's postrotate). The
 * SIGUSR1 watcher is on loop, does not keep ev_run going, and is there
 * without --log-dir too (a no-op then), so the signal never kills. Call once,
 * after log_init and the loop's creation.
 */
void logsetup_apply(struct ev_loop *loop, const struct config *cf);

#endif /* SHARED_LOGSETUP_H */
