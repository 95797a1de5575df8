/* runtime/error.c: names of the runtime's status codes and actions. */
#include "internal.h"

const char *kiln_rt_strerror(int code)
{
	switch (code) {
#define X(name, value, text)                                                                       \
	case value:                                                                                \
		return text;
		KILN_RT_ERRORS(X)
#undef X
	default:
		return "unknown kiln runtime error";
	}
}

const char *kiln_rt_action_name(int a)
{
	static const char *const names[] = {[KILN_RT_KEEP] = "keep",
	                                    [KILN_RT_RECOMPUTE] = "recompute",
	                                    [KILN_RT_OFFLOAD] = "offload"};
	return a >= 0 && a < (int)(sizeof names / sizeof names[0]) ? names[a] : "?";
}
