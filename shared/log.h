/*
 * log.h: the one logging API of every smg-c process.
 *
 * Each line carries the time, the level, the process role and its pid:
 *   2026-12-02T09:40:14.123Z info smg-broker[4242]: main: serving ...
 * With log_set_json, each line is one JSON object instead, with the stable
 * keys ts, level, role, pid, msg (and, for access lines, the fields of
 * struct log_access):
 *   {"ts":"2026-12-02T09:40:14.123Z","level":"info","role":"smg-broker",
 *    "pid":4242,"msg":"main: serving ..."}
 * Lines go to stderr (supervisors collect it), which log_open_file can
 * point at a file. Messages start with __func__ by convention. log_warn appends
 * strerror(errno); the x variants do not. fatal/fatalx log and exit(1): only
 * for startup failures and broken invariants, never because of peer or client
 * input.
 */
#ifndef SHARED_LOG_H
#define SHARED_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

enum log_level {
	LOG_LEVEL_DEBUG = 0,
	LOG_LEVEL_INFO,
	LOG_LEVEL_WARN,
	LOG_LEVEL_ERROR,
};

/* Sets the role shown on every line and the lowest level printed. */
void log_init(const char *role, enum log_level level);
/* Changes the role after fork (the pid is read on every line). */
void log_procinit(const char *role);
void log_setlevel(enum log_level level);
enum log_level log_getlevel(void);
/* Parses "debug", "info", "warn" ("warning"), "error"; -1 if unknown. */
int log_level_parse(const char *name, enum log_level *out);

/* One JSON object per line from now on (true) or the text form. */
void log_set_json(bool on);

/*
 * Sends every later line (and anything else written to stderr) to
 * dir/<role>.log, opened for appending, created mode 0640. Returns 0, or
 * -1 with errno set and stderr unchanged.
 */
int log_open_file(const char *dir);
/*
 * Opens the file of log_open_file again (after logrotate moved it away);
 * does nothing without one. Returns 0 or -1 (errno set; the old file
 * stays in use).
 */
int log_reopen(void);

/* One request as the access line shows it; NULL strings print as "-". */
struct log_access {
	const char *la_method;
	const char *la_path;
	int la_status;
	const char *la_worker;
	double la_latency_ms;
	uint64_t la_bytes; /* response bytes written to the client */
	const char *la_request_id;
};
/*
 * The access line, at info level:
 *   access: GET /v1/chat/completions 200 worker=http://w1:8000
 *   latency_ms=12.3 bytes=456 request_id=chatcmpl-...
 * or, as JSON, msg "access" and the keys method, path, status, worker,
 * latency_ms, bytes, request_id.
 */
void log_access(const struct log_access *a);

void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fatal(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
void fatalx(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

#endif /* SHARED_LOG_H */
