/*
 * nngreq.c: asks a running broker for decisions with a plain libnng REQ
 * socket, the way any SP peer can: the system tests use it to hold the
 * broker's wire to nng's.
 *
 * usage: smg-nngreq URL MODEL [TEXT...]
 * Sends one RouteBatch with a chat RouteRequest per TEXT (one with no text
 * when none is given) and prints the decisions, one JSON object per line:
 *   {"status":"ok","worker_url":"http://...","model":"m","policy":"p"}
 *   {"status":"error","http_status":404,"code":"model_not_found"}
 * Exits 0 when a DecisionBatch answered every request, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "shared/ipc.h"
#include "shared/log.h"

#define NNGREQ_TIMEOUT_MS 5000

int
main(int argc, char **argv)
{
	Smg__FrontendMsg m = SMG__FRONTEND_MSG__INIT;
	Smg__RouteBatch rb = SMG__ROUTE_BATCH__INIT;
	Smg__RouteRequest *rr, **rrp;
	Smg__BrokerReply *r;
	const char *why;
	uint8_t *buf;
	char *out = NULL;
	size_t len, olen, n, i;
	nng_socket s;
	int rv, rc = 1;

	if (argc < 3) {
		fprintf(stderr, "usage: smg-nngreq URL MODEL [TEXT...]\n");
		return 2;
	}
	log_init("smg-nngreq", LOG_LEVEL_WARN);
	n = argc > 3 ? (size_t)argc - 3 : 1;
	if ((rr = calloc(n, sizeof(*rr))) == NULL ||
	    (rrp = calloc(n, sizeof(*rrp))) == NULL)
		fatal("calloc");
	for (i = 0; i < n; i++) {
		smg__route_request__init(&rr[i]);
		rr[i].id = i;
		rr[i].endpoint = SMG__ENDPOINT__ENDPOINT_CHAT;
		rr[i].model = argv[2];
		if (argc > 3) {
			rr[i].text = argv[3 + i];
			rr[i].has_text = true;
			rr[i].size = strlen(argv[3 + i]);
		}
		rrp[i] = &rr[i];
	}
	rb.n_requests = n;
	rb.requests = rrp;
	m.body_case = SMG__FRONTEND_MSG__BODY_ROUTE_BATCH;
	m.route_batch = &rb;
	if ((buf = ipc_pack_frontend(&m, &len)) == NULL)
		fatalx("pack");

	if ((rv = nng_req0_open(&s)) != 0 ||
	    (rv = nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, NNGREQ_TIMEOUT_MS)) !=
	        0 ||
	    (rv = nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, NNGREQ_TIMEOUT_MS)) !=
	        0)
		fatalx("nng: %s", nng_strerror(rv));
	if ((rv = nng_dial(s, argv[1], NULL, 0)) != 0) {
		log_warnx("dial %s: %s", argv[1], nng_strerror(rv));
		goto done;
	}
	if ((rv = nng_send(s, buf, len, 0)) != 0 ||
	    (rv = nng_recv(s, &out, &olen, NNG_FLAG_ALLOC)) != 0) {
		log_warnx("request: %s", nng_strerror(rv));
		goto done;
	}
	if ((r = ipc_decode_broker((uint8_t *)out, olen, &why)) == NULL)
		goto done;
	if (r->body_case == SMG__BROKER_REPLY__BODY_DECISION_BATCH &&
	    r->decision_batch->n_decisions == n) {
		for (i = 0; i < n; i++) {
			const Smg__Decision *d =
			    r->decision_batch->decisions[i];

			if (d->status == SMG__DECISION_STATUS__DECISION_OK)
				printf(
				    "{\"status\":\"ok\",\"worker_url\":\"%s\","
				    "\"model\":\"%s\",\"policy\":\"%s\"}\n",
				    d->worker_url, d->model, d->policy);
			else
				printf("{\"status\":\"error\",\"http_status\":"
				       "%u,\"code\":\"%s\"}\n",
				    d->http_status, d->error_code);
		}
		rc = 0;
	} else
		log_warnx("unexpected reply (body %d)", (int)r->body_case);
	smg__broker_reply__free_unpacked(r, NULL);
done:
	if (out != NULL)
		nng_free(out, olen);
	nng_close(s);
	free(buf);
	free(rrp);
	free(rr);
	return rc;
}
