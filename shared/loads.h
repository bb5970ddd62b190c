/*
 * loads.h: a worker's /v1/loads answer (workers.md §2.2, gateway.md §9.2),
 * read the same way by the poller's load polling and the frontend's
 * /get_loads fan-out. The Prometheus fallback is shared/promload.h.
 */
#ifndef SHARED_LOADS_H
#define SHARED_LOADS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "ipc.pb-c.h"

enum loads_answer {
	LOADS_REPORT = 0, /* a load response with >= 1 rank */
	LOADS_EMPTY, /* a load response without ranks: nothing this time */
	LOADS_ABSENT, /* the route is absent: /metrics from now on */
	LOADS_FAILED, /* anything else: /metrics this time only */
};

/*
 * Classifies one answer. status: the response status, 0 when none came;
 * whole: the body is complete (not cut at the caller's cap). A load
 * response is a JSON object with a "loads" array; its ranks are the
 * array's objects. Absent: 404, 405, 501, or a whole 2xx body that is no
 * load response. With LOADS_REPORT and doc non-NULL, *doc is the parsed
 * document (the caller frees it with cJSON_Delete); otherwise *doc is
 * NULL. Safe on any input.
 */
enum loads_answer loads_classify(int status, bool whole, const char *body,
    size_t len, cJSON **doc);
/*
 * Fills ranks[0..return) from a load document (at most max; every field
 * optional, missing or mistyped ones 0, dp_rank defaults to the position
 * in the array). Non-object entries are skipped.
 */
size_t loads_ranks(const cJSON *doc, Smg__RankLoad *ranks, size_t max);
/*
 * gateway.md §9.4: the load of a worker, the sum of num_used_tokens over
 * the ranks of doc when some rank has max_total_num_tokens > 0, else -1.
 */
double loads_used_tokens(const cJSON *doc);

#endif /* SHARED_LOADS_H */
