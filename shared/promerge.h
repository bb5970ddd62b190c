/*
 * promerge.h: merging the Prometheus text expositions of several workers
 * into one (GET /engine_metrics): every sample gets a label naming its
 * worker, families keep one HELP and TYPE line and gather the samples of
 * every worker, in the order families were first seen. Metric names have
 * ':' replaced by '_' (as SMG's aggregator does). Lines that are not
 * samples, HELP or TYPE are dropped.
 */
#ifndef SHARED_PROMERGE_H
#define SHARED_PROMERGE_H

#include <stddef.h>

struct promerge;

/* NULL when out of memory. promerge_free(NULL) is a no-op. */
struct promerge *promerge_new(void);
void promerge_free(struct promerge *pm);
/*
 * Adds one exposition (text[0..len), need not be NUL-terminated); each of
 * its samples gets label="value" first. 0, or -1 when out of memory (pm
 * stays usable, possibly with part of text).
 */
int promerge_add(struct promerge *pm, const char *text, size_t len,
    const char *label, const char *value);
/* The merged exposition (malloc'ed, length in *len), or NULL (memory). */
char *promerge_text(const struct promerge *pm, size_t *len);

#endif /* SHARED_PROMERGE_H */
