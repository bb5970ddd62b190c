/*
 * policy_passthrough.c: `passthrough` (policies.md §10.2): the first
 * candidate; one warning per instance when more than one is offered.
 */
#include "shared/log.h"

#include "broker.h"

static int passthrough_select(struct policy *p, struct worker *const *c,
    unsigned n, const Smg__RouteRequest *req);

const struct policy_ops policy_passthrough_ops = {
	.po_kind = POLICY_PASSTHROUGH,
	.po_select = passthrough_select,
};

static int
passthrough_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	(void)req;
	if (n > 1 && !p->pl_warned) {
		p->pl_warned = true;
		log_warnx("%s: %u candidates offered, passthrough always "
		          "routes to the first (%s)",
		    __func__, n, c[0]->wk_url);
	}
	return 0;
}
