/* frontend/source.c: source text in: a file read whole within the size
 * limit, and text parsed to its root mapping. Below everything that reads
 * a description (frontend.c) or a hardware profile (hardware.c), so that
 * neither depends on the other for it. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend/internal.h"

bool kiln_fe_read_file(kiln_fe_ctx *c, const char *path, int line, int col, char **out_text,
                       size_t *out_len)
{
	/* O_NONBLOCK: opening a FIFO must not wait for a writer; anything but a
	 * regular file (a FIFO, a device, a directory) is refused. */
	int fd = open(path, O_RDONLY | O_NONBLOCK);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		kiln_fe_error(c, line, col, "cannot read '%s': %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return false;
	}
	if (!S_ISREG(st.st_mode)) {
		kiln_fe_error(c, line, col, "cannot read '%s': not a regular file", path);
		close(fd);
		return false;
	}
	FILE *f = fdopen(fd, "rb");
	if (!f) {
		kiln_fe_error(c, line, col, "cannot read '%s': %s", path, strerror(errno));
		close(fd);
		return false;
	}
	/* One byte past the limit tells an oversized file apart without reading
	 * it all. */
	size_t cap = (size_t)KILN_FRONTEND_MAX_FILE_BYTES + 1;
	char *buf = kiln_arena_alloc(c->a, cap + 1);
	if (!buf) {
		fclose(f);
		kiln_fe_oom(c);
		return false;
	}
	size_t n = fread(buf, 1, cap, f);
	int err = ferror(f) ? errno : 0;
	fclose(f);
	if (err) {
		kiln_fe_error(c, line, col, "cannot read '%s': %s", path, strerror(err));
		return false;
	}
	if (n > KILN_FRONTEND_MAX_FILE_BYTES) {
		kiln_fe_error(c, line, col, "'%s' is larger than the limit of %u bytes", path,
		              KILN_FRONTEND_MAX_FILE_BYTES);
		return false;
	}
	buf[n] = '\0';
	*out_text = buf;
	*out_len = n;
	return true;
}

kiln_fe_node *kiln_fe_parse_text(kiln_fe_ctx *c, const char *text, size_t len)
{
	if (len > KILN_FRONTEND_MAX_FILE_BYTES) {
		kiln_fe_error(c, 0, 0, "input of %zu bytes is larger than the limit of %u bytes",
		              len, KILN_FRONTEND_MAX_FILE_BYTES);
		return NULL;
	}
	kiln_fe_node *root;
	if (kiln_fe_yaml_parse(c, text, len, &root) != 0)
		return NULL;
	return root;
}
