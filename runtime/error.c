/* runtime/error.c: names of the runtime's status codes. */
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
