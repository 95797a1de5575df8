/* frontend/yaml.c: YAML text to a node tree. The only file that includes
 * libyaml. Reads libyaml's event stream with an explicit stack (no recursion),
 * and stops at the first event that breaks a limit, so hostile input costs
 * bounded time and memory. */
#include <string.h>
#include <yaml.h>

#include "frontend/internal.h"

typedef struct anchor {
	const char *name;
	kiln_fe_node *node;
} anchor;

typedef struct frame {
	kiln_fe_node *node;
	kiln_fe_node *first, *last;
	size_t count;
	bool want_key; /* MAP: the next child is a key */
} frame;

typedef struct builder {
	kiln_fe_ctx *c;
	const char *text;
	size_t len;
	frame stack[KILN_FRONTEND_MAX_DEPTH];
	size_t depth;
	anchor anchors[KILN_FRONTEND_MAX_ANCHORS];
	size_t n_anchors;
	size_t total; /* nodes so far, aliases counted by their expanded size */
	kiln_fe_node *root;
	bool failed; /* stop reading events */
} builder;

static size_t add_sat(size_t x, size_t y)
{
	size_t cap = (size_t)KILN_FRONTEND_MAX_NODES + 1;
	return (x >= cap || y >= cap || x + y >= cap) ? cap : x + y;
}

static kiln_fe_node *node_new(builder *b, kiln_fe_kind kind, yaml_mark_t m)
{
	kiln_fe_node *n = kiln_arena_alloc(b->c->a, sizeof(*n));
	if (!n) {
		kiln_fe_oom(b->c);
		b->failed = true;
		return NULL;
	}
	n->kind = kind;
	n->line = (int)(m.line + 1 > (size_t)0x7fffffff ? 0x7fffffff : m.line + 1);
	n->col = (int)(m.column + 1 > (size_t)0x7fffffff ? 0x7fffffff : m.column + 1);
	n->weight = 1;
	return n;
}

static void mark_error(builder *b, yaml_mark_t m, const char *msg)
{
	kiln_fe_error(b->c, (int)m.line + 1, (int)m.column + 1, "%s", msg);
	b->failed = true;
}

/* Counts weight more nodes; false (after reporting at m) past the limit. */
static bool count_nodes(builder *b, size_t weight, yaml_mark_t m)
{
	b->total = add_sat(b->total, weight);
	if (b->total > KILN_FRONTEND_MAX_NODES) {
		kiln_fe_error(b->c, (int)m.line + 1, (int)m.column + 1,
		              "document too large: more than %d nodes after expanding aliases",
		              KILN_FRONTEND_MAX_NODES);
		b->failed = true;
		return false;
	}
	return true;
}

/* Hangs n under the innermost open container, or makes it the root. */
static void attach(builder *b, kiln_fe_node *n)
{
	if (b->depth == 0) {
		b->root = n;
		return;
	}
	frame *f = &b->stack[b->depth - 1];
	if (f->last)
		f->last->next = n;
	else
		f->first = n;
	f->last = n;
	f->count++;
	f->node->weight = add_sat(f->node->weight, n->weight);
}

static void define_anchor(builder *b, const yaml_char_t *name, kiln_fe_node *n, yaml_mark_t m)
{
	if (!name)
		return;
	for (size_t i = b->n_anchors; i-- > 0;) {
		if (strcmp(b->anchors[i].name, (const char *)name) == 0) {
			/* A redefinition replaces the earlier anchor (YAML 1.2). */
			b->anchors[i].node = n;
			return;
		}
	}
	if (b->n_anchors == KILN_FRONTEND_MAX_ANCHORS) {
		kiln_fe_error(b->c, (int)m.line + 1, (int)m.column + 1,
		              "too many anchors (the limit is %d)", KILN_FRONTEND_MAX_ANCHORS);
		b->failed = true;
		return;
	}
	const char *copy = kiln_arena_strdup(b->c->a, (const char *)name);
	if (!copy) {
		kiln_fe_oom(b->c);
		b->failed = true;
		return;
	}
	b->anchors[b->n_anchors].name = copy;
	b->anchors[b->n_anchors].node = n;
	b->n_anchors++;
}

static void reject_tag(builder *b, const yaml_char_t *tag, yaml_mark_t m)
{
	if (!tag)
		return;
	kiln_fe_error(b->c, (int)m.line + 1, (int)m.column + 1,
	              "YAML tags are not supported (found %s)",
	              kiln_fe_show(b->c, (const char *)tag, strlen((const char *)tag)));
}

static void on_scalar(builder *b, yaml_event_t *ev)
{
	kiln_fe_node *n = node_new(b, KILN_FE_SCALAR, ev->start_mark);
	if (!n)
		return;
	reject_tag(b, ev->data.scalar.tag, ev->start_mark);
	n->text = kiln_arena_strndup(b->c->a, (const char *)ev->data.scalar.value,
	                             ev->data.scalar.length);
	if (!n->text) {
		kiln_fe_oom(b->c);
		b->failed = true;
		return;
	}
	n->len = ev->data.scalar.length;
	n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
	/* The reader refuses control characters in the file; an escape in a
	 * double-quoted scalar ("\e", "\0", "\x9b") or a block scalar's line
	 * break makes them anyway, after it. No value of the format is
	 * multi-line text, and a name with them could drive the terminal it is
	 * printed to. */
	uint32_t cp;
	if (kiln_text_has_control(n->text, n->len, &cp))
		kiln_fe_error(b->c, n->line, n->col,
		              "control character U+%04X in %s; text values must be printable "
		              "(no escapes such as \\e, \\n or \\t, no line breaks)",
		              (unsigned)cp, kiln_fe_show(b->c, n->text, n->len));
	if (!count_nodes(b, 1, ev->start_mark))
		return;
	define_anchor(b, ev->data.scalar.anchor, n, ev->start_mark);
	attach(b, n);
}

static void on_start(builder *b, yaml_event_t *ev, kiln_fe_kind kind)
{
	if (b->depth == KILN_FRONTEND_MAX_DEPTH) {
		kiln_fe_error(b->c, (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1,
		              "nesting too deep: more than %d levels of mappings and sequences",
		              KILN_FRONTEND_MAX_DEPTH);
		b->failed = true;
		return;
	}
	kiln_fe_node *n = node_new(b, kind, ev->start_mark);
	if (!n || !count_nodes(b, 1, ev->start_mark))
		return;
	const yaml_char_t *anchor_name, *tag;
	if (kind == KILN_FE_MAP) {
		anchor_name = ev->data.mapping_start.anchor;
		tag = ev->data.mapping_start.tag;
	} else {
		anchor_name = ev->data.sequence_start.anchor;
		tag = ev->data.sequence_start.tag;
	}
	reject_tag(b, tag, ev->start_mark);
	n->open = true;
	define_anchor(b, anchor_name, n, ev->start_mark);
	b->stack[b->depth++] = (frame){.node = n};
}

static void on_end(builder *b)
{
	frame f = b->stack[--b->depth];
	kiln_fe_node *n = f.node;
	n->open = false;
	if (f.count) {
		n->items = kiln_arena_alloc(b->c->a, f.count * sizeof(*n->items));
		if (!n->items) {
			kiln_fe_oom(b->c);
			b->failed = true;
			return;
		}
		size_t i = 0;
		for (kiln_fe_node *k = f.first; k; k = k->next)
			n->items[i++] = k;
	}
	/* libyaml always pairs mapping children; halve to count pairs. */
	n->n = n->kind == KILN_FE_MAP ? f.count / 2 : f.count;
	attach(b, n);
}

static void on_alias(builder *b, yaml_event_t *ev)
{
	const char *name = (const char *)ev->data.alias.anchor;
	kiln_fe_node *target = NULL;
	for (size_t i = b->n_anchors; i-- > 0;) {
		if (strcmp(b->anchors[i].name, name) == 0) {
			target = b->anchors[i].node;
			break;
		}
	}
	kiln_fe_node *n = node_new(b, KILN_FE_SCALAR, ev->start_mark);
	if (!n)
		return;
	if (!target || target->open) {
		if (target)
			kiln_fe_error(b->c, n->line, n->col,
			              "alias %s refers to a node that contains it",
			              kiln_fe_show(b->c, name, strlen(name)));
		else
			kiln_fe_error(b->c, n->line, n->col,
			              "unknown alias %s (no anchor of that name before it)",
			              kiln_fe_show(b->c, name, strlen(name)));
		/* Continue with an empty placeholder that reports nothing more. */
		n->text = "";
		n->plain = true;
		n->broken = true;
		if (count_nodes(b, 1, ev->start_mark))
			attach(b, n);
		return;
	}
	if (!count_nodes(b, target->weight, ev->start_mark))
		return;
	int line = n->line, col = n->col;
	*n = *target;
	n->line = line;
	n->col = col;
	n->next = NULL;
	attach(b, n);
}

/* Line and column (1-based) of byte offset off in the text. */
static void offset_position(const builder *b, size_t off, int *out_line, int *out_col)
{
	int line = 1, col = 1;
	if (off > b->len)
		off = b->len;
	for (size_t i = 0; i < off; i++) {
		if (b->text[i] == '\n') {
			line++;
			col = 1;
		} else if (((unsigned char)b->text[i] & 0xc0) != 0x80) {
			col++;
		}
	}
	*out_line = line;
	*out_col = col;
}

static void report_parser_error(builder *b, const yaml_parser_t *p)
{
	b->failed = true;
	const char *problem = p->problem ? p->problem : "unknown error";
	if (p->error == YAML_MEMORY_ERROR) {
		kiln_fe_oom(b->c);
		return;
	}
	if (p->error == YAML_READER_ERROR) {
		int line, col;
		offset_position(b, p->problem_offset, &line, &col);
		if (p->problem_value >= 0)
			kiln_fe_error(b->c, line, col, "not valid YAML text: %s (#x%x)", problem,
			              (unsigned)p->problem_value);
		else
			kiln_fe_error(b->c, line, col, "not valid YAML text: %s", problem);
		return;
	}
	kiln_fe_diag *d =
	    kiln_fe_error(b->c, (int)p->problem_mark.line + 1, (int)p->problem_mark.column + 1,
	                  "not valid YAML: %s", problem);
	if (p->context)
		kiln_fe_note_at(b->c, d, (int)p->context_mark.line + 1,
		                (int)p->context_mark.column + 1, "%s", p->context);
}

int kiln_fe_yaml_parse(kiln_fe_ctx *c, const char *text, size_t len, kiln_fe_node **out)
{
	*out = NULL;
	builder *b = kiln_arena_alloc(c->a, sizeof(*b));
	if (!b) {
		kiln_fe_oom(c);
		return -1;
	}
	b->c = c;
	b->text = text;
	b->len = len;

	yaml_parser_t p;
	if (!yaml_parser_initialize(&p)) {
		kiln_fe_oom(c);
		return -1;
	}
	yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
	int documents = 0;
	bool done = false;
	while (!done && !b->failed) {
		yaml_event_t ev;
		if (!yaml_parser_parse(&p, &ev)) {
			report_parser_error(b, &p);
			break;
		}
		switch (ev.type) {
		case YAML_DOCUMENT_START_EVENT:
			if (++documents > 1)
				mark_error(
				    b, ev.start_mark,
				    "more than one YAML document in the file; kiln reads exactly "
				    "one");
			break;
		case YAML_STREAM_END_EVENT:
			done = true;
			break;
		case YAML_SCALAR_EVENT:
			on_scalar(b, &ev);
			break;
		case YAML_SEQUENCE_START_EVENT:
			on_start(b, &ev, KILN_FE_SEQ);
			break;
		case YAML_MAPPING_START_EVENT:
			on_start(b, &ev, KILN_FE_MAP);
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			on_end(b);
			break;
		case YAML_ALIAS_EVENT:
			on_alias(b, &ev);
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&p);
	if (b->failed || c->nomem)
		return -1;

	const kiln_fe_node *r = b->root;
	if (!r || (r->kind == KILN_FE_SCALAR && r->plain && r->len == 0)) {
		kiln_fe_error(c, 1, 1,
		              "empty document, expected a mapping starting with `kiln: 1`");
		return -1;
	}
	if (r->kind != KILN_FE_MAP) {
		kiln_fe_error(c, r->line, r->col,
		              "the top level must be a mapping starting with `kiln: 1`, not %s",
		              kiln_fe_node_describe(c, r));
		return -1;
	}
	*out = b->root;
	return 0;
}
