/* urlallow_test.c: unit tests of the worker API's URL rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shared/urlallow.h"

static enum urlallow_result
check(const struct urlallow_rule *rule, const char *url)
{
	char err[512];
	enum urlallow_result rv;

	err[0] = '\0';
	rv = urlallow_check(rule, url, err, sizeof(err));
	if (rv != URLALLOW_OK)
		assert_non_null(strstr(err, url));
	return rv;
}

static void
test_cidr_parse(void **state)
{
	struct urlallow_cidr c;

	(void)state;
	assert_int_equal(urlallow_cidr_parse("10.0.0.0/8", &c), 0);
	assert_int_equal(c.uc_bits, 8);
	assert_int_equal(urlallow_cidr_parse("10.0.0.1", &c), 0);
	assert_int_equal(c.uc_bits, 32);
	assert_int_equal(urlallow_cidr_parse("fd00::/8", &c), 0);
	assert_int_equal(c.uc_bits, 8);
	assert_int_equal(urlallow_cidr_parse("10.0.0.0/33", &c), -1);
	assert_int_equal(urlallow_cidr_parse("fd00::/129", &c), -1);
	assert_int_equal(urlallow_cidr_parse("10.0.0.0/", &c), -1);
	assert_int_equal(urlallow_cidr_parse("10.0.0.0/-1", &c), -1);
	assert_int_equal(urlallow_cidr_parse("host/8", &c), -1);
	assert_int_equal(urlallow_cidr_parse("012.0.0.0/8", &c), -1);
	assert_int_equal(urlallow_cidr_parse("", &c), -1);
}

/* Schemes, user info, and the IPv4 forms besides dotted decimal. */
static void
test_forms(void **state)
{
	struct urlallow_rule rule = { 0 };

	(void)state;
	assert_int_equal(check(&rule, "http://10.1.2.3:8000"), URLALLOW_OK);
	assert_int_equal(check(&rule, "grpcs://[fd00::1]:50051"), URLALLOW_OK);
	assert_int_equal(check(&rule, "http://localhost:8000/v1"), URLALLOW_OK);
	assert_int_equal(check(&rule, "ipc:///tmp/w.sock"), URLALLOW_INVALID);
	assert_int_equal(check(&rule, "ftp://10.1.2.3"), URLALLOW_INVALID);
	assert_int_equal(check(&rule, "http://u:p@10.1.2.3"), URLALLOW_INVALID);
	assert_int_equal(check(&rule, "http://2130706433:8000"),
	    URLALLOW_INVALID);
	assert_int_equal(check(&rule, "http://0x7f000001:8000"),
	    URLALLOW_INVALID);
	assert_int_equal(check(&rule, "http://0x7f.0.0.1"), URLALLOW_INVALID);
	assert_int_equal(check(&rule, "http://0177.0.0.1:8000"),
	    URLALLOW_INVALID);
	assert_int_equal(check(&rule, "http://127.1:8000"), URLALLOW_INVALID);
	assert_int_equal(check(&rule, "http://999.1.1.1:8000"),
	    URLALLOW_INVALID);
}

/* The gateway's own address on its port, in any spelling. */
static void
test_self(void **state)
{
	struct urlallow_rule rule = { .ur_self_host = "127.0.0.1",
		.ur_self_port = 30000 };

	(void)state;
	assert_int_equal(check(&rule, "http://127.0.0.1:30000"), URLALLOW_SELF);
	assert_int_equal(check(&rule, "http://localhost:30000"), URLALLOW_SELF);
	assert_int_equal(check(&rule, "https://localhost:30000/x"),
	    URLALLOW_SELF);
	assert_int_equal(check(&rule, "http://[::ffff:127.0.0.1]:30000"),
	    URLALLOW_SELF);
	assert_int_equal(check(&rule, "http://0.0.0.0:30000"), URLALLOW_SELF);
	/* Another port, or a loopback address the listener is not on. */
	assert_int_equal(check(&rule, "http://127.0.0.1:30001"), URLALLOW_OK);
	assert_int_equal(check(&rule, "http://127.0.0.2:30000"), URLALLOW_OK);

	/* A wildcard --host: every local address is the gateway. */
	rule.ur_self_host = "0.0.0.0";
	assert_int_equal(check(&rule, "http://127.0.0.2:30000"), URLALLOW_SELF);
	assert_int_equal(check(&rule, "http://[::1]:30000"), URLALLOW_SELF);
	assert_int_equal(check(&rule, "http://[::]:30000"), URLALLOW_SELF);
	assert_int_equal(check(&rule, "http://192.0.2.1:30000"), URLALLOW_OK);

	/* The scheme's port when the URL has none. */
	rule.ur_self_port = 80;
	assert_int_equal(check(&rule, "http://localhost"), URLALLOW_SELF);
	assert_int_equal(check(&rule, "https://localhost"), URLALLOW_OK);
}

static void
test_allow_cidr(void **state)
{
	struct urlallow_cidr c[2];
	struct urlallow_rule rule = { .ur_cidrs = c, .ur_ncidrs = 1 };

	(void)state;
	assert_int_equal(urlallow_cidr_parse("10.0.0.0/8", &c[0]), 0);
	assert_int_equal(urlallow_cidr_parse("fd00::/8", &c[1]), 0);
	assert_int_equal(check(&rule, "http://10.1.2.3:8000"), URLALLOW_OK);
	assert_int_equal(check(&rule, "http://11.1.2.3:8000"), URLALLOW_DENIED);
	assert_int_equal(check(&rule, "http://[fd00::1]:8000"),
	    URLALLOW_DENIED);
	assert_int_equal(check(&rule, "http://localhost:8000"),
	    URLALLOW_DENIED);
	rule.ur_ncidrs = 2;
	assert_int_equal(check(&rule, "http://[fd00::1]:8000"), URLALLOW_OK);
	/* A partial last byte of the prefix. */
	assert_int_equal(urlallow_cidr_parse("192.168.4.0/22", &c[0]), 0);
	rule.ur_ncidrs = 1;
	assert_int_equal(check(&rule, "http://192.168.7.255"), URLALLOW_OK);
	assert_int_equal(check(&rule, "http://192.168.8.1"), URLALLOW_DENIED);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cidr_parse),
		cmocka_unit_test(test_forms),
		cmocka_unit_test(test_self),
		cmocka_unit_test(test_allow_cidr),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
