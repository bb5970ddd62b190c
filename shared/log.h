/*
 * log.h: the one logging API of every smg-c process.
 *
 * Each line carries the time, the level, the process role and its pid:
 *   2026-12-02T09:40:14.123Z info smg-broker[4242]: main: serving ...
 * Lines go to stderr (supervisors collect it). Messages start with __func__
 * by convention. log_warn appends strerror(errno); the x variants do not.
 * fatal/fatalx log and exit(1): only for startup failures and broken
 * invariants, never because of peer or client input.
 */
#ifndef SHARED_LOG_H
#define SHARED_LOG_H

#include <stdarg.h>

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
