/* costmodel/hbm.c: the one formula for time spent moving bytes through HBM.
 *
 * Memory-bound ops (time.c) and the copy engine's HBM traffic of an offload
 * (passes/options.c, passes/interleave.c) are priced by this one function,
 * so that a recompute and an offload moving the same bytes cost bit for bit
 * the same, and floating-point rounding never decides between them
 * (docs/cost-model.md, "HBM time").
 */
#include "costmodel/costmodel.h"

double kiln_cost_hbm_us(const kiln_hardware *hw, double bytes)
{
	if (!(hw->hbm_gbps > 0) || !(bytes > 0))
		return 0.0;
	return bytes / (hw->hbm_gbps * 1e3); /* GB/s = 1e3 bytes per us */
}
