/*
 * tenant.c: per-tenant rates (--tenant-rate-limit-enabled,
 * --tenant-rate-limit-config).
 *
 * The file is SMG's tenant rate-limit document in its JSON form (YAML 1.2
 * reads JSON, so one file serves both gateways): a default_policy and
 * tenants[] with tenant_key ("auth:<id>", "header:<id>", "anonymous"),
 * requests_per_minute, tokens_per_minute and model_rules (rule_id, a
 * matcher {type: exact|prefix, value}, the rule's own requests_per_minute
 * and tokens_per_minute). Every scope is a GCRA bucket in shared memory
 * (shm_tenant_slot), so the limits hold across frontends: the tenant's
 * requests, refilled at requests_per_minute / 60 per second and holding
 * up to "burst" (smg-c's addition; default requests_per_minute, SMG's
 * bucket size), the tenant's tokens (a minute's worth banked), and the
 * matching rule's requests and tokens. At most one rule matches a
 * request (exact before prefix, the longest prefix first); rules add to
 * the tenant's limits, never replace them. Tokens are the prompt's as
 * the frontend estimates them for live load (docs/decisions.md).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "frontend/frontend.h"
#include "shared/log.h"
#include "shared/xmalloc.h"

struct tenant_rule {
	char *tr_id;
	bool tr_prefix; /* else exact */
	char *tr_value;
	double tr_rpm;
	double tr_tpm;
};

struct tenant_policy {
	char *tp_key; /* NULL: the default policy */
	double tp_rate; /* requests per second */
	double tp_burst;
	double tp_tpm; /* tokens per minute */
	/* Exact rules first, then prefix rules longest first: the first
	 * that matches is the request's. */
	struct tenant_rule *tp_rules;
	size_t tp_nrules;
};

static int tenant_policy_parse(const cJSON *, bool, struct tenant_policy *,
    char *, size_t);
static int tenant_rules_parse(const cJSON *, struct tenant_policy *, char *,
    size_t);
static int tenant_rule_cmp(const void *, const void *);
static const struct tenant_policy *tenant_policy_of(const char *);
static unsigned tenant_slot(const char *, const char *, uint64_t);
static uint64_t tenant_now_us(void);

static struct tenant_policy tenant_default;
static struct tenant_policy *tenant_policies;
static size_t tenant_policies_n;
static bool tenant_on;

static int
tenant_policy_parse(const cJSON *o, bool is_default, struct tenant_policy *tp,
    char *err, size_t errlen)
{
	const cJSON *key, *rpm, *tpm, *burst, *rules, *it;

	if (!cJSON_IsObject(o)) {
		snprintf(err, errlen, "a policy is not an object");
		return -1;
	}
	cJSON_ArrayForEach(it, o)
	{
		if (strcmp(it->string, "tenant_key") != 0 &&
		    strcmp(it->string, "requests_per_minute") != 0 &&
		    strcmp(it->string, "tokens_per_minute") != 0 &&
		    strcmp(it->string, "burst") != 0 &&
		    strcmp(it->string, "model_rules") != 0) {
			snprintf(err, errlen, "unknown field '%s'", it->string);
			return -1;
		}
	}
	key = cJSON_GetObjectItemCaseSensitive(o, "tenant_key");
	rpm = cJSON_GetObjectItemCaseSensitive(o, "requests_per_minute");
	tpm = cJSON_GetObjectItemCaseSensitive(o, "tokens_per_minute");
	burst = cJSON_GetObjectItemCaseSensitive(o, "burst");
	rules = cJSON_GetObjectItemCaseSensitive(o, "model_rules");
	if (is_default && key != NULL) {
		snprintf(err, errlen, "default_policy must not set tenant_key");
		return -1;
	}
	if (!is_default &&
	    (!cJSON_IsString(key) ||
	        (strncmp(key->valuestring, "auth:", 5) != 0 &&
	            strncmp(key->valuestring, "header:", 7) != 0 &&
	            strcmp(key->valuestring, "anonymous") != 0))) {
		snprintf(err, errlen,
		    "tenant_key must be auth:<id>, header:<id> or anonymous");
		return -1;
	}
	if (!cJSON_IsNumber(rpm) || rpm->valuedouble < 1 ||
	    !cJSON_IsNumber(tpm) || tpm->valuedouble < 1) {
		snprintf(err, errlen,
		    "requests_per_minute and tokens_per_minute must be > 0");
		return -1;
	}
	if (burst != NULL &&
	    (!cJSON_IsNumber(burst) || burst->valuedouble < 1)) {
		snprintf(err, errlen, "burst must be >= 1");
		return -1;
	}
	if (rules != NULL && tenant_rules_parse(rules, tp, err, errlen) == -1)
		return -1;
	tp->tp_key = is_default ? NULL : xstrdup(key->valuestring);
	tp->tp_rate = rpm->valuedouble / 60.;
	tp->tp_burst =
	    burst != NULL ? floor(burst->valuedouble) : floor(rpm->valuedouble);
	tp->tp_tpm = floor(tpm->valuedouble);
	return 0;
}

static int
tenant_rule_cmp(const void *a, const void *b)
{
	const struct tenant_rule *x = a, *y = b;
	size_t lx = strlen(x->tr_value), ly = strlen(y->tr_value);

	if (x->tr_prefix != y->tr_prefix)
		return x->tr_prefix ? 1 : -1;
	return lx > ly ? -1 : lx < ly ? 1 : 0;
}

/* model_rules as SMG validates them (rate_limit/config.rs). */
static int
tenant_rules_parse(const cJSON *rules, struct tenant_policy *tp, char *err,
    size_t errlen)
{
	const cJSON *r, *it, *id, *m, *type, *value, *rpm, *tpm;
	struct tenant_rule *tr;
	size_t i, n;
	const char *p;

	if (!cJSON_IsArray(rules)) {
		snprintf(err, errlen, "model_rules is not a list");
		return -1;
	}
	n = (size_t)cJSON_GetArraySize(rules);
	tp->tp_rules = xcalloc(n + 1, sizeof(*tp->tp_rules));
	cJSON_ArrayForEach(r, rules)
	{
		if (!cJSON_IsObject(r)) {
			snprintf(err, errlen, "a model rule is not an object");
			return -1;
		}
		cJSON_ArrayForEach(it, r)
		{
			if (strcmp(it->string, "rule_id") != 0 &&
			    strcmp(it->string, "matcher") != 0 &&
			    strcmp(it->string, "requests_per_minute") != 0 &&
			    strcmp(it->string, "tokens_per_minute") != 0) {
				snprintf(err, errlen,
				    "model rule: unknown field '%s'",
				    it->string);
				return -1;
			}
		}
		id = cJSON_GetObjectItemCaseSensitive(r, "rule_id");
		m = cJSON_GetObjectItemCaseSensitive(r, "matcher");
		rpm =
		    cJSON_GetObjectItemCaseSensitive(r, "requests_per_minute");
		tpm = cJSON_GetObjectItemCaseSensitive(r, "tokens_per_minute");
		if (!cJSON_IsString(id) || id->valuestring[0] == '\0' ||
		    strspn(id->valuestring,
		        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
		        "0123456789._-") != strlen(id->valuestring)) {
			snprintf(err, errlen,
			    "model rule: rule_id must match [A-Za-z0-9._-]+");
			return -1;
		}
		if (!cJSON_IsNumber(rpm) || rpm->valuedouble < 1 ||
		    !cJSON_IsNumber(tpm) || tpm->valuedouble < 1) {
			snprintf(err, errlen,
			    "rule '%s': requests_per_minute and "
			    "tokens_per_minute must be > 0",
			    id->valuestring);
			return -1;
		}
		type = cJSON_GetObjectItemCaseSensitive(m, "type");
		value = cJSON_GetObjectItemCaseSensitive(m, "value");
		if (!cJSON_IsObject(m) || cJSON_GetArraySize(m) != 2 ||
		    !cJSON_IsString(type) || !cJSON_IsString(value) ||
		    (strcmp(type->valuestring, "exact") != 0 &&
		        strcmp(type->valuestring, "prefix") != 0)) {
			snprintf(err, errlen,
			    "rule '%s': matcher must be {\"type\": "
			    "\"exact\"|\"prefix\", \"value\": ...}",
			    id->valuestring);
			return -1;
		}
		p = value->valuestring;
		if (p[0] == '\0' || isspace((unsigned char)p[0]) ||
		    isspace((unsigned char)p[strlen(p) - 1])) {
			snprintf(err, errlen,
			    "rule '%s': matcher value must be non-empty, "
			    "without surrounding whitespace",
			    id->valuestring);
			return -1;
		}
		tr = &tp->tp_rules[tp->tp_nrules];
		tr->tr_prefix = strcmp(type->valuestring, "prefix") == 0;
		for (i = 0; i < tp->tp_nrules; i++) {
			if (strcmp(tp->tp_rules[i].tr_id, id->valuestring) ==
			        0 ||
			    (tp->tp_rules[i].tr_prefix == tr->tr_prefix &&
			        strcmp(tp->tp_rules[i].tr_value, p) == 0)) {
				snprintf(err, errlen,
				    "rule '%s': duplicate rule_id or matcher",
				    id->valuestring);
				return -1;
			}
		}
		tr->tr_id = xstrdup(id->valuestring);
		tr->tr_value = xstrdup(p);
		tr->tr_rpm = floor(rpm->valuedouble);
		tr->tr_tpm = floor(tpm->valuedouble);
		tp->tp_nrules++;
	}
	qsort(tp->tp_rules, tp->tp_nrules, sizeof(*tp->tp_rules),
	    tenant_rule_cmp);
	return 0;
}

void
tenant_init(void)
{
	const struct config *cf = fe->fe_cf;
	const cJSON *def, *tenants, *t;
	char err[160], *buf;
	cJSON *doc;
	size_t i, n;
	FILE *f;
	long len;

	if (!cf->cf_tenant_rate_limit_enabled)
		return;
	if ((f = fopen(cf->cf_tenant_rate_limit_config, "r")) == NULL)
		fatal("%s: --tenant-rate-limit-config %s", __func__,
		    cf->cf_tenant_rate_limit_config);
	buf = xmalloc(1024 * 1024);
	len = (long)fread(buf, 1, 1024 * 1024 - 1, f);
	fclose(f);
	buf[len] = '\0';
	doc = cJSON_Parse(buf);
	free(buf);
	if (doc == NULL)
		fatalx("%s: --tenant-rate-limit-config %s: not JSON (write "
		       "SMG's YAML document in its JSON form)",
		    __func__, cf->cf_tenant_rate_limit_config);
	def = cJSON_GetObjectItemCaseSensitive(doc, "default_policy");
	tenants = cJSON_GetObjectItemCaseSensitive(doc, "tenants");
	if (def == NULL ||
	    tenant_policy_parse(def, true, &tenant_default, err, sizeof(err)) ==
	        -1 ||
	    (tenants != NULL && !cJSON_IsArray(tenants)))
		fatalx("%s: --tenant-rate-limit-config %s: default_policy: %s",
		    __func__, cf->cf_tenant_rate_limit_config,
		    def == NULL ? "missing" : err);
	n = tenants != NULL ? (size_t)cJSON_GetArraySize(tenants) : 0;
	tenant_policies = xcalloc(n + 1, sizeof(*tenant_policies));
	cJSON_ArrayForEach(t, tenants)
	{
		if (tenant_policy_parse(t, false,
		        &tenant_policies[tenant_policies_n], err,
		        sizeof(err)) == -1)
			fatalx(
			    "%s: --tenant-rate-limit-config %s: tenants[%zu]: "
			    "%s",
			    __func__, cf->cf_tenant_rate_limit_config,
			    tenant_policies_n, err);
		for (i = 0; i < tenant_policies_n; i++)
			if (strcmp(tenant_policies[i].tp_key,
			        tenant_policies[tenant_policies_n].tp_key) == 0)
				fatalx("%s: duplicate tenant_key '%s'",
				    __func__, tenant_policies[i].tp_key);
		tenant_policies_n++;
	}
	cJSON_Delete(doc);
	tenant_on = true;
	log_info("%s: tenant rate limits on: default %.3g requests/s, %.0f "
	         "tokens/min, %zu tenants of their own",
	    __func__, tenant_default.tp_rate, tenant_default.tp_tpm,
	    tenant_policies_n);
}

const char *
tenant_label(const char *tenant)
{
	const struct config *cf = fe->fe_cf;
	const char *colon, *p;
	size_t i, n;

	/* Only what a Prometheus label holds unescaped. */
	for (p = tenant; *p != '\0'; p++)
		if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
			return "other";
	for (i = 0; i < tenant_policies_n; i++)
		if (strcmp(tenant_policies[i].tp_key, tenant) == 0)
			return tenant;
	if (strncmp(tenant, "auth:", 5) == 0) {
		n = strlen(tenant + 5);
		for (i = 0; i < cf->cf_tenant_api_keys_n; i++) {
			colon = strchr(cf->cf_tenant_api_keys[i], ':');
			if ((size_t)(colon - cf->cf_tenant_api_keys[i]) == n &&
			    strncmp(cf->cf_tenant_api_keys[i], tenant + 5, n) ==
			        0)
				return tenant;
		}
	}
	return strcmp(tenant, "anonymous") == 0 ? tenant : "other";
}

static const struct tenant_policy *
tenant_policy_of(const char *tenant)
{
	size_t i;

	for (i = 0; i < tenant_policies_n; i++)
		if (strcmp(tenant_policies[i].tp_key, tenant) == 0)
			return &tenant_policies[i];
	return &tenant_default;
}

/*
 * The shm slot of one scope: the tenant's requests (seed 0: the key
 * alone, as before scopes), its tokens (1), a rule's requests (2) and
 * tokens (3), rule ids keyed under their tenant.
 */
static unsigned
tenant_slot(const char *tenant, const char *rule, uint64_t seed)
{
	char key[REQCTX_TENANT_MAX + 160];
	uint64_t h;
	int n;

	n = snprintf(key, sizeof(key), "%s%s%s", tenant,
	    rule != NULL ? "\x1f" : "", rule != NULL ? rule : "");
	if (n < 0 || (size_t)n >= sizeof(key))
		n = (int)sizeof(key) - 1;
	h = seed == 0 ? XXH3_64bits(key, (size_t)n)
	              : XXH3_64bits_withSeed(key, (size_t)n, seed);
	return shm_tenant_slot(fe->fe_shm, h != 0 ? h : 1);
}

static uint64_t
tenant_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

bool
tenant_take(const struct reqctx *rx, int *retry_after_secs)
{
	const struct tenant_policy *tp;
	const char *tenant;
	uint64_t wait = 0, now;
	char labels[256];
	unsigned slot;
	bool ok;

	if (!tenant_on)
		return true;
	tenant = rx != NULL && rx->rc_tenant[0] != '\0' ? rx->rc_tenant
	                                                : "anonymous";
	tp = tenant_policy_of(tenant);
	now = tenant_now_us();
	slot = tenant_slot(tenant, NULL, 0);
	ok = shm_tenant_rate_take(fe->fe_shm, slot, tp->tp_rate, tp->tp_burst,
	    now, &wait);
	*retry_after_secs = ok ? 0 : (int)((wait + 999999) / 1000000);
	snprintf(labels, sizeof(labels), "tenant=\"%s\",result=\"%s\"",
	    tenant_label(tenant), ok ? "allowed" : "rejected");
	stats_add("smg_tenant_rate_limit_total", labels, 1);
	return ok;
}

bool
tenant_charge(const struct reqctx *rx, const char *model, uint64_t tokens,
    int *retry_after_secs, char *why, size_t whylen)
{
	const struct tenant_policy *tp;
	const struct tenant_rule *tr = NULL;
	unsigned s_tok, s_rreq = 0, s_rtok = 0;
	uint64_t wait = 0, now;
	const char *tenant;
	char labels[256];
	double cost = (double)tokens;
	size_t i;

	*retry_after_secs = 0;
	if (!tenant_on)
		return true;
	tenant = rx != NULL && rx->rc_tenant[0] != '\0' ? rx->rc_tenant
	                                                : "anonymous";
	tp = tenant_policy_of(tenant);
	for (i = 0; model != NULL && i < tp->tp_nrules && tr == NULL; i++) {
		if (tp->tp_rules[i].tr_prefix
		        ? strncmp(model, tp->tp_rules[i].tr_value,
		              strlen(tp->tp_rules[i].tr_value)) == 0
		        : strcmp(model, tp->tp_rules[i].tr_value) == 0)
			tr = &tp->tp_rules[i];
	}
	now = tenant_now_us();
	/* All or nothing: what a scope took goes back when a later one
	 * refuses, the tenant's request taken at admission too. */
	s_tok = tenant_slot(tenant, NULL, 1);
	if (!shm_tenant_take_cost(fe->fe_shm, s_tok, tp->tp_tpm / 60.,
	        tp->tp_tpm, cost, now, &wait)) {
		snprintf(why, whylen,
		    "Too many tokens: the tenant's tokens_per_minute is "
		    "reached");
		goto refused;
	}
	if (tr != NULL) {
		s_rreq = tenant_slot(tenant, tr->tr_id, 2);
		s_rtok = tenant_slot(tenant, tr->tr_id, 3);
		if (!shm_tenant_take_cost(fe->fe_shm, s_rreq, tr->tr_rpm / 60.,
		        tr->tr_rpm, 1, now, &wait)) {
			snprintf(why, whylen,
			    "Too many requests: the tenant's limit for model "
			    "rule '%s' is reached",
			    tr->tr_id);
			shm_tenant_give(fe->fe_shm, s_tok, tp->tp_tpm / 60.,
			    cost);
			goto refused;
		}
		if (!shm_tenant_take_cost(fe->fe_shm, s_rtok, tr->tr_tpm / 60.,
		        tr->tr_tpm, cost, now, &wait)) {
			snprintf(why, whylen,
			    "Too many tokens: the tenant's tokens_per_minute "
			    "for model rule '%s' is reached",
			    tr->tr_id);
			shm_tenant_give(fe->fe_shm, s_rreq, tr->tr_rpm / 60.,
			    1);
			shm_tenant_give(fe->fe_shm, s_tok, tp->tp_tpm / 60.,
			    cost);
			goto refused;
		}
	}
	return true;
refused:
	shm_tenant_give(fe->fe_shm, tenant_slot(tenant, NULL, 0), tp->tp_rate,
	    1);
	/* More than a bucket holds never fits: no time to come back. */
	*retry_after_secs =
	    wait == UINT64_MAX ? 0 : (int)((wait + 999999) / 1000000);
	snprintf(labels, sizeof(labels), "tenant=\"%s\",result=\"rejected\"",
	    tenant_label(tenant));
	stats_add("smg_tenant_rate_limit_total", labels, 1);
	return false;
}
