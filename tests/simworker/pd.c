/*
 * pd.c: the simulated engine's PD/EPD roles (workers.md §2.3, §7). A
 * prefill or encode worker publishes each finished request's bootstrap
 * room under its own identity (host, bootstrap port, room) as a file in a
 * directory the workers of a test share; a decode worker (and a prefill
 * worker given an encode partner) waits for the room named by the request
 * before it runs, as a KV transfer would, and fails the request when the
 * room does not appear within the bootstrap timeout. The stats show the
 * last bootstrap fields and DP-rank fields (routed_dp_rank,
 * disagg_prefill_dp_rank) a request carried.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "shared/log.h"
#include "shared/xmalloc.h"
#include "tests/simworker/simworker.h"

#define PDSIM_POLL_SECS 0.002
#define PDSIM_ROOMS     32

struct pdsim {
	struct ev_loop *ps_loop;
	enum sim_role ps_role;
	char *ps_host; /* our identity as a bootstrap peer */
	long ps_port; /* -1 none */
	char *ps_dir; /* rendezvous directory, NULL: no rendezvous */
	double ps_timeout;
	uint64_t ps_published;
	uint64_t ps_received;
	uint64_t ps_timeouts;
	uint64_t ps_aborted;
	uint64_t ps_waiting;
	char ps_rooms[PDSIM_ROOMS][24]; /* the last rooms seen, as text */
	unsigned ps_nrooms;
	unsigned ps_nextroom;
	char ps_last_host[128];
	char ps_last_port[16];
	long ps_last_dp_rank; /* -1: absent */
	long ps_last_prefill_dp_rank;
};

static void pdsim_poll_cb(struct ev_loop *, ev_timer *, int);
static int pdsim_path(const struct pdsim *, const char *, char *, size_t);
static int pdsim_room_text(const char *, size_t, const char *, char *, size_t);
static int pdsim_key(const cJSON *, const char *, const char *, char *, size_t);

const char *
pdsim_role_name(enum sim_role r)
{
	switch (r) {
	case SIM_ROLE_REGULAR:
		return "regular";
	case SIM_ROLE_PREFILL:
		return "prefill";
	case SIM_ROLE_DECODE:
		return "decode";
	case SIM_ROLE_ENCODE:
		return "encode";
	}
	return "unknown";
}

int
pdsim_role_parse(const char *s, enum sim_role *out)
{
	enum sim_role r;

	for (r = SIM_ROLE_REGULAR; r <= SIM_ROLE_ENCODE; r++) {
		if (strcmp(s, pdsim_role_name(r)) == 0) {
			*out = r;
			return 0;
		}
	}
	return -1;
}

struct pdsim *
pdsim_new(struct ev_loop *loop, enum sim_role role, const char *host,
    long bootstrap_port, const char *dir, double timeout)
{
	struct pdsim *ps = xcalloc(1, sizeof(*ps));

	ps->ps_loop = loop;
	ps->ps_role = role;
	ps->ps_host = xstrdup(host);
	ps->ps_port = bootstrap_port;
	ps->ps_last_dp_rank = -1;
	ps->ps_last_prefill_dp_rank = -1;
	ps->ps_dir = dir != NULL ? xstrdup(dir) : NULL;
	ps->ps_timeout = timeout;
	return ps;
}

void
pdsim_free(struct pdsim *ps)
{
	if (ps == NULL)
		return;
	free(ps->ps_host);
	free(ps->ps_dir);
	free(ps);
}

enum sim_role
pdsim_role(const struct pdsim *ps)
{
	return ps->ps_role;
}

static int
pdsim_path(const struct pdsim *ps, const char *key, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/%s", ps->ps_dir, key);

	return n > 0 && (size_t)n < len ? 0 : -1;
}

/*
 * The digits of "<name>": <integer> in the raw body (exact, unlike a
 * double); -1 when absent or not a plain integer.
 */
static int
pdsim_room_text(const char *body, size_t len, const char *name, char *out,
    size_t outlen)
{
	char pat[64];
	const char *p, *end = body + len;
	size_t n = 0;

	snprintf(pat, sizeof(pat), "\"%s\":", name);
	if ((p = strstr(body, pat)) == NULL)
		return -1;
	p += strlen(pat);
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	while (p + n < end && p[n] >= '0' && p[n] <= '9')
		n++;
	if (n == 0 || n >= outlen)
		return -1;
	memcpy(out, p, n);
	out[n] = '\0';
	return 0;
}

/* "<host>_<port|none>_<room>" from <prefix>bootstrap_host/_port. */
static int
pdsim_key(const cJSON *body, const char *prefix, const char *room, char *out,
    size_t len)
{
	char name[64];
	const cJSON *h, *p;
	const char *c;
	char port[24];
	int n;

	snprintf(name, sizeof(name), "%sbootstrap_host", prefix);
	h = cJSON_GetObjectItemCaseSensitive(body, name);
	snprintf(name, sizeof(name), "%sbootstrap_port", prefix);
	p = cJSON_GetObjectItemCaseSensitive(body, name);
	if (!cJSON_IsString(h) || h->valuestring[0] == '\0')
		return -1;
	for (c = h->valuestring; *c != '\0'; c++)
		if (*c == '/' || *c == '\\')
			return -1;
	if (cJSON_IsNumber(p) && p->valuedouble >= 0 && p->valuedouble <= 65535)
		snprintf(port, sizeof(port), "%d", (int)p->valuedouble);
	else
		snprintf(port, sizeof(port), "none");
	n = snprintf(out, len, "%s_%s_%s", h->valuestring, port, room);
	return n > 0 && (size_t)n < len ? 0 : -1;
}

int
pdsim_parse(struct pdsim *ps, const char *raw, size_t rawlen, const cJSON *body,
    struct pdsim_req *q)
{
	char room[24];
	int n;

	memset(q, 0, sizeof(*q));
	q->pq_sim = ps;
	if (ps->ps_role == SIM_ROLE_REGULAR)
		return 0;
	if (pdsim_room_text(raw, rawlen, "bootstrap_room", room,
	        sizeof(room)) == -1)
		return ps->ps_role == SIM_ROLE_DECODE ? -1 : 0;
	q->pq_has = 1;
	{
		const cJSON *r = cJSON_GetObjectItemCaseSensitive(body,
		                "routed_dp_rank"),
		            *pr = cJSON_GetObjectItemCaseSensitive(body,
		                "disagg_prefill_dp_rank");

		ps->ps_last_dp_rank =
		    cJSON_IsNumber(r) ? (long)r->valuedouble : -1;
		ps->ps_last_prefill_dp_rank =
		    cJSON_IsNumber(pr) ? (long)pr->valuedouble : -1;
	}
	snprintf(ps->ps_rooms[ps->ps_nextroom], sizeof(ps->ps_rooms[0]), "%s",
	    room);
	ps->ps_nextroom = (ps->ps_nextroom + 1) % PDSIM_ROOMS;
	if (ps->ps_nrooms < PDSIM_ROOMS)
		ps->ps_nrooms++;
	{
		const cJSON *h = cJSON_GetObjectItemCaseSensitive(body,
		                "bootstrap_host"),
		            *p = cJSON_GetObjectItemCaseSensitive(body,
		                "bootstrap_port");

		snprintf(ps->ps_last_host, sizeof(ps->ps_last_host), "%s",
		    cJSON_IsString(h) ? h->valuestring : "");
		if (cJSON_IsNumber(p))
			snprintf(ps->ps_last_port, sizeof(ps->ps_last_port),
			    "%d", (int)p->valuedouble);
		else
			snprintf(ps->ps_last_port, sizeof(ps->ps_last_port),
			    "null");
	}
	if (ps->ps_dir == NULL)
		return 0;
	switch (ps->ps_role) {
	case SIM_ROLE_DECODE:
		if (pdsim_key(body, "", room, q->pq_wait, sizeof(q->pq_wait)) ==
		    -1)
			return -1;
		break;
	case SIM_ROLE_PREFILL:
		/* EPD: the encoder's output comes first. */
		if (cJSON_GetObjectItemCaseSensitive(body,
		        "encode_bootstrap_host") != NULL &&
		    pdsim_key(body, "encode_", room, q->pq_wait,
		        sizeof(q->pq_wait)) == -1)
			return -1;
		/* FALLTHROUGH */
	case SIM_ROLE_ENCODE:
		if (ps->ps_port >= 0)
			n = snprintf(q->pq_pub, sizeof(q->pq_pub), "%s_%ld_%s",
			    ps->ps_host, ps->ps_port, room);
		else
			n = snprintf(q->pq_pub, sizeof(q->pq_pub), "%s_none_%s",
			    ps->ps_host, room);
		if (n < 0 || (size_t)n >= sizeof(q->pq_pub))
			return -1;
		break;
	default:
		break;
	}
	return 0;
}

int
pdsim_wait(struct pdsim_req *q, pdsim_cb cb, void *arg)
{
	struct pdsim *ps = q->pq_sim;

	if (q->pq_wait[0] == '\0')
		return 0;
	q->pq_cb = cb;
	q->pq_arg = arg;
	q->pq_deadline = ev_now(ps->ps_loop) + ps->ps_timeout;
	q->pq_waiting = 1;
	ps->ps_waiting++;
	ev_timer_init(&q->pq_poll, pdsim_poll_cb, 0., PDSIM_POLL_SECS);
	q->pq_poll.data = q;
	ev_timer_start(ps->ps_loop, &q->pq_poll);
	return 1;
}

static void
pdsim_poll_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
	struct pdsim_req *q = w->data;
	struct pdsim *ps = q->pq_sim;
	char path[1024];
	int ok;

	(void)revents;
	if (pdsim_path(ps, q->pq_wait, path, sizeof(path)) == -1)
		ok = 0;
	else if (unlink(path) == 0)
		ok = 1;
	else if (errno == ENOENT && ev_now(loop) < q->pq_deadline)
		return;
	else
		ok = 0;
	ev_timer_stop(loop, w);
	q->pq_waiting = 0;
	ps->ps_waiting--;
	if (ok)
		ps->ps_received++;
	else {
		ps->ps_timeouts++;
		log_info("%s: no transfer for room %s within %gs", __func__,
		    q->pq_wait, ps->ps_timeout);
	}
	q->pq_cb(q->pq_arg, ok);
}

void
pdsim_cancel(struct pdsim_req *q)
{
	struct pdsim *ps = q->pq_sim;

	if (ps == NULL || !q->pq_waiting)
		return;
	ev_timer_stop(ps->ps_loop, &q->pq_poll);
	q->pq_waiting = 0;
	ps->ps_waiting--;
	ps->ps_aborted++;
	log_info("%s: request waiting for room %s aborted", __func__,
	    q->pq_wait);
}

void
pdsim_publish(struct pdsim_req *q)
{
	struct pdsim *ps = q->pq_sim;
	char path[1024];
	FILE *f;

	if (ps == NULL || ps->ps_dir == NULL || q->pq_pub[0] == '\0')
		return;
	if (pdsim_path(ps, q->pq_pub, path, sizeof(path)) == -1 ||
	    (f = fopen(path, "w")) == NULL) {
		log_warn("%s: %s", __func__, q->pq_pub);
		return;
	}
	if (fclose(f) == EOF)
		log_warn("%s: %s", __func__, path);
	ps->ps_published++;
}

void
pdsim_stats_json(const struct pdsim *ps, cJSON *obj)
{
	cJSON *b, *rooms;
	unsigned i, k;

	cJSON_AddStringToObject(obj, "role", pdsim_role_name(ps->ps_role));
	b = cJSON_AddObjectToObject(obj, "bootstrap");
	cJSON_AddNumberToObject(b, "published", (double)ps->ps_published);
	cJSON_AddNumberToObject(b, "received", (double)ps->ps_received);
	cJSON_AddNumberToObject(b, "timeouts", (double)ps->ps_timeouts);
	cJSON_AddNumberToObject(b, "aborted", (double)ps->ps_aborted);
	cJSON_AddNumberToObject(b, "waiting", (double)ps->ps_waiting);
	cJSON_AddStringToObject(b, "last_host", ps->ps_last_host);
	cJSON_AddStringToObject(b, "last_port", ps->ps_last_port);
	if (ps->ps_last_dp_rank >= 0)
		cJSON_AddNumberToObject(b, "last_dp_rank",
		    (double)ps->ps_last_dp_rank);
	else
		cJSON_AddNullToObject(b, "last_dp_rank");
	if (ps->ps_last_prefill_dp_rank >= 0)
		cJSON_AddNumberToObject(b, "last_prefill_dp_rank",
		    (double)ps->ps_last_prefill_dp_rank);
	else
		cJSON_AddNullToObject(b, "last_prefill_dp_rank");
	/* Oldest first; strings, since rooms exceed a double's precision. */
	rooms = cJSON_AddArrayToObject(b, "rooms");
	for (i = 0; i < ps->ps_nrooms; i++) {
		k = (ps->ps_nextroom + PDSIM_ROOMS - ps->ps_nrooms + i) %
		    PDSIM_ROOMS;
		cJSON_AddItemToArray(rooms,
		    cJSON_CreateString(ps->ps_rooms[k]));
	}
}
