/*
 * avail.c: the candidate list of policies.md §1.2. The pool is the
 * workers of the request's model (plus model-less workers, whose model is
 * still "unknown"), or every worker for a model-less request, of the
 * leg's worker type and the router's connection mode, in registration
 * order. The availability filter keeps Ready workers whose breaker is not
 * Open (examining it may move it to HalfOpen) and whose overload flag is
 * clear.
 */
#include <string.h>

#include "broker.h"

static unsigned avail_take(struct worker *const *src, unsigned n, int type,
    int mode, struct worker **out, unsigned k);

static unsigned
avail_take(struct worker *const *src, unsigned n, int type, int mode,
    struct worker **out, unsigned k)
{
	unsigned i;

	for (i = 0; i < n && k < SHM_MAX_WORKERS; i++) {
		if (src[i]->wk_type == type && src[i]->wk_mode == mode)
			out[k++] = src[i];
	}
	return k;
}

unsigned
avail_pool(struct broker *br, const char *model, int type, int mode,
    struct worker **out)
{
	struct model_entry *me = NULL, *any = NULL;
	unsigned i, a, b, k;

	if (model == NULL || *model == '\0' ||
	    strcmp(model, BROKER_MODEL_UNKNOWN) == 0)
		return avail_take(br->br_order, br->br_nworkers, type, mode,
		    out, 0);
	for (i = 0; i < br->br_nmodels; i++) {
		if (strcmp(br->br_models[i]->me_name, model) == 0)
			me = br->br_models[i];
		else if (strcmp(br->br_models[i]->me_name,
		             BROKER_MODEL_UNKNOWN) == 0)
			any = br->br_models[i];
	}
	if (me == NULL && any == NULL)
		return 0;
	if (me == NULL)
		return avail_take(any->me_workers, any->me_n, type, mode, out,
		    0);
	if (any == NULL)
		return avail_take(me->me_workers, me->me_n, type, mode, out, 0);
	/* Merge both ordered indexes by registration order. */
	a = b = k = 0;
	while (a < me->me_n || b < any->me_n) {
		struct worker *w;

		if (b >= any->me_n ||
		    (a < me->me_n &&
		        me->me_workers[a]->wk_order <
		            any->me_workers[b]->wk_order))
			w = me->me_workers[a++];
		else
			w = any->me_workers[b++];
		k = avail_take(&w, 1, type, mode, out, k);
	}
	return k;
}

bool
avail_worker(struct broker *br, struct worker *w)
{
	if (w->wk_status != SHM_WORKER_READY || w->wk_overloaded)
		return false;
	return breaker_routable(br, w);
}

unsigned
avail_filter(struct broker *br, struct worker **c, unsigned n,
    bool *overloaded_all)
{
	unsigned i, k = 0, over = 0;

	for (i = 0; i < n; i++) {
		if (c[i]->wk_overloaded)
			over++;
		if (avail_worker(br, c[i]))
			c[k++] = c[i];
	}
	*overloaded_all = n > 0 && over == n;
	return k;
}
