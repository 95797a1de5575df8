/* python/tests/layout.c: prints the size of every struct of
 * include/kiln/runtime.h that python/kiln/runtime.py mirrors with ctypes,
 * and the offset and size of each of its fields, one per line:
 *
 *   STRUCT sizeof BYTES
 *   STRUCT FIELD OFFSET BYTES
 *
 * python/tests/test_layout.py compares them with the ctypes mirrors. A
 * test helper built by CMake (kiln_py_layout), never installed. */
#include <kiln/runtime.h>
#include <stddef.h>
#include <stdio.h>

#define S(type) printf(#type " sizeof %zu\n", sizeof(type))
#define F(type, field)                                                                             \
	printf(#type " " #field " %zu %zu\n", offsetof(type, field), sizeof(((type *)0)->field))

int main(void)
{
	S(kiln_rt_info);
	F(kiln_rt_info, model);
	F(kiln_rt_info, compiler);
	F(kiln_rt_info, model_hash);
	F(kiln_rt_info, major);
	F(kiln_rt_info, minor);
	F(kiln_rt_info, n_stages);
	F(kiln_rt_info, n_layers);
	F(kiln_rt_info, n_model_layers);
	F(kiln_rt_info, n_buckets);
	F(kiln_rt_info, max_factor);
	F(kiln_rt_info, blob_bytes);

	S(kiln_rt_stage_info);
	F(kiln_rt_stage_info, capacity_bytes);
	F(kiln_rt_stage_info, static_bytes);
	F(kiln_rt_stage_info, fixed_bytes);
	F(kiln_rt_stage_info, budget_bytes);
	F(kiln_rt_stage_info, steady_bytes);
	F(kiln_rt_stage_info, floor_bytes);
	F(kiln_rt_stage_info, transient_bytes);
	F(kiln_rt_stage_info, inflight);
	F(kiln_rt_stage_info, safety_factor);
	F(kiln_rt_stage_info, n_layers);

	S(kiln_rt_group_info);
	F(kiln_rt_group_info, plan);
	F(kiln_rt_group_info, fit_rows);
	F(kiln_rt_group_info, resident_base_bytes);
	F(kiln_rt_group_info, resident_per_row_bytes);
	F(kiln_rt_group_info, saved_base_bytes);
	F(kiln_rt_group_info, saved_per_row_bytes);
	F(kiln_rt_group_info, transient_base_bytes);
	F(kiln_rt_group_info, transient_per_row_bytes);
	F(kiln_rt_group_info, exposed_base_us);
	F(kiln_rt_group_info, exposed_per_row_us);
	S(kiln_rt_layer_info);
	F(kiln_rt_layer_info, model_layer);
	F(kiln_rt_layer_info, stage);
	F(kiln_rt_layer_info, position);
	F(kiln_rt_layer_info, moe);
	F(kiln_rt_layer_info, n_units);
	F(kiln_rt_layer_info, balanced_rows);
	F(kiln_rt_layer_info, tail_floor_bytes);
	F(kiln_rt_layer_info, head_steady_bytes);
	F(kiln_rt_layer_info, steady_bytes);
	F(kiln_rt_layer_info, steady_keep_bytes);

	S(kiln_rt_unit_info);
	F(kiln_rt_unit_info, name);
	F(kiln_rt_unit_info, flags);
	F(kiln_rt_unit_info, base_bytes);
	F(kiln_rt_unit_info, per_row_bytes);

	S(kiln_rt_table_info);
	F(kiln_rt_table_info, load_factor);
	F(kiln_rt_table_info, max_rows);
	F(kiln_rt_table_info, quantum_bytes);
	F(kiln_rt_table_info, keep_bytes);
	F(kiln_rt_table_info, n_points);

	S(kiln_rt_point);
	F(kiln_rt_point, saved_bytes);
	F(kiln_rt_point, exposed_us);
	F(kiln_rt_point, plan);

	S(kiln_query);
	F(kiln_query, stage);
	F(kiln_query, layer);
	F(kiln_query, tokens);
	F(kiln_query, n_tokens);
	F(kiln_query, total_rows);
	F(kiln_query, free_bytes);
	F(kiln_query, pending);
	F(kiln_query, microbatch);
	F(kiln_query, held_bytes);
	F(kiln_query, group_rows);
	F(kiln_query, group_size);

	S(kiln_plan);
	F(kiln_plan, actions);
	F(kiln_plan, n_units);
	F(kiln_plan, plan);
	F(kiln_plan, template_id);
	F(kiln_plan, bucket);
	F(kiln_plan, load_factor);
	F(kiln_plan, need_bytes);
	F(kiln_plan, saved_bytes);
	F(kiln_plan, resident_bytes);
	F(kiln_plan, avail_bytes);
	F(kiln_plan, exposed_us);
	F(kiln_plan, flags);
	F(kiln_plan, transient_bytes);
	F(kiln_plan, group_max_rows);

	S(kiln_rt_template_info);
	F(kiln_rt_template_info, plan);
	F(kiln_rt_template_info, n_tasks);
	F(kiln_rt_template_info, n_deps);
	F(kiln_rt_template_info, makespan_us);
	F(kiln_rt_template_info, serial_us);
	F(kiln_rt_template_info, base_us);
	F(kiln_rt_template_info, load_factor);

	S(kiln_rt_task);
	F(kiln_rt_task, name);
	F(kiln_rt_task, stream);
	F(kiln_rt_task, kind);
	F(kiln_rt_task, chain);
	F(kiln_rt_task, unit);

	S(kiln_acct);
	F(kiln_acct, limit_bytes);
	F(kiln_acct, device_bytes);
	F(kiln_acct, host_bytes);
	F(kiln_acct, peak_device_bytes);
	F(kiln_acct, open_microbatches);
	F(kiln_acct, free_bytes);

	S(kiln_copy_config);
	F(kiln_copy_config, backend);
	F(kiln_copy_config, pool_bytes);
	F(kiln_copy_config, max_buffers);
	F(kiln_copy_config, device);
	F(kiln_copy_config, library);

	S(kiln_copy_probe_report);
	F(kiln_copy_probe_report, library);
	F(kiln_copy_probe_report, n_required);
	F(kiln_copy_probe_report, n_optional);
	F(kiln_copy_probe_report, n_resolved);
	F(kiln_copy_probe_report, missing);
	F(kiln_copy_probe_report, devices);
	F(kiln_copy_probe_report, status);
	return 0;
}
