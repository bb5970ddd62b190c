/*
 * policy_random.c: `random` (policies.md §10.1), a uniform pick among the
 * candidates; no state.
 */
#include "broker.h"

static int random_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req);

const struct policy_ops policy_random_ops = {
	.po_kind = POLICY_RANDOM,
	.po_select = random_select,
};

static int
random_select(struct policy *p, struct worker *const *c, unsigned n,
    const Smg__RouteRequest *req)
{
	(void)p;
	(void)c;
	(void)req;
	return (int)policy_rand_below(n);
}
