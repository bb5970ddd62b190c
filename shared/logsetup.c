/* logsetup.c: --log-json, --log-dir and SIGUSR1 (logsetup.h). */
#include "shared/logsetup.h"

#include <sys/stat.h>

#include <errno.h>
#include <signal.h>

#include "shared/log.h"

static ev_signal logsetup_usr1;
static bool logsetup_file; /* --log-dir given */

static void logsetup_usr1_cb(struct ev_loop *, ev_signal *, int);

static void
logsetup_usr1_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)w;
	(void)revents;
	if (!logsetup_file)
		return;
	if (log_reopen() == -1)
		log_warn("%s: cannot reopen the log file", __func__);
	else
		log_info("%s: log file reopened", __func__);
}

void
logsetup_apply(struct ev_loop *loop, const struct config *cf)
{
	log_setlevel(cf->cf_log_level);
	log_set_json(cf->cf_log_json);
	if (cf->cf_log_dir != NULL) {
		if (mkdir(cf->cf_log_dir, 0750) == -1 && errno != EEXIST)
			fatal("%s: mkdir %s", __func__, cf->cf_log_dir);
		if (log_open_file(cf->cf_log_dir) == -1)
			fatal("%s: cannot open a log file in %s", __func__,
			    cf->cf_log_dir);
		logsetup_file = true;
	}
	/* Always: SIGUSR1's default action would end the process. */
	ev_signal_init(&logsetup_usr1, logsetup_usr1_cb, SIGUSR1);
	ev_signal_start(loop, &logsetup_usr1);
	ev_unref(loop);
}
