/* tests/test_install.c: `cmake --install` of this build into a temporary
 * prefix, and the embedding example built against that installed tree the
 * two ways README.md ("Embedding the runtime") shows: pkg-config, and a
 * CMake project with find_package(kiln). */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln_test.h"

static void assert_file(const char *prefix, const char *rel, int is_link)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", prefix, rel);
	struct stat st;
	cr_assert_eq(lstat(path, &st), 0, "not installed: %s", rel);
	if (is_link)
		cr_assert(S_ISLNK(st.st_mode), "%s is not a symbolic link", rel);
	else
		cr_assert(S_ISREG(st.st_mode), "%s is not a regular file", rel);
}

/* The shared library's real name and soname, from the version. */
static void so_names(char real[64], char soname[64])
{
	snprintf(real, 64, "libkiln_rt.so.%s", KILN_VERSION);
	snprintf(soname, 64, "libkiln_rt.so.%.*s", (int)strcspn(KILN_VERSION, "."), KILN_VERSION);
}

Test(install, prefix_tree_then_pkg_config_and_find_package_consumers, .timeout = 120)
{
	char prefix[] = "/tmp/kiln-install-XXXXXX";
	cr_assert_not_null(mkdtemp(prefix));
	char *out = NULL;
	int status =
	    kt_sh(&out, "'%s' --install '%s' --prefix '%s'", KILN_CMAKE, KILN_BINARY_DIR, prefix);
	cr_assert_eq(status, 0, "cmake --install:\n%s", out);
	free(out);

	/* The tree. */
	char lib[256], rel[512], real[64], soname[64];
	snprintf(lib, sizeof lib, "%s", KILN_INSTALL_LIBDIR);
	so_names(real, soname);
	assert_file(prefix, "include/kiln/runtime.h", 0);
	assert_file(prefix, "include/kiln/blob.h", 0);
	assert_file(prefix, "bin/kilnc", 0);
	const char *const files[] = {"libkiln_rt.a", "cmake/kiln/kilnConfig.cmake",
	                             "cmake/kiln/kilnConfigVersion.cmake",
	                             "cmake/kiln/kilnTargets.cmake", "pkgconfig/kiln-runtime.pc"};
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		snprintf(rel, sizeof rel, "%s/%s", lib, files[i]);
		assert_file(prefix, rel, 0);
	}
	snprintf(rel, sizeof rel, "%s/%s", lib, real);
	assert_file(prefix, rel, 0);
	snprintf(rel, sizeof rel, "%s/%s", lib, soname);
	assert_file(prefix, rel, 1);
	snprintf(rel, sizeof rel, "%s/libkiln_rt.so", lib);
	assert_file(prefix, rel, 1);

	/* The .pc file names the prefix given at install time. */
	status = kt_sh(&out, "PKG_CONFIG_PATH='%s/%s/pkgconfig' '%s' --variable=prefix kiln-runtime",
	            prefix, lib, KILN_PKG_CONFIG);
	cr_assert_eq(status, 0, "pkg-config:\n%s", out);
	cr_assert(strncmp(out, prefix, strlen(prefix)) == 0 && out[strlen(prefix)] == '\n',
	          "prefix=%s, expected %s", out, prefix);
	free(out);

	/* The installed kilnc starts (its rpath still finds the MLIR
	 * libraries) and compiles the plan the consumers run. */
	status = kt_sh(&out, "'%s/bin/kilnc' compile '%s' -o '%s/tiny.kiln'", prefix,
	            kt_src("examples/models/tiny.yaml"), prefix);
	cr_assert_eq(status, 0, "installed kilnc:\n%s", out);
	free(out);

	/* Consumer 1: pkg-config, linking libkiln_rt.so. */
	status = kt_sh(&out,
	            "cd '%s' && export PKG_CONFIG_PATH='%s/%s/pkgconfig' && "
	            "'%s' -std=c11 -Wall -Werror %s '%s' -o embed-pc "
	            "$('%s' --cflags --libs kiln-runtime) && "
	            "LD_LIBRARY_PATH='%s/%s' ./embed-pc tiny.kiln",
	            prefix, prefix, lib, KILN_CC, KILN_TEST_SANITIZE_FLAGS,
	            kt_src("examples/embed/embed.c"), KILN_PKG_CONFIG, prefix, lib);
	cr_assert_eq(status, 0, "pkg-config consumer:\n%s", out);
	cr_assert_not_null(strstr(out, "model tiny"), "pkg-config consumer:\n%s", out);
	cr_assert_not_null(strstr(out, ": fits"), "pkg-config consumer:\n%s", out);
	free(out);
	/* ... and it really is the installed shared library that it runs on. */
	status = kt_sh(&out, "cd '%s' && LD_LIBRARY_PATH='%s/%s' ldd ./embed-pc", prefix, prefix, lib);
	cr_assert_eq(status, 0, "ldd:\n%s", out);
	snprintf(rel, sizeof rel, "%s => %s/%s/%s", soname, prefix, lib, soname);
	cr_assert_not_null(strstr(out, rel), "expected '%s' in:\n%s", rel, out);
	free(out);

	/* Consumer 2: examples/embed/CMakeLists.txt, find_package(kiln),
	 * linking kiln::kiln_rt (static). */
	status = kt_sh(&out,
	            "cd '%s' && '%s' -S '%s' -B build-embed -DCMAKE_PREFIX_PATH='%s' "
	            "-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_C_COMPILER='%s' "
	            "-DCMAKE_C_FLAGS='%s' -DCMAKE_EXE_LINKER_FLAGS='%s' >/dev/null && "
	            "'%s' --build build-embed >/dev/null && ./build-embed/embed tiny.kiln 1",
	            prefix, KILN_CMAKE, kt_src("examples/embed"), prefix, KILN_CC,
	            KILN_TEST_SANITIZE_FLAGS, KILN_TEST_SANITIZE_FLAGS, KILN_CMAKE);
	cr_assert_eq(status, 0, "find_package consumer:\n%s", out);
	cr_assert_not_null(strstr(out, "stage 1:"), "find_package consumer:\n%s", out);
	cr_assert_not_null(strstr(out, ": fits"), "find_package consumer:\n%s", out);
	free(out);
	/* Static: no libkiln_rt.so needed at run time. */
	status = kt_sh(&out, "ldd '%s/build-embed/embed'", prefix);
	cr_assert_null(strstr(out, "libkiln_rt"), "static consumer links the .so:\n%s", out);
	free(out);

	cr_assert_eq(kt_sh(NULL, "rm -rf '%s'", prefix), 0);
}
