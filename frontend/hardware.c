/* frontend/hardware.c: hardware profiles, shipped (compiled in from
 * examples/hardware/ by cmake/embed.cmake), from a file, or inline. */
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "frontend/internal.h"

/* Defined in the generated hardware_profiles.c; the table ends with a NULL
 * entry after kiln_shipped_hardware_count profiles, sorted by name. */
struct kiln_shipped_file {
	const char *name;
	const char *text;
	size_t len;
};
extern const struct kiln_shipped_file kiln_shipped_hardware[];
extern const size_t kiln_shipped_hardware_count;

size_t kiln_frontend_hardware_count(void)
{
	return kiln_shipped_hardware_count;
}

const char *kiln_frontend_hardware_name(size_t i)
{
	return i < kiln_shipped_hardware_count ? kiln_shipped_hardware[i].name : NULL;
}

/* The figures every profile must give, in the order of the format. */
static const kiln_fe_field_id figures[] = {
    KILN_FE_F_MEMORY_GIB,      KILN_FE_F_RESERVED_GIB,    KILN_FE_F_PEAK_TFLOPS,
    KILN_FE_F_GEMM_EFFICIENCY, KILN_FE_F_HBM_GBPS,        KILN_FE_F_H2D_GBPS,
    KILN_FE_F_D2H_GBPS,        KILN_FE_F_HOST_MEMORY_GIB, KILN_FE_F_DEVICES_PER_NODE,
    KILN_FE_F_INTRA_NODE_GBPS, KILN_FE_F_INTER_NODE_GBPS,
};

/* Fills *out from a read hardware section; where is the node missing keys
 * are reported at. in_file: kiln_hardware and name are required. Returns
 * true when the profile is complete and consistent. */
static bool hw_from_fields(kiln_fe_ctx *c, kiln_fe_field *f, bool in_file,
                           const kiln_fe_node *where, const char *source, kiln_hardware *out)
{
	bool ok = true;
	const char *what = in_file ? "the hardware profile" : "hardware";
	kiln_fe_field *ver = &f[KILN_FE_F_HW_VERSION];
	if (ver->state == KILN_FE_ABSENT && in_file) {
		kiln_fe_error(
		    c, where->line, where->col,
		    "missing required key 'kiln_hardware' in %s (write `kiln_hardware: 1`)", what);
		ok = false;
	} else if (ver->state == KILN_FE_SET && ver->i != 1) {
		kiln_fe_error(c, ver->value->line, ver->value->col,
		              "unsupported kiln_hardware version %lld; this kiln reads version 1",
		              (long long)ver->i);
		ok = false;
	} else if (ver->state == KILN_FE_BAD) {
		ok = false;
	}
	kiln_fe_field *name = &f[KILN_FE_F_HW_NAME];
	if (name->state == KILN_FE_ABSENT && in_file) {
		kiln_fe_error(c, where->line, where->col, "missing required key 'name' in %s",
		              what);
		ok = false;
	} else if (name->state == KILN_FE_BAD) {
		ok = false;
	}
	for (size_t i = 0; i < sizeof(figures) / sizeof(figures[0]); i++) {
		kiln_fe_field *x = &f[figures[i]];
		if (x->state == KILN_FE_ABSENT)
			kiln_fe_error(c, where->line, where->col, "missing required key '%s' in %s",
			              kiln_fe_field_key(figures[i]), what);
		if (x->state != KILN_FE_SET)
			ok = false;
	}
	kiln_fe_field *eff = &f[KILN_FE_F_GEMM_EFFICIENCY];
	/* Plausible ranges keep every derived figure finite: a profile of 1e-300
	 * TFLOP/s or 1e308 GiB is a typo, not a machine; an efficiency is at
	 * most 1. */
	for (size_t i = 0; i < sizeof(figures) / sizeof(figures[0]); i++) {
		kiln_fe_field *x = &f[figures[i]];
		if (x->state != KILN_FE_SET || figures[i] == KILN_FE_F_DEVICES_PER_NODE)
			continue;
		double lo = figures[i] == KILN_FE_F_GEMM_EFFICIENCY ? 1e-3 : 1e-6;
		double hi = figures[i] == KILN_FE_F_GEMM_EFFICIENCY ? 1 : 1e7;
		if (x->f < lo || x->f > hi) {
			kiln_fe_error(c, x->value->line, x->value->col,
			              "%s (%g) is out of range [%g, %g]",
			              kiln_fe_field_key(figures[i]), x->f, lo, hi);
			ok = false;
		}
	}
	kiln_fe_field *mem = &f[KILN_FE_F_MEMORY_GIB], *res = &f[KILN_FE_F_RESERVED_GIB];
	if (mem->state == KILN_FE_SET && res->state == KILN_FE_SET && !(res->f < mem->f)) {
		kiln_fe_error(c, res->value->line, res->value->col,
		              "reserved_gib (%g) must be less than memory_gib (%g)", res->f,
		              mem->f);
		ok = false;
	}
	/* issue 15, item 2: the step-time model's optional fitted figures. */
	static const struct {
		kiln_fe_field_id id;
		double lo, hi;
	} fitted[] = {
	    {KILN_FE_F_TIME_GEMM_EFFICIENCY, 1e-3, 1},
	    {KILN_FE_F_TIME_GEMM_HALF_ROWS, 0, 1e7},
	    {KILN_FE_F_TIME_ATTENTION_EFFICIENCY, 1e-3, 1},
	    {KILN_FE_F_TIME_COMM_EFFICIENCY, 1e-3, 1},
	    {KILN_FE_F_TIME_INTER_NODE_EFFICIENCY, 1e-3, 1},
	    {KILN_FE_F_TIME_KERNEL_FLOOR_US, 0, 1e6},
	    {KILN_FE_F_TIME_HOST_LAYER_US, 0, 1e6},
	    /* optional datasheet figure, range as the required ones */
	    {KILN_FE_F_SFU_TOPS, 1e-6, 1e7},
	};
	for (size_t i = 0; i < sizeof(fitted) / sizeof(fitted[0]); i++) {
		kiln_fe_field *x = &f[fitted[i].id];
		if (x->state == KILN_FE_BAD)
			ok = false;
		if (x->state == KILN_FE_SET && !(x->f >= fitted[i].lo && x->f <= fitted[i].hi)) {
			kiln_fe_error(
			    c, x->value->line, x->value->col, "%s (%g) is out of range [%g, %g]",
			    kiln_fe_field_key(fitted[i].id), x->f, fitted[i].lo, fitted[i].hi);
			ok = false;
		}
	}
	if (!ok)
		return false;
	kiln_fe_field *tg = &f[KILN_FE_F_TIME_GEMM_EFFICIENCY],
	              *ta = &f[KILN_FE_F_TIME_ATTENTION_EFFICIENCY];
	kiln_fe_field *tc = &f[KILN_FE_F_TIME_COMM_EFFICIENCY];
	out->time_gemm_efficiency = tg->state == KILN_FE_SET ? tg->f : eff->f;
	out->time_gemm_half_rows = f[KILN_FE_F_TIME_GEMM_HALF_ROWS].state == KILN_FE_SET
	                               ? f[KILN_FE_F_TIME_GEMM_HALF_ROWS].f
	                               : 0;
	out->time_attention_efficiency = ta->state == KILN_FE_SET ? ta->f : eff->f;
	out->time_comm_efficiency = tc->state == KILN_FE_SET ? tc->f : 1;
	out->time_inter_node_efficiency =
	    f[KILN_FE_F_TIME_INTER_NODE_EFFICIENCY].state == KILN_FE_SET
	        ? f[KILN_FE_F_TIME_INTER_NODE_EFFICIENCY].f
	        : out->time_comm_efficiency;
	out->time_kernel_floor_us = f[KILN_FE_F_TIME_KERNEL_FLOOR_US].state == KILN_FE_SET
	                                ? f[KILN_FE_F_TIME_KERNEL_FLOOR_US].f
	                                : 0;
	out->time_host_layer_us = f[KILN_FE_F_TIME_HOST_LAYER_US].state == KILN_FE_SET
	                              ? f[KILN_FE_F_TIME_HOST_LAYER_US].f
	                              : 0;
	out->name = name->state == KILN_FE_SET ? name->s : "inline";
	out->source = source;
	out->memory_gib = mem->f;
	out->reserved_gib = res->f;
	out->peak_tflops = f[KILN_FE_F_PEAK_TFLOPS].f;
	out->gemm_efficiency = eff->f;
	out->hbm_gbps = f[KILN_FE_F_HBM_GBPS].f;
	out->sfu_tops = f[KILN_FE_F_SFU_TOPS].state == KILN_FE_SET ? f[KILN_FE_F_SFU_TOPS].f : 0;
	out->h2d_gbps = f[KILN_FE_F_H2D_GBPS].f;
	out->d2h_gbps = f[KILN_FE_F_D2H_GBPS].f;
	out->host_memory_gib = f[KILN_FE_F_HOST_MEMORY_GIB].f;
	out->devices_per_node = f[KILN_FE_F_DEVICES_PER_NODE].i;
	out->intra_node_gbps = f[KILN_FE_F_INTRA_NODE_GBPS].f;
	out->inter_node_gbps = f[KILN_FE_F_INTER_NODE_GBPS].f;
	return true;
}

/* A profile file's text (borrowed), reported as file (borrowed, must live as
 * long as the arena). */
static bool hw_from_text(kiln_fe_ctx *c, const char *file, const char *text, size_t len,
                         kiln_hardware *out)
{
	const char *saved_file;
	int saved_index;
	kiln_fe_ctx_enter(c, file, &saved_file, &saved_index);
	bool ok = false;
	kiln_fe_node *root = kiln_fe_parse_text(c, text, len);
	if (root) {
		kiln_fe_field *f = kiln_arena_alloc(c->a, KILN_FE_F_COUNT * sizeof(*f));
		if (!f) {
			kiln_fe_oom(c);
		} else {
			kiln_fe_section_read(c, KILN_FE_S_HW, root, f);
			ok = hw_from_fields(c, f, true, root, file, out);
		}
	}
	kiln_fe_ctx_restore(c, saved_file, saved_index);
	return ok;
}

bool kiln_fe_hardware_shipped(kiln_fe_ctx *c, const char *name, int line, int col,
                              kiln_hardware *out)
{
	const char *names[64];
	size_t n = 0;
	for (size_t i = 0; i < kiln_shipped_hardware_count; i++) {
		const struct kiln_shipped_file *s = &kiln_shipped_hardware[i];
		if (strcmp(s->name, name) == 0) {
			size_t need = strlen(name) + sizeof("<shipped:>");
			char *file = kiln_arena_alloc(c->a, need);
			if (!file) {
				kiln_fe_oom(c);
				return false;
			}
			snprintf(file, need, "<shipped:%s>", name);
			return hw_from_text(c, file, s->text, s->len, out);
		}
		if (n < sizeof(names) / sizeof(names[0]))
			names[n++] = s->name;
	}
	const char *hint = kiln_fe_suggest(name, strlen(name), names, n);
	const char *shown = kiln_fe_show(c, name, strlen(name));
	kiln_fe_diag *d;
	if (hint)
		d = kiln_fe_error(c, line, col, "unknown hardware profile %s; did you mean '%s'?",
		                  shown, hint);
	else
		d = kiln_fe_error(c, line, col, "unknown hardware profile %s", shown);
	char list[512];
	size_t o = 0;
	list[0] = '\0';
	for (size_t i = 0; i < n && o < sizeof(list); i++)
		o += (size_t)snprintf(list + o, sizeof(list) - o, "%s%s", i ? ", " : "", names[i]);
	kiln_fe_note_at(c, d, line, col,
	                "shipped profiles: %s; a path to a profile file must contain '/' or end "
	                "in .yaml",
	                list);
	return false;
}

bool kiln_fe_hardware_file(kiln_fe_ctx *c, const char *path, kiln_hardware *out)
{
	char *text;
	size_t len;
	const char *saved_file;
	int saved_index;
	kiln_fe_ctx_enter(c, path, &saved_file, &saved_index);
	bool ok = kiln_fe_read_file(c, path, 0, 0, &text, &len);
	kiln_fe_ctx_restore(c, saved_file, saved_index);
	return ok && hw_from_text(c, path, text, len, out);
}

/* A shipped profile name: no '/' and no .yaml or .yml ending. */
static bool is_profile_name(const char *s, size_t len)
{
	if (memchr(s, '/', len))
		return false;
	if (len >= 5 && strcmp(s + len - 5, ".yaml") == 0)
		return false;
	if (len >= 4 && strcmp(s + len - 4, ".yml") == 0)
		return false;
	return true;
}

bool kiln_fe_hardware_resolve(kiln_fe_ctx *c, const kiln_fe_node *key, const kiln_fe_node *v,
                              const char *base_dir, const char *model_path, kiln_hardware *out)
{
	if (v->kind == KILN_FE_MAP) {
		kiln_fe_field *f = kiln_arena_alloc(c->a, KILN_FE_F_COUNT * sizeof(*f));
		if (!f) {
			kiln_fe_oom(c);
			return false;
		}
		kiln_fe_section_read(c, KILN_FE_S_HW, v, f);
		return hw_from_fields(c, f, false, key, model_path, out);
	}
	if (memchr(v->text, '\0', v->len)) {
		kiln_fe_error(c, v->line, v->col, "hardware must not contain NUL bytes");
		return false;
	}
	if (is_profile_name(v->text, v->len))
		return kiln_fe_hardware_shipped(c, v->text, v->line, v->col, out);
	const char *path = v->text;
	if (base_dir && v->text[0] != '/') {
		size_t need = strlen(base_dir) + 1 + v->len + 1;
		char *joined = kiln_arena_alloc(c->a, need);
		if (!joined) {
			kiln_fe_oom(c);
			return false;
		}
		snprintf(joined, need, "%s/%s", base_dir, v->text);
		path = joined;
	}
	char *text;
	size_t len;
	/* A missing or oversized file is reported where the model names it. */
	if (!kiln_fe_read_file(c, path, v->line, v->col, &text, &len))
		return false;
	return hw_from_text(c, path, text, len, out);
}

int kiln_frontend_load_hardware(const char *name_or_path, kiln_arena *a, FILE *diag,
                                kiln_hardware *out)
{
	kiln_fe_ctx c;
	kiln_fe_ctx_init(&c, a, name_or_path);
	kiln_hardware hw;
	memset(&hw, 0, sizeof(hw));
	bool ok;
	if (is_profile_name(name_or_path, strlen(name_or_path)))
		ok = kiln_fe_hardware_shipped(&c, name_or_path, 0, 0, &hw);
	else
		ok = kiln_fe_hardware_file(&c, name_or_path, &hw);
	int rc = kiln_fe_ctx_finish(&c, diag);
	if (rc == KILN_FRONTEND_OK && !ok)
		rc = KILN_FRONTEND_INVALID;
	if (rc == KILN_FRONTEND_OK)
		*out = hw;
	return rc;
}
