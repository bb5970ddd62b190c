/*
 * stats.c: the broker's metric helpers over the shm metrics registry
 * (shared/metrics.h), on the broker's row. They touch nothing else, so
 * every file of the broker may call them.
 */
#include <stdarg.h>
#include <stdio.h>

#include "shared/metrics.h"

#include "broker.h"

void
stats_label_escape(char *out, size_t len, const char *s)
{
	size_t o = 0;

	if (len == 0)
		return;
	for (; *s != '\0' && o + 2 < len; s++) {
		if (*s == '\\' || *s == '"') {
			out[o++] = '\\';
			out[o++] = *s;
		} else if (*s == '\n') {
			out[o++] = '\\';
			out[o++] = 'n';
		} else
			out[o++] = *s;
	}
	out[o] = '\0';
}

int
stats_series(struct broker *br, int kind, const char *family,
    const char *labels_fmt, ...)
{
	char labels[1024];
	va_list ap;
	int n;

	va_start(ap, labels_fmt);
	n = vsnprintf(labels, sizeof(labels), labels_fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(labels))
		return -1;
	return metrics_series(br->br_shm, (enum metrics_kind)kind, family,
	    labels);
}

void
stats_add(struct broker *br, int series, int64_t delta)
{
	if (series >= 0)
		metrics_add(br->br_shm, br->br_row, series, delta);
}

void
stats_set(struct broker *br, int series, int64_t value)
{
	if (series >= 0)
		metrics_set(br->br_shm, br->br_row, series, value);
}

void
stats_retire(struct broker *br, int series)
{
	if (series >= 0)
		metrics_retire(br->br_shm, series);
}
