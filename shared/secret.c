/* secret.c: constant-time credential comparison over SHA-256 digests. */
#include <string.h>

#include <mbedtls/constant_time.h>
#include <mbedtls/sha256.h>

#include "shared/secret.h"

bool
secret_equal(const char *want, const void *got, size_t got_len)
{
	unsigned char dw[32], dg[32];
	int bad = 0;

	if (want == NULL || got == NULL)
		return false;
	/* Equal digests of different lengths are impossible in practice;
	 * the length check is on public data once the digests match. */
	if (mbedtls_sha256_ret((const unsigned char *)want, strlen(want), dw,
	        0) != 0 ||
	    mbedtls_sha256_ret((const unsigned char *)got, got_len, dg, 0) != 0)
		return false;
	bad = mbedtls_ct_memcmp(dw, dg, sizeof(dw));
	return bad == 0 && strlen(want) == got_len;
}
