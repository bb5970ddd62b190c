/* log.c: timestamped, role- and pid-tagged log lines on stderr. */
#include "shared/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const char *log_role = "smg";
static enum log_level log_min = LOG_LEVEL_INFO;
static bool log_json;
static char log_path[PATH_MAX]; /* "" = stderr as inherited */

static const char *const log_level_names[] = {
	[LOG_LEVEL_DEBUG] = "debug",
	[LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_WARN] = "warn",
	[LOG_LEVEL_ERROR] = "error",
};

static void log_vline(enum log_level, int, const char *, va_list)
    __attribute__((format(printf, 3, 0)));
static void log_emit(enum log_level, const char *, const char *);
static size_t log_escape(char *, size_t, const char *);

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

void
log_set_json(bool on)
{
	log_json = on;
}

int
log_open_file(const char *dir)
{
	int n;

	n = snprintf(log_path, sizeof(log_path), "%s/%s.log", dir, log_role);
	if (n < 0 || (size_t)n >= sizeof(log_path)) {
		log_path[0] = '\0';
		errno = ENAMETOOLONG;
		return -1;
	}
	if (log_reopen() == -1) {
		log_path[0] = '\0';
		return -1;
	}
	return 0;
}

int
log_reopen(void)
{
	int fd;

	if (log_path[0] == '\0')
		return 0;
	fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	if (fd == -1)
		return -1;
	/* dup2 swaps the file under fd 2 at once: no line is lost or torn,
	 * and the launcher's children inherit the new file. */
	if (dup2(fd, STDERR_FILENO) == -1) {
		close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/*
 * Copies src into dst as the inside of a JSON string: quote, backslash and
 * every byte below 0x20 or above 0x7e escaped (bytes above as \u00XX, so
 * the line is valid JSON whatever the input). Returns the length written;
 * stops short rather than cut an escape.
 */
static size_t
log_escape(char *dst, size_t cap, const char *src)
{
	const unsigned char *p = (const unsigned char *)src;
	size_t n = 0;

	for (; *p != '\0'; p++) {
		if (*p == '"' || *p == '\\') {
			if (n + 2 >= cap)
				break;
			dst[n++] = '\\';
			dst[n++] = (char)*p;
		} else if (*p < 0x20 || *p > 0x7e) {
			if (n + 6 >= cap)
				break;
			snprintf(dst + n, 7, "\\u%04x", *p);
			n += 6;
		} else {
			if (n + 1 >= cap)
				break;
			dst[n++] = (char)*p;
		}
	}
	if (cap > 0)
		dst[n] = '\0';
	return n;
}

/*
 * Writes one line: the text form, or a JSON object whose msg is msg and
 * to which extra (already-escaped ,"key":value pairs, or NULL) is added.
 * One write(2) per line so lines of concurrent processes sharing stderr
 * do not interleave.
 */
static void
log_emit(enum log_level level, const char *msg, const char *extra)
{
	char line[8192], stamp[32];
	struct timeval tv;
	struct tm tm;
	size_t n;
	int m;

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
	if (!log_json) {
		m = snprintf(line, sizeof(line), "%s.%03ldZ %s %s[%ld]: %s",
		    stamp, (long)(tv.tv_usec / 1000), log_level_names[level],
		    log_role, (long)getpid(), msg);
		if (m < 0)
			return;
		n = (size_t)m < sizeof(line) - 1 ? (size_t)m : sizeof(line) - 2;
	} else {
		m = snprintf(line, sizeof(line),
		    "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"role\":\"%s\","
		    "\"pid\":%ld,\"msg\":\"",
		    stamp, (long)(tv.tv_usec / 1000), log_level_names[level],
		    log_role, (long)getpid());
		if (m < 0 || (size_t)m >= sizeof(line))
			return;
		n = (size_t)m;
		n += log_escape(line + n, sizeof(line) - n - 3, msg);
		line[n++] = '"';
		if (extra != NULL) {
			m = snprintf(line + n, sizeof(line) - n - 2, "%s",
			    extra);
			/* A cut extra would break the object: drop it. */
			if (m < 0 || (size_t)m >= sizeof(line) - n - 2)
				m = 0;
			n += (size_t)m;
		}
		line[n++] = '}';
	}
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, n);
}

static void
log_vline(enum log_level level, int errnum, const char *fmt, va_list ap)
{
	char msg[4096];
	int n, m;

	if (level < log_min)
		return;
	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(msg))
		n = (int)sizeof(msg) - 1;
	if (errnum != 0) {
		m = snprintf(msg + n, sizeof(msg) - (size_t)n, ": %s",
		    strerror(errnum));
		(void)m;
	}
	log_emit(level, msg, NULL);
}

/* Text-form value: control bytes become '?' so a value cannot forge a
 * line; NULL or empty prints "-". */
static const char *
log_text_value(char *buf, size_t cap, const char *v)
{
	size_t i;

	if (v == NULL || *v == '\0')
		return "-";
	snprintf(buf, cap, "%s", v);
	for (i = 0; buf[i] != '\0'; i++)
		if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f ||
		    buf[i] == ' ')
			buf[i] = '?';
	return buf;
}

void
log_access(const struct log_access *a)
{
	char msg[4608], extra[4 * 1024 + 256], e[4][1024];
	const char *v[4] = { a->la_method, a->la_path, a->la_worker,
		a->la_request_id };
	size_t i;

	if (LOG_LEVEL_INFO < log_min)
		return;
	if (!log_json) {
		for (i = 0; i < 4; i++)
			v[i] = log_text_value(e[i], sizeof(e[i]), v[i]);
		snprintf(msg, sizeof(msg),
		    "access: %s %s %d worker=%s latency_ms=%.1f bytes=%" PRIu64
		    " request_id=%s",
		    v[0], v[1], a->la_status, v[2], a->la_latency_ms,
		    a->la_bytes, v[3]);
		log_emit(LOG_LEVEL_INFO, msg, NULL);
		return;
	}
	for (i = 0; i < 4; i++)
		log_escape(e[i], sizeof(e[i]), v[i] != NULL ? v[i] : "");
	snprintf(extra, sizeof(extra),
	    ",\"method\":\"%s\",\"path\":\"%s\",\"status\":%d,"
	    "\"worker\":\"%s\",\"latency_ms\":%.3f,\"bytes\":%" PRIu64
	    ",\"request_id\":\"%s\"",
	    e[0], e[1], a->la_status, e[2], a->la_latency_ms, a->la_bytes,
	    e[3]);
	log_emit(LOG_LEVEL_INFO, "access", extra);
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
