/* tests/test_mlir.c: the MLIR view (codegen/mlir.c) and `kilnc viz`.
 *
 * Every shipped model is emitted and handed to mlir-opt-16, an MLIR parser
 * kiln does not control; the schedule read back must equal the compiled one
 * field by field, doubles bit for bit. A hand-built schedule with hostile
 * doubles and names checks exactness where the compiler's own numbers are
 * tame. Bad inputs to the reader each name their fault.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "kiln_test.h"
#include "passes/passes.h"

#define RUN(...) kt_kilnc((const char *const[]){__VA_ARGS__, NULL}, NULL)


/* kiln_mlir_emit into memory; asserts success. Caller frees. */
static char *emit(const kiln_compilation *c, size_t *out_len)
{
	char *text = NULL, *msg = NULL;
	size_t len = 0, msg_len = 0;
	FILE *f = open_memstream(&text, &len), *err = open_memstream(&msg, &msg_len);
	cr_assert(f && err);
	int rc = kiln_mlir_emit(c, f, err);
	fclose(f);
	fclose(err);
	cr_assert_eq(rc, 0, "emit failed: %s", msg);
	cr_assert_eq(msg_len, 0, "emit wrote messages: %s", msg);
	free(msg);
	*out_len = len;
	return text;
}

/* kiln_mlir_read_schedule; returns its status, the messages in *out_msg. */
static int read_back(const char *text, size_t len, kiln_arena *a, kiln_plan_schedule *s,
                     char **out_msg)
{
	size_t msg_len = 0;
	*out_msg = NULL;
	FILE *err = open_memstream(out_msg, &msg_len);
	cr_assert_not_null(err);
	int rc = kiln_mlir_read_schedule(text, len, a, s, err);
	fclose(err);
	return rc;
}

static bool same_double(double x, double y)
{
	return memcmp(&x, &y, sizeof x) == 0;
}

static const char *str_or_empty(const char *s)
{
	return s ? s : "";
}

/* Field-by-field equality, doubles by their bits. */
static void assert_same_schedule(const kiln_plan_schedule *x, const kiln_plan_schedule *y,
                                 const char *what)
{
	cr_assert_str_eq(str_or_empty(x->model), str_or_empty(y->model), "%s: model", what);
	cr_assert_eq(x->n_templates, y->n_templates, "%s: template count", what);
	cr_assert_eq(x->n_stages, y->n_stages, "%s: timeline count", what);
	for (int32_t j = 0; j < x->n_templates; j++) {
		const kiln_template *a = &x->templates[j], *b = &y->templates[j];
		cr_assert(a->stage == b->stage && a->kind == b->kind && a->plan == b->plan &&
		              a->n_tasks == b->n_tasks,
		          "%s: template %d header", what, (int)j);
		cr_assert(same_double(a->load_factor, b->load_factor) &&
		              same_double(a->makespan_us, b->makespan_us) &&
		              same_double(a->serial_us, b->serial_us) &&
		              same_double(a->base_us, b->base_us),
		          "%s: template %d times", what, (int)j);
		for (int32_t i = 0; i < a->n_tasks; i++) {
			const kiln_task *p = &a->tasks[i], *q = &b->tasks[i];
			cr_assert_str_eq(str_or_empty(p->name), str_or_empty(q->name),
			                 "%s: template %d task %d name", what, (int)j, (int)i);
			cr_assert(p->kind == q->kind && p->stream == q->stream &&
			              p->chain == q->chain && p->index == q->index &&
			              p->n_deps == q->n_deps,
			          "%s: template %d task %d fields", what, (int)j, (int)i);
			cr_assert(same_double(p->duration_us, q->duration_us) &&
			              same_double(p->start_us, q->start_us) &&
			              same_double(p->end_us, q->end_us) &&
			              same_double(p->mem_bytes, q->mem_bytes),
			          "%s: template %d task %d times (%a vs %a)", what, (int)j, (int)i,
			          p->start_us, q->start_us);
			for (int32_t d = 0; d < p->n_deps; d++)
				cr_assert_eq(p->deps[d], q->deps[d],
				             "%s: template %d task %d dep %d", what, (int)j, (int)i,
				             (int)d);
		}
	}
	for (int32_t s = 0; s < x->n_stages; s++) {
		const kiln_stage_timeline *a = &x->stages[s], *b = &y->stages[s];
		cr_assert(a->stage == b->stage && a->n_layers == b->n_layers, "%s: timeline %d",
		          what, (int)s);
		for (int32_t l = 0; l < a->n_layers; l++)
			cr_assert(a->layer[l] == b->layer[l] &&
			              a->template_id[l] == b->template_id[l],
			          "%s: timeline %d layer %d", what, (int)s, (int)l);
	}
}

/* Runs mlir-opt-16 --allow-unregistered-dialect on path; returns its exit
 * status (-1 when it did not exit). Its output is discarded, its errors
 * kept in the test log. */
static int mlir_opt(const char *path)
{
	pid_t pid = fork();
	cr_assert(pid >= 0, "fork failed");
	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY);
		if (fd >= 0)
			dup2(fd, 1);
		execl(KILN_MLIR_OPT, KILN_MLIR_OPT, "--allow-unregistered-dialect", path, "-o",
		      "/dev/null", (char *)NULL);
		_exit(127);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0)
		;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp_file(const char *path, size_t *out_len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot open %s", path);
	char *buf = NULL;
	size_t len = 0, cap = 0;
	for (;;) {
		if (cap - len < 65536) {
			cap = cap ? cap * 2 : 65536;
			buf = realloc(buf, cap);
			cr_assert_not_null(buf);
		}
		size_t n = fread(buf + len, 1, cap - len, f);
		if (n == 0)
			break;
		len += n;
	}
	fclose(f);
	*out_len = len;
	return buf;
}

/* ------------------------------------------------------------ every shipped model */

static void emit_check_and_read_back(const char *rel)
{
	kiln_arena *a;
	kiln_compilation c = kt_compile(rel, KILN_SOLVER_DP, &a);
	cr_assert_not_null(c.schedule, "%s: the interleave pass left no schedule", rel);
	size_t len;
	char *text = emit(&c, &len);
	cr_assert(len > 0 && text[len - 1] == '\n', "%s", rel);
	cr_assert_not_null(strstr(text, "\"kiln.graph\""), "%s", rel);
	cr_assert_not_null(strstr(text, "\"kiln.schedule\""), "%s", rel);
	cr_assert_not_null(strstr(text, "kiln.version = 1 : i64"), "%s", rel);

	char *path = kt_temp_file(".mlir", text, len);
	cr_assert_eq(mlir_opt(path), 0, "%s: mlir-opt-16 rejected %s", rel, path);
	unlink(path);
	free(path);

	kiln_plan_schedule back;
	char *msg;
	cr_assert_eq(read_back(text, len, a, &back, &msg), 0, "%s: %s", rel, msg);
	free(msg);
	assert_same_schedule(c.schedule, &back, rel);
	free(text);
	kiln_arena_free(a);
}

/* One test per model, so Criterion runs them in parallel; together a loop
 * over every shipped model, so slow (mlir_emit and mlir_viz cover tiny in
 * the quick tier). */
#define MODEL_TEST(id, file)                                                                       \
	Test(mlir_models, id, .timeout = 300, .init = kt_slow)                                     \
	{                                                                                          \
		emit_check_and_read_back("examples/models/" file);                                 \
	}
MODEL_TEST(tiny, "tiny.yaml")
MODEL_TEST(deepseek_v3, "deepseek-v3-671b.yaml")
MODEL_TEST(kimi_k2, "kimi-k2-1t.yaml")
MODEL_TEST(qwen3, "qwen3-235b-a22b.yaml")
MODEL_TEST(mixtral, "mixtral-8x22b.yaml")
MODEL_TEST(custom_moe, "custom-moe-188b.yaml")
MODEL_TEST(llama3_dense, "llama3-8b-dense.yaml")

Test(mlir_emit, graph_units_tables_and_pool_are_all_there)
{
	kiln_arena *a;
	kiln_compilation c = kt_compile("examples/models/tiny.yaml", KILN_SOLVER_DP, &a);
	size_t len;
	char *text = emit(&c, &len);
	/* Count ops by their quoted names: the graph's sizes come from the
	 * compilation, counted independently of the emitter. */
	struct {
		const char *op;
		long want;
	} want[] = {
	    {"\"kiln.stage\"", c.graph->n_stages},
	    {"\"kiln.layer\"", c.graph->n_layers},
	    {"\"kiln.op\"", c.graph->n_ops},
	    {"\"kiln.tensor\"", c.graph->n_tensors},
	    {"\"kiln.units\"", c.n_sets},
	    {"\"kiln.table\"", (long)c.n_sets * c.n_buckets},
	    {"\"kiln.plan\"", c.pool->n},
	    {"\"kiln.budget\"", c.graph->n_stages},
	    {"\"kiln.baseline\"", KILN_BASELINE_COUNT},
	    {"\"kiln.template\"", c.schedule->n_templates},
	    {"\"kiln.timeline\"", c.schedule->n_stages},
	};
	long units = 0, points = 0, tasks = 0;
	for (int32_t i = 0; i < c.n_sets; i++)
		units += c.sets[i].n_units;
	for (int32_t i = 0; i < c.n_sets * c.n_buckets; i++)
		points += c.tables[i].n_points;
	for (int32_t j = 0; j < c.schedule->n_templates; j++)
		tasks += c.schedule->templates[j].n_tasks;
	for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
		long n = (long)kt_count(text, want[k].op);
		cr_assert_eq(n, want[k].want, "%s: %ld ops, want %ld", want[k].op, n, want[k].want);
	}
	long n_unit = (long)kt_count(text, "\"kiln.unit\""),
	     n_point = (long)kt_count(text, "\"kiln.point\""),
	     n_task = (long)kt_count(text, "\"kiln.task\"");
	cr_assert_eq(n_unit, units);
	cr_assert_eq(n_point, points);
	cr_assert_eq(n_task, tasks);
	free(text);
	kiln_arena_free(a);
}

Test(mlir_emit, is_deterministic)
{
	kiln_arena *a;
	kiln_compilation c = kt_compile("examples/models/tiny.yaml", KILN_SOLVER_DP, &a);
	size_t l1, l2;
	char *t1 = emit(&c, &l1), *t2 = emit(&c, &l2);
	cr_assert(l1 == l2 && memcmp(t1, t2, l1) == 0);
	free(t1);
	free(t2);
	kiln_arena_free(a);
}

/* ------------------------------------------------------------ exactness */

/* Doubles whose shortest decimal form is long or absent, names that need
 * escaping. Times need not be consistent for the reader, only finite. */
static const double HARD[] = {0.1,
                              1.0 / 3.0,
                              5e-324, /* the smallest subnormal */
                              DBL_MIN,
                              DBL_MAX,
                              1.0000000000000002, /* 1 + ulp */
                              123456789.12345679,
                              0.30000000000000004,
                              1e300,
                              2.5,
                              -0.0};
#define N_HARD (sizeof HARD / sizeof HARD[0])

static kiln_task hard_tasks[N_HARD];
static int32_t hard_deps[N_HARD][2];
static kiln_template hard_templates[2];
/* Each timeline names its own stage's templates (passes/verify.c). */
static int32_t tl_layers[3] = {7, 8, 9}, tl_templates[3] = {0, 0, 0};
static int32_t tl1_layers[1] = {10}, tl1_templates[1] = {1};
static kiln_stage_timeline hard_tl[2];

static kiln_plan_schedule hard_schedule(void)
{
	static const char *const names[] = {"a\"b",
	                                    "back\\slash",
	                                    "new\nline",
	                                    "tab\there",
	                                    "utf-8 \xc3\xa9\xe2\x86\x92",
	                                    "\x7f\x01",
	                                    "",
	                                    "{}()<>",
	                                    "// not a comment",
	                                    "x",
	                                    "y"};
	for (size_t i = 0; i < N_HARD; i++) {
		kiln_task *t = &hard_tasks[i];
		t->name = names[i % (sizeof names / sizeof names[0])];
		t->kind = (kiln_task_kind)(i % KILN_TASK_KIND_COUNT);
		t->stream = (kiln_stream)(i % KILN_STREAM_COUNT);
		t->chain = (int32_t)(i % 2);
		t->index = (int32_t)(i / 2);
		t->duration_us = fabs(HARD[i]);
		t->start_us = HARD[(i + 1) % N_HARD]; /* -0.0 included: it is not < 0 */
		t->end_us = t->start_us + t->duration_us;
		t->mem_bytes = fabs(HARD[(i + 3) % N_HARD]);
		t->n_deps = (int32_t)(i % 3 == 2 ? 2 : i % 3);
		hard_deps[i][0] = (int32_t)((i + 1) % N_HARD);
		hard_deps[i][1] = (int32_t)((i + 2) % N_HARD);
		t->deps = t->n_deps ? hard_deps[i] : NULL;
	}
	hard_templates[0] = (kiln_template){.stage = 0,
	                                    .kind = KILN_LAYER_MOE,
	                                    .plan = 42,
	                                    .load_factor = 1.05,
	                                    .tasks = hard_tasks,
	                                    .n_tasks = N_HARD,
	                                    .makespan_us = 1.0 / 7.0,
	                                    .serial_us = DBL_MAX,
	                                    .base_us = 5e-324};
	hard_templates[1] = (kiln_template){.stage = 1, .kind = KILN_LAYER_DENSE, .plan = -1};
	hard_tl[0] = (kiln_stage_timeline){
	    .stage = 0, .n_layers = 3, .layer = tl_layers, .template_id = tl_templates};
	hard_tl[1] = (kiln_stage_timeline){
	    .stage = 1, .n_layers = 1, .layer = tl1_layers, .template_id = tl1_templates};
	return (kiln_plan_schedule){.model = "m\"odel\\ \xe2\x9c\x93",
	                            .templates = hard_templates,
	                            .n_templates = 2,
	                            .stages = hard_tl,
	                            .n_stages = 2};
}

Test(mlir_exact, hard_doubles_and_names_round_trip_bit_for_bit)
{
	kiln_arena *a;
	kiln_compilation c = kt_compile("examples/models/tiny.yaml", KILN_SOLVER_DP, &a);
	kiln_plan_schedule s = hard_schedule();
	c.schedule = &s;
	size_t len;
	char *text = emit(&c, &len);
	kiln_plan_schedule back;
	char *msg;
	cr_assert_eq(read_back(text, len, a, &back, &msg), 0, "%s", msg);
	free(msg);
	assert_same_schedule(&s, &back, "hard");
	/* -0.0 and 0.0 differ in their bits; the comparison above told them apart. */
	cr_assert(signbit(back.templates[0].tasks[N_HARD - 2].start_us));
	char *path = kt_temp_file(".mlir", text, len);
	cr_assert_eq(mlir_opt(path), 0, "mlir-opt-16 rejected %s", path);
	unlink(path);
	free(path);
	free(text);
	kiln_arena_free(a);
}

/* ------------------------------------------------------------ bad input */

/* Asserts that text is refused with a message containing want. */
static void expect_refused(const char *what, const char *text, size_t len, const char *want)
{
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_plan_schedule s;
	memset(&s, 0x5a, sizeof s);
	char *msg;
	cr_assert_eq(read_back(text, len, a, &s, &msg), -1, "%s: accepted", what);
	cr_assert_not_null(msg);
	cr_assert_not_null(strstr(msg, want), "%s: message lacks '%s': %s", what, want, msg);
	cr_assert(s.n_templates == 0 && s.templates == NULL && s.n_stages == 0,
	          "%s: out not cleared", what);
	free(msg);
	kiln_arena_free(a);
}

/* A minimal valid schedule, then variations of it. */
#define TASK(deps, extra)                                                                          \
	"\"kiln.task\"() {chain = 0 : i64, deps = array<i32" deps ">, duration_us = 1.0 : f64, "   \
	"end_us = 1.0 : f64, index = 0 : i64, kind = \"forward\", mem_bytes = 0.0 : f64, "         \
	"name = \"t\", start_us = 0.0 : f64, stream = \"compute\"" extra "} : () -> ()\n"
#define TEMPLATE(body, extra)                                                                      \
	"\"kiln.template\"() ({\n" body "}) {base_us = 1.0 : f64, id = 0 : i64, kind = \"moe\", "  \
	"load_factor = 1.0 : f64, makespan_us = 1.0 : f64, plan = 0 : i64, serial_us = 2.0 : "     \
	"f64, "                                                                                    \
	"stage = 0 : i64" extra "} : () -> ()\n"
#define SCHEDULE(body) "\"kiln.schedule\"() ({\n" body "}) {model = \"m\"} : () -> ()\n"
#define TIMELINE(tpl)                                                                              \
	"\"kiln.timeline\"() {layers = array<i32: 3>, stage = 0 : i64, "                           \
	"templates = array<i32: " tpl ">} : () -> ()\n"

/* The task after TASK in its chain: position 1, from 1 to 2. */
#define TASK2(deps)                                                                                \
	"\"kiln.task\"() {chain = 0 : i64, deps = array<i32" deps ">, duration_us = 1.0 : f64, "   \
	"end_us = 2.0 : f64, index = 1 : i64, kind = \"forward\", mem_bytes = 0.0 : f64, "         \
	"name = \"u\", start_us = 1.0 : f64, stream = \"compute\"} : () -> ()\n"

static const char VALID[] = SCHEDULE(TEMPLATE(TASK("", "") TASK2(": 0"), "") TIMELINE("0"));

Test(mlir_read, minimal_schedule_is_read)
{
	kiln_arena *a = kiln_arena_new();
	kiln_plan_schedule s;
	char *msg;
	cr_assert_eq(read_back(VALID, strlen(VALID), a, &s, &msg), 0, "%s", msg);
	free(msg);
	cr_assert_str_eq(s.model, "m");
	cr_assert_eq(s.n_templates, 1);
	cr_assert_eq(s.templates[0].n_tasks, 2);
	cr_assert_eq(s.templates[0].kind, KILN_LAYER_MOE);
	cr_assert_eq(s.templates[0].tasks[1].n_deps, 1);
	cr_assert_eq(s.templates[0].tasks[1].deps[0], 0);
	cr_assert_eq(s.n_stages, 1);
	cr_assert_eq(s.stages[0].layer[0], 3);
	kiln_arena_free(a);
}

Test(mlir_read, garbage_is_not_mlir)
{
	static const char bytes[] = "\x7f"
	                            "ELF\x02\x01\x01\x00garbage \xff\xfe {{{ ]]";
	expect_refused("binary", bytes, sizeof bytes - 1, "not valid MLIR");
	expect_refused("words", "hello world", 11, "not valid MLIR");
	expect_refused("truncated", VALID, strlen(VALID) / 2, "not valid MLIR");
}

Test(mlir_read, empty_input)
{
	expect_refused("empty", "", 0, "empty input");
	expect_refused("null", NULL, 0, "empty input");
}

Test(mlir_read, mlir_without_kiln_ops)
{
	static const char t[] = "\"foo.bar\"() {x = 1 : i64} : () -> ()\n";
	expect_refused("foreign", t, strlen(t), "no kiln ops");
	static const char m[] = "module {\n}\n";
	expect_refused("empty module", m, strlen(m), "no kiln ops");
	static const char g[] = "\"kiln.graph\"() ({\n}) {model = \"m\"} : () -> ()\n";
	expect_refused("no schedule", g, strlen(g), "no kiln.schedule");
}

Test(mlir_read, dep_out_of_range)
{
	static const char t[] = SCHEDULE(TEMPLATE(TASK("", "") TASK(": 2", ""), ""));
	expect_refused("dep 2 of 2 tasks", t, strlen(t), "'deps' element 0 is 2, outside [0, 1]");
	static const char n[] = SCHEDULE(TEMPLATE(TASK(": -1", ""), ""));
	expect_refused("negative dep", n, strlen(n), "'deps' element 0 is -1");
	static const char self[] = SCHEDULE(TEMPLATE(TASK("", "") TASK(": 1", ""), ""));
	expect_refused("self dep", self, strlen(self), "depends on itself");
}

Test(mlir_read, template_id_out_of_range)
{
	static const char t[] = SCHEDULE(TEMPLATE(TASK("", ""), "") TIMELINE("1"));
	expect_refused("timeline", t, strlen(t), "'templates' element 0 is 1, outside [0, 0]");
	static const char none[] = SCHEDULE(TIMELINE("0"));
	expect_refused("no templates", none, strlen(none), "has none");
}

Test(mlir_read, missing_and_mistyped_attributes)
{
	/* A task without duration_us: rebuild TASK by hand. */
	static const char missing[] = SCHEDULE(TEMPLATE(
	    "\"kiln.task\"() {chain = 0 : i64, deps = array<i32>, end_us = 1.0 : f64, index = 0 : "
	    "i64, kind = \"forward\", mem_bytes = 0.0 : f64, name = \"t\", start_us = 0.0 : f64, "
	    "stream = \"compute\"} : () -> ()\n",
	    ""));
	expect_refused("missing", missing, strlen(missing), "missing attribute 'duration_us'");
	/* Attributes given twice are refused by MLIR itself; the second of a
	 * dictionary would otherwise win. Instead mistype through extra names
	 * the templates do not use elsewhere: */
	static const char i32[] = SCHEDULE(
	    "\"kiln.template\"() ({\n}) {base_us = 1.0 : f64, id = 0 : i32, kind = \"moe\", "
	    "load_factor = 1.0 : f64, makespan_us = 1.0 : f64, plan = 0 : i64, serial_us = 2.0 : "
	    "f64, stage = 0 : i64} : () -> ()\n");
	expect_refused("i32 id", i32, strlen(i32), "'id' must be an i64 integer");
	static const char f32[] = SCHEDULE(
	    "\"kiln.template\"() ({\n}) {base_us = 1.0 : f32, id = 0 : i64, kind = \"moe\", "
	    "load_factor = 1.0 : f64, makespan_us = 1.0 : f64, plan = 0 : i64, serial_us = 2.0 : "
	    "f64, stage = 0 : i64} : () -> ()\n");
	expect_refused("f32", f32, strlen(f32), "'base_us' must be an f64 float");
	static const char kind[] = SCHEDULE(TEMPLATE(
	    "\"kiln.task\"() {chain = 0 : i64, deps = array<i32>, duration_us = 1.0 : f64, end_us "
	    "= "
	    "1.0 : f64, index = 0 : i64, kind = \"forward\", mem_bytes = 0.0 : f64, name = \"t\", "
	    "start_us = 0.0 : f64, stream = \"pcie\"} : () -> ()\n",
	    ""));
	expect_refused("stream", kind, strlen(kind), "'stream' is \"pcie\"");
	static const char str[] = SCHEDULE(TEMPLATE(
	    "\"kiln.task\"() {chain = 0 : i64, deps = array<i64: 0>, duration_us = 1.0 : f64, "
	    "end_us = 1.0 : f64, index = 0 : i64, kind = \"forward\", mem_bytes = 0.0 : f64, "
	    "name = 7 : i64, start_us = 0.0 : f64, stream = \"compute\"} : () -> ()\n",
	    ""));
	expect_refused("name", str, strlen(str), "'name' must be a string");
	static const char nan[] = SCHEDULE(TEMPLATE(
	    "\"kiln.task\"() {chain = 0 : i64, deps = array<i32>, duration_us = 0x7FF8000000000000 "
	    ": "
	    "f64, end_us = 1.0 : f64, index = 0 : i64, kind = \"forward\", mem_bytes = 0.0 : f64, "
	    "name = \"t\", start_us = 0.0 : f64, stream = \"compute\"} : () -> ()\n",
	    ""));
	expect_refused("nan", nan, strlen(nan), "'duration_us' is nan");
	static const char chain[] = SCHEDULE(TEMPLATE(
	    "\"kiln.task\"() {chain = 2 : i64, deps = array<i32>, duration_us = 1.0 : f64, end_us "
	    "= "
	    "1.0 : f64, index = 0 : i64, kind = \"forward\", mem_bytes = 0.0 : f64, name = \"t\", "
	    "start_us = 0.0 : f64, stream = \"compute\"} : () -> ()\n",
	    ""));
	expect_refused("chain", chain, strlen(chain), "'chain' is 2, outside [0, 1]");
}

Test(mlir_read, structure_errors)
{
	static const char two[] = SCHEDULE("") SCHEDULE("");
	expect_refused("two schedules", two, strlen(two), "a second kiln.schedule");
	static const char stray[] = SCHEDULE("\"kiln.graph\"() : () -> ()\n");
	expect_refused("stray op", stray, strlen(stray), "unexpected op 'kiln.graph'");
	static const char ver[] =
	    "module attributes {kiln.version = 99 : i64} {\n" SCHEDULE("") "}\n";
	expect_refused("version", ver, strlen(ver), "kiln.version is not 1");
	static const char id[] = SCHEDULE(TEMPLATE("", "") TEMPLATE("", ""));
	expect_refused("ids", id, strlen(id), "'id' is 0, outside [1, 1]");
}

/* passes/verify.c's schedule invariants hold on what viz reads: one
 * timeline per stage in stage order, each naming its stage's templates. */
#define TIMELINE_AT(stage, tpl)                                                                    \
	"\"kiln.timeline\"() {layers = array<i32: 3>, stage = " stage " : i64, "                   \
	"templates = array<i32: " tpl ">} : () -> ()\n"

Test(mlir_read, timelines_in_stage_order_name_their_stages_templates)
{
	static const char far[] = SCHEDULE(TEMPLATE(TASK("", ""), "") TIMELINE_AT("0", "0")
	                                       TIMELINE_AT("2147483647", "0"));
	expect_refused("stage 2^31 - 1", far, strlen(far),
	               "kiln.timeline 1: stage 2147483647, expected 1 (one timeline per stage");
	static const char dup[] =
	    SCHEDULE(TEMPLATE(TASK("", ""), "") TIMELINE_AT("0", "0") TIMELINE_AT("0", "0"));
	expect_refused("stage twice", dup, strlen(dup), "kiln.timeline 1: stage 0, expected 1");
	static const char other[] =
	    SCHEDULE(TEMPLATE(TASK("", ""), "") TIMELINE_AT("0", "0") TIMELINE_AT("1", "0"));
	expect_refused("another stage's template", other, strlen(other),
	               "kiln.timeline 1: layer 3 names template 0 of stage 0");
	static const char none[] = SCHEDULE(TEMPLATE(TASK("", ""), ""));
	expect_refused("template of no stage", none, strlen(none),
	               "kiln.template 0: stage 0, but there are 0 timelines");
}

Test(mlir_read, deep_nesting_is_refused_without_recursion)
{
	size_t n = 1u << 20;
	char *t = malloc(2 * n);
	cr_assert_not_null(t);
	for (size_t i = 0; i < n; i++) {
		t[i] = '[';
		t[n + i] = ']';
	}
	expect_refused("brackets", t, 2 * n, "nest deeper");
	free(t);
}

/* MLIR's lexer skips a raw NUL between tokens like a blank, and a string
 * may hold an escaped one: neither may crash the reader; a name ends at it. */
Test(mlir_read, embedded_nul_is_harmless)
{
	static const char t[] = "\"kiln.schedule\"() ({\n}) {model = \"a\\00b\"}\0 : () -> ()\n";
	kiln_arena *a = kiln_arena_new();
	kiln_plan_schedule s;
	char *msg;
	cr_assert_eq(read_back(t, sizeof t - 1, a, &s, &msg), 0, "%s", msg);
	free(msg);
	cr_assert_str_eq(s.model, "a");
	kiln_arena_free(a);
}

/* ------------------------------------------------------------ kilnc viz */

Test(mlir_viz, usage_errors_exit_2)
{
	const char *const *cases[] = {
	    (const char *const[]){"viz", NULL},
	    (const char *const[]){"viz", "plan.mlir", NULL},
	    (const char *const[]){"viz", "plan.mlir", "-o", NULL},
	    (const char *const[]){"viz", "plan.mlir", "-o", "out.png", NULL},
	    (const char *const[]){"viz", "plan.mlir", "-o", "svg", NULL},
	    (const char *const[]){"viz", "plan.kiln", "-o", "out.svg", NULL},
	    (const char *const[]){"viz", "a.mlir", "b.mlir", "-o", "out.svg", NULL},
	    (const char *const[]){"viz", "plan.mlir", "--bogus", "-o", "out.svg", NULL},
	    (const char *const[]){"compile", "m.yaml", "--emit-mlir", "x", "--emit-svg", "x", NULL},
	    (const char *const[]){"compile", "m.yaml", "--emit-mlir", NULL},
	    (const char *const[]){"compile", "m.yaml", "--emit-trace=a", "--emit-trace=b", NULL},
	    (const char *const[]){"compile", "m.yaml", "--emit-bogus", "x", NULL},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		kt_run r = kt_kilnc(cases[i], NULL);
		cr_assert_eq(r.status, 2, "case %zu: status %d, stderr: %s", i, r.status, r.err);
		cr_assert(r.err_len > 0, "case %zu: no message", i);
		cr_assert_eq(r.out_len, 0, "case %zu: wrote to stdout", i);
		kt_run_free(&r);
	}
	kt_run r = RUN("viz", "plan.kiln", "-o", "out.svg");
	cr_assert_not_null(strstr(r.err, "cannot draw it"), "%s", r.err);
	kt_run_free(&r);
}

/* `kilnc viz IN -o OUT` must exit 1 with want on stderr and leave no OUT. */
static void expect_viz_bad(const char *in, const char *want)
{
	char out[] = "/tmp/kiln-viz-XXXXXX";
	cr_assert_not_null(mkdtemp(out));
	char target[64];
	snprintf(target, sizeof target, "%s/out.svg", out);
	kt_run r = RUN("viz", in, "-o", target);
	cr_assert_eq(r.status, 1, "%s: status %d, stderr: %s", in, r.status, r.err);
	cr_assert_not_null(strstr(r.err, want), "%s: stderr lacks '%s': %s", in, want, r.err);
	cr_assert_eq(access(target, F_OK), -1, "%s: wrote %s", in, target);
	cr_assert_eq(rmdir(out), 0, "%s: left files in %s", in, out); /* no temporary left */
	kt_run_free(&r);
}

Test(mlir_viz, bad_files_exit_1)
{
	expect_viz_bad("/nonexistent/plan.mlir", "cannot open");
	expect_viz_bad("/tmp", "not a regular file");
	char *garbage = kt_temp_file(".mlir", "garbage {", 9);
	expect_viz_bad(garbage, "not valid MLIR");
	unlink(garbage);
	free(garbage);
	static const char foreign[] = "\"foo.bar\"() : () -> ()\n";
	char *f = kt_temp_file(".mlir", foreign, strlen(foreign));
	expect_viz_bad(f, "no kiln ops");
	/* The file name prefixes the reader's messages. */
	kt_run r = RUN("viz", f, "-o", "/tmp/kiln-never.svg");
	cr_assert(strncmp(r.err, f, strlen(f)) == 0, "stderr: %s", r.err);
	kt_run_free(&r);
	unlink(f);
	free(f);
	static const char dep[] = SCHEDULE(TEMPLATE(TASK(": 5", ""), ""));
	char *d = kt_temp_file(".mlir", dep, strlen(dep));
	expect_viz_bad(d, ":3:");
	unlink(d);
	free(d);
}

/* viz of a library-emitted file draws what kiln_trace_write draws from the
 * schedule in memory. */
Test(mlir_viz, redraws_the_emitted_schedule)
{
	kiln_arena *a;
	kiln_compilation c = kt_compile("examples/models/tiny.yaml", KILN_SOLVER_DP, &a);
	size_t len;
	char *text = emit(&c, &len);
	char *in = kt_temp_file(".mlir", text, len);
	free(text);
	char *want = NULL;
	size_t want_len = 0;
	FILE *f = open_memstream(&want, &want_len);
	cr_assert_eq(kiln_trace_write(c.schedule, f), 0);
	fclose(f);
	char out[] = "/tmp/kiln-viz-XXXXXX";
	cr_assert_not_null(mkdtemp(out));
	char target[64];
	snprintf(target, sizeof target, "%s/t.json", out);
	kt_run r = RUN("viz", in, "-o", target);
	cr_assert_eq(r.status, 0, "stderr: %s", r.err);
	kt_run_free(&r);
	size_t got_len;
	char *got = slurp_file(target, &got_len);
	cr_assert(got_len == want_len && memcmp(got, want, got_len) == 0,
	          "viz output differs from kiln_trace_write (%zu vs %zu bytes)", got_len, want_len);
	struct stat st;
	cr_assert_eq(stat(target, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0666 & ~(unsigned)umask(022), "mode %o", st.st_mode & 0777);
	unlink(target);
	rmdir(out);
	unlink(in);
	free(in);
	free(got);
	free(want);
	kiln_arena_free(a);
}

/* The round trip the issue names: compile --emit-trace and viz of
 * compile --emit-mlir give the same bytes; likewise for SVG. */
Test(mlir_viz, viz_of_emitted_mlir_equals_emitted_views, .timeout = 120)
{
	char dir[] = "/tmp/kiln-rt-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char mlir[64], trace[64], svg[64], vtrace[64], vsvg[64];
	snprintf(mlir, sizeof mlir, "%s/p.mlir", dir);
	snprintf(trace, sizeof trace, "%s/t.json", dir);
	snprintf(svg, sizeof svg, "%s/s.svg", dir);
	snprintf(vtrace, sizeof vtrace, "%s/vt.json", dir);
	snprintf(vsvg, sizeof vsvg, "%s/vs.svg", dir);
	kt_run r = RUN("compile", kt_src("examples/models/tiny.yaml"), "--emit-mlir", mlir,
	               "--emit-trace", trace, "--emit-svg", svg);
	cr_assert_eq(r.status, 0, "stderr: %s", r.err);
	kt_run_free(&r);
	cr_assert_eq(mlir_opt(mlir), 0);
	r = RUN("viz", mlir, "-o", vtrace);
	cr_assert_eq(r.status, 0, "stderr: %s", r.err);
	kt_run_free(&r);
	r = RUN("viz", mlir, "--output", vsvg);
	cr_assert_eq(r.status, 0, "stderr: %s", r.err);
	kt_run_free(&r);
	const char *pairs[][2] = {{trace, vtrace}, {svg, vsvg}};
	for (int i = 0; i < 2; i++) {
		size_t la, lb;
		char *x = slurp_file(pairs[i][0], &la), *y = slurp_file(pairs[i][1], &lb);
		cr_assert(la > 0 && la == lb && memcmp(x, y, la) == 0, "%s and %s differ",
		          pairs[i][0], pairs[i][1]);
		free(x);
		free(y);
	}
	const char *all[] = {mlir, trace, svg, vtrace, vsvg};
	for (int i = 0; i < 5; i++)
		unlink(all[i]);
	cr_assert_eq(rmdir(dir), 0, "temporary files left in %s", dir);
}

Test(mlir_viz, unwritable_view_fails_and_leaves_nothing)
{
	kt_run r = RUN("compile", kt_src("examples/models/tiny.yaml"), "--emit-mlir",
	               "/nonexistent-dir/p.mlir");
	cr_assert_eq(r.status, 1, "stderr: %s", r.err);
	cr_assert_not_null(strstr(r.err, "cannot write /nonexistent-dir/p.mlir"), "%s", r.err);
	cr_assert_eq(r.out_len, 0, "wrote to stdout: %s", r.out);
	kt_run_free(&r);
}

Test(mlir_viz, help_describes_viz_and_emit_flags)
{
	kt_run r = RUN("help", "viz");
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "usage: kilnc viz PLAN.mlir -o OUT.svg|OUT.json"));
	kt_run_free(&r);
	r = RUN("compile", "--help");
	cr_assert_not_null(strstr(r.out, "--emit-mlir F"));
	cr_assert_not_null(strstr(r.out, "--emit-trace F"));
	cr_assert_not_null(strstr(r.out, "--emit-svg F"));
	kt_run_free(&r);
	r = RUN("--help");
	cr_assert_not_null(strstr(r.out, "viz PLAN.mlir"));
	kt_run_free(&r);
}
