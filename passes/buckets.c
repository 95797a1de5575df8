/* passes/buckets.c: the load buckets every plan table is built at
 * (docs/cost-model.md, "Plan tables"). Below the passes that read them
 * (plan, interleave, budget, baselines) and the views and the simulator. */
#include <string.h>

#include "passes/passes.h"

int kiln_plan_buckets(double max_factor, kiln_arena *a, double **out_edges, int32_t *out_n)
{
	/* Coarse below the steady state, where loads are rare and cheap to
	 * over-provision; fine just above 1.0, where 97% of iterations live
	 * (DESIGN.md section 1); 0.1 apart in the spike range. */
	double tmp[KILN_PLAN_MAX_BUCKETS];
	int32_t n = 0;
	static const double low[] = {0.25, 0.5, 0.75, 0.9, 1.0};
	for (size_t i = 0; i < sizeof low / sizeof low[0]; i++)
		tmp[n++] = low[i];
	for (int k = 1; k <= 10; k++)
		tmp[n++] = 1.0 + 0.05 * k; /* 1.05 .. 1.5 */
	for (int k = 1; n < KILN_PLAN_MAX_BUCKETS; k++)
		tmp[n++] = 1.5 + 0.1 * k; /* 1.6 .. */
	/* Cut at max_factor, which becomes the last edge. */
	int32_t m = 0;
	while (m < n && tmp[m] < max_factor - 1e-9)
		m++;
	if (m == n) /* max_factor beyond the table: the frontend caps it lower */
		return -1;
	tmp[m++] = max_factor;
	double *e = kiln_arena_alloc(a, sizeof(double) * (size_t)m);
	if (!e)
		return -1;
	memcpy(e, tmp, sizeof(double) * (size_t)m);
	*out_edges = e;
	*out_n = m;
	return 0;
}

int32_t kiln_plan_bucket_of(const double *edges, int32_t n, double r)
{
	/* Binary search for the first edge >= r (with a little slack so that
	 * 1.0 computed as 0.1 * 10 lands in the 1.0 bucket). */
	int32_t lo = 0, hi = n;
	while (lo < hi) {
		int32_t mid = lo + (hi - lo) / 2;
		if (edges[mid] >= r - 1e-9)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}
