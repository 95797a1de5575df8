/* costmodel/hbm.c: the one formula for time spent moving bytes through HBM.
 *
 * The bytes of memory-bound ops and the memory side of attention and GEMM
 * epilogues (step.c, which the planner prices ops with through time.c) and
 * the copy engine's HBM traffic of an offload (passes/options.c,
 * passes/interleave.c) are priced by this one function, so that a recompute
 * and an offload moving the same bytes cost the same double for those bytes;
 * a recompute adds only its kernels' floor (a kernel on the compute stream,
 * which a copy engine's transfer is not), and where that floor is 0 the two
 * are bit for bit equal and the canonical tie rule decides, never rounding
 * (docs/cost-model.md, "HBM time").
 */
#include "costmodel/costmodel.h"

double kiln_cost_hbm_us(const kiln_hardware *hw, double bytes)
{
	if (!(hw->hbm_gbps > 0) || !(bytes > 0))
		return 0.0;
	return bytes / (hw->hbm_gbps * 1e3); /* GB/s = 1e3 bytes per us */
}
