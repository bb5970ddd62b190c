/*
 * xmalloc.h: allocation that cannot fail, for startup and the control path.
 * On failure they call fatal(). The request path uses plain malloc and fails
 * only the request instead.
 */
#ifndef SHARED_XMALLOC_H
#define SHARED_XMALLOC_H

#include <stddef.h>

void *xmalloc(size_t size);
void *xcalloc(size_t nmemb, size_t size);
void *xreallocarray(void *ptr, size_t nmemb, size_t size);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
/* asprintf that cannot fail; the caller frees the result. */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* SHARED_XMALLOC_H */
