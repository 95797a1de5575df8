/* tests/test_layering.c: the tree's layering rules (docs/passes.md,
 * "Layering"): no file-level dependency cycle among the C files
 * (scripts/file_cycles.py over this build's objects), and the one table of
 * names per concept: actions (kiln_rt_action_name), solvers
 * (kiln_solver_name), streams and task kinds (kiln_stream_name,
 * kiln_task_kind_name, which kilnc inspect prints the blob's values with).
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/runtime.h"
#include "kiln_test.h"
#include "passes/passes.h"

/* The build folder this test binary was built in: the kilnc beside it. */
static const char *build_dir(void)
{
	static char buf[4096];
	snprintf(buf, sizeof buf, "%s", KILN_KILNC);
	return dirname(buf);
}

Test(layering, no_file_cycles_in_this_build)
{
	const char *b = build_dir();
	char *out = NULL;
	int rc = kt_sh(&out,
	               "python3 '%s' '%s/CMakeFiles/kiln_compiler.dir' '%s/CMakeFiles/kilnc.dir' "
	               "'%s/CMakeFiles/kiln_rt_objects.dir' '%s/CMakeFiles/kiln_output.dir'",
	               kt_src("scripts/file_cycles.py"), b, b, b, b);
	cr_assert_eq(rc, 0, "scripts/file_cycles.py found a cycle:\n%s", out);
	/* It looked at the real tree: the compiler, the driver and the runtime. */
	cr_assert(strstr(out, " files, ") != NULL, "%s", out);
	/* No cycle at all: the script's list of known ones is empty. */
	cr_assert(strstr(out, " files, 0 cycles (0 not allowed)\n") != NULL, "%s", out);
	free(out);
}

/* Two files that call each other are a cycle; a third that only calls one
 * of them is not part of it. The check must say so and fail. */
Test(layering, a_cycle_fails_the_check)
{
	char dir[] = "/tmp/kiln_cycles_XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char *out = NULL;
	int rc = kt_sh(&out,
	               "set -e; cd '%s'; mkdir -p t.dir/x x;"
	               "printf 'int b(int);\\nint a(int x){return x ? b(x - 1) : 0;}\\n' > x/a.c;"
	               "printf 'int a(int);\\nint b(int x){return x ? a(x - 1) : 1;}\\n' > x/b.c;"
	               "printf 'int a(int);\\nint c(void){return a(3);}\\n' > x/c.c;"
	               "for f in a b c; do cc -c x/$f.c -o t.dir/x/$f.c.o; done;"
	               "python3 '%s' '%s'",
	               dir, kt_src("scripts/file_cycles.py"), dir);
	cr_assert_eq(rc, 1, "rc %d:\n%s", rc, out);
	cr_assert(strstr(out, "NEW cycle: x/a.c, x/b.c\n") != NULL, "%s", out);
	cr_assert(strstr(out, "x/a.c -> x/b.c: b") != NULL, "%s", out);
	cr_assert(strstr(out, "x/c.c") == NULL, "c.c is in no cycle:\n%s", out);
	free(out);
	kt_sh(NULL, "rm -rf '%s'", dir);
}

/* Nothing to look at is not a pass. */
Test(layering, no_objects_is_an_error)
{
	char dir[] = "/tmp/kiln_cycles_XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	int rc = kt_sh(NULL, "python3 '%s' '%s'", kt_src("scripts/file_cycles.py"), dir);
	cr_assert_eq(rc, 2);
	rmdir(dir);
}

/* The names are the contract of kilnc's JSON and docs/cli.md ("keep",
 * "recompute", "offload"), written here independently of the table. */
Test(layering, action_names)
{
	cr_assert_str_eq(kiln_rt_action_name(KILN_RT_KEEP), "keep");
	cr_assert_str_eq(kiln_rt_action_name(KILN_RT_RECOMPUTE), "recompute");
	cr_assert_str_eq(kiln_rt_action_name(KILN_RT_OFFLOAD), "offload");
	cr_assert_str_eq(kiln_rt_action_name(3), "?");
	cr_assert_str_eq(kiln_rt_action_name(-1), "?");
}

/* The solver names are the contract of --solver and of the JSON's "solver"
 * key (docs/cli.md: "dp", "milp"), written here independently of the table;
 * parsing a name gives back the solver that prints it. */
Test(layering, solver_names)
{
	cr_assert_str_eq(kiln_solver_name(KILN_SOLVER_DP), "dp");
	cr_assert_str_eq(kiln_solver_name(KILN_SOLVER_MILP), "milp");
	cr_assert_str_eq(kiln_solver_name(KILN_SOLVER_COUNT), "?");
	cr_assert_str_eq(kiln_solver_name(-1), "?");
	kiln_solver s = KILN_SOLVER_DP;
	cr_assert_eq(kiln_solver_parse("milp", &s), 0);
	cr_assert_eq(s, KILN_SOLVER_MILP);
	cr_assert_eq(kiln_solver_parse("dp", &s), 0);
	cr_assert_eq(s, KILN_SOLVER_DP);
	cr_assert_eq(kiln_solver_parse("glpk", &s), -1);
	cr_assert_eq(kiln_solver_parse("", &s), -1);
	cr_assert_eq(kiln_solver_parse("DP", &s), -1);
	cr_assert_eq(s, KILN_SOLVER_DP, "a failed parse leaves the solver alone");
}

/* kilnc inspect names a template task's stream and kind with the compiler's
 * tables, through the runtime's values: the blob's values and the
 * compiler's enums agree (codegen/blob.c asserts it at build time), so each
 * runtime value prints as the name docs/cli.md gives it. */
Test(layering, stream_and_task_kind_names)
{
	cr_assert_str_eq(kiln_stream_name((kiln_stream)KILN_RT_STREAM_COMPUTE), "compute");
	cr_assert_str_eq(kiln_stream_name((kiln_stream)KILN_RT_STREAM_COMM), "comm");
	cr_assert_str_eq(kiln_stream_name((kiln_stream)KILN_RT_STREAM_D2H), "d2h");
	cr_assert_str_eq(kiln_stream_name((kiln_stream)KILN_RT_STREAM_H2D), "h2d");
	cr_assert_str_eq(kiln_task_kind_name((kiln_task_kind)KILN_RT_TASK_FORWARD), "forward");
	cr_assert_str_eq(kiln_task_kind_name((kiln_task_kind)KILN_RT_TASK_BACKWARD), "backward");
	cr_assert_str_eq(kiln_task_kind_name((kiln_task_kind)KILN_RT_TASK_RECOMPUTE), "recompute");
	cr_assert_str_eq(kiln_task_kind_name((kiln_task_kind)KILN_RT_TASK_COPY), "copy");
	cr_assert_str_eq(kiln_task_kind_name((kiln_task_kind)KILN_RT_TASK_COMM), "comm");
}
