/*
 * report.c: the poller's one path to the broker: PollerMsg envelopes over
 * nng PUSH to RUN/reports.ipc. Discovery, health and (later) load reports
 * all leave through report_send.
 */
#include "poller/poller.h"

#include <stdlib.h>

#include "shared/ipc.h"
#include "shared/log.h"

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
