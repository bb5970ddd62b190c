/*
 * reqctx.c: the per-request context (principal, tenant, trace) the router
 * sets and the modules a request reaches read back, found from the
 * request's struct http_request in a small hash of the requests in
 * progress.
 */
#include <sys/queue.h>

#include <stdint.h>

#include "frontend/frontend.h"

#define REQCTX_BUCKETS 1024 /* a power of two */

LIST_HEAD(reqctx_list, reqctx);

static void reqctx_end(void *);
static unsigned reqctx_bucket(const struct http_request *);

static struct reqctx_list reqctx_table[REQCTX_BUCKETS];

static unsigned
reqctx_bucket(const struct http_request *hr)
{
	uintptr_t p = (uintptr_t)hr;

	return (unsigned)((p >> 4) ^ (p >> 14)) & (REQCTX_BUCKETS - 1);
}

static void
reqctx_end(void *arg)
{
	struct reqctx *rx = arg;

	LIST_REMOVE(rx, rc_link);
}

struct reqctx *
reqctx_get(struct conn *c, const struct http_request *hr)
{
	struct reqctx *rx;

	if ((rx = (struct reqctx *)reqctx_find(hr)) != NULL)
		return rx;
	if ((rx = conn_alloc(c, sizeof(*rx))) == NULL)
		return NULL;
	if (conn_on_end(c, reqctx_end, rx) == -1)
		return NULL;
	rx->rc_hr = hr;
	rx->rc_conn = c;
	LIST_INSERT_HEAD(&reqctx_table[reqctx_bucket(hr)], rx, rc_link);
	return rx;
}

const struct reqctx *
reqctx_find(const struct http_request *hr)
{
	struct reqctx *rx;

	if (hr == NULL)
		return NULL;
	LIST_FOREACH(rx, &reqctx_table[reqctx_bucket(hr)], rc_link)
	{
		if (rx->rc_hr == hr)
			return rx;
	}
	return NULL;
}
