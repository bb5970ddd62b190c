/*
 * fallback.c: the local routing decision used while the broker cannot be
 * reached (DESIGN.md "broker down"): least in-flight among the available
 * workers of the model, read from the shared-memory worker table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"

static bool fallback_model_any(const char *);
static void fallback_error(struct decision *, int, const char *, const char *);

static bool
fallback_model_any(const char *model)
{
	return model == NULL || model[0] == '\0' ||
	    strcmp(model, "unknown") == 0;
}

static void
fallback_error(struct decision *d, int status, const char *code,
    const char *msg)
{
	d->dc_ok = false;
	d->dc_status = status;
	snprintf(d->dc_code, sizeof(d->dc_code), "%s", code);
	snprintf(d->dc_message, sizeof(d->dc_message), "%s", msg);
}

const char *
fallback_canonical(const struct config *cf, const char *model)
{
	size_t i;

	if (cf == NULL || model == NULL)
		return model;
	for (i = 0; i < cf->cf_model_alias_n; i++)
		if (strcmp(cf->cf_model_alias[i].ca_alias, model) == 0)
			return cf->cf_model_alias[i].ca_canonical;
	return model;
}

void
fallback_select(struct shm *shm, const struct config *cf, const char *model,
    uint32_t worker_type, const uint32_t *exclude, size_t nexclude,
    struct decision *d)
{
	static unsigned cand[SHM_MAX_WORKERS];
	struct shm_worker w;
	unsigned slot, ncand = 0, npool = 0, nties = 0, best = 0, i;
	uint32_t load, best_load = UINT32_MAX;
	bool any = fallback_model_any(model), excluded, have_other = false;
	char msg[FE_MSG_MAX];

	memset(d, 0, sizeof(*d));
	d->dc_fallback = true;
	if (!any)
		model = fallback_canonical(cf, model);
	for (slot = 0; slot < SHM_MAX_WORKERS; slot++) {
		if (shm_worker_read(shm, slot, &w) == -1)
			continue;
		if (w.sw_type != worker_type || w.sw_mode != 0)
			continue;
		if (!any && strcmp(w.sw_model, model) != 0)
			continue;
		npool++;
		if (w.sw_status != SHM_WORKER_READY ||
		    w.sw_breaker == SHM_BREAKER_OPEN || w.sw_overloaded)
			continue;
		cand[ncand++] = slot;
	}
	if (npool == 0) {
		snprintf(msg, sizeof(msg), "No worker available for model '%s'",
		    any ? "unknown" : model);
		fallback_error(d, 404, "model_not_found", msg);
		return;
	}
	if (ncand == 0) {
		fallback_error(d, 503, "no_available_workers",
		    "All workers are unavailable (circuit breaker open or "
		    "unhealthy)");
		return;
	}
	for (i = 0; i < ncand && !have_other; i++) {
		size_t k;

		excluded = false;
		for (k = 0; k < nexclude; k++)
			if (exclude[k] == cand[i])
				excluded = true;
		have_other = !excluded;
	}
	for (i = 0; i < ncand; i++) {
		size_t k;

		excluded = false;
		for (k = 0; k < nexclude && have_other; k++)
			if (exclude[k] == cand[i])
				excluded = true;
		if (excluded)
			continue;
		load = shm_inflight_total(shm, cand[i]);
		if (load < best_load) {
			best_load = load;
			best = cand[i];
			nties = 1;
		} else if (load == best_load) {
			/* Reservoir sampling: the k-th tie wins with 1/k. */
			nties++;
			if ((unsigned)random() % nties == 0)
				best = cand[i];
		}
	}
	if (shm_worker_read(shm, best, &w) == -1) {
		fallback_error(d, 503, "no_available_workers",
		    "All workers are unavailable (circuit breaker open or "
		    "unhealthy)");
		return;
	}
	d->dc_ok = true;
	d->dc_slot = best;
	d->dc_generation = w.sw_generation;
	d->dc_worker_type = w.sw_type;
	snprintf(d->dc_url, sizeof(d->dc_url), "%s", w.sw_url);
	snprintf(d->dc_model, sizeof(d->dc_model), "%s", w.sw_model);
	snprintf(d->dc_api_key, sizeof(d->dc_api_key), "%s", w.sw_api_key);
	snprintf(d->dc_policy, sizeof(d->dc_policy), "%s", "fallback");
}

int
fallback_fill_worker(struct shm *shm, unsigned slot, uint32_t generation,
    struct decision *d)
{
	struct shm_worker w;

	if (shm_worker_read(shm, slot, &w) == -1 ||
	    w.sw_generation != generation)
		return -1;
	d->dc_worker_type = w.sw_type;
	snprintf(d->dc_api_key, sizeof(d->dc_api_key), "%s", w.sw_api_key);
	if (d->dc_url[0] == '\0')
		snprintf(d->dc_url, sizeof(d->dc_url), "%s", w.sw_url);
	return 0;
}

int
fallback_first_ready(struct shm *shm, struct shm_worker *out, unsigned *slot)
{
	struct shm_worker w;
	unsigned s;
	bool found = false;

	for (s = 0; s < SHM_MAX_WORKERS; s++) {
		if (shm_worker_read(shm, s, &w) == -1)
			continue;
		if (w.sw_status != SHM_WORKER_READY || w.sw_mode != 0 ||
		    w.sw_type != 0)
			continue;
		if (!found || w.sw_order < out->sw_order) {
			*out = w;
			*slot = s;
			found = true;
		}
	}
	return found ? 0 : -1;
}
