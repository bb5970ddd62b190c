/*
 * tenant.c: per-tenant request rates (--tenant-rate-limit-enabled,
 * --tenant-rate-limit-config).
 *
 * The file is SMG's tenant rate-limit document in its JSON form (YAML 1.2
 * reads JSON, so one file serves both gateways): a default_policy and
 * tenants[] with tenant_key ("auth:<id>", "header:<id>", "anonymous"),
 * requests_per_minute and tokens_per_minute. Each tenant gets a GCRA
 * bucket in shared memory (shm_tenant_slot), refilled at
 * requests_per_minute / 60 per second and holding up to "burst" requests
 * (smg-c's addition; default requests_per_minute, SMG's bucket size).
 * tokens_per_minute is checked but not enforced (docs/decisions.md).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "frontend/frontend.h"
#include "shared/log.h"
#include "shared/xmalloc.h"

struct tenant_policy {
	char *tp_key; /* NULL: the default policy */
	double tp_rate; /* requests per second */
	double tp_burst;
};

static int tenant_policy_parse(const cJSON *, bool, struct tenant_policy *,
    char *, size_t);

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
	if (rules != NULL && cJSON_GetArraySize(rules) > 0) {
		/* Refused rather than ignored: limits must not loosen. */
		snprintf(err, errlen, "model_rules are not supported");
		return -1;
	}
	tp->tp_key = is_default ? NULL : xstrdup(key->valuestring);
	tp->tp_rate = rpm->valuedouble / 60.;
	tp->tp_burst =
	    burst != NULL ? floor(burst->valuedouble) : floor(rpm->valuedouble);
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
	log_info("%s: tenant rate limits on: default %.3g requests/s, %zu "
	         "tenants of their own",
	    __func__, tenant_default.tp_rate, tenant_policies_n);
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

bool
tenant_take(const struct reqctx *rx, int *retry_after_secs)
{
	const struct tenant_policy *tp = &tenant_default;
	const char *tenant;
	struct timespec ts;
	uint64_t wait = 0, now;
	char labels[256];
	unsigned slot;
	size_t i;
	bool ok;

	if (!tenant_on)
		return true;
	tenant = rx != NULL && rx->rc_tenant[0] != '\0' ? rx->rc_tenant
	                                                : "anonymous";
	for (i = 0; i < tenant_policies_n; i++) {
		if (strcmp(tenant_policies[i].tp_key, tenant) == 0) {
			tp = &tenant_policies[i];
			break;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	slot = shm_tenant_slot(fe->fe_shm, XXH3_64bits(tenant, strlen(tenant)));
	ok = shm_tenant_rate_take(fe->fe_shm, slot, tp->tp_rate, tp->tp_burst,
	    now, &wait);
	*retry_after_secs = ok ? 0 : (int)((wait + 999999) / 1000000);
	snprintf(labels, sizeof(labels), "tenant=\"%s\",result=\"%s\"",
	    tenant_label(tenant), ok ? "allowed" : "rejected");
	stats_add("smg_tenant_rate_limit_total", labels, 1);
	return ok;
}
