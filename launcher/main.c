/*
 * main.c: smg, the foreground launcher.
 *
 * It parses the command line once (a bad line exits 2 before anything is
 * created), claims --host:--port for this gateway (shared/portlock.h: a
 * second gateway on the same port exits 2 naming the owner's pid), checks
 * that the listening ports can be bound (exit 1 at once, not a restart
 * loop), makes the run and state directories and the shared segment, then
 * starts one smg-broker, one smg-poller and --frontends smg-frontend
 * processes from its own directory, each with the same arguments
 * (frontends also get --frontend-slot). With --broker (a broker on another
 * host) only the frontends are started. A child that dies is logged and
 * restarted with backoff.
 *
 * SIGTERM/SIGINT drain: the frontends get SIGTERM first and finish their
 * in-flight requests for up to --shutdown-grace-period-secs; once the last
 * frontend is gone the broker and the poller get SIGTERM (a draining
 * frontend may still ask the broker for a retry's worker). What is still
 * running LAUNCHER_STOP_MARGIN s after the grace period (or SMG_STOP_SECS
 * after it, for runs slowed down on purpose, e.g. under valgrind) is
 * killed. Then the run dir's sockets, the segment and the run dir are
 * removed and the launcher exits 0. A second SIGTERM/SIGINT kills at once.
 * SIGUSR1 reopens the --log-dir files here and is passed on to every child
 * (shared/logsetup.h). SIGHUP is a logged no-op here and in every child
 * (shared/sighup.h), and
 * is not passed on. Children get PR_SET_PDEATHSIG so they never outlive a
 * launcher killed with SIGKILL.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ev.h>

#include "shared/config.h"
#include "shared/fdlimit.h"
#include "shared/log.h"
#include "shared/logsetup.h"
#include "shared/portlock.h"
#include "shared/shm.h"
#include "shared/sighup.h"
#include "shared/xmalloc.h"

#define LAUNCHER_BACKOFF_MIN  0.1 /* first restart delay, s */
#define LAUNCHER_BACKOFF_MAX  5.0 /* doubling stops here */
#define LAUNCHER_HEALTHY_SECS 10.0 /* a run this long resets the delay */
#define LAUNCHER_STOP_MARGIN  5.0 /* grace period end to SIGKILL */
#define LAUNCHER_STOP_MAX     600.0 /* bound on SMG_STOP_SECS */
#define LAUNCHER_LOCKFILE     "smg.lock"

enum child_role {
	CHILD_BROKER = 0,
	CHILD_POLLER,
	CHILD_FRONTEND,
};

struct launcher;

struct child {
	struct launcher *ch_l;
	enum child_role ch_role;
	int ch_slot; /* frontend slot; -1 for the others */
	char ch_label[48];
	char *ch_path;
	pid_t ch_pid; /* 0: not running */
	ev_tstamp ch_started;
	double ch_backoff;
	ev_child ch_watch;
	ev_timer ch_restart;
};

struct launcher {
	struct ev_loop *l_loop;
	struct config *l_cf;
	struct shm *l_shm;
	pid_t l_pid;
	int l_lockfd;
	struct child *l_children;
	size_t l_nchildren;
	bool l_stopping;
	bool l_backend_stopped; /* broker and poller got SIGTERM */
	ev_tstamp l_stop_secs; /* SIGTERM to SIGKILL */
	ev_signal l_sigterm;
	ev_signal l_sigint;
	ev_signal l_sigusr1; /* passed on: one signal reopens every log */
	ev_timer l_kill;
};

static char *launcher_bindir(void);
static double launcher_stop_margin(void);
static void launcher_claim_port(struct launcher *);
static void launcher_probe_port(const char *, long);
static int launcher_mkdirs(const char *, mode_t);
static int launcher_spawn(struct child *);
static void launcher_child_cb(struct ev_loop *, ev_child *, int);
static void launcher_restart_cb(struct ev_loop *, ev_timer *, int);
static void launcher_signal_cb(struct ev_loop *, ev_signal *, int);
static void launcher_kill_cb(struct ev_loop *, ev_timer *, int);
static void launcher_usr1_cb(struct ev_loop *, ev_signal *, int);
static void launcher_signal_all(struct launcher *, int, bool);
static size_t launcher_running(struct launcher *);
static void launcher_stop_progress(struct launcher *);
static void launcher_clean_run_dir(struct launcher *);

int
main(int argc, char *argv[])
{
	struct config cf;
	struct launcher l;
	struct child *ch;
	char *bindir, lockpath[PATH_MAX];
	const char *names[] = { "smg-broker", "smg-poller", "smg-frontend" };
	size_t i, nback;

	log_init("smg", LOG_LEVEL_INFO);
	config_load_or_exit(&cf, argc, argv);
	(void)fdlimit_raise();
	log_setlevel(cf.cf_log_level);
	for (i = 0; i < cf.cf_warnings_n; i++)
		log_warnx("%s: %s", __func__, cf.cf_warnings[i]);
	signal(SIGPIPE, SIG_IGN);

	memset(&l, 0, sizeof(l));
	l.l_cf = &cf;
	l.l_pid = getpid();
	bindir = launcher_bindir();
	/* With --broker the broker (and its poller) run on another host. */
	nback = cf.cf_broker != NULL ? 0 : 2;
	l.l_nchildren = nback + (size_t)cf.cf_frontends;
	l.l_children = xcalloc(l.l_nchildren, sizeof(*l.l_children));
	for (i = 0; i < l.l_nchildren; i++) {
		ch = &l.l_children[i];
		ch->ch_l = &l;
		ch->ch_role = i < nback ? (enum child_role)i : CHILD_FRONTEND;
		ch->ch_slot = i < nback ? -1 : (int)(i - nback);
		ch->ch_path = xasprintf("%s/%s", bindir, names[ch->ch_role]);
		ch->ch_backoff = LAUNCHER_BACKOFF_MIN;
		if (ch->ch_slot >= 0)
			snprintf(ch->ch_label, sizeof(ch->ch_label),
			    "%s[slot %d]", names[ch->ch_role], ch->ch_slot);
		else
			snprintf(ch->ch_label, sizeof(ch->ch_label), "%s",
			    names[ch->ch_role]);
		if (access(ch->ch_path, X_OK) == -1)
			fatal("%s: %s", __func__, ch->ch_path);
	}
	free(bindir);

	if ((l.l_loop = ev_default_loop(EVFLAG_AUTO)) == NULL)
		fatalx("%s: cannot make the event loop", __func__);
	launcher_claim_port(&l);
	launcher_probe_port(cf.cf_host, cf.cf_port);
	launcher_probe_port(cf.cf_prometheus_host, cf.cf_prometheus_port);
	if (cf.cf_health_check_port_set)
		launcher_probe_port(cf.cf_host, cf.cf_health_check_port);
	logsetup_apply(l.l_loop, &cf);
	l.l_stop_secs =
	    (double)cf.cf_shutdown_grace_period_secs + launcher_stop_margin();

	if (launcher_mkdirs(cf.cf_run_dir, 0700) == -1)
		fatal("%s: mkdir %s", __func__, cf.cf_run_dir);
	if (launcher_mkdirs(cf.cf_state_dir, 0700) == -1)
		fatal("%s: mkdir %s", __func__, cf.cf_state_dir);
	/* One launcher per run dir: its children share sockets and shm. */
	snprintf(lockpath, sizeof(lockpath), "%s/%s", cf.cf_run_dir,
	    LAUNCHER_LOCKFILE);
	l.l_lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (l.l_lockfd == -1)
		fatal("%s: %s", __func__, lockpath);
	if (flock(l.l_lockfd, LOCK_EX | LOCK_NB) == -1)
		fatalx("%s: another smg runs with --run-dir %s", __func__,
		    cf.cf_run_dir);
	/* Made before any child, so all of them map the same version. */
	if ((l.l_shm = shm_open_segment(cf.cf_run_dir)) == NULL)
		fatalx("%s: cannot create the shared segment in %s", __func__,
		    cf.cf_run_dir);

	ev_signal_init(&l.l_sigterm, launcher_signal_cb, SIGTERM);
	ev_signal_init(&l.l_sigint, launcher_signal_cb, SIGINT);
	l.l_sigterm.data = l.l_sigint.data = &l;
	ev_signal_start(l.l_loop, &l.l_sigterm);
	ev_signal_start(l.l_loop, &l.l_sigint);
	sighup_ignore(l.l_loop);
	ev_signal_init(&l.l_sigusr1, launcher_usr1_cb, SIGUSR1);
	l.l_sigusr1.data = &l;
	ev_signal_start(l.l_loop, &l.l_sigusr1);
	ev_unref(l.l_loop);
	ev_timer_init(&l.l_kill, launcher_kill_cb, l.l_stop_secs, 0.);
	l.l_kill.data = &l;

	for (i = 0; i < l.l_nchildren; i++) {
		ch = &l.l_children[i];
		ev_init(&ch->ch_restart, launcher_restart_cb);
		ch->ch_restart.data = ch;
		if (launcher_spawn(ch) == -1)
			fatalx("%s: cannot start %s", __func__, ch->ch_label);
	}
	if (nback == 0)
		log_info("%s: started %ld frontends on %s:%ld, broker %s",
		    __func__, cf.cf_frontends, cf.cf_host, cf.cf_port,
		    cf.cf_broker);
	else
		log_info("%s: started broker pid %ld, poller pid %ld, %ld "
		         "frontends on %s:%ld",
		    __func__, (long)l.l_children[CHILD_BROKER].ch_pid,
		    (long)l.l_children[CHILD_POLLER].ch_pid, cf.cf_frontends,
		    cf.cf_host, cf.cf_port);

	ev_run(l.l_loop, 0);

	launcher_clean_run_dir(&l);
	portlock_release(l.l_loop);
	for (i = 0; i < l.l_nchildren; i++)
		free(l.l_children[i].ch_path);
	free(l.l_children);
	log_info("%s: stopped", __func__);
	config_free(&cf);
	ev_loop_destroy(l.l_loop);
	return 0;
}

/* The directory of our own executable: the children live beside it. */
static char *
launcher_bindir(void)
{
	char buf[PATH_MAX], *slash;
	ssize_t n;

	if ((n = readlink("/proc/self/exe", buf, sizeof(buf) - 1)) == -1)
		fatal("%s: readlink /proc/self/exe", __func__);
	buf[n] = '\0';
	if ((slash = strrchr(buf, '/')) == NULL)
		fatalx("%s: odd executable path %s", __func__, buf);
	*slash = '\0';
	return xstrdup(buf[0] != '\0' ? buf : "/");
}

/*
 * How long after the grace period stragglers are killed: SMG_STOP_SECS
 * when it holds a number in (0, LAUNCHER_STOP_MAX], else
 * LAUNCHER_STOP_MARGIN.
 */
static double
launcher_stop_margin(void)
{
	const char *s = getenv("SMG_STOP_SECS");
	char *end;
	double v;

	if (s == NULL || *s == '\0')
		return LAUNCHER_STOP_MARGIN;
	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || *end != '\0' || !(v > 0 && v <= LAUNCHER_STOP_MAX)) {
		log_warnx("%s: ignoring SMG_STOP_SECS=\"%s\"", __func__, s);
		return LAUNCHER_STOP_MARGIN;
	}
	return v;
}

/*
 * One gateway per host:port: a port held by another gateway (another run
 * dir) ends the start with exit 2 and one line naming the holder. Held by
 * this gateway's own run dir (its broker under a supervisor), the run
 * dir's lock decides below.
 */
static void
launcher_claim_port(struct launcher *l)
{
	const struct config *cf = l->l_cf;

	portlock_claim(l->l_loop, cf->cf_host, cf->cf_port, cf->cf_run_dir);
}

/*
 * Binds host:port the way the frontends will (SO_REUSEADDR and
 * SO_REUSEPORT, no listen, so no connection lands here) and lets go: a
 * port another program holds ends the start with exit 1 now, rather than
 * frontends that fail and are restarted forever.
 */
static void
launcher_probe_port(const char *host, long port)
{
	struct addrinfo hints, *res, *ai;
	char portstr[16];
	int fd, on = 1, rv, err = 0;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	snprintf(portstr, sizeof(portstr), "%ld", port);
	if ((rv = getaddrinfo(host, portstr, &hints, &res)) != 0)
		fatalx("%s: cannot listen on %s:%ld: %s", __func__, host, port,
		    gai_strerror(rv));
	/* Like listener_open: the first address that binds is used. */
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
		    ai->ai_protocol);
		if (fd == -1) {
			err = errno;
			continue;
		}
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) ==
		        0 &&
		    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) ==
		        0 &&
		    bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
			close(fd);
			freeaddrinfo(res);
			return;
		}
		err = errno;
		close(fd);
	}
	freeaddrinfo(res);
	errno = err;
	fatal("%s: cannot listen on %s:%ld", __func__, host, port);
}

/* mkdir -p; the last component gets mode, existing ones are kept. */
static int
launcher_mkdirs(const char *path, mode_t mode)
{
	char buf[PATH_MAX], *p;

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	for (p = buf + 1; *p != '\0'; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) == -1 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, mode) == -1 && errno != EEXIST)
		return -1;
	return 0;
}

static int
launcher_spawn(struct child *ch)
{
	struct launcher *l = ch->ch_l;
	const struct config *cf = l->l_cf;
	char **argv, slot[16];
	sigset_t none;
	pid_t pid;
	int i, n = 0;

	argv = xcalloc((size_t)cf->cf_argc + 4, sizeof(*argv));
	argv[n++] = ch->ch_path;
	for (i = 0; i < cf->cf_argc; i++)
		argv[n++] = cf->cf_argv[i];
	if (ch->ch_role == CHILD_FRONTEND) {
		snprintf(slot, sizeof(slot), "%d", ch->ch_slot);
		argv[n++] = "--frontend-slot";
		argv[n++] = slot;
	}
	argv[n] = NULL;

	if ((pid = fork()) == -1) {
		log_warn("%s: fork for %s", __func__, ch->ch_label);
		free(argv);
		return -1;
	}
	if (pid == 0) {
		/* libev blocks the signals it watches; exec keeps masks. */
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		/* Ignored until the child's own no-op watcher is up. */
		signal(SIGHUP, SIG_IGN);
		signal(SIGUSR1, SIG_IGN);
		if (prctl(PR_SET_PDEATHSIG, SIGTERM) == -1 ||
		    getppid() != l->l_pid)
			_exit(1);
		execv(ch->ch_path, argv);
		_exit(127);
	}
	free(argv);
	ch->ch_pid = pid;
	ch->ch_started = ev_time();
	ev_child_init(&ch->ch_watch, launcher_child_cb, pid, 0);
	ch->ch_watch.data = ch;
	ev_child_start(l->l_loop, &ch->ch_watch);
	return 0;
}

static void
launcher_child_cb(struct ev_loop *loop, ev_child *w, int revents)
{
	struct child *ch = w->data;
	struct launcher *l = ch->ch_l;
	char cause[64];
	double ran, delay;
	int st = w->rstatus;

	(void)revents;
	ev_child_stop(loop, w);
	ran = ev_time() - ch->ch_started;
	if (WIFEXITED(st))
		snprintf(cause, sizeof(cause), "exited with status %d",
		    WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(cause, sizeof(cause), "killed by signal %d (%s)",
		    WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		snprintf(cause, sizeof(cause), "ended (status %#x)", st);
	ch->ch_pid = 0;

	if (l->l_stopping) {
		log_info("%s: %s pid %ld %s", __func__, ch->ch_label,
		    (long)w->rpid, cause);
		launcher_stop_progress(l);
		return;
	}
	if (ran >= LAUNCHER_HEALTHY_SECS)
		ch->ch_backoff = LAUNCHER_BACKOFF_MIN;
	delay = ch->ch_backoff;
	ch->ch_backoff *= 2;
	if (ch->ch_backoff > LAUNCHER_BACKOFF_MAX)
		ch->ch_backoff = LAUNCHER_BACKOFF_MAX;
	log_warnx("%s: %s pid %ld %s after %.1f s; restarting in %.1f s",
	    __func__, ch->ch_label, (long)w->rpid, cause, ran, delay);
	ev_timer_set(&ch->ch_restart, delay, 0.);
	ev_timer_start(loop, &ch->ch_restart);
}

static void
launcher_restart_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct child *ch = w->data;
	double delay;

	(void)revents;
	if (ch->ch_l->l_stopping)
		return;
	if (launcher_spawn(ch) == 0) {
		log_info("%s: restarted %s: pid %ld", __func__, ch->ch_label,
		    (long)ch->ch_pid);
		return;
	}
	delay = ch->ch_backoff;
	ch->ch_backoff *= 2;
	if (ch->ch_backoff > LAUNCHER_BACKOFF_MAX)
		ch->ch_backoff = LAUNCHER_BACKOFF_MAX;
	ev_timer_set(w, delay, 0.);
	ev_timer_start(loop, w);
}

static size_t
launcher_running(struct launcher *l)
{
	size_t i, n = 0;

	for (i = 0; i < l->l_nchildren; i++)
		if (l->l_children[i].ch_pid != 0)
			n++;
	return n;
}

static size_t
launcher_frontends_running(struct launcher *l)
{
	size_t i, n = 0;

	for (i = 0; i < l->l_nchildren; i++)
		if (l->l_children[i].ch_role == CHILD_FRONTEND &&
		    l->l_children[i].ch_pid != 0)
			n++;
	return n;
}

/* Sends sig to the running children: frontends only, or all of them. */
static void
launcher_signal_all(struct launcher *l, int sig, bool frontends_only)
{
	size_t i;

	for (i = 0; i < l->l_nchildren; i++) {
		if (frontends_only &&
		    l->l_children[i].ch_role != CHILD_FRONTEND)
			continue;
		if (l->l_children[i].ch_pid != 0 &&
		    kill(l->l_children[i].ch_pid, sig) == -1 && errno != ESRCH)
			log_warn("%s: kill %s", __func__,
			    l->l_children[i].ch_label);
	}
}

/*
 * Stopping, once no frontend runs: the broker and the poller get SIGTERM,
 * and the loop ends when nothing runs at all.
 */
static void
launcher_stop_progress(struct launcher *l)
{
	if (launcher_frontends_running(l) == 0 && !l->l_backend_stopped) {
		l->l_backend_stopped = true;
		launcher_signal_all(l, SIGTERM, false);
	}
	if (launcher_running(l) == 0)
		ev_break(l->l_loop, EVBREAK_ALL);
}

static void
launcher_signal_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	struct launcher *l = w->data;
	size_t i;

	(void)revents;
	if (l->l_stopping) {
		/* Asked twice: do not wait for the stragglers. */
		log_info("%s: signal %d again, killing", __func__, w->signum);
		launcher_signal_all(l, SIGKILL, false);
		return;
	}
	log_info("%s: signal %d, stopping %zu processes: frontends drain for "
	         "up to %ld s",
	    __func__, w->signum, launcher_running(l),
	    l->l_cf->cf_shutdown_grace_period_secs);
	l->l_stopping = true;
	for (i = 0; i < l->l_nchildren; i++)
		ev_timer_stop(loop, &l->l_children[i].ch_restart);
	launcher_signal_all(l, SIGTERM, true);
	ev_timer_start(loop, &l->l_kill);
	launcher_stop_progress(l);
}

/* SIGUSR1 (logrotate's postrotate): every child reopens its log too. */
static void
launcher_usr1_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
	(void)loop;
	(void)revents;
	launcher_signal_all(w->data, SIGUSR1, false);
}

static void
launcher_kill_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct launcher *l = w->data;
	size_t i;

	(void)loop;
	(void)revents;
	for (i = 0; i < l->l_nchildren; i++)
		if (l->l_children[i].ch_pid != 0)
			log_warnx("%s: %s pid %ld still running %.0f s after "
			          "SIGTERM, killing",
			    __func__, l->l_children[i].ch_label,
			    (long)l->l_children[i].ch_pid, l->l_stop_secs);
	launcher_signal_all(l, SIGKILL, false);
}

/*
 * After every child is gone: the sockets the children listened on, the
 * segment, the lock, and the run dir itself when nothing else is in it.
 */
static void
launcher_clean_run_dir(struct launcher *l)
{
	const char *dir = l->l_cf->cf_run_dir;
	char path[PATH_MAX];
	struct dirent *de;
	struct stat sb;
	DIR *d;

	ev_timer_stop(l->l_loop, &l->l_kill);
	if ((d = opendir(dir)) != NULL) {
		while ((de = readdir(d)) != NULL) {
			if (snprintf(path, sizeof(path), "%s/%s", dir,
			        de->d_name) >= (int)sizeof(path))
				continue;
			if (lstat(path, &sb) == 0 && S_ISSOCK(sb.st_mode) &&
			    unlink(path) == -1)
				log_warn("%s: unlink %s", __func__, path);
		}
		closedir(d);
	}
	shm_close(l->l_shm);
	if (shm_unlink_segment(dir) == -1)
		log_warnx("%s: cannot remove the shared segment", __func__);
	snprintf(path, sizeof(path), "%s/%s", dir, LAUNCHER_LOCKFILE);
	(void)unlink(path);
	close(l->l_lockfd);
	if (rmdir(dir) == -1 && errno != ENOTEMPTY && errno != EEXIST)
		log_warn("%s: rmdir %s", __func__, dir);
}
