/* tests/kiln_test.c: helpers shared by the test suites (no tests here). */
#include "kiln_test.h"

#include "frontend/frontend.h"
#include "passes/passes.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *slurp(int fd, size_t *out_len)
{
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	cr_assert_not_null(buf);
	lseek(fd, 0, SEEK_SET);
	for (;;) {
		if (cap - len < 4096) {
			cap *= 2;
			buf = realloc(buf, cap);
			cr_assert_not_null(buf);
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	*out_len = len;
	return buf;
}

static int temp_fd(void)
{
	char path[] = "/tmp/kiln-test-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0, "mkstemp failed");
	unlink(path);
	return fd;
}

kt_run kt_kilnc(const char *const *args, const char *stdout_path)
{
	const char *argv[64];
	size_t n = 0;
	argv[n++] = KILN_KILNC;
	for (; args && args[n - 1] && n < 63; n++)
		argv[n] = args[n - 1];
	argv[n] = NULL;

	int out_fd = temp_fd(), err_fd = temp_fd();
	pid_t pid = fork();
	cr_assert(pid >= 0, "fork failed");
	if (pid == 0) {
		int fd = out_fd;
		if (stdout_path)
			fd = open(stdout_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0)
			_exit(127);
		dup2(fd, 1);
		dup2(err_fd, 2);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, 0);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0)
		;
	kt_run r;
	r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	r.out = slurp(out_fd, &r.out_len);
	r.err = slurp(err_fd, &r.err_len);
	close(out_fd);
	close(err_fd);
	return r;
}

int kt_sh(char **out, const char *fmt, ...)
{
	char cmd[16384];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(cmd, sizeof cmd - 8, fmt, ap);
	va_end(ap);
	cr_assert(n > 0 && (size_t)n < sizeof cmd - 8, "command too long");
	strcat(cmd, " 2>&1");
	FILE *p = popen(cmd, "r");
	cr_assert_not_null(p, "popen %s", cmd);
	size_t cap = 1 << 16, len = 0, got;
	char *buf = malloc(cap);
	cr_assert_not_null(buf);
	while ((got = fread(buf + len, 1, cap - len - 1, p)) > 0) {
		len += got;
		if (cap - len < 4096) {
			cap *= 2;
			buf = realloc(buf, cap);
			cr_assert_not_null(buf);
		}
	}
	buf[len] = '\0';
	int st = pclose(p);
	if (out)
		*out = buf;
	else
		free(buf);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void kt_run_free(kt_run *r)
{
	free(r->out);
	free(r->err);
	r->out = r->err = NULL;
}

char *kt_temp_file(const char *suffix, const void *data, size_t len)
{
	char *path = malloc(64);
	cr_assert_not_null(path);
	snprintf(path, 64, "/tmp/kiln-test-XXXXXX%s", suffix);
	int fd = mkstemps(path, (int)strlen(suffix));
	cr_assert(fd >= 0, "mkstemps failed");
	const char *p = data;
	while (len > 0) {
		ssize_t w = write(fd, p, len);
		cr_assert(w > 0, "write failed");
		p += w;
		len -= (size_t)w;
	}
	close(fd);
	return path;
}

size_t kt_count(const char *hay, const char *needle)
{
	size_t n = 0, k = strlen(needle);
	cr_assert_gt(k, 0, "kt_count: empty needle");
	for (const char *p = hay; (p = strchr(p, needle[0])); p++)
		n += strncmp(p, needle, k) == 0;
	return n;
}

const char *kt_src(const char *rel)
{
	static char buf[4096];
	snprintf(buf, sizeof buf, "%s/%s", KILN_SOURCE_DIR, rel);
	return buf;
}

void kt_model_init(kt_model *t)
{
	memset(t, 0, sizeof(*t));
	kiln_model *m = &t->m;
	m->path = "test.yaml";
	m->name = "test";
	m->layers = 4;
	m->dense_layers = 4;
	m->hidden = 64;
	m->ffn_hidden = 256;
	m->heads = 4;
	m->kv_heads = 4;
	m->head_dim = 16;
	m->vocab = 1000;
	m->seq_len = 128;
	m->attention = KILN_ATTN_FLASH;
	m->activation = KILN_FN_SWIGLU;
	m->moe_activation = KILN_FN_SWIGLU;
	m->activation_fn = m->moe_activation_fn = KILN_ACTFN_SWIGLU;
	/* The memory options of the hand calculations written before they
	 * existed: separate q, k, v, no saved rstd, probabilities on the expert
	 * output, int32 row map. Tests of the defaults set them (the frontend
	 * defaults are Megatron-Core's, docs/model-format.md). */
	m->fused_qkv = false;
	m->norm_saves_rstd = false;
	m->prob_apply = KILN_PROB_EXPERT_OUTPUT;
	m->moe_permute_fusion = true;
	m->micro_batch = 1;
	m->global_batch = 8;
	m->dtype = KILN_DTYPE_BF16;
	m->optimizer = KILN_OPTIM_ADAM;
	m->devices = 1;
	m->tp = m->pp = m->ep = m->vpp = 1;
	m->schedule = KILN_SCHED_1F1B;
	m->max_factor = 2.0;
	m->hw = (kiln_hardware){.name = "test",
	                        .source = "<test>",
	                        .memory_gib = 80,
	                        .reserved_gib = 4,
	                        .peak_tflops = 1000,
	                        .gemm_efficiency = 0.5,
	                        .hbm_gbps = 3000,
	                        .h2d_gbps = 25,
	                        .d2h_gbps = 25,
	                        .host_memory_gib = 1024,
	                        .devices_per_node = 8,
	                        .intra_node_gbps = 400,
	                        .inter_node_gbps = 50};
}

void kt_model_finish(kt_model *t)
{
	kiln_model *m = &t->m;
	int64_t c = m->pp * m->vpp;
	for (int64_t i = 0; i < c; i++)
		t->chunks[i] = m->layers / c + (i < m->layers % c ? 1 : 0);
	m->stage_layers = t->chunks;
	m->n_stage_layers = (size_t)c;
	if (!m->moe)
		m->dense_layers = m->layers;
	m->dp = m->devices / (m->tp * m->pp);
	m->edp = m->dp * m->tp / m->ep;
	m->micro_batches = m->global_batch / (m->micro_batch * m->dp);
}

kiln_ir_graph *kt_lower_ok(const kiln_model *m, kiln_arena **arena)
{
	*arena = kiln_arena_new();
	cr_assert_not_null(*arena);
	kiln_ir_graph *g = NULL;
	cr_assert_eq(kiln_pass_lower(m, *arena, &g), 0);
	cr_assert_not_null(g);
	cr_assert_eq(kiln_ir_graph_verify(g, stderr), 0);
	return g;
}

const char *const kt_shipped[KT_N_SHIPPED] = {
	"examples/models/tiny.yaml",          "examples/models/deepseek-v3-671b.yaml",
	"examples/models/kimi-k2-1t.yaml",    "examples/models/qwen3-235b-a22b.yaml",
	"examples/models/mixtral-8x22b.yaml", "examples/models/custom-moe-188b.yaml",
	"examples/models/llama3-8b-dense.yaml",
};

kiln_compilation kt_compile(const char *rel, int solver, kiln_arena **out_a)
{
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_model *m = NULL;
	cr_assert_eq(kiln_frontend_load_file(kt_src(rel), a, stderr, &m), 0, "%s", rel);
	kiln_compilation c = {.model = m, .arena = a, .solver = (kiln_solver)solver};
	cr_assert_eq(kiln_pipeline_compile(&c, NULL, NULL, NULL, stderr), 0, "%s", rel);
	*out_a = a;
	return c;
}

/* kt_compiled's cache: per model, one arena holding the loaded model and
 * each of its compilations. Static, so the memory stays reachable (no leak
 * report) until the process exits. */
#define KT_CACHE_MODELS 16
#define KT_CACHE_VARIANTS 8

static struct kt_cached_model {
	char rel[256];
	kiln_arena *arena;
	kiln_model *model;
	int n;
	struct kt_cached_compilation {
		int solver;
		bool no_offload;
		kiln_compilation c;
	} variants[KT_CACHE_VARIANTS];
} kt_cache[KT_CACHE_MODELS];
static int kt_cache_n;

const kiln_compilation *kt_compiled(const char *rel, int solver, bool no_offload)
{
	struct kt_cached_model *cm = NULL;
	for (int i = 0; i < kt_cache_n && !cm; i++)
		if (strcmp(kt_cache[i].rel, rel) == 0)
			cm = &kt_cache[i];
	if (!cm) {
		cr_assert_lt(kt_cache_n, KT_CACHE_MODELS, "kt_compiled: more than %d models",
		             KT_CACHE_MODELS);
		cr_assert_lt(strlen(rel), sizeof cm->rel, "kt_compiled: path too long: %s", rel);
		cm = &kt_cache[kt_cache_n];
		cm->arena = kiln_arena_new();
		cr_assert_not_null(cm->arena);
		cr_assert_eq(kiln_frontend_load_file(kt_src(rel), cm->arena, stderr, &cm->model), 0,
		             "%s", rel);
		strcpy(cm->rel, rel);
		kt_cache_n++;
	}
	for (int i = 0; i < cm->n; i++)
		if (cm->variants[i].solver == solver && cm->variants[i].no_offload == no_offload)
			return &cm->variants[i].c;
	cr_assert_lt(cm->n, KT_CACHE_VARIANTS, "kt_compiled: more than %d variants of %s",
	             KT_CACHE_VARIANTS, rel);
	struct kt_cached_compilation *v = &cm->variants[cm->n];
	v->solver = solver;
	v->no_offload = no_offload;
	v->c = (kiln_compilation){.model = cm->model,
	                          .arena = cm->arena,
	                          .solver = (kiln_solver)solver,
	                          .no_offload = no_offload};
	cr_assert_eq(kiln_pipeline_compile(&v->c, NULL, NULL, NULL, stderr), 0, "%s", rel);
	cm->n++;
	return &v->c;
}

void kt_slow(void)
{
	const char *tier = getenv("KILN_TEST_TIER");
	if (!tier || strcmp(tier, "full") == 0)
		return;
	if (strcmp(tier, "quick") == 0)
		cr_skip_test(
		    "slow: the quick tier (KILN_TEST_TIER=quick) skips it; make test runs it");
	cr_assert_fail("KILN_TEST_TIER is quick or full (or unset: full), got '%s'", tier);
}

double kt_fair_scale(const kiln_rt_stage_info *si)
{
	double want = ceil(si->inflight < 1 ? 1 : si->inflight) * (double)si->steady_bytes;
	double room =
	    (double)si->capacity_bytes - (double)si->static_bytes - (double)si->transient_bytes;
	return want <= 0 ? 1 : room > 0 ? room / want : 0;
}
