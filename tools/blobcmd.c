/* tools/blobcmd.c: the kilnc commands that read a plan blob through the
 * runtime's public API: `inspect` (decode it) and `select` (one runtime
 * decision from the command line). docs/cli.md lists their JSON keys.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "kiln/blob.h"
#include "kiln/runtime.h"
#include "passes/passes.h"
#include "tools/tools.h"

/* A template task's stream and kind, a layer's kind: the compiler's names
 * (kiln_stream_name, kiln_task_kind_name, kiln_ir_layer_kind_name), whose
 * enums are the blob's values (codegen/blob.c asserts it). */
static const char *stream_name(int s)
{
	return s >= 0 && s < KILN_STREAM_COUNT ? kiln_stream_name((kiln_stream)s) : "?";
}

static const char *kind_name(int k)
{
	return k >= 0 && k < KILN_TASK_KIND_COUNT ? kiln_task_kind_name((kiln_task_kind)k) : "?";
}

static const char *layer_kind_name(int moe)
{
	return kiln_ir_layer_kind_name(moe ? KILN_LAYER_MOE : KILN_LAYER_DENSE);
}

static const char *section_name(int id)
{
	switch (id) {
#define X(name, type)                                                                              \
	case KILN_SEC_##name:                                                                      \
		return #name;
		KILN_BLOB_SECTIONS(X)
#undef X
	}
	return "?";
}

/* Human-readable bytes: B, KiB, MiB, GiB. */
static void fmt_bytes(char *buf, size_t n, uint64_t v)
{
	if (v < 1024)
		snprintf(buf, n, "%" PRIu64 " B", v);
	else if (v < (1u << 20))
		snprintf(buf, n, "%.2f KiB", v / 1024.0);
	else if (v < (1u << 30))
		snprintf(buf, n, "%.2f MiB", v / 1048576.0);
	else
		snprintf(buf, n, "%.2f GiB", v / 1073741824.0);
}

/* s escaped for a terminal (kiln_text_escape) into buf of cap bytes. */
static const char *esc(const char *s, char *buf, size_t cap)
{
	return kiln_text_escape(s, strlen(s), cap, buf);
}

/* "kilnc: error: PATH: " with PATH escaped, the start of every message
 * about a plan file (docs/cli.md: kilnc: error: PLAN: REASON). */
static void plan_error(const char *path)
{
	fputs("kilnc: error: ", stderr);
	kiln_text_put(stderr, path, strlen(path));
	fputs(": ", stderr);
}

/* The reason kiln_rt_open gave for bytes, with the blob's own version and
 * the versions this runtime reads when the version is the problem. */
static void open_failure(const char *path, int rc, const unsigned char *bytes, size_t len)
{
	plan_error(path);
	if (rc == KILN_RT_EVERSION && len >= sizeof(kiln_blob_header)) {
		kiln_blob_header h;
		memcpy(&h, bytes, sizeof h);
		fprintf(stderr, "%s %u.%u; this kilnc reads %u.0", kiln_rt_strerror(rc),
		        (unsigned)h.major, (unsigned)h.minor, (unsigned)KILN_BLOB_MAJOR);
		if (KILN_BLOB_MINOR > 0)
			fprintf(stderr, " to %u.%u", (unsigned)KILN_BLOB_MAJOR,
			        (unsigned)KILN_BLOB_MINOR);
		fputs(" (recompile the plan with this kilnc)\n", stderr);
		return;
	}
	fprintf(stderr, "%s\n", kiln_rt_strerror(rc));
}

int kilnc_blob_load(const char *path, unsigned char **out_bytes, size_t *out_len, kiln_rt **out)
{
	*out = NULL;
	*out_bytes = NULL;
	*out_len = 0;
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		plan_error(path);
		fprintf(stderr, "cannot open: %s\n", strerror(errno));
		return KILNC_EXIT_INPUT;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		plan_error(path);
		fputs("not a regular file\n", stderr);
		close(fd);
		return KILNC_EXIT_INPUT;
	}
	if ((uint64_t)st.st_size > KILN_BLOB_MAX_BYTES) {
		plan_error(path);
		fprintf(stderr, "%lld bytes, over the 1 GiB limit of a plan blob\n",
		        (long long)st.st_size);
		close(fd);
		return KILNC_EXIT_INPUT;
	}
	size_t cap = (size_t)st.st_size, len = 0;
	unsigned char *buf = malloc(cap ? cap : 1);
	if (!buf) {
		plan_error(path);
		fputs("out of memory reading it\n", stderr);
		close(fd);
		return KILNC_EXIT_INPUT;
	}
	while (len < cap) {
		ssize_t k = read(fd, buf + len, cap - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			plan_error(path);
			fprintf(stderr, "cannot read: %s\n", strerror(errno));
			free(buf);
			close(fd);
			return KILNC_EXIT_INPUT;
		}
		if (k == 0)
			break;
		len += (size_t)k;
	}
	close(fd);
	int rc = kiln_rt_open(buf, len, out);
	if (rc != KILN_RT_OK) {
		open_failure(path, rc, buf, len);
		free(buf);
		return KILNC_EXIT_INPUT;
	}
	*out_bytes = buf;
	*out_len = len;
	return KILNC_EXIT_OK;
}

/* ---------------------------------------------------------------- inspect */

static const char HELP_INSPECT[] =
	"usage: kilnc inspect PLAN.kiln [--json] [--templates]\n"
	"\n"
	"Validates a plan blob exactly as the runtime's kiln_rt_open does and decodes\n"
	"it: the header (format version, size, checksum, sections), the model it was\n"
	"compiled from, per stage the memory figures the runtime decides with, per\n"
	"stage and layer kind the units and the plan table of every load bucket, and\n"
	"the plan and template counts. --templates also lists every template's tasks\n"
	"in start order. --json gives one JSON document (keys in docs/cli.md).\n"
	"\n"
	"Exit status 1, with the reason, when the file is not a valid blob.\n";

static const char HELP_SELECT[] =
	"usage: kilnc select PLAN.kiln --stage S --layer L\n"
	"                    (--tokens A,B,... | --rows N | --load-factor R) --free BYTES\n"
	"                    [--pending N] [--json]\n"
	"\n"
	"One runtime decision (kiln_rt_select), as a trainer would ask for it after\n"
	"layer L's MoE gate on pipeline stage S:\n"
	"  --layer L          model layer number (0-based; kilnc inspect lists them)\n"
	"  --tokens A,B,...   rows routed to each of this device's local experts\n"
	"  --rows N           their sum\n"
	"  --load-factor R    or a load factor: rows = ceil(R * balanced rows)\n"
	"  --free BYTES       device bytes free now; suffixes K, M, G, T (powers of\n"
	"                     1024; KiB, MiB, ... and KB, MB, ... mean the same)\n"
	"  --pending N        micro-batches that start a forward on this stage before\n"
	"                     memory is next freed (default 0)\n"
	"Prints the load bucket, the bytes to save, the chosen plan (one action per\n"
	"unit, with the unit's bytes at these rows), its exposed time and flags:\n"
	"over-budget (nothing fits: the maximal-saving plan) and load-beyond (load\n"
	"above load.max_factor).\n"
	"\n"
	"Exit status 1 for a bad blob, 2 for bad arguments (also a stage or layer\n"
	"the blob does not have).\n";

int kilnc_help_blob(const char *cmd)
{
	if (strcmp(cmd, "inspect") == 0)
		fputs(HELP_INSPECT, stdout);
	else if (strcmp(cmd, "select") == 0)
		fputs(HELP_SELECT, stdout);
	else
		return -1;
	return 0;
}

static void unit_flags(uint32_t f, char *buf, size_t n)
{
	snprintf(buf, n, "%s%s%s%s", f & KILN_RT_UNIT_LAYER_INPUT ? "input " : "",
	         f & KILN_RT_UNIT_COLLECTIVE ? "collective " : "", f & KILN_RT_UNIT_RNG ? "rng " : "",
	         f & KILN_RT_UNIT_EXPERT ? "expert " : "");
	size_t len = strlen(buf);
	if (len && buf[len - 1] == ' ')
		buf[len - 1] = '\0';
	if (!len)
		snprintf(buf, n, "-");
}

/* The first model layer of each (stage, kind) in stage order: the runtime
 * keeps one table set per pair. Returns how many were found. */
static int32_t layer_kinds(const kiln_rt *rt, int32_t *out, int32_t cap)
{
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	int32_t n = 0;
	for (int32_t s = 0; s < info.n_stages; s++)
		for (int moe = 0; moe <= 1; moe++)
			for (int32_t l = 0; l < info.n_model_layers; l++) {
				kiln_rt_layer_info li;
				if (kiln_rt_layer_get(rt, l, &li) == 0 && li.stage == s && li.moe == moe) {
					if (n < cap)
						out[n++] = l;
					break;
				}
			}
	return n;
}

static int32_t layers_of(const kiln_rt *rt, int32_t stage, int moe)
{
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	int32_t n = 0;
	for (int32_t l = 0; l < info.n_model_layers; l++) {
		kiln_rt_layer_info li;
		if (kiln_rt_layer_get(rt, l, &li) == 0 && li.stage == stage && (moe < 0 || li.moe == moe))
			n++;
	}
	return n;
}

static void inspect_text(const kiln_rt *rt, const char *path, const unsigned char *bytes,
                         bool templates)
{
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	kiln_blob_header h;
	memcpy(&h, bytes, sizeof h);
	char b1[32], b2[32], b3[32], b4[32], b5[32];
	fmt_bytes(b1, sizeof b1, info.blob_bytes);
	/* Names in the blob are untrusted text: escaped, as is the path. */
	char name[4096];
	printf("%s: kiln plan blob %d.%d, %zu bytes (%s), CRC32C %08" PRIx32 " ok\n",
	       esc(path, name, sizeof name), info.major, info.minor, info.blob_bytes, b1, h.crc32c);
	printf("model %s (hash %016" PRIx64 ")", esc(info.model, name, sizeof name),
	       info.model_hash);
	printf(", compiled by %s\n", esc(info.compiler, name, sizeof name));
	printf("%d stages, %d planned layers of %d, %d load buckets up to %gx, %d plans, %d "
	       "templates\n\n",
	       info.n_stages, info.n_layers, info.n_model_layers, info.n_buckets, info.max_factor,
	       kiln_rt_plan_count(rt), kiln_rt_template_count(rt));
	printf("section      offset   records      bytes\n");
	for (uint32_t i = 0; i < h.n_sections; i++) {
		kiln_blob_section s;
		memcpy(&s, bytes + h.table_offset + i * sizeof s, sizeof s);
		printf("%-10s %8" PRIu64 " %9" PRIu64 " %10" PRIu64 "\n", section_name((int)s.id),
		       s.offset, s.count, s.count * s.record_bytes);
	}
	printf("\nstage   capacity     static      floor  transient  inflight  safety  layers\n");
	for (int32_t s = 0; s < info.n_stages; s++) {
		kiln_rt_stage_info si;
		kiln_rt_stage_get(rt, s, &si);
		fmt_bytes(b1, sizeof b1, si.capacity_bytes);
		fmt_bytes(b2, sizeof b2, si.static_bytes);
		fmt_bytes(b3, sizeof b3, si.floor_bytes);
		fmt_bytes(b4, sizeof b4, si.transient_bytes);
		printf("%5d %10s %10s %10s %10s %9.3g %6.3gx  %6d\n", s, b1, b2, b3, b4, si.inflight,
		       si.safety_factor, si.n_layers);
	}
	printf("\nfloor: one micro-batch at load.max_factor with every layer maximal-saving; the\n"
	       "runtime keeps it free for work that has not decided yet (docs/runtime.md).\n");
	int32_t *reps = malloc(sizeof(int32_t) * 2 * (size_t)info.n_stages);
	if (!reps) {
		fprintf(stderr, "kilnc: error: out of memory\n");
		return;
	}
	int32_t n = layer_kinds(rt, reps, 2 * info.n_stages);
	for (int32_t k = 0; k < n; k++) {
		kiln_rt_layer_info li;
		kiln_rt_layer_get(rt, reps[k], &li);
		printf("\nstage %d %s layers (%d, first %d): %d units\n", li.stage,
		       layer_kind_name(li.moe), layers_of(rt, li.stage, li.moe), reps[k],
		       li.n_units);
		printf("  %-3s %-28s %-22s %14s %14s\n", "#", "unit", "flags", "base bytes",
		       "bytes per row");
		for (int32_t u = 0; u < li.n_units; u++) {
			kiln_rt_unit_info ui;
			char fl[64];
			kiln_rt_unit_get(rt, reps[k], u, &ui);
			unit_flags(ui.flags, fl, sizeof fl);
			printf("  %-3d %-28s %-22s %14" PRIu64 " %14" PRIu64 "\n", u,
			       esc(ui.name, name, sizeof name), fl, ui.base_bytes,
			       ui.per_row_bytes);
		}
		printf("  %-6s %6s %10s %11s %7s %12s %12s\n", "bucket", "load", "max rows", "keep",
		       "points", "max saving", "at cost");
		for (int32_t b = 0; b < info.n_buckets; b++) {
			kiln_rt_table_info ti;
			kiln_rt_point last;
			kiln_rt_table_get(rt, reps[k], b, &ti);
			kiln_rt_point_get(rt, reps[k], b, ti.n_points - 1, &last);
			fmt_bytes(b2, sizeof b2, ti.keep_bytes);
			fmt_bytes(b5, sizeof b5, last.saved_bytes);
			printf("  %-6d %5.3gx %10" PRIu64 " %11s %7d %12s %9.3f ms\n", b, ti.load_factor,
			       ti.max_rows, b2, ti.n_points, b5, last.exposed_us / 1000.0);
		}
		kiln_rt_group_info gi;
		kiln_rt_group_get(rt, reps[k], &gi);
		if (gi.plan < 0) {
			printf("  group fallback: none (%s)\n",
			       li.moe ? "a 1.0 blob has no GROUPS" : "a dense layer has no rows");
		} else {
			fmt_bytes(b1, sizeof b1, gi.resident_base_bytes);
			fmt_bytes(b2, sizeof b2, gi.transient_base_bytes);
			printf("  group fallback: plan %d when a rank of the EP group has more "
			       "than %" PRIu64 " rows;\n    resident %s + %" PRIu64
			       " B/row, transient %s + %" PRIu64
			       " B/row, exposed %.3f ms + %.4g us/row\n",
			       gi.plan, gi.fit_rows, b1, gi.resident_per_row_bytes, b2,
			       gi.transient_per_row_bytes, gi.exposed_base_us / 1000.0,
			       gi.exposed_per_row_us);
		}
	}
	free(reps);
	if (!templates)
		return;
	for (int32_t t = 0; t < kiln_rt_template_count(rt); t++) {
		kiln_rt_template_info ti;
		kiln_rt_template_get(rt, t, &ti);
		printf("\ntemplate %d (plan %d, load %gx): %d tasks, %.1f us interleaved, %.1f us "
		       "serial, %.1f us keep-everything\n",
		       t, ti.plan, ti.load_factor, ti.n_tasks, ti.makespan_us, ti.serial_us, ti.base_us);
		for (int32_t i = 0; i < ti.n_tasks; i++) {
			kiln_rt_task task;
			kiln_rt_template_task(rt, t, i, &task);
			printf("  %3d  chain %d  %-8s %-9s %s\n", i, task.chain,
			       stream_name(task.stream), kind_name(task.kind),
			       esc(task.name, name, sizeof name));
		}
	}
}

static kiln_json *inspect_json(const kiln_rt *rt, const char *path, const unsigned char *bytes,
                               bool templates)
{
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	kiln_blob_header h;
	memcpy(&h, bytes, sizeof h);
	char hex[32];
	kiln_json *doc = kiln_json_object();
	kiln_json *blob = kiln_json_add_object(doc, "blob");
	kiln_json_add_string(blob, "path", path);
	kiln_json_add_i64(blob, "major", info.major);
	kiln_json_add_i64(blob, "minor", info.minor);
	kiln_json_add_u64(blob, "bytes", info.blob_bytes);
	snprintf(hex, sizeof hex, "%08" PRIx32, h.crc32c);
	kiln_json_add_string(blob, "crc32c", hex);
	kiln_json *secs = kiln_json_add_array(blob, "sections");
	for (uint32_t i = 0; i < h.n_sections; i++) {
		kiln_blob_section s;
		memcpy(&s, bytes + h.table_offset + i * sizeof s, sizeof s);
		kiln_json *o = kiln_json_add_object(secs, NULL);
		kiln_json_add_string(o, "name", section_name((int)s.id));
		kiln_json_add_u64(o, "offset", s.offset);
		kiln_json_add_u64(o, "records", s.count);
		kiln_json_add_u64(o, "bytes", s.count * s.record_bytes);
	}
	kiln_json *model = kiln_json_add_object(doc, "model");
	kiln_json_add_string(model, "name", info.model);
	snprintf(hex, sizeof hex, "%016" PRIx64, info.model_hash);
	kiln_json_add_string(model, "hash", hex);
	kiln_json_add_string(model, "compiler", info.compiler);
	kiln_json_add_i64(model, "layers", info.n_model_layers);
	kiln_json_add_number(model, "max_factor", info.max_factor);
	kiln_json_add_i64(doc, "plans", kiln_rt_plan_count(rt));
	kiln_json_add_i64(doc, "templates", kiln_rt_template_count(rt));
	kiln_json *stages = kiln_json_add_array(doc, "stages");
	for (int32_t s = 0; s < info.n_stages; s++) {
		kiln_rt_stage_info si;
		kiln_rt_stage_get(rt, s, &si);
		kiln_json *o = kiln_json_add_object(stages, NULL);
		kiln_json_add_i64(o, "stage", s);
		kiln_json_add_u64(o, "capacity_bytes", si.capacity_bytes);
		kiln_json_add_u64(o, "static_bytes", si.static_bytes);
		kiln_json_add_u64(o, "fixed_bytes", si.fixed_bytes);
		kiln_json_add_u64(o, "budget_bytes", si.budget_bytes);
		kiln_json_add_u64(o, "steady_bytes", si.steady_bytes);
		kiln_json_add_u64(o, "floor_bytes", si.floor_bytes);
		kiln_json_add_u64(o, "transient_bytes", si.transient_bytes);
		kiln_json_add_number(o, "inflight", si.inflight);
		kiln_json_add_number(o, "safety_factor", si.safety_factor);
		kiln_json *ls = kiln_json_add_array(o, "layers");
		for (int32_t l = 0; l < info.n_model_layers; l++) {
			kiln_rt_layer_info li;
			if (kiln_rt_layer_get(rt, l, &li) == 0 && li.stage == s)
				kiln_json_add_i64(ls, NULL, l);
		}
	}
	kiln_json *kinds = kiln_json_add_array(doc, "layer_kinds");
	int32_t *reps = malloc(sizeof(int32_t) * 2 * (size_t)info.n_stages);
	int32_t n = reps ? layer_kinds(rt, reps, 2 * info.n_stages) : 0;
	if (!reps) {
		kiln_json_free(doc);
		return NULL; /* kiln_json_write(NULL) reports out of memory */
	}
	for (int32_t k = 0; k < n; k++) {
		kiln_rt_layer_info li;
		kiln_rt_layer_get(rt, reps[k], &li);
		kiln_json *o = kiln_json_add_object(kinds, NULL);
		kiln_json_add_i64(o, "stage", li.stage);
		kiln_json_add_string(o, "kind", layer_kind_name(li.moe));
		kiln_json_add_i64(o, "first_layer", reps[k]);
		kiln_json_add_u64(o, "balanced_rows", li.balanced_rows);
		kiln_json *us = kiln_json_add_array(o, "units");
		for (int32_t u = 0; u < li.n_units; u++) {
			kiln_rt_unit_info ui;
			kiln_rt_unit_get(rt, reps[k], u, &ui);
			kiln_json *uo = kiln_json_add_object(us, NULL);
			kiln_json_add_string(uo, "name", ui.name);
			kiln_json_add_u64(uo, "flags", ui.flags);
			kiln_json_add_u64(uo, "base_bytes", ui.base_bytes);
			kiln_json_add_u64(uo, "per_row_bytes", ui.per_row_bytes);
		}
		kiln_rt_group_info gi;
		kiln_rt_group_get(rt, reps[k], &gi);
		if (gi.plan < 0) {
			kiln_json_add_null(o, "group_fallback");
		} else {
			kiln_json *go = kiln_json_add_object(o, "group_fallback");
			kiln_json_add_i64(go, "plan", gi.plan);
			kiln_json_add_u64(go, "fit_rows", gi.fit_rows);
			kiln_json_add_u64(go, "resident_base_bytes", gi.resident_base_bytes);
			kiln_json_add_u64(go, "resident_per_row_bytes", gi.resident_per_row_bytes);
			kiln_json_add_u64(go, "saved_base_bytes", gi.saved_base_bytes);
			kiln_json_add_u64(go, "saved_per_row_bytes", gi.saved_per_row_bytes);
			kiln_json_add_u64(go, "transient_base_bytes", gi.transient_base_bytes);
			kiln_json_add_u64(go, "transient_per_row_bytes",
			                  gi.transient_per_row_bytes);
			kiln_json_add_number(go, "exposed_base_us", gi.exposed_base_us);
			kiln_json_add_number(go, "exposed_per_row_us", gi.exposed_per_row_us);
		}
		kiln_json *ts = kiln_json_add_array(o, "tables");
		for (int32_t b = 0; b < info.n_buckets; b++) {
			kiln_rt_table_info ti;
			kiln_rt_table_get(rt, reps[k], b, &ti);
			kiln_json *to = kiln_json_add_object(ts, NULL);
			kiln_json_add_number(to, "load_factor", ti.load_factor);
			kiln_json_add_u64(to, "max_rows", ti.max_rows);
			kiln_json_add_u64(to, "quantum_bytes", ti.quantum_bytes);
			kiln_json_add_u64(to, "keep_bytes", ti.keep_bytes);
			kiln_json *ps = kiln_json_add_array(to, "points");
			for (int32_t i = 0; i < ti.n_points; i++) {
				kiln_rt_point p;
				kiln_rt_point_get(rt, reps[k], b, i, &p);
				kiln_json *po = kiln_json_add_object(ps, NULL);
				kiln_json_add_u64(po, "saved_bytes", p.saved_bytes);
				kiln_json_add_number(po, "exposed_us", p.exposed_us);
				kiln_json_add_i64(po, "plan", p.plan);
			}
		}
	}
	free(reps);
	if (templates) {
		kiln_json *ps = kiln_json_add_array(doc, "plan_pool");
		for (int32_t p = 0; p < kiln_rt_plan_count(rt); p++) {
			const uint8_t *acts;
			int32_t nu, tpl;
			kiln_rt_plan_get(rt, p, &acts, &nu, &tpl);
			kiln_json *po = kiln_json_add_object(ps, NULL);
			kiln_json *as = kiln_json_add_array(po, "actions");
			for (int32_t u = 0; u < nu; u++)
				kiln_json_add_string(as, NULL, kiln_rt_action_name(acts[u]));
			kiln_json_add_i64(po, "template", tpl);
		}
		kiln_json *tl = kiln_json_add_array(doc, "template_list");
		for (int32_t t = 0; t < kiln_rt_template_count(rt); t++) {
			kiln_rt_template_info ti;
			kiln_rt_template_get(rt, t, &ti);
			kiln_json *to = kiln_json_add_object(tl, NULL);
			kiln_json_add_i64(to, "plan", ti.plan);
			kiln_json_add_number(to, "load_factor", ti.load_factor);
			kiln_json_add_number(to, "makespan_us", ti.makespan_us);
			kiln_json_add_number(to, "serial_us", ti.serial_us);
			kiln_json_add_number(to, "base_us", ti.base_us);
			kiln_json *tasks = kiln_json_add_array(to, "tasks");
			for (int32_t i = 0; i < ti.n_tasks; i++) {
				kiln_rt_task task;
				kiln_rt_template_task(rt, t, i, &task);
				kiln_json *xo = kiln_json_add_object(tasks, NULL);
				kiln_json_add_string(xo, "name", task.name);
				kiln_json_add_string(xo, "stream", stream_name(task.stream));
				kiln_json_add_string(xo, "kind", kind_name(task.kind));
				kiln_json_add_i64(xo, "chain", task.chain);
				kiln_json_add_i64(xo, "unit", task.unit);
			}
			kiln_json *deps = kiln_json_add_array(to, "deps");
			for (int32_t j = 0; j < ti.n_deps; j++) {
				int32_t a, d;
				kiln_rt_template_dep(rt, t, j, &a, &d);
				kiln_json *pair = kiln_json_add_array(deps, NULL);
				kiln_json_add_i64(pair, NULL, a);
				kiln_json_add_i64(pair, NULL, d);
			}
		}
	}
	return doc;
}

int kilnc_inspect(int argc, char **argv)
{
	const char *path = NULL;
	bool json = false, templates = false;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		char eb[200], eb2[200]; /* arguments, escaped for a message */
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
			return kilnc_help_blob("inspect"), KILNC_EXIT_OK;
		int m = kilnc_flag("inspect", "--json", a, &json);
		if (m == 0)
			m = kilnc_flag("inspect", "--templates", a, &templates);
		if (m == KILNC_EXIT_USAGE)
			return m;
		if (m) {
			/* a flag */
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "kilnc: error: unknown option '%s' for 'inspect'\n",
			        esc(a, eb, sizeof eb));
			fprintf(stderr, "Try 'kilnc help inspect'.\n");
			return KILNC_EXIT_USAGE;
		} else if (!path) {
			path = a;
		} else {
			fprintf(stderr,
			        "kilnc: error: 'inspect' takes one PLAN, got '%s' and '%s'\n",
			        esc(path, eb, sizeof eb), esc(a, eb2, sizeof eb2));
			return KILNC_EXIT_USAGE;
		}
	}
	if (!path) {
		fprintf(stderr, "kilnc: error: 'inspect' needs a PLAN.kiln file\n");
		fprintf(stderr, "Try 'kilnc help inspect'.\n");
		return KILNC_EXIT_USAGE;
	}
	unsigned char *bytes;
	size_t len;
	kiln_rt *rt;
	const kiln_out_name plan_in = {"PLAN", path};
	if (kilnc_check_outputs(&plan_in, 1, NULL, NULL, 0) != KILNC_EXIT_OK)
		return KILNC_EXIT_USAGE; /* stdout redirected onto the blob */
	int rc = kilnc_blob_load(path, &bytes, &len, &rt);
	if (rc != KILNC_EXIT_OK)
		return rc;
	if (json) {
		kiln_json *doc = inspect_json(rt, path, bytes, templates);
		if (kiln_json_write(doc, stdout) == KILN_JSON_ENOMEM) {
			/* A failed write is reported by main's finish_output. */
			fprintf(stderr, "kilnc: error: out of memory building the JSON output\n");
			rc = KILNC_EXIT_INPUT;
		}
		kiln_json_free(doc);
	} else {
		inspect_text(rt, path, bytes, templates);
	}
	kiln_rt_close(rt);
	free(bytes);
	return rc;
}

/* ---------------------------------------------------------------- select */

/* "a,b,c" into a malloc'd array of at most 1 << 20 counts. */
static int parse_tokens(const char *s, uint32_t **out, int32_t *out_n)
{
	int32_t n = 1;
	for (const char *p = s; *p; p++)
		n += *p == ',';
	if (n > (1 << 20))
		return -1;
	uint32_t *v = malloc(sizeof(uint32_t) * (size_t)n);
	if (!v)
		return -1;
	const char *p = s;
	for (int32_t i = 0; i < n; i++) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		uint64_t x;
		if (kiln_num_u64_parse(p, len, 0, UINT32_MAX, &x) != KILN_NUM_OK) {
			free(v);
			return -1;
		}
		v[i] = (uint32_t)x;
		p += len + (comma != NULL);
	}
	*out = v;
	*out_n = n;
	return 0;
}

typedef struct select_args {
	const char *path;
	const char *stage, *layer, *tokens, *rows, *load, *free_arg, *pending;
	bool json;
} select_args;

int kilnc_select(int argc, char **argv)
{
	select_args o = {0};
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		static const char *names[] = {"--stage", "--layer", "--tokens", "--rows",
		                              "--load-factor", "--free", "--pending"};
		const char **slots[] = {&o.stage, &o.layer, &o.tokens, &o.rows,
		                        &o.load, &o.free_arg, &o.pending};
		int m = 0;
		for (int k = 0; k < 7 && m == 0; k++)
			m = kilnc_option_value("select", names[k], argc, argv, &i, slots[k]);
		if (m == KILNC_EXIT_USAGE)
			return m;
		if (m)
			continue;
		char eb[200], eb2[200]; /* arguments, escaped for a message */
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
			return kilnc_help_blob("select"), KILNC_EXIT_OK;
		if ((m = kilnc_flag("select", "--json", a, &o.json)) != 0) {
			if (m == KILNC_EXIT_USAGE)
				return m;
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "kilnc: error: unknown option '%s' for 'select'\n",
			        esc(a, eb, sizeof eb));
			fprintf(stderr, "Try 'kilnc help select'.\n");
			return KILNC_EXIT_USAGE;
		} else if (!o.path) {
			o.path = a;
		} else {
			fprintf(stderr,
			        "kilnc: error: 'select' takes one PLAN, got '%s' and '%s'\n",
			        esc(o.path, eb, sizeof eb), esc(a, eb2, sizeof eb2));
			return KILNC_EXIT_USAGE;
		}
	}
	if (!o.path || !o.stage || !o.layer || !o.free_arg ||
	    (!!o.tokens + !!o.rows + !!o.load) != 1) {
		fprintf(stderr, "kilnc: error: 'select' needs PLAN.kiln, --stage, --layer, --free and "
		                "exactly one of --tokens, --rows, --load-factor\n");
		fprintf(stderr, "Try 'kilnc help select'.\n");
		return KILNC_EXIT_USAGE;
	}
	kiln_query q = {0};
	int64_t stage, layer;
	uint64_t pending = 0;
	double load = 0;
	if (kilnc_arg_i64("select", "--stage", o.stage, 0, INT32_MAX, &stage) ||
	    kilnc_arg_i64("select", "--layer", o.layer, 0, INT32_MAX, &layer) ||
	    kilnc_arg_bytes("select", "--free", o.free_arg, UINT64_MAX, &q.free_bytes) ||
	    (o.pending && kilnc_arg_u64("select", "--pending", o.pending, 0, 1000000, &pending)) ||
	    (o.rows && kilnc_arg_u64("select", "--rows", o.rows, 0, UINT64_MAX, &q.total_rows)) ||
	    (o.load && kilnc_arg_f64("select", "--load-factor", o.load, 0, 1e6, &load)))
		return KILNC_EXIT_USAGE;
	if (q.free_bytes == KILN_RT_FREE_FROM_ACCOUNTING) {
		kilnc_usage("select",
		            "--free: %" PRIu64
		            " is KILN_RT_FREE_FROM_ACCOUNTING, the value that asks "
		            "kiln_rt_select to take free memory from the handle's accounting; the "
		            "command line records no accounting, so give the device's free bytes "
		            "(at most %" PRIu64 ")",
		            q.free_bytes, KILN_RT_FREE_FROM_ACCOUNTING - 1);
		return KILNC_EXIT_USAGE;
	}
	q.stage = (int32_t)stage;
	q.layer = (int32_t)layer;
	q.pending = (uint32_t)pending;
	uint32_t *tokens = NULL;
	if (o.tokens && parse_tokens(o.tokens, &tokens, &q.n_tokens) != 0) {
		char buf[200];
		kilnc_usage("select",
		            "--tokens: must be a list of integers from 0 to %u separated by commas "
		            "(at most %d of them, no blanks), got '%s'",
		            (unsigned)UINT32_MAX, 1 << 20,
		            kiln_text_escape(o.tokens, strlen(o.tokens), sizeof buf, buf));
		return KILNC_EXIT_USAGE;
	}
	q.tokens = tokens;

	unsigned char *bytes;
	size_t len;
	kiln_rt *rt;
	const kiln_out_name plan_in = {"PLAN", o.path};
	if (kilnc_check_outputs(&plan_in, 1, NULL, NULL, 0) != KILNC_EXIT_OK) {
		free(tokens);
		return KILNC_EXIT_USAGE; /* stdout redirected onto the blob */
	}
	int rc = kilnc_blob_load(o.path, &bytes, &len, &rt);
	if (rc != KILNC_EXIT_OK) {
		free(tokens);
		return rc;
	}
	kiln_rt_layer_info li;
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	kiln_plan plan;
	char name[4096];
	if (kiln_rt_layer_get(rt, q.layer, &li) != 0 || li.stage != q.stage) {
		if (q.stage < 0 || q.stage >= info.n_stages)
			fprintf(stderr, "kilnc: error: --stage %d: the plan has stages 0 to %d\n", q.stage,
			        info.n_stages - 1);
		else if (kiln_rt_layer_get(rt, q.layer, &li) != 0)
			fprintf(stderr,
			        "kilnc: error: --layer %d: not a planned layer of %s (0 to %d)\n",
			        q.layer, esc(info.model, name, sizeof name),
			        info.n_model_layers - 1);
		else
			fprintf(stderr, "kilnc: error: --layer %d runs on stage %d, not %d\n", q.layer,
			        li.stage, q.stage);
		rc = KILNC_EXIT_USAGE;
		goto out;
	}
	if (o.load)
		q.total_rows = (uint64_t)ceil(load * (double)li.balanced_rows - 1e-9);
	int src = kiln_rt_select(rt, &q, &plan);
	if (src != KILN_RT_OK) {
		fprintf(stderr, "kilnc: error: select: %s\n", kiln_rt_strerror(src));
		rc = KILNC_EXIT_USAGE;
		goto out;
	}
	uint64_t rows = q.total_rows;
	if (tokens) {
		rows = 0;
		for (int32_t i = 0; i < q.n_tokens; i++)
			rows += tokens[i];
	}
	kiln_rt_table_info ti;
	kiln_rt_table_get(rt, q.layer, plan.bucket, &ti);
	if (o.json) {
		kiln_json *doc = kiln_json_object();
		kiln_json_add_i64(doc, "stage", q.stage);
		kiln_json_add_i64(doc, "layer", q.layer);
		kiln_json_add_string(doc, "kind", layer_kind_name(li.moe));
		kiln_json_add_u64(doc, "rows", rows);
		kiln_json_add_number(doc, "load_factor", plan.load_factor);
		kiln_json_add_i64(doc, "bucket", plan.bucket);
		kiln_json_add_number(doc, "bucket_load_factor", ti.load_factor);
		kiln_json_add_u64(doc, "free_bytes", q.free_bytes);
		kiln_json_add_u64(doc, "avail_bytes", plan.avail_bytes);
		kiln_json_add_u64(doc, "need_bytes", plan.need_bytes);
		kiln_json_add_u64(doc, "saved_bytes", plan.saved_bytes);
		kiln_json_add_u64(doc, "resident_bytes", plan.resident_bytes);
		kiln_json_add_number(doc, "exposed_us", plan.exposed_us);
		kiln_json_add_i64(doc, "plan", plan.plan);
		kiln_json_add_i64(doc, "template", plan.template_id);
		kiln_json_add_bool(doc, "over_budget", plan.flags & KILN_PLAN_OVER_BUDGET);
		kiln_json_add_bool(doc, "load_beyond", plan.flags & KILN_PLAN_LOAD_BEYOND);
		kiln_json *us = kiln_json_add_array(doc, "units");
		for (int32_t u = 0; u < plan.n_units; u++) {
			kiln_rt_unit_info ui;
			kiln_rt_unit_get(rt, q.layer, u, &ui);
			kiln_json *uo = kiln_json_add_object(us, NULL);
			kiln_json_add_string(uo, "name", ui.name);
			kiln_json_add_string(uo, "action", kiln_rt_action_name(plan.actions[u]));
			kiln_json_add_u64(uo, "bytes", kiln_rt_unit_bytes(rt, q.layer, u, rows));
		}
		if (kiln_json_write(doc, stdout) == KILN_JSON_ENOMEM) {
			/* A failed write is reported by main's finish_output. */
			fprintf(stderr, "kilnc: error: out of memory building the JSON output\n");
			rc = KILNC_EXIT_INPUT;
		}
		kiln_json_free(doc);
	} else {
		char b1[32], b2[32], b3[32], b4[32];
		printf("stage %d, layer %d (%s, position %d): %" PRIu64 " rows", q.stage, q.layer,
		       layer_kind_name(li.moe), li.position, rows);
		if (li.moe)
			printf(" = load factor %.3f -> bucket %d (up to %gx)\n", plan.load_factor,
			       plan.bucket, ti.load_factor);
		else
			printf(" (dense: one table)\n");
		fmt_bytes(b1, sizeof b1, q.free_bytes);
		fmt_bytes(b2, sizeof b2, plan.avail_bytes);
		fmt_bytes(b3, sizeof b3, ti.keep_bytes);
		fmt_bytes(b4, sizeof b4, plan.need_bytes);
		printf("free %s, available after the reserve for later work %s; keeping everything "
		       "takes %s, so save %s\n",
		       b1, b2, b3, b4);
		fmt_bytes(b1, sizeof b1, plan.saved_bytes);
		fmt_bytes(b2, sizeof b2, plan.resident_bytes);
		printf("plan %d (template %d): saves %s, keeps %s, exposed %.3f ms%s%s\n", plan.plan,
		       plan.template_id, b1, b2, plan.exposed_us / 1000.0,
		       plan.flags & KILN_PLAN_OVER_BUDGET ? " [over budget: nothing fits, best effort]"
		                                          : "",
		       plan.flags & KILN_PLAN_LOAD_BEYOND ? " [load beyond load.max_factor]" : "");
		printf("\n  %-3s %-28s %-10s %14s\n", "#", "unit", "action", "bytes");
		for (int32_t u = 0; u < plan.n_units; u++) {
			kiln_rt_unit_info ui;
			kiln_rt_unit_get(rt, q.layer, u, &ui);
			printf("  %-3d %-28s %-10s %14" PRIu64 "\n", u,
			       esc(ui.name, name, sizeof name),
			       kiln_rt_action_name(plan.actions[u]),
			       kiln_rt_unit_bytes(rt, q.layer, u, rows));
		}
	}
out:
	kiln_rt_close(rt);
	free(bytes);
	free(tokens);
	return rc;
}
