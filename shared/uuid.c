/*
 * uuid.c: version 7 UUIDs and the syntax check of client-given ones.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "shared/uuid.h"

static bool uuid_hyphenated(const char *s, size_t len, bool lower_only);

void
uuid_v7(char out[UUID_STR_LEN])
{
	static uint64_t counter;
	struct timespec ts;
	unsigned char b[16];
	uint64_t ms;
	unsigned i;

	clock_gettime(CLOCK_REALTIME, &ts);
	ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b)) {
		uint64_t x = (uint64_t)ts.tv_nsec ^ (++counter << 32);

		for (i = 0; i < sizeof(b); i++) {
			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
			b[i] = (unsigned char)(x >> 56);
		}
	}
	for (i = 0; i < 6; i++)
		b[i] = (unsigned char)(ms >> (40 - 8 * i));
	b[6] = (unsigned char)(0x70 | (b[6] & 0x0f));
	b[8] = (unsigned char)(0x80 | (b[8] & 0x3f));
	snprintf(out, UUID_STR_LEN,
	    "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
	    "%02x%02x%02x%02x%02x%02x",
	    b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
	    b[11], b[12], b[13], b[14], b[15]);
}

static bool
uuid_hyphenated(const char *s, size_t len, bool lower_only)
{
	size_t i;

	if (len != 36)
		return false;
	for (i = 0; i < 36; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (s[i] != '-')
				return false;
		} else if (!isxdigit((unsigned char)s[i]) ||
		    (lower_only && isupper((unsigned char)s[i])))
			return false;
	}
	return true;
}

bool
uuid_valid(const char *s)
{
	size_t len, i;

	if (s == NULL)
		return false;
	len = strlen(s);
	if (len == 32) {
		for (i = 0; i < 32; i++)
			if (!isxdigit((unsigned char)s[i]))
				return false;
		return true;
	}
	if (len == 38 && s[0] == '{' && s[37] == '}')
		return uuid_hyphenated(s + 1, 36, false);
	if (len == 45 && strncmp(s, "urn:uuid:", 9) == 0)
		return uuid_hyphenated(s + 9, 36, false);
	return uuid_hyphenated(s, len, false);
}

bool
uuid_canonical(const char *s)
{
	return s != NULL && uuid_hyphenated(s, strlen(s), true);
}
