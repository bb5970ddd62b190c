/*
 * policy_power_of_two.c: `power_of_two` (policies.md §4): two distinct
 * candidates drawn uniformly, the expected-wait scorer of §2 on that pair
 * with built-in tunables (the --least-load-* flags do not apply). The
 * scorer glue is policy_least_load.c's.
 */
#include "broker.h"

static int p2_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);

const struct policy_ops policy_power_of_two_ops = {
	.po_kind = POLICY_POWER_OF_TWO,
	.po_create = policy_least_load_create,
	.po_free = policy_least_load_free,
	.po_select = p2_select,
	.po_on_remove = policy_least_load_on_remove,
	.po_on_report = policy_least_load_on_report,
};

static int
p2_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	return policy_least_load_pick(p, c, n, req, true);
}
