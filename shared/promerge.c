/*
 * promerge.c: the merge of Prometheus expositions for /engine_metrics.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shared/promerge.h"

struct promerge_buf {
	char *pb_s;
	size_t pb_len;
	size_t pb_cap;
};

struct promerge_family {
	char *pf_name;
	char *pf_help; /* rest of the HELP line, or NULL */
	char *pf_type; /* rest of the TYPE line, or NULL */
	struct promerge_buf pf_samples;
};

struct promerge {
	struct promerge_family *pm_fam;
	size_t pm_n;
	size_t pm_cap;
};

static int promerge_put(struct promerge_buf *, const char *, size_t);
static char *promerge_name(const char *, size_t);
static struct promerge_family *promerge_family(struct promerge *, const char *);
static bool promerge_member(const struct promerge_family *, const char *);
static int promerge_line(struct promerge *, const char *, size_t,
    struct promerge_family **, const char *, const char *);

static int
promerge_put(struct promerge_buf *b, const char *s, size_t n)
{
	size_t cap;
	char *ns;

	if (b->pb_len + n + 1 > b->pb_cap) {
		cap = (b->pb_len + n + 1) * 2;
		if ((ns = realloc(b->pb_s, cap)) == NULL)
			return -1;
		b->pb_s = ns;
		b->pb_cap = cap;
	}
	memcpy(b->pb_s + b->pb_len, s, n);
	b->pb_len += n;
	b->pb_s[b->pb_len] = '\0';
	return 0;
}

/* A metric name with ':' made '_' (malloc'ed). */
static char *
promerge_name(const char *s, size_t n)
{
	char *out;
	size_t i;

	if ((out = malloc(n + 1)) == NULL)
		return NULL;
	for (i = 0; i < n; i++)
		out[i] = s[i] == ':' ? '_' : s[i];
	out[n] = '\0';
	return out;
}

struct promerge *
promerge_new(void)
{
	return calloc(1, sizeof(struct promerge));
}

void
promerge_free(struct promerge *pm)
{
	size_t i;

	if (pm == NULL)
		return;
	for (i = 0; i < pm->pm_n; i++) {
		free(pm->pm_fam[i].pf_name);
		free(pm->pm_fam[i].pf_help);
		free(pm->pm_fam[i].pf_type);
		free(pm->pm_fam[i].pf_samples.pb_s);
	}
	free(pm->pm_fam);
	free(pm);
}

/* The family named name, added when new; NULL when out of memory. */
static struct promerge_family *
promerge_family(struct promerge *pm, const char *name)
{
	struct promerge_family *f;
	size_t i, cap;

	for (i = 0; i < pm->pm_n; i++)
		if (strcmp(pm->pm_fam[i].pf_name, name) == 0)
			return &pm->pm_fam[i];
	if (pm->pm_n == pm->pm_cap) {
		cap = pm->pm_cap != 0 ? pm->pm_cap * 2 : 32;
		if ((f = realloc(pm->pm_fam, cap * sizeof(*f))) == NULL)
			return NULL;
		pm->pm_fam = f;
		pm->pm_cap = cap;
	}
	f = &pm->pm_fam[pm->pm_n];
	memset(f, 0, sizeof(*f));
	if ((f->pf_name = strdup(name)) == NULL)
		return NULL;
	pm->pm_n++;
	return f;
}

/* Whether sample name belongs to family f (histogram/summary parts). */
static bool
promerge_member(const struct promerge_family *f, const char *name)
{
	static const char *const sfx[] = { "", "_bucket", "_sum", "_count",
		"_total", "_created", "_info" };
	size_t n = strlen(f->pf_name), i;

	if (strncmp(name, f->pf_name, n) != 0)
		return false;
	for (i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++)
		if (strcmp(name + n, sfx[i]) == 0)
			return true;
	return false;
}

static int
promerge_line(struct promerge *pm, const char *l, size_t n,
    struct promerge_family **cur, const char *label, const char *value)
{
	struct promerge_family *f;
	struct promerge_buf *b;
	const char *p, *end = l + n;
	char *name, **slot;
	size_t k, i;

	if (n > 7 && l[0] == '#' &&
	    (strncmp(l, "# HELP ", 7) == 0 || strncmp(l, "# TYPE ", 7) == 0)) {
		p = l + 7;
		for (k = 0; p + k < end && p[k] != ' '; k++)
			;
		if (k == 0 || (name = promerge_name(p, k)) == NULL)
			return k == 0 ? 0 : -1;
		f = promerge_family(pm, name);
		free(name);
		if (f == NULL)
			return -1;
		*cur = f;
		slot = l[2] == 'H' ? &f->pf_help : &f->pf_type;
		p += k;
		if (p < end)
			p++;
		if (*slot == NULL &&
		    (*slot = strndup(p, (size_t)(end - p))) == NULL)
			return -1;
		return 0;
	}
	if (l[0] == '#')
		return 0;
	for (k = 0; k < n && l[k] != '{' && l[k] != ' ' && l[k] != '\t'; k++)
		;
	if (k == 0 || k == n || (name = promerge_name(l, k)) == NULL)
		return k == 0 || k == n ? 0 : -1;
	f = *cur != NULL && promerge_member(*cur, name)
	    ? *cur
	    : promerge_family(pm, name);
	if (f == NULL) {
		free(name);
		return -1;
	}
	b = &f->pf_samples;
	if (promerge_put(b, name, strlen(name)) == -1 ||
	    promerge_put(b, "{", 1) == -1 ||
	    promerge_put(b, label, strlen(label)) == -1 ||
	    promerge_put(b, "=\"", 2) == -1) {
		free(name);
		return -1;
	}
	free(name);
	for (i = 0; value[i] != '\0'; i++) {
		const char *e = value[i] == '\\' ? "\\\\"
		    : value[i] == '"'            ? "\\\""
		    : value[i] == '\n'           ? "\\n"
		                                 : NULL;

		if (promerge_put(b, e != NULL ? e : &value[i],
		        e != NULL ? 2 : 1) == -1)
			return -1;
	}
	p = l + k;
	if (*p == '{') {
		p++;
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		if (p < end && *p == '}') {
			if (promerge_put(b, "\"", 1) == -1)
				return -1;
		} else if (promerge_put(b, "\",", 2) == -1)
			return -1;
	} else if (promerge_put(b, "\"}", 2) == -1)
		return -1;
	if (promerge_put(b, p, (size_t)(end - p)) == -1 ||
	    promerge_put(b, "\n", 1) == -1)
		return -1;
	return 0;
}

int
promerge_add(struct promerge *pm, const char *text, size_t len,
    const char *label, const char *value)
{
	struct promerge_family *cur = NULL;
	const char *l = text, *end = text + len, *nl;
	size_t n;

	while (l < end) {
		nl = memchr(l, '\n', (size_t)(end - l));
		n = nl != NULL ? (size_t)(nl - l) : (size_t)(end - l);
		while (n > 0 && (l[n - 1] == '\r' || l[n - 1] == ' '))
			n--;
		while (n > 0 && (*l == ' ' || *l == '\t')) {
			l++;
			n--;
		}
		if (n > 0 && promerge_line(pm, l, n, &cur, label, value) == -1)
			return -1;
		if (nl == NULL)
			break;
		l = nl + 1;
	}
	return 0;
}

char *
promerge_text(const struct promerge *pm, size_t *len)
{
	struct promerge_buf out = { NULL, 0, 0 };
	const struct promerge_family *f;
	size_t i;

	if (promerge_put(&out, "", 0) == -1)
		return NULL;
	for (i = 0; i < pm->pm_n; i++) {
		f = &pm->pm_fam[i];
		if (f->pf_samples.pb_len == 0)
			continue;
		if ((f->pf_help != NULL &&
		        (promerge_put(&out, "# HELP ", 7) == -1 ||
		            promerge_put(&out, f->pf_name,
		                strlen(f->pf_name)) == -1 ||
		            promerge_put(&out, " ", 1) == -1 ||
		            promerge_put(&out, f->pf_help,
		                strlen(f->pf_help)) == -1 ||
		            promerge_put(&out, "\n", 1) == -1)) ||
		    (f->pf_type != NULL &&
		        (promerge_put(&out, "# TYPE ", 7) == -1 ||
		            promerge_put(&out, f->pf_name,
		                strlen(f->pf_name)) == -1 ||
		            promerge_put(&out, " ", 1) == -1 ||
		            promerge_put(&out, f->pf_type,
		                strlen(f->pf_type)) == -1 ||
		            promerge_put(&out, "\n", 1) == -1)) ||
		    promerge_put(&out, f->pf_samples.pb_s,
		        f->pf_samples.pb_len) == -1) {
			free(out.pb_s);
			return NULL;
		}
	}
	*len = out.pb_len;
	return out.pb_s;
}
