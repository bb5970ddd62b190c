/*
 * fetch.c: the poller's HTTP GETs to workers (and the JWKS issuer), on the
 * shared HTTP client (shared/upstream.h).
 */
#include "poller/poller.h"

#include <stdio.h>
#include <string.h>

#include "shared/config.h"
#include "shared/log.h"

struct upstream *
fetch_client_new(struct ev_loop *loop, const struct config *cf)
{
	struct upstream_config uc;
	struct upstream *up;
	size_t i;

	memset(&uc, 0, sizeof(uc));
	for (i = 0; i < cf->cf_ca_cert_paths_n && i < 7; i++)
		uc.uc_ca_paths[i] = cf->cf_ca_cert_paths[i];
	uc.uc_client_cert_path = cf->cf_client_cert_path;
	uc.uc_client_key_path = cf->cf_client_key_path;
	if ((up = upstream_new(loop, &uc)) == NULL)
		fatalx("%s: cannot load the TLS client files", __func__);
	return up;
}

struct upstream_fetch *
fetch_get(struct poller *p, const char *base, const char *path,
    const char *api_key, double timeout_secs, size_t body_max,
    upstream_fetch_cb cb, void *arg)
{
	struct upstream_header h[3] = {
		{ "user-agent", 10, "smg-poller", 10 },
		{ "accept", 6, "application/json", 16 },
	};
	char auth[SHM_KEY_MAX + 16];
	size_t n = 2;
	int len;

	if (api_key != NULL && api_key[0] != '\0') {
		len = snprintf(auth, sizeof(auth), "Bearer %s", api_key);
		if (len > 0 && (size_t)len < sizeof(auth)) {
			h[n].uh_name = "authorization";
			h[n].uh_name_len = 13;
			h[n].uh_value = auth;
			h[n].uh_value_len = (size_t)len;
			n++;
		}
	}
	return upstream_fetch(p->p_up, base, path, h, n, timeout_secs, body_max,
	    cb, arg);
}
