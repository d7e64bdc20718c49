/* ast.c - AST construction helpers and the --emit=ast printer (see ast.h). */
#include "ast.h"

#include <string.h>

Node *ast_new(Arena *ar, NodeKind k, Span sp) {
    Node *n = arena_alloc(ar, sizeof(Node));
    n->kind = k;
    n->span = sp;
    return n;
}

void ast_push(Arena *ar, NodeList *l, Node *n) {
    /* Lists double in place when their size reaches a power of two (the arena never frees). */
    if ((l->n & (l->n - 1)) == 0) {
        /* a list of 2^30 nodes needs more than the 256 MiB a source may have (module.c) */
        if (l->n >= (1 << 30)) diag_internal(__FILE__, __LINE__, "a syntax list of more than 2^30 items");
        int cap = l->n ? l->n * 2 : 2;
        Node **v = arena_alloc(ar, sizeof(Node *) * (size_t)cap);
        if (l->n) memcpy(v, l->v, sizeof(Node *) * (size_t)l->n);
        l->v = v;
    }
    l->v[l->n++] = n;
}

static const char *const kind_names[N_KIND_COUNT] = {
    [N_PROGRAM] = "program",
    [N_IMPORT] = "import",
    [N_MODEL] = "model",
    [N_FN] = "fn",
    [N_OPTIMIZER] = "optimizer",
    [N_TRAIN] = "train",
    [N_SERVE] = "serve",
    [N_FPARAM] = "fparam",
    [N_TYPE] = "type",
    [N_STATE] = "state",
    [N_SETTING] = "setting",
    [N_SETTING_BLOCK] = "settings",
    [N_PARAM_DECL] = "param",
    [N_ASSIGN] = "assign",
    [N_AUG_ASSIGN] = "aug-assign",
    [N_EXPR_STMT] = "expr",
    [N_RETURN] = "return",
    [N_FOR] = "for",
    [N_IF] = "if",
    [N_NAME] = "name",
    [N_INT] = "int",
    [N_FLOAT] = "float",
    [N_STRING] = "string",
    [N_BOOL] = "bool",
    [N_BINARY] = "binary",
    [N_UNARY] = "unary",
    [N_CALL] = "call",
    [N_KWARG] = "kwarg",
    [N_INDEX] = "index",
    [N_SLICE] = "slice",
    [N_ATTR] = "attr",
    [N_TUPLE] = "tuple",
    [N_LIST] = "list",
    [N_COMP] = "comprehension",
    [N_RANGE] = "range",
};

const char *ast_kind_name(NodeKind k) { return k < N_KIND_COUNT && kind_names[k] ? kind_names[k] : "?"; }

const char *ast_op_text(Op op) {
    switch (op) {
    case OP_ADD:
    case OP_POS: return "+";
    case OP_SUB:
    case OP_NEG: return "-";
    case OP_MUL: return "*";
    case OP_DIV: return "/";
    case OP_MOD: return "%";
    case OP_POW: return "^";
    case OP_MATMUL: return "@";
    case OP_EQ: return "==";
    case OP_NE: return "!=";
    case OP_LT: return "<";
    case OP_LE: return "<=";
    case OP_GT: return ">";
    case OP_GE: return ">=";
    case OP_AND: return "and";
    case OP_OR: return "or";
    case OP_NOT: return "not";
    default: return "?";
    }
}

/* ---- printer: one node a line, children indented, `kind detail @line:col` ---- */

static void print_list(FILE *out, const char *label, const NodeList *l, int ind);

static void print_node(FILE *out, const Node *n, int ind, const char *label) {
    fprintf(out, "%*s", ind * 2, "");
    if (label) fprintf(out, "%s: ", label);
    if (!n) {
        fprintf(out, "-\n");
        return;
    }
    fprintf(out, "%s", ast_kind_name(n->kind));
    switch (n->kind) {
    case N_INT: fprintf(out, " %lld", (long long)n->ival); break;
    case N_FLOAT: fprintf(out, " %.17g", n->fval); break;
    case N_BOOL: fprintf(out, " %s", n->ival ? "true" : "false"); break;
    case N_STRING: {
        fputs(" \"", out);
        for (uint32_t i = 0; i < n->slen; i++) {
            unsigned char ch = (unsigned char)n->sval[i];
            if (ch == '"' || ch == '\\') fprintf(out, "\\%c", ch);
            else if (ch == '\n') fputs("\\n", out);
            else if (ch == '\t') fputs("\\t", out);
            else fputc(ch, out);
        }
        fputc('"', out);
        break;
    }
    case N_BINARY:
    case N_UNARY:
    case N_AUG_ASSIGN: fprintf(out, " %s", ast_op_text(n->op)); break;
    case N_TYPE: fprintf(out, " %.*s%s", (int)n->name.len, n->name.p, n->ival ? (n->list.n ? "[...]" : "[]") : ""); break;
    default:
        if (n->name.len) fprintf(out, " %.*s", (int)n->name.len, n->name.p);
        break;
    }
    if (n->alias.len) fprintf(out, " as %.*s", (int)n->alias.len, n->alias.p);
    fprintf(out, " @%u:%u\n", n->span.line, n->span.col);
    if (n->type) print_node(out, n->type, ind + 1, "type");
    if (n->kind == N_TYPE) {
        print_list(out, NULL, &n->list, ind + 1);
        return;
    }
    if (n->a) print_node(out, n->a, ind + 1, NULL);
    if (n->b) print_node(out, n->b, ind + 1, NULL);
    const char *l1 = NULL, *l2 = NULL;
    switch (n->kind) {
    case N_MODEL:
    case N_FN:
    case N_OPTIMIZER:
        l1 = "params";
        l2 = "body";
        break;
    case N_IF:
        l1 = "then";
        l2 = "else";
        break;
    case N_ASSIGN: l1 = "targets"; break;
    default: break;
    }
    print_list(out, l1, &n->list, ind + 1);
    print_list(out, l2, &n->list2, ind + 1);
}

static void print_list(FILE *out, const char *label, const NodeList *l, int ind) {
    if (l->n == 0) return;
    if (label) {
        fprintf(out, "%*s%s:\n", ind * 2, "", label);
        ind++;
    }
    for (int i = 0; i < l->n; i++) print_node(out, l->v[i], ind, NULL);
}

void ast_print(FILE *out, const Node *n) { print_node(out, n, 0, NULL); }

/* ---- span check (used by tests): every node located inside its file ---- */

static int spans_ok(const Node *n, uint32_t file, uint32_t len) {
    if (!n) return 1;
    if (n->kind != N_PROGRAM && (n->span.file != file || n->span.off + n->span.len > len || n->span.line == 0)) return 0;
    if (!spans_ok(n->a, file, len) || !spans_ok(n->b, file, len) || !spans_ok(n->type, file, len)) return 0;
    for (int i = 0; i < n->list.n; i++)
        if (!spans_ok(n->list.v[i], file, len)) return 0;
    for (int i = 0; i < n->list2.n; i++)
        if (!spans_ok(n->list2.v[i], file, len)) return 0;
    return 1;
}

int ast_check_spans(const Node *n) {
    uint32_t len;
    diag_source_text(n->span.file, &len);
    return spans_ok(n, n->span.file, len);
}
