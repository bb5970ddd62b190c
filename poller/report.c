/*
 * report.c: the poller's one path to the broker: PollerMsg envelopes over
 * nng PUSH to RUN/reports.ipc. Discovery, health and load reports and KV
 * events all leave through report_send; the data-parallel ranks of one
 * engine are told the findings of its leading rank (poller_ranks).
 */
#include "poller/poller.h"

#include <stdlib.h>
#include <string.h>

#include "shared/ipc.h"
#include "shared/log.h"

static bool poller_live(const struct pworker *);
static bool poller_same_engine(const struct pworker *, const struct pworker *);

int
report_send(struct poller *p, Smg__PollerMsg *m)
{
	uint8_t *buf;
	size_t len;
	int rv;

	m->version = IPC_VERSION;
	if ((buf = ipc_pack_poller(m, &len)) == NULL) {
		log_warnx("%s: cannot pack a report", __func__);
		return -1;
	}
	rv = ipc_client_send(p->p_reports, buf, len, 0, NULL, NULL);
	free(buf);
	if (rv == -1) {
		log_warnx("%s: broker not reachable, report dropped", __func__);
		return -1;
	}
	return 0;
}

static bool
poller_live(const struct pworker *pw)
{
	return pw->pw_in_use &&
	    (pw->pw_status == SHM_WORKER_READY ||
	        pw->pw_status == SHM_WORKER_NOT_READY);
}

static bool
poller_same_engine(const struct pworker *a, const struct pworker *b)
{
	return a->pw_rank >= 0 && b->pw_rank >= 0 &&
	    strcmp(a->pw_base, b->pw_base) == 0;
}

bool
poller_leads(const struct pworker *pw)
{
	const struct poller *p = pw->pw_poller;
	unsigned i;

	if (pw->pw_rank < 0)
		return true;
	for (i = 0; i < pw->pw_slot; i++) {
		if (poller_live(&p->p_workers[i]) &&
		    poller_same_engine(&p->p_workers[i], pw))
			return false;
	}
	return true;
}

unsigned
poller_ranks(struct pworker *pw, struct pworker **out)
{
	struct poller *p = pw->pw_poller;
	unsigned i, n = 0;

	if (pw->pw_rank < 0) {
		out[n++] = pw;
		return n;
	}
	for (i = 0; i < SHM_MAX_WORKERS; i++) {
		struct pworker *o = &p->p_workers[i];

		if (o == pw || (poller_live(o) && poller_same_engine(o, pw)))
			out[n++] = o;
	}
	return n;
}
