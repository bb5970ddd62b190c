/* log.c: timestamped, role- and pid-tagged log lines on stderr. */
#include "shared/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const char *log_role = "smg";
static enum log_level log_min = LOG_LEVEL_INFO;

static const char *const log_level_names[] = {
	[LOG_LEVEL_DEBUG] = "debug",
	[LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_WARN] = "warn",
	[LOG_LEVEL_ERROR] = "error",
};

static void log_vline(enum log_level, int, const char *, va_list)
    __attribute__((format(printf, 3, 0)));

void
log_init(const char *role, enum log_level level)
{
	log_role = role;
	log_min = level;
}

void
log_procinit(const char *role)
{
	log_role = role;
}

void
log_setlevel(enum log_level level)
{
	log_min = level;
}

enum log_level
log_getlevel(void)
{
	return log_min;
}

int
log_level_parse(const char *name, enum log_level *out)
{
	if (strcmp(name, "debug") == 0)
		*out = LOG_LEVEL_DEBUG;
	else if (strcmp(name, "info") == 0)
		*out = LOG_LEVEL_INFO;
	else if (strcmp(name, "warn") == 0 || strcmp(name, "warning") == 0)
		*out = LOG_LEVEL_WARN;
	else if (strcmp(name, "error") == 0)
		*out = LOG_LEVEL_ERROR;
	else
		return -1;
	return 0;
}

/*
 * One write(2) per line so lines of concurrent processes sharing stderr do
 * not interleave.
 */
static void
log_vline(enum log_level level, int errnum, const char *fmt, va_list ap)
{
	char line[4096], stamp[32];
	struct timeval tv;
	struct tm tm;
	int n, m;

	if (level < log_min)
		return;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	n = snprintf(line, sizeof(line), "%s.%03ldZ %s %s[%ld]: ", stamp,
	    (long)(tv.tv_usec / 1000), log_level_names[level], log_role,
	    (long)getpid());
	if (n < 0)
		return;
	m = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	if (m < 0)
		return;
	n += m;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	if (errnum != 0) {
		m = snprintf(line + n, sizeof(line) - n, ": %s",
		    strerror(errnum));
		if (m > 0)
			n += m;
		if ((size_t)n > sizeof(line) - 2)
			n = sizeof(line) - 2;
	}
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, n);
}

#define LOG_BODY(level, errnum)                                                \
	do {                                                                   \
		va_list ap;                                                    \
		va_start(ap, fmt);                                             \
		log_vline(level, errnum, fmt, ap);                             \
		va_end(ap);                                                    \
	} while (0)

void
log_debug(const char *fmt, ...)
{
	LOG_BODY(LOG_LEVEL_DEBUG, 0);
}

void
log_info(const char *fmt, ...)
{
	LOG_BODY(LOG_LEVEL_INFO, 0);
}

void
log_warn(const char *fmt, ...)
{
	int saved = errno;

	LOG_BODY(LOG_LEVEL_WARN, saved);
}

void
log_warnx(const char *fmt, ...)
{
	LOG_BODY(LOG_LEVEL_WARN, 0);
}

void
log_error(const char *fmt, ...)
{
	LOG_BODY(LOG_LEVEL_ERROR, 0);
}

void
fatal(const char *fmt, ...)
{
	int saved = errno;

	LOG_BODY(LOG_LEVEL_ERROR, saved);
	exit(1);
}

void
fatalx(const char *fmt, ...)
{
	LOG_BODY(LOG_LEVEL_ERROR, 0);
	exit(1);
}
