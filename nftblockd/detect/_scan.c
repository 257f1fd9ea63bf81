/* nftblockd.detect._scan: the native scanning core of the matcher (PCRE2, JIT when the system allows it).
 *
 * What it does: `Scanner.scan(lines, now, ctx, slow[, stamped])` runs a compiled filter over a block of log
 * lines and returns what `Filter.scan` returns, `[(index, Match | Rejected), ...]`, doing per line in C what the
 * Python path (matcher.py, `Filter._general` and the fast lane) does: cut overlong lines, the substring
 * gate, the syslog / ISO timestamp at the line start, the prefix or prefregex, the dispatch on the
 * message's first characters, the failregexes in order, ignoreregexes, the multi-line connection memory
 * (the caller's MatchContext: a dict of _Conn objects shared with the Python path) and the strict host.
 * `stamped` lines (journal entries, whose time travels beside the text) skip the timestamp step: the whole
 * line is the text, its time None, exactly as the Python path's stamped mode (Filter.scan).
 *
 * What it must not do: decide anything the Python path would decide differently. Every line it cannot take
 * exactly is handed to `slow(line, now, ctx)` (the Python path, for that one line, with the same context):
 * lines that are not pure ASCII (PCRE2 and `re` differ on Unicode classes; invalid UTF-8 arrives as lone
 * surrogates), lines with CR/LF (the Python path rewrites them), lines without a syslog / ISO timestamp at
 * the start (the Python path tries its other templates), timestamps the Python side cannot convert, and
 * lines whose candidate rules include one PCRE2 cannot run. matcher.py translates each regex so that it
 * means on ASCII text exactly what it means to `re` (native.py), and refuses those it cannot translate.
 *
 * It never touches the clock, files or the network; time is the caller's `now`. It never raises on input:
 * a line on which PCRE2 hits its match limit (a pathological backtracking case) is skipped and counted in
 * `limited`, so a hostile line costs bounded time. It is not thread-safe; the GIL is held throughout and a
 * Scanner refuses to be re-entered.
 *
 * Built against the stable ABI (Py_LIMITED_API 3.11): one binary for every CPython >= 3.11.
 *
 * Ownership rules the code follows (reviewed s10; tests/unit/test_native.py runs the paths):
 *  - A function returning PyObject * returns a new reference or NULL; NULL with an error set is an error
 *    (propagated: the scan raises), NULL without one means "not this path" (ipv4_fast, ipv6_fast, text_of,
 *    text_again: the caller tries the next way). Every PyErr_Occurred() after such a NULL tells them apart,
 *    so no call may leave an error set and still return a value (see `again` in result()).
 *  - Helpers that take an object to consume say "stolen" (by_slots, append, append_new in fleet/_plain.c)
 *    and release it on every path, error included.
 *  - Borrowed references (PyList_GetItem, PyDict_GetItemWithError, the line's UTF-8 buffer) are used only
 *    until the next call that can run Python code (a callback, a dict store, a decref of an object with a
 *    finalizer); the scan holds a reference to each line for its whole step, and INCREFs what it keeps.
 *  - The Scanner's caches (last_raw/last_host, last_text[], the host memo, the hour slots) own one
 *    reference each, replaced new-before-old (the old one released last), and are visited/cleared by GC.
 *  - Reads stay inside the lengths PCRE2 and CPython give (memchr/memcmp/memmem bounded by them); a C string
 *    function (inet_pton) only sees a NUL-terminated text checked to hold no other NUL: a str's own UTF-8
 *    (ipv4_fast) or a bounded copy (ipv6_fast). Checked with -fsanitize=address,undefined (s10).
 */

#define _GNU_SOURCE /* memmem */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <arpa/inet.h>
#include <stddef.h>
#include <string.h>

#include "structmember.h"

/* Bounds for one match attempt. The match limit counts the engine's backtracking steps: a legitimate rule
 * on an 8 KiB line needs tens of thousands; a pathological one stops here in a few milliseconds. */
#define MATCH_LIMIT 1000000u
#define DEPTH_LIMIT 10000u
#define HEAP_LIMIT_KIB 65536u
#define JIT_STACK_MIN (32 * 1024)
#define JIT_STACK_MAX (1024 * 1024)

static PyObject *ScanError;
static PyObject *s_conns, *s_max_age, *s_max_entries, *s_ip4, *s_ip6, *s_dns, *s_fid, *s_nofail, *s_gained,
    *s_pending, *s_fields, *s_user, *s_multi, *s_seen, *s_empty, *s_no_address, *s_ip, *s_scope_id;

/* ------------------------------------------------------------------------------------------------------ */
/* Regex: one compiled pattern */

typedef struct {
    PyObject_HEAD
    pcre2_code *code;
    int jit;
    uint32_t captures;
    PyObject *pattern;
    PyObject *names; /* dict name -> group number */
} RegexObject;

static PyObject *RegexType;

static void Regex_dealloc(PyObject *op) {
    RegexObject *self = (RegexObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    if (self->code != NULL)
        pcre2_code_free(self->code);
    Py_XDECREF(self->pattern);
    Py_XDECREF(self->names);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(op);
    Py_DECREF(tp);
}

static pcre2_match_context *g_mctx;
static pcre2_jit_stack *g_jstack;

/* compile(pattern: str, anchored: bool) -> Regex; raises _scan.error with PCRE2's message */
static PyObject *mod_compile(PyObject *mod, PyObject *args) {
    PyObject *pattern;
    int anchored = 0;
    (void)mod;
    if (!PyArg_ParseTuple(args, "U|p", &pattern, &anchored))
        return NULL;
    Py_ssize_t plen;
    const char *p = PyUnicode_AsUTF8AndSize(pattern, &plen);
    if (p == NULL) {
        PyErr_Clear();
        PyErr_SetString(ScanError, "the pattern is not valid Unicode text");
        return NULL;
    }
    pcre2_compile_context *cctx = pcre2_compile_context_create(NULL);
    if (cctx == NULL)
        return PyErr_NoMemory();
    pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
    int err;
    PCRE2_SIZE erroff;
    uint32_t opts = PCRE2_UTF | (anchored ? PCRE2_ANCHORED : 0);
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)p, (PCRE2_SIZE)plen, opts, &err, &erroff, cctx);
    pcre2_compile_context_free(cctx);
    if (code == NULL) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        PyErr_Format(ScanError, "%s at offset %zu", (const char *)msg, (size_t)erroff);
        return NULL;
    }
    RegexObject *self = PyObject_New(RegexObject, (PyTypeObject *)RegexType);
    if (self == NULL) {
        pcre2_code_free(code);
        return NULL;
    }
    self->code = code;
    self->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &self->captures);
    Py_INCREF(pattern);
    self->pattern = pattern;
    self->names = PyDict_New();
    if (self->names == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    uint32_t count = 0, size = 0;
    PCRE2_SPTR table = NULL;
    pcre2_pattern_info(code, PCRE2_INFO_NAMECOUNT, &count);
    pcre2_pattern_info(code, PCRE2_INFO_NAMEENTRYSIZE, &size);
    pcre2_pattern_info(code, PCRE2_INFO_NAMETABLE, &table);
    for (uint32_t i = 0; i < count; i++) {
        PCRE2_SPTR e = table + (size_t)i * size;
        int num = (e[0] << 8) | e[1];
        PyObject *name = PyUnicode_FromString((const char *)(e + 2));
        PyObject *n = PyLong_FromLong(num);
        if (name == NULL || n == NULL || PyDict_SetItem(self->names, name, n) < 0) {
            Py_XDECREF(name);
            Py_XDECREF(n);
            Py_DECREF(self);
            return NULL;
        }
        Py_DECREF(name);
        Py_DECREF(n);
    }
    return (PyObject *)self;
}

/* One match attempt; returns the number of pairs set (> 0), 0 for no match, -1 when a limit was hit. */
static inline int run(RegexObject *rx, const char *s, Py_ssize_t n, pcre2_match_data *md) {
    int rc;
    if (rx->jit)
        rc = pcre2_jit_match(rx->code, (PCRE2_SPTR)s, (PCRE2_SIZE)n, 0, 0, md, g_mctx);
    else
        rc = pcre2_match(rx->code, (PCRE2_SPTR)s, (PCRE2_SIZE)n, 0, PCRE2_NO_UTF_CHECK, md, g_mctx);
    if (rc > 0)
        return rc;
    if (rc == 0) /* the ovector was too small: cannot happen, match data is sized for every pattern */
        return 1;
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    return -1;
}

/* One anchored attempt at `start` of a regex compiled anchored (the JIT takes no match-time anchoring). */
static inline int run_at(RegexObject *rx, const char *s, Py_ssize_t n, Py_ssize_t start, pcre2_match_data *md) {
    int rc;
    if (rx->jit)
        rc = pcre2_jit_match(rx->code, (PCRE2_SPTR)s, (PCRE2_SIZE)n, (PCRE2_SIZE)start, 0, md, g_mctx);
    else
        rc = pcre2_match(rx->code, (PCRE2_SPTR)s, (PCRE2_SIZE)n, (PCRE2_SIZE)start, PCRE2_NO_UTF_CHECK, md, g_mctx);
    if (rc >= 0)
        return rc > 0 ? rc : 1;
    return rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

/* Regex.search(text) -> tuple of (start, end) | None per group, or None; for tests and diagnostics
 * (ASCII text only, as the scanner uses it). Raises _scan.error when a limit is hit. */
static PyObject *Regex_search(PyObject *op, PyObject *args) {
    RegexObject *self = (RegexObject *)op;
    PyObject *text;
    if (!PyArg_ParseTuple(args, "U", &text))
        return NULL;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    if (s == NULL)
        return NULL;
    if (n != PyUnicode_GetLength(text)) {
        PyErr_SetString(PyExc_ValueError, "search() takes ASCII text");
        return NULL;
    }
    pcre2_match_data *md = pcre2_match_data_create(self->captures + 1, NULL);
    if (md == NULL)
        return PyErr_NoMemory();
    int rc = run(self, s, n, md);
    PyObject *out = NULL;
    if (rc < 0) {
        PyErr_SetString(ScanError, "match limit");
    } else if (rc == 0) {
        out = Py_NewRef(Py_None);
    } else {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        out = PyTuple_New(self->captures + 1);
        for (uint32_t i = 0; out != NULL && i <= self->captures; i++) {
            PyObject *v;
            if (ov[2 * i] == PCRE2_UNSET)
                v = Py_NewRef(Py_None);
            else
                v = Py_BuildValue("(nn)", (Py_ssize_t)ov[2 * i], (Py_ssize_t)ov[2 * i + 1]);
            if (v == NULL || PyTuple_SetItem(out, i, v) < 0) {
                Py_CLEAR(out);
            }
        }
    }
    pcre2_match_data_free(md);
    return out;
}

static PyObject *Regex_get_jit(PyObject *op, void *closure) {
    (void)closure;
    return PyBool_FromLong(((RegexObject *)op)->jit);
}

static PyObject *Regex_get_groups(PyObject *op, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLong(((RegexObject *)op)->captures);
}

static PyObject *Regex_get_names(PyObject *op, void *closure) {
    (void)closure;
    return PyDictProxy_New(((RegexObject *)op)->names);
}

static PyObject *Regex_get_pattern(PyObject *op, void *closure) {
    (void)closure;
    return Py_NewRef(((RegexObject *)op)->pattern);
}

static PyMethodDef Regex_methods[] = {
    {"search", Regex_search, METH_VARARGS, "search(text) -> spans of every group, or None"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Regex_getset[] = {
    {"jit", Regex_get_jit, NULL, "compiled to machine code", NULL},
    {"groups", Regex_get_groups, NULL, "number of capturing groups", NULL},
    {"names", Regex_get_names, NULL, "group name -> number", NULL},
    {"pattern", Regex_get_pattern, NULL, "the pattern as compiled", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Regex_slots[] = {
    {Py_tp_dealloc, Regex_dealloc},
    {Py_tp_methods, Regex_methods},
    {Py_tp_getset, Regex_getset},
    {Py_tp_doc, "A pattern compiled by PCRE2 (see compile())."},
    {0, NULL},
};

static PyType_Spec Regex_spec = {"nftblockd.detect._scan.Regex", sizeof(RegexObject), 0, Py_TPFLAGS_DEFAULT,
                                 Regex_slots};

/* ------------------------------------------------------------------------------------------------------ */
/* Conn: what the lines of one connection said so far (matcher._Conn's fields, in C)
 *
 * The Scanner creates these for the connections it sees first; lines on the Python path create
 * matcher._Conn dataclasses in the same MatchContext, and both paths read and write either kind by
 * attribute (the C side by struct field when it is a Conn). Not tracked by the garbage collector: it only
 * ever holds strings, None, booleans, a float and a dict of strings, so it cannot be part of a cycle. */

enum { K_IP4, K_IP6, K_DNS, K_FID, K_NOFAIL, K_GAINED, K_PENDING, K_FIELDS, K_USER, K_MULTI, K_SEEN, K_N };

typedef struct {
    PyObject_HEAD
    PyObject *f[K_N];
} ConnObject;

static PyObject *ConnType;
static PyObject **conn_names[K_N];

static void Conn_dealloc(PyObject *op) {
    ConnObject *self = (ConnObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    for (int k = 0; k < K_N; k++)
        Py_CLEAR(self->f[k]);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(op);
    Py_DECREF(tp);
}

static PyObject *conn_new(PyObject *const *values) {
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)ConnType, Py_tp_alloc);
    ConnObject *c = (ConnObject *)alloc((PyTypeObject *)ConnType, 0);
    if (c == NULL)
        return NULL;
    for (int k = 0; k < K_N; k++)
        c->f[k] = Py_NewRef(values[k]);
    return (PyObject *)c;
}

/* Conn(ip4, ip6, dns, fid, nofail, gained, pending, fields, user, multi, seen), as matcher._Conn */
static PyObject *Conn_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    (void)type;
    if (kw != NULL && PyDict_Size(kw) > 0) {
        PyErr_SetString(PyExc_TypeError, "Conn takes positional arguments");
        return NULL;
    }
    PyObject *v[K_N];
    if (!PyArg_UnpackTuple(args, "Conn", K_N, K_N, &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8],
                           &v[9], &v[10]))
        return NULL;
    return conn_new(v);
}

static PyMemberDef Conn_members[] = {
    {"ip4", T_OBJECT, offsetof(ConnObject, f) + K_IP4 * sizeof(PyObject *), 0, NULL},
    {"ip6", T_OBJECT, offsetof(ConnObject, f) + K_IP6 * sizeof(PyObject *), 0, NULL},
    {"dns", T_OBJECT, offsetof(ConnObject, f) + K_DNS * sizeof(PyObject *), 0, NULL},
    {"fid", T_OBJECT, offsetof(ConnObject, f) + K_FID * sizeof(PyObject *), 0, NULL},
    {"nofail", T_OBJECT, offsetof(ConnObject, f) + K_NOFAIL * sizeof(PyObject *), 0, NULL},
    {"gained", T_OBJECT, offsetof(ConnObject, f) + K_GAINED * sizeof(PyObject *), 0, NULL},
    {"pending", T_OBJECT, offsetof(ConnObject, f) + K_PENDING * sizeof(PyObject *), 0, NULL},
    {"fields", T_OBJECT, offsetof(ConnObject, f) + K_FIELDS * sizeof(PyObject *), 0, NULL},
    {"user", T_OBJECT, offsetof(ConnObject, f) + K_USER * sizeof(PyObject *), 0, NULL},
    {"multi", T_OBJECT, offsetof(ConnObject, f) + K_MULTI * sizeof(PyObject *), 0, NULL},
    {"seen", T_OBJECT, offsetof(ConnObject, f) + K_SEEN * sizeof(PyObject *), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Conn_slots[] = {
    {Py_tp_new, Conn_tp_new},
    {Py_tp_dealloc, Conn_dealloc},
    {Py_tp_members, Conn_members},
    {Py_tp_doc, "A connection's memory (matcher._Conn's fields), made by the native core."},
    {0, NULL},
};

static PyType_Spec Conn_spec = {"nftblockd.detect._scan.Conn", sizeof(ConnObject), 0, Py_TPFLAGS_DEFAULT,
                                Conn_slots};

/* A field of a connection, either kind (new reference) */
static inline PyObject *cget(PyObject *c, int k) {
    if (Py_TYPE(c) == (PyTypeObject *)ConnType)
        return Py_NewRef(((ConnObject *)c)->f[k]);
    return PyObject_GetAttr(c, *conn_names[k]);
}

static inline int cset(PyObject *c, int k, PyObject *v) {
    if (v == NULL)
        v = Py_None;
    if (Py_TYPE(c) == (PyTypeObject *)ConnType) {
        PyObject *old = ((ConnObject *)c)->f[k];
        ((ConnObject *)c)->f[k] = Py_NewRef(v);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(c, *conn_names[k], v);
}

/* matcher._other_peer: 1 when the line names an address (ip4/ip6, NULL when absent) and the connection
 * holds another one, the id reused by a new connection; 0 when not; -1 on error. */
static int other_peer(PyObject *c, PyObject *ip4, PyObject *ip6) {
    if (ip4 == NULL && ip6 == NULL)
        return 0;
    PyObject *c4 = cget(c, K_IP4), *c6 = c4 == NULL ? NULL : cget(c, K_IP6);
    int rc = -1;
    if (c4 == NULL || c6 == NULL)
        goto out;
    rc = 0;
    if (c4 == Py_None && c6 == Py_None)
        goto out;
    for (int k = 0; k < 2 && rc == 0; k++) {
        PyObject *mine = k == 0 ? ip4 : ip6, *held = k == 0 ? c4 : c6;
        if (mine == NULL)
            continue;
        if (held == Py_None) {
            rc = 1;
            continue;
        }
        int same = PyObject_RichCompareBool(mine, held, Py_EQ);
        rc = same < 0 ? -1 : !same;
    }
out:
    Py_XDECREF(c4);
    Py_XDECREF(c6);
    return rc;
}

/* Truthiness of a field; -1 on error */
static inline int ctrue(PyObject *c, int k) {
    if (Py_TYPE(c) == (PyTypeObject *)ConnType) {
        PyObject *v = ((ConnObject *)c)->f[k];
        if (v == Py_None || v == Py_False)
            return 0;
        if (v == Py_True)
            return 1;
        return PyObject_IsTrue(v);
    }
    PyObject *v = PyObject_GetAttr(c, *conn_names[k]);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* ------------------------------------------------------------------------------------------------------ */
/* Scanner: one filter */

enum { C_IP4, C_IP6, C_DNS, C_FID, C_NOFAIL, C_GAINED, C_FORGET, C_MLFID, C_N };

typedef struct {
    RegexObject *rx; /* NULL: PCRE2 cannot run this rule; a line that reaches it goes to the Python path */
    Py_ssize_t limit; /* characters of the message the rule may see (a lint-flagged regex on `re`); -1: all */
    PyObject *index;  /* the rule's index in the filter (Match.regex) */
    int core[C_N];    /* group codes: > 0 the rule's group, < 0 the prefix's (negated), 0 absent */
    Py_ssize_t nfields;
    PyObject **fname;
    int *fcode;
    Py_ssize_t fuser; /* the position of the field "user" in fname; -1: none */
    Py_ssize_t nalts;
    PyObject **abase;
    int *acode;
    /* The split form of a rule `^A(?P<user>.*)L B` (native.split_rule; NULL sa: none): A and B compiled
     * alone (anchored), L a literal text. PCRE2's interpreter pays a frame copy for each character the
     * greedy `.*` gives back on its way to the last L that B accepts; here the candidates are found by
     * memcmp from the right and B is tried at each (run_rule). */
    RegexObject *sa, *sb;
    char *slit;
    Py_ssize_t slitlen;
    int suser;   /* the user group's number in rx */
    Py_ssize_t sna, snb;
    int *samap, *sbmap; /* A's (B's) group i + 1 -> rx's group */
} Rule;

typedef struct {
    char *key;
    Py_ssize_t klen;
    Py_ssize_t n;
    int *rules;
    Py_ssize_t next; /* the next head (in table order) whose key has the same first byte; -1: none */
} Head;

/* Epochs of local wall-clock hours, as DateParser.hour_base gives them: a cache, since a syslog timestamp
 * converts as base + minutes * 60 + seconds. */
#define HOUR_SLOTS 256
typedef struct {
    int year, month, day, hour;
    int state; /* 0 empty, 1 base, 2 the zone's offset changes within the hour, 3 no such date */
    double base;
} HourSlot;

/* A text text_again made, with its characters (the str's own, valid while `text` is held) */
typedef struct {
    PyObject *text;
    const char *s;
    Py_ssize_t n;
} LastText;

typedef struct {
    PyObject_HEAD
    Py_ssize_t ngate; /* -1: no gate */
    char **gate;
    Py_ssize_t *gatelen;
    Py_ssize_t max_line;
    RegexObject *ts; /* (syslog)|(iso), anchored */
    int ts_syslog_c; /* ts's first alternative is timestamps.FAST_SYSLOG: syslog_shape() may stand in for it */
    int prefix_kind; /* 0 none, 1 anchored prefix (content: the rest), 2 prefregex (content: its group) */
    RegexObject *prefix;
    Py_ssize_t prefix_limit;
    Py_ssize_t nhead; /* the daemon names of the prefix's syslog header (syslog_head_end); 0: no such header */
    char **head;
    Py_ssize_t *headlen;
    Py_ssize_t ntail; /* the texts the prefix's rest matches, in the order the regex tries them */
    char **tail;
    Py_ssize_t *taillen;
    PCRE2_SIZE head_ov[4]; /* the ovector the whole prefix gives (its one group: the header, F-MLFID) */
    int content_group;
    Py_ssize_t heads_len;
    Py_ssize_t nheads;
    Head *heads;
    Py_ssize_t head_first[256]; /* the first head (in table order) whose key starts with that byte; -1: none */
    Py_ssize_t nunheaded;
    int *unheaded;
    Py_ssize_t nrules;
    Rule *rules;
    Py_ssize_t nign;
    RegexObject **ign;
    Py_ssize_t *ign_limit;
    int ignore_whole;
    PyObject *stamp, *year_of, *hour_base, *find_span, *hosts, *parse_host, *match_type, *rejected_type, *evict,
        *ipv4_type, *ipv6_type;
    PyObject *last_raw, *last_host; /* the host text `result` parsed last, and what it gave (NULL: none yet) */
    LastText last_text[2];          /* the last connection id and IPv4 text made (see text_again) */
    char *buf; /* max_line bytes: a line without the timestamp found inside it */
    Py_ssize_t host_memo;
    HourSlot hours[HOUR_SLOTS];
    pcre2_match_data *md_ts, *md_pre, *md_rule, *md_ign, *md_sa, *md_sb;
    PCRE2_SIZE *split_ov; /* a split rule's match, numbered as its whole regex numbers its groups */
    Py_ssize_t split_pairs;
    long long lines, python_lines, limited, headers, split_hits, split_misses;
    int busy;
} ScannerObject;

static PyObject *ScannerType;

static void free_texts(char ***texts, Py_ssize_t **lens, Py_ssize_t n) {
    if (*texts != NULL) {
        for (Py_ssize_t i = 0; i < n; i++)
            PyMem_Free((*texts)[i]);
        PyMem_Free(*texts);
        *texts = NULL;
    }
    PyMem_Free(*lens);
    *lens = NULL;
}

static void Scanner_free_tables(ScannerObject *self) {
    free_texts(&self->gate, &self->gatelen, self->ngate);
    if (self->heads != NULL) {
        for (Py_ssize_t i = 0; i < self->nheads; i++) {
            PyMem_Free(self->heads[i].key);
            PyMem_Free(self->heads[i].rules);
        }
        PyMem_Free(self->heads);
        self->heads = NULL;
    }
    PyMem_Free(self->unheaded);
    self->unheaded = NULL;
    if (self->rules != NULL) {
        for (Py_ssize_t i = 0; i < self->nrules; i++) {
            Rule *r = &self->rules[i];
            Py_XDECREF((PyObject *)r->rx);
            Py_XDECREF(r->index);
            for (Py_ssize_t j = 0; j < r->nfields; j++)
                Py_XDECREF(r->fname[j]);
            for (Py_ssize_t j = 0; j < r->nalts; j++)
                Py_XDECREF(r->abase[j]);
            PyMem_Free(r->fname);
            PyMem_Free(r->fcode);
            PyMem_Free(r->abase);
            PyMem_Free(r->acode);
            Py_XDECREF((PyObject *)r->sa);
            Py_XDECREF((PyObject *)r->sb);
            PyMem_Free(r->slit);
            PyMem_Free(r->samap);
            PyMem_Free(r->sbmap);
        }
        PyMem_Free(self->rules);
        self->rules = NULL;
    }
    if (self->ign != NULL) {
        for (Py_ssize_t i = 0; i < self->nign; i++)
            Py_XDECREF((PyObject *)self->ign[i]);
        PyMem_Free(self->ign);
        self->ign = NULL;
    }
    PyMem_Free(self->ign_limit);
    self->ign_limit = NULL;
    free_texts(&self->head, &self->headlen, self->nhead);
    free_texts(&self->tail, &self->taillen, self->ntail);
}

static int Scanner_traverse(PyObject *op, visitproc visit, void *arg) {
    ScannerObject *self = (ScannerObject *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->stamp);
    Py_VISIT(self->year_of);
    Py_VISIT(self->hour_base);
    Py_VISIT(self->find_span);
    Py_VISIT(self->ipv4_type);
    Py_VISIT(self->ipv6_type);
    Py_VISIT(self->hosts);
    Py_VISIT(self->parse_host);
    Py_VISIT(self->match_type);
    Py_VISIT(self->rejected_type);
    Py_VISIT(self->evict);
    Py_VISIT(self->last_raw);
    Py_VISIT(self->last_host);
    Py_VISIT(self->last_text[0].text);
    Py_VISIT(self->last_text[1].text);
    return 0;
}

static int Scanner_clear(PyObject *op) {
    ScannerObject *self = (ScannerObject *)op;
    Py_CLEAR(self->stamp);
    Py_CLEAR(self->year_of);
    Py_CLEAR(self->hour_base);
    Py_CLEAR(self->find_span);
    Py_CLEAR(self->ipv4_type);
    Py_CLEAR(self->ipv6_type);
    Py_CLEAR(self->hosts);
    Py_CLEAR(self->parse_host);
    Py_CLEAR(self->match_type);
    Py_CLEAR(self->rejected_type);
    Py_CLEAR(self->evict);
    Py_CLEAR(self->last_raw);
    Py_CLEAR(self->last_host);
    Py_CLEAR(self->last_text[0].text);
    Py_CLEAR(self->last_text[1].text);
    return 0;
}

static void Scanner_dealloc(PyObject *op) {
    ScannerObject *self = (ScannerObject *)op;
    PyTypeObject *tp = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    Scanner_clear(op);
    Scanner_free_tables(self);
    PyMem_Free(self->buf);
    Py_CLEAR(self->ts);
    Py_CLEAR(self->prefix);
    if (self->md_ts)
        pcre2_match_data_free(self->md_ts);
    if (self->md_pre)
        pcre2_match_data_free(self->md_pre);
    if (self->md_rule)
        pcre2_match_data_free(self->md_rule);
    if (self->md_ign)
        pcre2_match_data_free(self->md_ign);
    if (self->md_sa)
        pcre2_match_data_free(self->md_sa);
    if (self->md_sb)
        pcre2_match_data_free(self->md_sb);
    PyMem_Free(self->split_ov);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(op);
    Py_DECREF(tp);
}

static int as_regex(PyObject *o, RegexObject **out, int optional) {
    if (o == Py_None && optional) {
        *out = NULL;
        return 0;
    }
    if (!PyObject_TypeCheck(o, (PyTypeObject *)RegexType)) {
        PyErr_SetString(PyExc_TypeError, "expected a Regex");
        return -1;
    }
    Py_INCREF(o);
    *out = (RegexObject *)o;
    return 0;
}

static char *copy_bytes(PyObject *b, Py_ssize_t *len) {
    char *s;
    if (PyBytes_AsStringAndSize(b, &s, len) < 0)
        return NULL;
    char *c = PyMem_Malloc(*len + 1);
    if (c == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(c, s, *len);
    c[*len] = 0;
    return c;
}

/* A sequence of bytes as C arrays (freed by free_texts, also after a failure here). */
static int copy_texts(PyObject *seq, char ***texts, Py_ssize_t **lens, Py_ssize_t *count) {
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0)
        return -1;
    *texts = PyMem_Calloc(n + 1, sizeof(char *));
    *lens = PyMem_Calloc(n + 1, sizeof(Py_ssize_t));
    if (*texts == NULL || *lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *count = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PySequence_GetItem(seq, i);
        if (b == NULL)
            return -1;
        (*texts)[i] = copy_bytes(b, &(*lens)[i]);
        Py_DECREF(b);
        if ((*texts)[i] == NULL)
            return -1;
    }
    return 0;
}

static int int_at(PyObject *seq, Py_ssize_t i, int *out) {
    PyObject *o = PySequence_GetItem(seq, i);
    if (o == NULL)
        return -1;
    long v = PyLong_AsLong(o);
    Py_DECREF(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int)v;
    return 0;
}

static int int_list(PyObject *seq, Py_ssize_t *n, int **out) {
    *n = PySequence_Size(seq);
    if (*n < 0)
        return -1;
    *out = PyMem_Calloc(*n + 1, sizeof(int));
    if (*out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++)
        if (int_at(seq, i, &(*out)[i]) < 0)
            return -1;
    return 0;
}

/* (name: str, code: int) pairs */
static int named_codes(PyObject *seq, Py_ssize_t *n, PyObject ***names, int **codes) {
    *n = PySequence_Size(seq);
    if (*n < 0)
        return -1;
    *names = PyMem_Calloc(*n + 1, sizeof(PyObject *));
    *codes = PyMem_Calloc(*n + 1, sizeof(int));
    if (*names == NULL || *codes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *pair = PySequence_GetItem(seq, i);
        if (pair == NULL)
            return -1;
        PyObject *name = PySequence_GetItem(pair, 0);
        int rc = name == NULL ? -1 : int_at(pair, 1, &(*codes)[i]);
        Py_DECREF(pair);
        if (rc < 0) {
            Py_XDECREF(name);
            return -1;
        }
        if (!PyUnicode_Check(name)) {
            Py_DECREF(name);
            PyErr_SetString(PyExc_TypeError, "field names are str");
            return -1;
        }
        (*names)[i] = name;
    }
    return 0;
}

static uint32_t max_captures(uint32_t a, RegexObject *rx) {
    return rx != NULL && rx->captures > a ? rx->captures : a;
}

/*
 * Scanner(gate, max_line, ts, prefix_kind, prefix, prefix_limit, content_group, heads_len, heads, unheaded,
 *         rules, ignores, ignore_whole, stamp, year_of, hour_base, find_span, hosts, parse_host, host_memo,
 *         match_type, rejected_type, evict, ipv4_type[, ts_syslog_c, ipv6_type])
 *
 *   ts: the syslog / ISO shapes, or None when the filter's datepattern has other forms
 *
 *   gate: tuple[bytes, ...] | None; heads: tuple[(key: bytes, rule positions: tuple[int, ...]), ...]
 *   rules: tuple[(Regex | None, limit, index, core codes (8 ints), fields ((name, code), ...),
 *                 alts ((base, code), ...)), ...]
 *   ignores: tuple[(Regex, limit), ...]
 */
/* A group map (a tuple of rx's group numbers, one per group of the part) into *n, *out; every number must be a
 * group of rx. 0 ok, -1 error set. */
static int group_map(PyObject *seq, const RegexObject *rx, Py_ssize_t *n, int **out) {
    if (int_list(seq, n, out) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < *n; i++)
        if ((*out)[i] < 1 || (uint32_t)(*out)[i] > rx->captures) {
            PyErr_SetString(PyExc_ValueError, "a split rule's group is not one of its regex's");
            return -1;
        }
    return 0;
}

/* The rule spec's 7th item: None, or (A, L, user group, A's map, B, B's map) (native.split_rule). */
static int split_spec(PyObject *spec, Rule *r) {
    PyObject *sp = PySequence_GetItem(spec, 6);
    if (sp == NULL)
        return -1;
    int ok = 1;
    if (sp != Py_None) {
        PyObject *it[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
        ok = PySequence_Size(sp) == 6;
        for (int k = 0; ok && k < 6; k++)
            ok = (it[k] = PySequence_GetItem(sp, k)) != NULL;
        if (ok)
            ok = r->rx != NULL && as_regex(it[0], &r->sa, 0) == 0 && as_regex(it[4], &r->sb, 0) == 0;
        if (ok)
            ok = (r->slit = copy_bytes(it[1], &r->slitlen)) != NULL && r->slitlen > 0;
        if (ok)
            ok = int_at(sp, 2, &r->suser) == 0 && r->suser >= 1 && (uint32_t)r->suser <= r->rx->captures;
        if (ok)
            ok = group_map(it[3], r->rx, &r->sna, &r->samap) == 0 && r->sna == (Py_ssize_t)r->sa->captures &&
                 group_map(it[5], r->rx, &r->snb, &r->sbmap) == 0 && r->snb == (Py_ssize_t)r->sb->captures;
        for (int k = 0; k < 6; k++)
            Py_XDECREF(it[k]);
        if (!ok && !PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a bad split rule");
    }
    Py_DECREF(sp);
    return ok ? 0 : -1;
}

static PyObject *Scanner_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *gate, *ts, *prefix, *heads, *unheaded, *rules, *ignores, *stamp, *year_of, *hour_base, *find_span,
        *hosts, *parse_host, *match_type, *rejected_type, *evict, *ipv4_type, *ipv6_type = Py_None,
        *head = Py_None, *tails = Py_None;
    Py_ssize_t max_line, prefix_limit, heads_len, host_memo;
    int prefix_kind, content_group, ignore_whole, ts_syslog_c = 0;
    (void)kw;
    if (!PyArg_ParseTuple(args, "OnOiOninOOOOpOOOOO!OnOOOO|pOOO", &gate, &max_line, &ts, &prefix_kind, &prefix,
                          &prefix_limit, &content_group, &heads_len, &heads, &unheaded, &rules, &ignores,
                          &ignore_whole, &stamp, &year_of, &hour_base, &find_span, &PyDict_Type, &hosts,
                          &parse_host, &host_memo, &match_type, &rejected_type, &evict, &ipv4_type,
                          &ts_syslog_c, &ipv6_type, &head, &tails))
        return NULL;
    /* by_slots allocates through these as types: anything else would be a bad cast, not an error */
    if ((ipv4_type != Py_None && !PyType_Check(ipv4_type)) || (ipv6_type != Py_None && !PyType_Check(ipv6_type))) {
        PyErr_SetString(PyExc_TypeError, "ipv4_type and ipv6_type must be a type or None");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    ScannerObject *self = (ScannerObject *)alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->max_line = max_line;
    self->ts_syslog_c = ts_syslog_c;
    self->prefix_kind = prefix_kind;
    self->prefix_limit = prefix_limit;
    self->content_group = content_group;
    self->heads_len = heads_len;
    self->ignore_whole = ignore_whole;
    self->host_memo = host_memo;
    self->stamp = Py_NewRef(stamp);
    self->year_of = Py_NewRef(year_of);
    self->hour_base = Py_NewRef(hour_base);
    self->find_span = Py_NewRef(find_span);
    self->buf = PyMem_Malloc(max_line > 0 ? (size_t)max_line : 1);
    if (self->buf == NULL) {
        PyErr_NoMemory();
        Py_DECREF(self);
        return NULL;
    }
    self->hosts = Py_NewRef(hosts);
    self->parse_host = Py_NewRef(parse_host);
    self->match_type = Py_NewRef(match_type);
    self->rejected_type = Py_NewRef(rejected_type);
    self->evict = Py_NewRef(evict);
    self->ipv4_type = Py_NewRef(ipv4_type);
    self->ipv6_type = Py_NewRef(ipv6_type);
    self->ngate = -1;
    if (as_regex(ts, &self->ts, 1) < 0 || as_regex(prefix, &self->prefix, 1) < 0)
        goto fail;
    if ((head == Py_None) != (tails == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "a syslog header has daemon names and tail texts");
        goto fail;
    }
    if (head != Py_None) {
        if (self->prefix == NULL || prefix_kind != 1 || self->prefix->captures != 1) {
            PyErr_SetString(PyExc_ValueError, "a syslog header needs an anchored prefix whose one group it is");
            goto fail;
        }
        if (copy_texts(head, &self->head, &self->headlen, &self->nhead) < 0 ||
            copy_texts(tails, &self->tail, &self->taillen, &self->ntail) < 0)
            goto fail;
    }
    if (gate != Py_None) {
        if (copy_texts(gate, &self->gate, &self->gatelen, &self->ngate) < 0)
            goto fail;
    }
    /* rules */
    self->nrules = PySequence_Size(rules);
    if (self->nrules < 0)
        goto fail;
    self->rules = PyMem_Calloc(self->nrules + 1, sizeof(Rule));
    if (self->rules == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    uint32_t caps = 0, scaps = 0, bcaps = 0;
    for (Py_ssize_t i = 0; i < self->nrules; i++) {
        Rule *r = &self->rules[i];
        PyObject *spec = PySequence_GetItem(rules, i);
        if (spec == NULL)
            goto fail;
        PyObject *rx = PySequence_GetItem(spec, 0), *limit = PySequence_GetItem(spec, 1),
                 *index = PySequence_GetItem(spec, 2), *core = PySequence_GetItem(spec, 3),
                 *fields = PySequence_GetItem(spec, 4), *alts = PySequence_GetItem(spec, 5);
        int ok = rx != NULL && limit != NULL && index != NULL && core != NULL && fields != NULL && alts != NULL;
        if (ok)
            ok = as_regex(rx, &r->rx, 1) == 0;
        if (ok) {
            r->limit = PyLong_AsSsize_t(limit);
            ok = !(r->limit == -1 && PyErr_Occurred());
        }
        if (ok) {
            r->index = Py_NewRef(index);
            for (int k = 0; ok && k < C_N; k++)
                ok = int_at(core, k, &r->core[k]) == 0;
        }
        if (ok)
            ok = named_codes(fields, &r->nfields, &r->fname, &r->fcode) == 0;
        r->fuser = -1;
        for (Py_ssize_t j = 0; ok && j < r->nfields; j++) {
            int cmp = PyUnicode_Compare(r->fname[j], s_user);
            ok = !(cmp == -1 && PyErr_Occurred());
            if (ok && cmp == 0)
                r->fuser = j;
        }
        if (ok)
            ok = named_codes(alts, &r->nalts, &r->abase, &r->acode) == 0;
        if (ok && PySequence_Size(spec) > 6)
            ok = split_spec(spec, r) == 0;
        else if (PyErr_Occurred())
            ok = 0;
        Py_XDECREF(rx);
        Py_XDECREF(limit);
        Py_XDECREF(index);
        Py_XDECREF(core);
        Py_XDECREF(fields);
        Py_XDECREF(alts);
        Py_DECREF(spec);
        if (!ok)
            goto fail;
        caps = max_captures(caps, r->rx);
        if (r->sa != NULL) {
            scaps = max_captures(scaps, r->sa);
            bcaps = max_captures(bcaps, r->sb);
        }
    }
    /* dispatch */
    if (int_list(unheaded, &self->nunheaded, &self->unheaded) < 0)
        goto fail;
    self->nheads = PySequence_Size(heads);
    if (self->nheads < 0)
        goto fail;
    self->heads = PyMem_Calloc(self->nheads + 1, sizeof(Head));
    if (self->heads == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < self->nheads; i++) {
        PyObject *pair = PySequence_GetItem(heads, i);
        if (pair == NULL)
            goto fail;
        PyObject *key = PySequence_GetItem(pair, 0), *list = PySequence_GetItem(pair, 1);
        int ok = key != NULL && list != NULL;
        if (ok)
            ok = (self->heads[i].key = copy_bytes(key, &self->heads[i].klen)) != NULL;
        if (ok)
            ok = int_list(list, &self->heads[i].n, &self->heads[i].rules) == 0;
        Py_XDECREF(key);
        Py_XDECREF(list);
        Py_DECREF(pair);
        if (!ok)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < self->nunheaded; i++)
        if (self->unheaded[i] < 0 || self->unheaded[i] >= self->nrules)
            goto bad_index;
    /* heads chained by their first byte: the dispatch looks only at the heads the message's first byte
     * allows, in table order (a key of another length never matches: it is left out) */
    for (int c = 0; c < 256; c++)
        self->head_first[c] = -1;
    for (Py_ssize_t i = self->nheads - 1; i >= 0; i--) {
        Head *hd = &self->heads[i];
        hd->next = -1;
        if (hd->klen != self->heads_len || hd->klen < 1)
            continue;
        unsigned char c = (unsigned char)hd->key[0];
        hd->next = self->head_first[c];
        self->head_first[c] = i;
    }
    for (Py_ssize_t i = 0; i < self->nheads; i++)
        for (Py_ssize_t j = 0; j < self->heads[i].n; j++)
            if (self->heads[i].rules[j] < 0 || self->heads[i].rules[j] >= self->nrules)
                goto bad_index;
    /* ignores */
    self->nign = PySequence_Size(ignores);
    if (self->nign < 0)
        goto fail;
    self->ign = PyMem_Calloc(self->nign + 1, sizeof(RegexObject *));
    self->ign_limit = PyMem_Calloc(self->nign + 1, sizeof(Py_ssize_t));
    if (self->ign == NULL || self->ign_limit == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    uint32_t icaps = 0;
    for (Py_ssize_t i = 0; i < self->nign; i++) {
        PyObject *pair = PySequence_GetItem(ignores, i);
        if (pair == NULL)
            goto fail;
        PyObject *rx = PySequence_GetItem(pair, 0), *limit = PySequence_GetItem(pair, 1);
        int ok = rx != NULL && limit != NULL && as_regex(rx, &self->ign[i], 0) == 0;
        if (ok) {
            self->ign_limit[i] = PyLong_AsSsize_t(limit);
            ok = !(self->ign_limit[i] == -1 && PyErr_Occurred());
        }
        Py_XDECREF(rx);
        Py_XDECREF(limit);
        Py_DECREF(pair);
        if (!ok)
            goto fail;
        icaps = max_captures(icaps, self->ign[i]);
    }
    self->md_ts = pcre2_match_data_create(max_captures(0, self->ts) + 1, NULL);
    self->md_pre = pcre2_match_data_create(max_captures(0, self->prefix) + 1, NULL);
    self->md_rule = pcre2_match_data_create(caps + 1, NULL);
    self->md_ign = pcre2_match_data_create(icaps + 1, NULL);
    self->md_sa = pcre2_match_data_create(scaps + 1, NULL);
    self->md_sb = pcre2_match_data_create(bcaps + 1, NULL);
    self->split_pairs = (Py_ssize_t)caps + 1;
    self->split_ov = PyMem_Calloc((size_t)self->split_pairs * 2, sizeof(PCRE2_SIZE));
    if (!self->md_ts || !self->md_pre || !self->md_rule || !self->md_ign || !self->md_sa || !self->md_sb ||
        !self->split_ov) {
        PyErr_NoMemory();
        goto fail;
    }
    return (PyObject *)self;
bad_index:
    PyErr_SetString(PyExc_ValueError, "rule position out of range");
fail:
    Py_DECREF(self);
    return NULL;
}

/* -- per line ------------------------------------------------------------------------------------------ */

typedef struct {
    const char *content; /* subject of the rule's groups */
    PCRE2_SIZE *ov;
    const char *text; /* subject of the prefix's groups */
    PCRE2_SIZE *pov;
} Groups;

/* The span of group `code`; 0 when it did not take part. */
static inline int span(const Groups *g, int code, const char **s, Py_ssize_t *n) {
    PCRE2_SIZE *ov;
    const char *base;
    if (code > 0) {
        ov = g->ov + 2 * code;
        base = g->content;
    } else if (code < 0 && g->pov != NULL) {
        ov = g->pov - 2 * code;
        base = g->text;
    } else {
        return 0;
    }
    if (ov[0] == PCRE2_UNSET)
        return 0;
    *s = base + ov[0];
    *n = (Py_ssize_t)(ov[1] - ov[0]);
    return 1;
}

/* 1: the group took part (its text may be empty) */
static inline int took_part(const Groups *g, int code) {
    const char *s;
    Py_ssize_t n;
    return span(g, code, &s, &n);
}

/* 1: the group took part and is not empty (Python truthiness of the captured text) */
static inline int truthy(const Groups *g, int code) {
    const char *s;
    Py_ssize_t n;
    return span(g, code, &s, &n) && n > 0;
}

/* New reference to the group's text, NULL with no error set when it did not take part. */
static inline PyObject *text_of(const Groups *g, int code) {
    const char *s;
    Py_ssize_t n;
    if (!span(g, code, &s, &n))
        return NULL;
    return PyUnicode_DecodeASCII(s, n, NULL);
}

/*
 * text_of, but the text made last time (`last`) is handed out again when the group holds the same
 * characters. A connection's lines come in runs: 80 % of a brute-force log's sshd lines have the previous
 * line's connection id, and most the previous line's address. The same object saves its allocation and,
 * as a dict key (the connection memory, the host memo), its hash and comparison.
 */
static PyObject *text_again(const Groups *g, int code, LastText *last) {
    const char *s;
    Py_ssize_t n;
    if (!span(g, code, &s, &n))
        return NULL;
    if (last->text != NULL && last->n == n && memcmp(last->s, s, (size_t)n) == 0)
        return Py_NewRef(last->text);
    PyObject *t = PyUnicode_DecodeASCII(s, n, NULL);
    if (t == NULL)
        return NULL;
    const char *ts = PyUnicode_AsUTF8AndSize(t, &n); /* an ASCII str's own characters: no copy is made */
    if (ts == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    PyObject *old = last->text;
    last->text = Py_NewRef(t);
    last->s = ts;
    last->n = n;
    Py_XDECREF(old);
    return t;
}

static PyObject *build_fields(const Rule *r, const Groups *g) {
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < r->nfields; i++) {
        if (r->fcode[i] == 0)
            continue;
        PyObject *v = text_of(g, r->fcode[i]);
        if (v == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        int rc = PyDict_SetItem(d, r->fname[i], v);
        Py_DECREF(v);
        if (rc < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < r->nalts; i++) {
        if (!truthy(g, r->acode[i]))
            continue;
        PyObject *cur = PyDict_GetItemWithError(d, r->abase[i]);
        if (cur == NULL && PyErr_Occurred())
            goto fail;
        if (cur != NULL && PyObject_IsTrue(cur))
            continue;
        PyObject *v = text_of(g, r->acode[i]);
        if (v == NULL)
            goto fail;
        int rc = PyDict_SetItem(d, r->abase[i], v);
        Py_DECREF(v);
        if (rc < 0)
            goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static int is_true(PyObject *o) { return o != NULL && o != Py_None && PyObject_IsTrue(o) == 1; }

/* `a or b or c or d` over possibly-NULL (None) values: the first non-empty text, else NULL */
static PyObject *first_truthy(PyObject *a, PyObject *b, PyObject *c, PyObject *d) {
    PyObject *v[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (is_true(v[i]))
            return v[i];
    return NULL;
}

static PyObject *new_tuple_of(PyObject *type, PyObject **items, int n) {
    /* A NamedTuple is a tuple subclass without extra fields: allocate it as the type does and fill it
     * (what tuple.__new__(type, values) does, without building the values tuple first). */
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_alloc);
    PyObject *t = alloc((PyTypeObject *)type, n);
    if (t == NULL)
        return NULL;
    for (int i = 0; i < n; i++) {
        if (PyTuple_SetItem(t, i, Py_NewRef(items[i])) < 0) {
            Py_DECREF(t);
            return NULL;
        }
    }
    return t;
}

/*
 * parse_host's common case in C: a plain dotted quad that inet_pton takes (it refuses leading zeros, as
 * parse_host does) becomes an IPv4Address built as object.__new__ + _ip (native.py checked at start that
 * this equals the class's own constructor; ipv4_type is None otherwise). NULL without an error: anything
 * else, for parse_host.
 */
/* An address object of `type` (IPv4Address or IPv6Address) from its value (stolen; NULL: an error is set)
 * through its slots: _ip, and _scope_id = None for IPv6 (`scoped`). */
static PyObject *by_slots(PyObject *type, PyObject *value, int scoped) {
    if (value == NULL)
        return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_alloc);
    PyObject *addr = alloc((PyTypeObject *)type, 0);
    if (addr == NULL || PyObject_SetAttr(addr, s_ip, value) < 0 ||
        (scoped && PyObject_SetAttr(addr, s_scope_id, Py_None) < 0)) {
        Py_XDECREF(addr);
        Py_DECREF(value);
        return NULL;
    }
    Py_DECREF(value);
    return addr;
}

static PyObject *ipv4_fast(ScannerObject *self, PyObject *raw) {
    if (self->ipv4_type == Py_None)
        return NULL;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(raw, &n);
    if (s == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (n < 7 || n > 15 || strlen(s) != (size_t)n || memchr(s, ':', (size_t)n) != NULL || s[0] == '[')
        return NULL;
    struct in_addr a;
    if (inet_pton(AF_INET, s, &a) != 1)
        return NULL;
    return by_slots(self->ipv4_type, PyLong_FromUnsignedLong((unsigned long)ntohl(a.s_addr)), 0);
}

/*
 * parse_host's IPv6 case in C: the text (in brackets or not) that inet_pton takes becomes an IPv6Address
 * built as object.__new__ + _ip + _scope_id, or the IPv4Address an IPv4-mapped one carries
 * (normalise_address). The Python path parses such a text with ipaddress.IPv6Address at ~10 us a call: a
 * brute-force log's IPv6 attackers each cost one (nearly 10 % of the scan's instructions). inet_pton
 * refuses zone ids ("%"), which parse_host refuses too; what inet_pton refuses goes to parse_host, which
 * decides (tests/unit/test_native.py holds the two equal on generated texts). native.py checked at start
 * that the slots make what the class's constructor makes; ipv6_type is None otherwise.
 */
static PyObject *ipv6_fast(ScannerObject *self, PyObject *raw) {
    if (self->ipv6_type == Py_None || self->ipv4_type == Py_None)
        return NULL;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(raw, &n);
    if (s == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        s++;
        n -= 2;
    }
    char text[INET6_ADDRSTRLEN];
    if (n < 2 || n >= (Py_ssize_t)sizeof text || memchr(s, ':', (size_t)n) == NULL)
        return NULL;
    memcpy(text, s, (size_t)n);
    text[n] = 0;
    unsigned char a[16];
    if (strlen(text) != (size_t)n || inet_pton(AF_INET6, text, a) != 1)
        return NULL;
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(a, mapped, sizeof mapped) == 0) {
        unsigned long v4 = ((unsigned long)a[12] << 24) | ((unsigned long)a[13] << 16) |
                           ((unsigned long)a[14] << 8) | (unsigned long)a[15];
        return by_slots(self->ipv4_type, PyLong_FromUnsignedLong(v4), 0);
    }
    unsigned long long hi = 0, lo = 0;
    for (int i = 0; i < 8; i++) {
        hi = (hi << 8) | a[i];
        lo = (lo << 8) | a[8 + i];
    }
    PyObject *h = PyLong_FromUnsignedLongLong(hi), *l = PyLong_FromUnsignedLongLong(lo), *shift = NULL,
             *value = NULL;
    if (h != NULL && l != NULL && (shift = PyLong_FromLong(64)) != NULL) {
        PyObject *up = PyNumber_Lshift(h, shift);
        if (up != NULL) {
            value = PyNumber_Or(up, l);
            Py_DECREF(up);
        }
    }
    Py_XDECREF(h);
    Py_XDECREF(l);
    Py_XDECREF(shift);
    return by_slots(self->ipv6_type, value, 1);
}

/* Match(host, when, ignored, fields, regex) or Rejected(text, reason, when, ignored, regex) for `raw` */
static PyObject *result(ScannerObject *self, PyObject *raw, PyObject *when, int ignored, PyObject *fields,
                        PyObject *index) {
    PyObject *ign = ignored ? Py_True : Py_False;
    if (raw == NULL) {
        PyObject *items[5] = {s_empty, s_no_address, when, ign, index};
        return new_tuple_of(self->rejected_type, items, 5);
    }
    /* An attacker's lines come in runs (a connection's failures): the host of the previous result is
     * taken again without the memo's lookup, which misses the CPU caches on a large memo (it was ~6 % of
     * a brute-force log's matching; the text is the same as last time for ~55 % of results there). */
    PyObject *host = NULL;
    /* Both exact str, checked before the lengths: PyUnicode_GetLength of anything else sets an error this
     * test would leave behind (a connection's stored text can be whatever the Python side put there). */
    int again = self->last_raw != NULL && (raw == self->last_raw ||
                (PyUnicode_CheckExact(raw) && PyUnicode_CheckExact(self->last_raw) &&
                 PyUnicode_GetLength(raw) == PyUnicode_GetLength(self->last_raw) &&
                 PyUnicode_Compare(raw, self->last_raw) == 0));
    if (again) {
        host = Py_NewRef(self->last_host);
    } else if ((host = PyDict_GetItemWithError(self->hosts, raw)) != NULL) {
        Py_INCREF(host);
    } else {
        if (PyErr_Occurred())
            return NULL;
        host = ipv4_fast(self, raw);
        if (host == NULL && !PyErr_Occurred())
            host = ipv6_fast(self, raw);
        if (host == NULL && !PyErr_Occurred())
            host = PyObject_CallFunctionObjArgs(self->parse_host, raw, NULL);
        if (host == NULL)
            return NULL;
        if (PyDict_Size(self->hosts) >= self->host_memo)
            PyDict_Clear(self->hosts);
        if (PyDict_SetItem(self->hosts, raw, host) < 0) {
            Py_DECREF(host);
            return NULL;
        }
    }
    if (!again) {
        PyObject *old_raw = self->last_raw, *old_host = self->last_host;
        self->last_raw = Py_NewRef(raw);
        self->last_host = Py_NewRef(host);
        Py_XDECREF(old_raw);
        Py_XDECREF(old_host);
    }
    PyObject *out;
    if (PyUnicode_Check(host)) {
        PyObject *items[5] = {raw, host, when, ign, index};
        out = new_tuple_of(self->rejected_type, items, 5);
    } else {
        PyObject *items[5] = {host, when, ign, fields, index};
        out = new_tuple_of(self->match_type, items, 5);
    }
    Py_DECREF(host);
    return out;
}

static int append(PyObject *out, Py_ssize_t i, PyObject *r) {
    if (r == NULL)
        return -1;
    PyObject *idx = PyLong_FromSsize_t(i);
    if (idx == NULL) {
        Py_DECREF(r);
        return -1;
    }
    PyObject *pair = PyTuple_Pack(2, idx, r);
    Py_DECREF(idx);
    Py_DECREF(r);
    if (pair == NULL)
        return -1;
    int rc = PyList_Append(out, pair);
    Py_DECREF(pair);
    return rc;
}

typedef struct {
    PyObject *conns;
    double max_age;
    Py_ssize_t max_entries;
    PyObject *ctx;
    PyObject *now;
    double now_d;
    long year; /* DateParser.year_of(now), asked once per call; -1: not yet */
} Context;

/*
 * A known connection learns the line's fields. A connection's fields dict is never changed in place (the
 * results of its lines hold it, as matcher._merged_fields says): when a value is new or differs, the
 * connection gets a new dict; when all are the same (a connection's lines repeat its user), nothing is made.
 */
static int fold_fields(PyObject *conn, PyObject *fields) {
    PyObject *cf = cget(conn, K_FIELDS);
    if (cf == NULL)
        return -1;
    int rc = -1;
    if (!PyDict_Check(cf)) {
        PyErr_SetString(PyExc_TypeError, "a connection's fields must be a dict");
        goto out;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    int differs = 0;
    while (!differs && PyDict_Next(fields, &pos, &k, &v)) {
        PyObject *held = PyDict_GetItemWithError(cf, k);
        if (held == NULL) {
            if (PyErr_Occurred())
                goto out;
            differs = 1;
        } else {
            int eq = PyObject_RichCompareBool(held, v, Py_EQ);
            if (eq < 0)
                goto out;
            differs = !eq;
        }
    }
    rc = 0;
    if (differs) {
        PyObject *merged = PyDict_Copy(cf);
        if (merged == NULL || PyDict_Update(merged, fields) < 0 || cset(conn, K_FIELDS, merged) < 0)
            rc = -1;
        Py_XDECREF(merged);
    }
out:
    Py_DECREF(cf);
    return rc;
}

/*
 * 1 when each field the line's rule captured already has that very text in the connection's fields (the
 * rule has no alt_ fields): the line says nothing new, so its fields dict is not made at all (what
 * build_fields then fold_fields would find), and `*held` is the connection's dict (new reference). 0: the
 * line's fields must be made and folded; -1: an error. Most lines of a connection repeat its user.
 */
static int fields_held(const Rule *r, const Groups *g, PyObject *conn, PyObject **held) {
    PyObject *cf = cget(conn, K_FIELDS);
    if (cf == NULL)
        return -1;
    if (!PyDict_Check(cf))
        goto differs; /* fold_fields says what is wrong */
    for (Py_ssize_t i = 0; i < r->nfields; i++) {
        const char *s;
        Py_ssize_t n, hn;
        if (r->fcode[i] == 0 || !span(g, r->fcode[i], &s, &n))
            continue; /* not captured: build_fields leaves it out */
        PyObject *v = PyDict_GetItemWithError(cf, r->fname[i]);
        if (v == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(cf);
                return -1;
            }
            goto differs;
        }
        if (!PyUnicode_CheckExact(v))
            goto differs;
        const char *hs = PyUnicode_AsUTF8AndSize(v, &hn);
        if (hs == NULL) {
            PyErr_Clear(); /* lone surrogates: not the line's ASCII text */
            goto differs;
        }
        if (hn != n || memcmp(hs, s, (size_t)n) != 0)
            goto differs;
    }
    *held = cf;
    return 1;
differs:
    Py_DECREF(cf);
    return 0;
}

/*
 * The decision for a line a rule matched: the same steps, in the same order, as the fast lane of
 * Filter._scan_py (which equals Filter._general): ignoreregex, then the connection memory, then the host.
 * Returns 0 (done, maybe appended), -1 on error.
 */
static int decide(ScannerObject *self, const Rule *r, const Groups *g, int ignored, PyObject *when, Context *cx,
                  PyObject *out, Py_ssize_t idx) {
    int rc = -1;
    PyObject *ip4 = NULL, *ip6 = NULL, *dns = NULL, *fid = NULL, *mlfid = NULL, *fields = NULL, *conn = NULL;
    PyObject *user = NULL; /* borrowed from fields (or from held) */
    PyObject *held = NULL; /* the connection's fields, when the line's say nothing new (fields_held) */
    PyObject *st[4] = {NULL, NULL, NULL, NULL};
#define TEXT(var, k)                                                                                      \
    do {                                                                                                  \
        var = text_of(g, r->core[k]);                                                                     \
        if (var == NULL && PyErr_Occurred())                                                              \
            goto done;                                                                                    \
    } while (0)
#define FIELDS()                                                                                          \
    do {                                                                                                  \
        if (fields == NULL && (fields = r->nfields || r->nalts ? build_fields(r, g) : PyDict_New()) == NULL) \
            goto done;                                                                                    \
    } while (0)
    ip4 = text_again(g, r->core[C_IP4], &self->last_text[1]);
    if (ip4 == NULL && PyErr_Occurred())
        goto done;
    TEXT(ip6, C_IP6);
    TEXT(dns, C_DNS);
    TEXT(fid, C_FID);
    int nofail = truthy(g, r->core[C_NOFAIL]);
    int gained = truthy(g, r->core[C_GAINED]);
    int forget = truthy(g, r->core[C_FORGET]);
    if (ignored) {
        FIELDS();
        rc = append(out, idx, result(self, first_truthy(ip4, ip6, dns, fid), when, 1, fields, r->index));
        goto done;
    }
    if (gained)
        nofail = 1;
    int missing = ip4 == NULL && ip6 == NULL && dns == NULL && fid == NULL;
    if (cx->conns != NULL && (mlfid = text_again(g, r->core[C_MLFID], &self->last_text[0])) == NULL &&
        PyErr_Occurred())
        goto done;
    if (mlfid == NULL) {
        if (nofail || missing) {
            rc = 0;
            goto done;
        }
        FIELDS();
        rc = append(out, idx, result(self, first_truthy(ip4, ip6, dns, fid), when, 0, fields, r->index));
        goto done;
    }
    conn = PyDict_GetItemWithError(cx->conns, mlfid);
    if (conn == NULL && PyErr_Occurred())
        goto done;
    Py_XINCREF(conn);
    if (conn != NULL) {
        PyObject *seen = cget(conn, K_SEEN);
        if (seen == NULL)
            goto done;
        double sd = PyFloat_AsDouble(seen);
        Py_DECREF(seen);
        if (sd == -1.0 && PyErr_Occurred())
            goto done;
        int reused = sd < cx->now_d - cx->max_age ? 0 : other_peer(conn, ip4, ip6);
        if (reused < 0)
            goto done;
        if (sd < cx->now_d - cx->max_age || reused) { /* forgotten: too old, or the id names a new peer */
            if (PyDict_DelItem(cx->conns, mlfid) < 0)
                goto done;
            Py_CLEAR(conn);
        }
    }
    if (conn == NULL) {
        /* the connection's first line (a fresh state is neither pending nor multi-user) */
        if (forget && (nofail || missing)) { /* nothing to remember, nothing to report */
            rc = 0;
            goto done;
        }
        FIELDS();
        user = PyDict_GetItemWithError(fields, s_user);
        if (user == NULL && PyErr_Occurred())
            goto done;
        if (!forget) { /* the connection and the result share the line's fields: neither changes them */
            PyObject *v[K_N] = {ip4 ? ip4 : Py_None, ip6 ? ip6 : Py_None, dns ? dns : Py_None, fid ? fid : Py_None,
                                nofail ? Py_True : Py_None, gained ? Py_True : Py_None,
                                missing && !nofail ? Py_True : Py_False, fields, is_true(user) ? user : s_empty,
                                Py_False, cx->now};
            PyObject *fresh = conn_new(v);
            if (fresh == NULL)
                goto done;
            int src = PyDict_SetItem(cx->conns, mlfid, fresh);
            Py_DECREF(fresh);
            if (src < 0)
                goto done;
            if (PyDict_Size(cx->conns) > cx->max_entries) {
                PyObject *ev = PyObject_CallFunctionObjArgs(self->evict, cx->ctx, NULL);
                if (ev == NULL)
                    goto done;
                Py_DECREF(ev);
            }
        }
        if (nofail || missing) {
            rc = 0;
            goto done;
        }
        rc = append(out, idx, result(self, first_truthy(ip4, ip6, dns, fid), when, 0, fields, r->index));
        goto done;
    }
    /* a later line of a known connection: fold it in */
    if (r->nfields || r->nalts) {
        int same = r->nalts == 0 ? fields_held(r, g, conn, &held) : 0;
        if (same < 0)
            goto done;
        if (same) { /* the line's user, if it names one, is the text the connection holds */
            if (r->fuser >= 0 && took_part(g, r->fcode[r->fuser]) &&
                (user = PyDict_GetItemWithError(held, s_user)) == NULL && PyErr_Occurred())
                goto done;
        } else {
            FIELDS();
            user = PyDict_GetItemWithError(fields, s_user);
            if (user == NULL && PyErr_Occurred())
                goto done;
        }
    }
    if (is_true(user)) {
        PyObject *cu = cget(conn, K_USER);
        if (cu == NULL)
            goto done;
        int same = PyObject_RichCompareBool(user, cu, Py_EQ);
        int cu_true = same < 0 ? -1 : PyObject_IsTrue(cu);
        Py_DECREF(cu);
        if (same < 0 || cu_true < 0)
            goto done;
        if (!same && (cu_true ? cset(conn, K_MULTI, Py_True) : cset(conn, K_USER, user)) < 0)
            goto done;
    }
    if (cset(conn, K_NOFAIL, nofail ? Py_True : NULL) < 0 || cset(conn, K_GAINED, gained ? Py_True : NULL) < 0)
        goto done;
    if (gained && cset(conn, K_PENDING, Py_False) < 0)
        goto done;
    if ((ip4 != NULL && cset(conn, K_IP4, ip4) < 0) || (ip6 != NULL && cset(conn, K_IP6, ip6) < 0) ||
        (dns != NULL && cset(conn, K_DNS, dns) < 0) || (fid != NULL && cset(conn, K_FID, fid) < 0))
        goto done;
    if (fields != NULL && PyDict_Size(fields) > 0 && fold_fields(conn, fields) < 0)
        goto done;
    if (cset(conn, K_SEEN, cx->now) < 0)
        goto done;
    if (forget && PyDict_DelItem(cx->conns, mlfid) < 0)
        goto done;
    /* the connection's state decides this line */
    int pending = ctrue(conn, K_PENDING), multi = pending < 0 ? -1 : ctrue(conn, K_MULTI);
    if (pending < 0 || multi < 0)
        goto done;
    if (pending || multi) {
        if (cset(conn, K_PENDING, Py_False) < 0 || cset(conn, K_NOFAIL, NULL) < 0 || cset(conn, K_GAINED, NULL) < 0)
            goto done;
    } else {
        int nf = ctrue(conn, K_NOFAIL), gd = nf < 0 ? -1 : ctrue(conn, K_GAINED);
        if (nf < 0 || gd < 0)
            goto done;
        if (nf || gd) {
            rc = 0;
            goto done;
        }
    }
    for (int k = 0; k < 4; k++)
        if ((st[k] = cget(conn, K_IP4 + k)) == NULL)
            goto done;
    if (st[0] == Py_None && st[1] == Py_None && st[2] == Py_None && st[3] == Py_None) {
        rc = cset(conn, K_PENDING, Py_True); /* remembered: a later line of this connection decides */
        goto done;
    }
    PyObject *cf = cget(conn, K_FIELDS); /* shared with the result: a connection's dict never changes */
    if (cf == NULL)
        goto done;
    Py_XDECREF(fields);
    fields = cf;
    rc = append(out, idx, result(self, first_truthy(st[0], st[1], st[2], st[3]), when, 0, fields, r->index));
done:
#undef TEXT
#undef FIELDS
    Py_XDECREF(ip4);
    Py_XDECREF(ip6);
    Py_XDECREF(dns);
    Py_XDECREF(fid);
    Py_XDECREF(mlfid);
    Py_XDECREF(fields);
    Py_XDECREF(held);
    Py_XDECREF(conn);
    for (int k = 0; k < 4; k++)
        Py_XDECREF(st[k]);
    return rc;
}

/*
 * memmem(s, n, t, m) != NULL. glibc's generic memmem costs ~275 instructions on a 100-byte log line; the
 * (vectorised) memchr for the text's first byte plus a memcmp at each place it occurs costs a fraction of
 * that on log text. A line where the first byte keeps occurring without the rest (a hostile one) goes on
 * with memmem after a few false starts, so a line still costs time linear in its length.
 */
static inline int contains(const char *s, size_t n, const char *t, size_t m) {
    if (m == 0)
        return 1;
    if (m > n)
        return 0;
    const char *p = s, *end = s + (n - m) + 1; /* one past the last place the text can start */
    for (int tries = 0; tries < 8; tries++) {
        p = memchr(p, (unsigned char)t[0], (size_t)(end - p));
        if (p == NULL)
            return 0;
        if (memcmp(p + 1, t + 1, m - 1) == 0)
            return 1;
        if (++p == end)
            return 0;
    }
    return memmem(p, (size_t)(s + n - p), t, m) != NULL;
}

static inline int gate_pass(const ScannerObject *self, const char *s, Py_ssize_t n) {
    if (self->ngate < 0)
        return 1;
    for (Py_ssize_t i = 0; i < self->ngate; i++)
        if (contains(s, (size_t)n, self->gate[i], (size_t)self->gatelen[i]))
            return 1;
    return 0;
}

enum { LINE_DONE = 0, LINE_SLOW = 1, LINE_LIMITED = 2, LINE_ERROR = -1 };

/* -- timestamps: what DateParser.stamp computes, in C (the Python side answers hour bases) ------------- */

enum { TS_VALUE = 0, TS_NONE = 1, TS_PYTHON = 2, TS_ERROR = -1 };

/* 1 base, 2 offset changes within the hour, 3 no such date; -1 error */
static int hour_base(ScannerObject *self, int year, int month, int day, int hour, double *base) {
    uint32_t key = ((((uint32_t)year * 16u + (uint32_t)month) * 32u + (uint32_t)day) * 32u + (uint32_t)hour);
    unsigned h = (unsigned)((key * 2654435761u) >> 24) % HOUR_SLOTS; /* Fibonacci hashing */
    HourSlot *slot = &self->hours[h];
    if (slot->state == 0 || slot->year != year || slot->month != month || slot->day != day || slot->hour != hour) {
        PyObject *v = PyObject_CallFunction(self->hour_base, "iiii", year, month, day, hour);
        if (v == NULL)
            return -1;
        int state;
        double b = 0.0;
        if (PyBool_Check(v)) {
            state = v == Py_True ? 2 : 3;
        } else {
            b = PyFloat_AsDouble(v);
            state = 1;
        }
        Py_DECREF(v);
        if (state == 1 && b == -1.0 && PyErr_Occurred())
            return -1;
        slot->year = year;
        slot->month = month;
        slot->day = day;
        slot->hour = hour;
        slot->state = state;
        slot->base = b;
    }
    *base = slot->base;
    return slot->state;
}

/* DateParser._local_epoch: base + minute * 60 + second + micro / 1e6, in Python's order of operations */
static int local_epoch(ScannerObject *self, int year, int month, int day, int hour, int minute, int second,
                       long micro, double *out) {
    double base;
    int st = hour_base(self, year, month, day, hour, &base);
    if (st < 0)
        return TS_ERROR;
    if (st == 2)
        return TS_PYTHON;
    if (st == 3)
        return TS_NONE;
    *out = ((base + (double)(minute * 60)) + (double)second) + (double)micro / 1e6;
    return TS_VALUE;
}

static inline int digit(char c) { return c >= '0' && c <= '9'; }
static inline int num2(const char *s) { return (s[0] - '0') * 10 + (s[1] - '0'); }

/* "Mmm dd HH:MM:SS" (FAST_SYSLOG matched it): DateParser.stamp(syslog, None, now) */
static int syslog_time(ScannerObject *self, const char *s, Context *cx, double *out) {
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    int month = 0;
    for (int m = 0; m < 12; m++)
        if (memcmp(months + 3 * m, s, 3) == 0)
            month = m + 1;
    if (month == 0)
        return TS_PYTHON;
    int day = (s[4] == ' ' ? 0 : (s[4] - '0') * 10) + (s[5] - '0');
    int hour = num2(s + 7), minute = num2(s + 10), second = num2(s + 13);
    if (cx->year < 0) {
        PyObject *y = PyObject_CallFunctionObjArgs(self->year_of, cx->now, NULL);
        if (y == NULL)
            return TS_ERROR;
        cx->year = PyLong_AsLong(y);
        Py_DECREF(y);
        if (cx->year == -1 && PyErr_Occurred())
            return TS_ERROR;
    }
    double this_y, prev_y;
    int a = local_epoch(self, (int)cx->year, month, day, hour, minute, second, 0, &this_y);
    if (a == TS_ERROR || a == TS_PYTHON)
        return a;
    int b = local_epoch(self, (int)cx->year - 1, month, day, hour, minute, second, 0, &prev_y);
    if (b == TS_ERROR || b == TS_PYTHON)
        return b;
    /* a log without a year is from the last twelve months */
    if (a == TS_NONE || this_y > cx->now_d + 86400.0) {
        *out = prev_y;
        return b;
    }
    *out = this_y;
    return TS_VALUE;
}

static long long days_from_civil(long long y, int m, int d) {
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int days_in_month(int y, int m) {
    static const int dm[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0))
        return 29;
    return dm[m - 1];
}

/* "YYYY-mm-ddTHH:MM:SS[.frac][zone]" (FAST_ISO matched it): DateParser.stamp(None, iso, now) */
static int iso_time(ScannerObject *self, const char *s, Py_ssize_t n, double *out) {
    int year = num2(s) * 100 + num2(s + 2), month = num2(s + 5), day = num2(s + 8);
    int hour = num2(s + 11), minute = num2(s + 14), second = num2(s + 17);
    Py_ssize_t i = 19;
    long micro = 0;
    if (i < n && (s[i] == '.' || s[i] == ',')) {
        i++;
        int k = 0;
        for (; i < n && digit(s[i]); i++, k++)
            if (k < 6)
                micro = micro * 10 + (s[i] - '0');
        for (; k < 6; k++)
            micro *= 10;
    }
    int offset = 0, zoned = 0; /* minutes east of UTC */
    if (i < n) {
        zoned = 1;
        if (s[i] == 'Z' && i + 1 == n) {
            offset = 0;
        } else if ((s[i] == '+' || s[i] == '-') && i + 3 <= n && digit(s[i + 1]) && digit(s[i + 2])) {
            int minutes = num2(s + i + 1) * 60;
            Py_ssize_t j = i + 3;
            if (j < n && s[j] == ':')
                j++;
            if (j + 2 == n && digit(s[j]) && digit(s[j + 1]))
                minutes += num2(s + j);
            else if (j != n || s[j - 1] == ':')
                return TS_PYTHON;
            offset = s[i] == '+' ? minutes : -minutes;
        } else {
            return TS_PYTHON;
        }
    }
    if (month < 1 || month > 12 || day < 1 || day > days_in_month(year, month) || hour > 23 || minute > 59)
        return zoned ? TS_NONE : local_epoch(self, year, month, day, hour, minute, second > 59 ? 59 : second,
                                            micro, out);
    if (second > 59)
        second = 59; /* a leap second counts as the one before */
    if (!zoned)
        return local_epoch(self, year, month, day, hour, minute, second, micro, out);
    long long t = days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second;
    *out = (double)(t - (long long)offset * 60) + (double)micro / 1e6;
    return TS_VALUE;
}

typedef struct {
    int kind; /* 0 none yet, 1 syslog, 2 iso */
    char text[64];
    Py_ssize_t len;
    PyObject *when;
} StampMemo;

/*
 * The line's time and the text the prefix sees (the line without its timestamp), as Filter._general finds
 * them: a syslog / ISO timestamp at the start is read here; any other line asks DateParser.find_span
 * (templates anywhere in the line). `*when` is a new reference.
 */
/*
 * 1 when `s` starts with a timestamp timestamps.FAST_SYSLOG matches ("Mmm dd HH:MM:SS" and then the end or
 * a space and a character that is not a digit, space or "."), checked by hand: the ts regex then matches
 * its first alternative with these 15 characters, so the scanner takes them without running it (an
 * interpreted PCRE2 spent ~250 ns a line on it, a third of what a line's rules cost). 0 does not mean the
 * regex fails: the character after the space is only accepted when it is printable ASCII (the regex also
 * takes control characters that are not space), and every 0 runs the regex as before.
 */
/* 1 when s[0:3] is a month's name, "Jan" to "Dec": a switch on the first letter (a loop over the twelve
 * names cost ~70 instructions a line in December, the last it tries) */
static inline int month_name(const char *s) {
    char b = s[1], c = s[2];
    switch (s[0]) {
    case 'J':
        return (b == 'a' && c == 'n') || (b == 'u' && (c == 'n' || c == 'l'));
    case 'F':
        return b == 'e' && c == 'b';
    case 'M':
        return b == 'a' && (c == 'r' || c == 'y');
    case 'A':
        return (b == 'p' && c == 'r') || (b == 'u' && c == 'g');
    case 'S':
        return b == 'e' && c == 'p';
    case 'O':
        return b == 'c' && c == 't';
    case 'N':
        return b == 'o' && c == 'v';
    case 'D':
        return b == 'e' && c == 'c';
    default:
        return 0;
    }
}

static int syslog_shape(const char *s, Py_ssize_t n) {
    if (n < 15 || (n != 15 && n < 17))
        return 0;
    if (s[3] != ' ' || s[6] != ' ' || s[9] != ':' || s[12] != ':' || !month_name(s))
        return 0;
    char d0 = s[4], d1 = s[5];
    if (!(((d0 == ' ' || d0 == '0') && d1 >= '1' && d1 <= '9') || ((d0 == '1' || d0 == '2') && digit(d1)) ||
          (d0 == '3' && (d1 == '0' || d1 == '1'))))
        return 0;
    char h0 = s[7], h1 = s[8];
    if (!(((h0 == '0' || h0 == '1') && digit(h1)) || (h0 == '2' && h1 >= '0' && h1 <= '3')))
        return 0;
    if (!(s[10] >= '0' && s[10] <= '5' && digit(s[11]) && s[13] >= '0' && s[13] <= '5' && digit(s[14])))
        return 0;
    if (n == 15)
        return 1;
    char c = s[16];
    return s[15] == ' ' && c > ' ' && c < 0x7f && !digit(c) && c != '.';
}

static int timestamp(ScannerObject *self, PyObject *line, const char *b, Py_ssize_t n, Context *cx,
                     StampMemo *memo, const char **text, Py_ssize_t *tlen, PyObject **when) {
    if (self->ts != NULL) {
        int rc = 1, kind = 1; /* kind 1: syslog, 2: ISO */
        Py_ssize_t tsend = 15;
        if (!(self->ts_syslog_c && syslog_shape(b, n))) {
            rc = run(self->ts, b, n, self->md_ts);
            if (rc < 0)
                return LINE_LIMITED;
            if (rc > 0) {
                PCRE2_SIZE *tov = pcre2_get_ovector_pointer(self->md_ts);
                kind = tov[2] != PCRE2_UNSET ? 1 : 2;
                tsend = (Py_ssize_t)tov[1];
            }
        }
        if (rc > 0) {
            /* a busy log has many lines a second: same text, same time */
            if (memo->kind != kind || memo->len != tsend || tsend > (Py_ssize_t)sizeof memo->text ||
                memcmp(memo->text, b, (size_t)tsend) != 0) {
                double w = 0.0;
                int conv = kind == 1 ? syslog_time(self, b, cx, &w) : iso_time(self, b, tsend, &w);
                PyObject *v;
                if (conv == TS_ERROR)
                    return LINE_ERROR;
                if (conv == TS_VALUE) {
                    v = PyFloat_FromDouble(w);
                } else if (conv == TS_NONE) {
                    v = Py_NewRef(Py_None);
                } else { /* an hour in which the zone's offset changes: the Python side converts it */
                    PyObject *t = PyUnicode_DecodeASCII(b, tsend, NULL);
                    if (t == NULL)
                        return LINE_ERROR;
                    v = PyObject_CallFunctionObjArgs(self->stamp, kind == 1 ? t : Py_None, kind == 2 ? t : Py_None,
                                                     cx->now, NULL);
                    Py_DECREF(t);
                }
                if (v == NULL)
                    return LINE_ERROR;
                Py_XDECREF(memo->when);
                memo->when = v;
                if (tsend <= (Py_ssize_t)sizeof memo->text) {
                    memo->kind = kind;
                    memo->len = tsend;
                    memcpy(memo->text, b, (size_t)tsend);
                } else {
                    memo->kind = 0;
                }
            }
            /* An unconvertible date (30 February): the Python path decides what it means. (Its fast lane
             * and its general path do not agree on such lines; the native core follows whichever runs.) */
            if (memo->when == Py_None)
                return LINE_SLOW;
            *text = b + tsend;
            *tlen = n - tsend;
            *when = Py_NewRef(memo->when);
            return LINE_DONE;
        }
    }
    PyObject *subject = line;
    if (n != PyUnicode_GetLength(line)) { /* cut to max_line */
        subject = PyUnicode_DecodeASCII(b, n, NULL);
        if (subject == NULL)
            return LINE_ERROR;
    } else {
        Py_INCREF(subject);
    }
    PyObject *found = PyObject_CallFunctionObjArgs(self->find_span, subject, cx->now, NULL);
    Py_DECREF(subject);
    if (found == NULL)
        return LINE_ERROR;
    if (found == Py_None) {
        *text = b;
        *tlen = n;
        *when = found;
        return LINE_DONE;
    }
    PyObject *w = NULL;
    Py_ssize_t start = 0, end = 0;
    if (!PyArg_ParseTuple(found, "Onn", &w, &start, &end) || start < 0 || end < start || end > n) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "find_span gave a span outside the line");
        Py_DECREF(found);
        return LINE_ERROR;
    }
    *when = Py_NewRef(w);
    Py_DECREF(found);
    if (start == 0) {
        *text = b + end;
        *tlen = n - end;
    } else { /* a timestamp inside the line: the text is what is around it */
        memcpy(self->buf, b, (size_t)start);
        memcpy(self->buf + start, b + end, (size_t)(n - end));
        *text = self->buf;
        *tlen = n - (end - start);
    }
    return LINE_DONE;
}

/* -- the prefix's syslog header, read by hand ------------------------------------------------------ */

/* Character classes of the header, by byte: a table, since the reading runs over every sshd line's host,
 * program name and PID (the chains of comparisons cost twice the instructions). */
enum { CH_HOST = 1, CH_NAME = 2, CH_DIGIT = 4, CH_SPACE = 8 };
static unsigned char char_class[256];

static void init_char_class(void) {
    for (int c = 0; c < 256; c++) {
        int alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        unsigned char k = 0;
        if (alnum || c == '_' || c == '.' || c == '-' || c == '@' || c == ':')
            k |= CH_HOST; /* [\w.\-@:] on ASCII */
        if (alnum || c == '_' || c == '-')
            k |= CH_NAME; /* what sysloghead.daemon_names lets a program name hold */
        if (c >= '0' && c <= '9')
            k |= CH_DIGIT;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r')
            k |= CH_SPACE; /* PCRE2's \s */
        char_class[c] = k;
    }
}
#define IS(c, k) (char_class[(unsigned char)(c)] & (k))

/* memcmp(a, b, n) == 0 for the few bytes of a program name or a tail text: a loop, without the call */
static inline int same_bytes(const char *a, const char *b, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/*
 * Where the first match of sysloghead.SYSLOG (the `<syslog>` fragment, the filter's daemon names in it)
 * ends in s[0:n], for the one shape nearly every line has, "  HOST NAME[PID]: MESSAGE": -1 for any other
 * shape, which the whole prefix regex then reads. The regex tries each optional part taken before left
 * out, and each greedy run longest first; for this shape the path below is the first that succeeds, so it
 * is the match the regex returns:
 *   \s*                 takes the leading spaces (a host character follows: it can take no more);
 *   <PRI>..., <f.l>, []  left out: they start with `<` or `[`, the host text does not;
 *   [\w.\-@:]+\s+       taken: HOST in full (it ends at a space), then the one space (a name follows);
 *   kernel:, @vserver_   left out: a name holds neither `:` nor `@`;
 *   [\[(]?               left out: the name starts here;
 *   the daemon names     only NAME itself leads on: a shorter name leaves a name character where the rest
 *                        needs `(`, `]`, `)`, `[`, `:` or a space, and none is longer (`[` follows NAME);
 *   \(\S+\), [\])]        left out: `[` follows;
 *   \[\d+\], :           taken: "[PID]" (all its digits), ":";
 *   \s+kernel:..., " N " left out: the message does not start with "kernel:" nor with a digit;
 *   \s+                 the one space (the message does not start with white space);
 *   \[ID N X\]\s+        left out: the message does not start with `[`.
 * The limits: the regex sees s[0:n] only, and every check below reads inside it (a message cut before 7
 * characters cannot spell "kernel:" for the regex either). tests/unit/test_native.py holds this equal to
 * the regex on generated headers, hostile ones included.
 */
static Py_ssize_t syslog_head_end(const ScannerObject *self, const char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && s[i] == ' ')
        i++;
    Py_ssize_t host = i;
    while (i < n && IS(s[i], CH_HOST))
        i++;
    if (i == host || i >= n || s[i] != ' ')
        return -1;
    Py_ssize_t name = ++i;
    while (i < n && IS(s[i], CH_NAME))
        i++;
    if (i >= n || s[i] != '[')
        return -1;
    Py_ssize_t len = i - name, k = 0;
    while (k < self->nhead && !(self->headlen[k] == len && same_bytes(self->head[k], s + name, len)))
        k++;
    if (k == self->nhead)
        return -1;
    Py_ssize_t pid = ++i;
    while (i < n && IS(s[i], CH_DIGIT))
        i++;
    if (i == pid || n - i < 4 || s[i] != ']' || s[i + 1] != ':' || s[i + 2] != ' ')
        return -1;
    const char *msg = s + i + 3;
    Py_ssize_t left = n - (i + 3); /* >= 1 */
    if (IS(msg[0], CH_SPACE | CH_DIGIT) || msg[0] == '[' || (msg[0] == 'k' && left >= 7 && memcmp(msg, "kernel:", 7) == 0))
        return -1;
    return i + 3;
}

/* The prefix on s[0:n] as the whole regex would match it: the hand-read header, then the first tail text
 * (in the regex's order) the rest starts with; nothing follows the tail in the regex, so that is its match.
 * The ovector in `*pov`; 1: matched, 0: the header has another shape or no tail text fits after it (the
 * whole regex decides: it may find another way through the header). */
static int syslog_head_match(ScannerObject *self, const char *s, Py_ssize_t n, PCRE2_SIZE **pov) {
    Py_ssize_t end = syslog_head_end(self, s, n);
    if (end < 0)
        return 0;
    for (Py_ssize_t k = 0; k < self->ntail; k++) {
        Py_ssize_t len = self->taillen[k];
        if (len <= n - end && same_bytes(s + end, self->tail[k], len)) {
            PCRE2_SIZE *ov = self->head_ov;
            ov[0] = 0;
            ov[1] = (PCRE2_SIZE)(end + len);
            ov[2] = 0;
            ov[3] = (PCRE2_SIZE)end;
            *pov = ov;
            self->headers++;
            return 1;
        }
    }
    return 0;
}

/* Prefix, dispatch, rules, ignoreregex and the decision for the text after the timestamp. */
/* Rule `r` on s[0:n]: > 0 matched, its ovector in *ov (numbered as r->rx numbers its groups), 0 no match,
 * -1 a limit was hit.
 *
 * A split rule `^A(?P<user>.*)L B` (native.split_rule: no top-level alternation, no back-reference, no
 * conditional, every capturing group named) gives what the whole regex gives, by how PCRE2 backtracks: it
 * tries A's ways in order; for A's first way (ending at e) the greedy `.*` gives back one character at a
 * time, so the positions p >= e are tried from the right, and at each one L must follow and then B match
 * from p + |L| (B's first way there). A and B see the same subject as the whole regex, so what B does at p
 * (its lookbehinds, `$`) does not depend on A. So the first p from the right where L and B fit is the one
 * PCRE2 stops at, with A's first way, and its groups are A's, the user's [e, p) and B's. When no p fits,
 * A's later ways are PCRE2's business: the whole regex runs. A that does not match means no match. */
static int run_rule(ScannerObject *self, const Rule *r, const char *s, Py_ssize_t n, PCRE2_SIZE **ov) {
    if (r->sa != NULL) {
        int rc = run_at(r->sa, s, n, 0, self->md_sa);
        if (rc <= 0)
            return rc;
        const PCRE2_SIZE *aov = pcre2_get_ovector_pointer(self->md_sa);
        Py_ssize_t e = (Py_ssize_t)aov[1], L = r->slitlen;
        char c0 = r->slit[0];
        for (Py_ssize_t p = n - L; p >= e; p--) {
            if (s[p] != c0 || memcmp(s + p, r->slit, (size_t)L) != 0)
                continue;
            rc = run_at(r->sb, s, n, p + L, self->md_sb);
            if (rc < 0)
                return -1;
            if (rc == 0)
                continue;
            const PCRE2_SIZE *bov = pcre2_get_ovector_pointer(self->md_sb);
            PCRE2_SIZE *o = self->split_ov;
            for (Py_ssize_t k = 0; k < 2 * self->split_pairs; k++)
                o[k] = PCRE2_UNSET;
            o[0] = aov[0];
            o[1] = bov[1];
            for (Py_ssize_t i = 0; i < r->sna; i++) {
                o[2 * r->samap[i]] = aov[2 * (i + 1)];
                o[2 * r->samap[i] + 1] = aov[2 * (i + 1) + 1];
            }
            o[2 * r->suser] = (PCRE2_SIZE)e;
            o[2 * r->suser + 1] = (PCRE2_SIZE)p;
            for (Py_ssize_t i = 0; i < r->snb; i++) {
                o[2 * r->sbmap[i]] = bov[2 * (i + 1)];
                o[2 * r->sbmap[i] + 1] = bov[2 * (i + 1) + 1];
            }
            *ov = o;
            self->split_hits++;
            return 1;
        }
        self->split_misses++;
    }
    int rc = run(r->rx, s, n, self->md_rule);
    *ov = pcre2_get_ovector_pointer(self->md_rule);
    return rc;
}

static int match_text(ScannerObject *self, const char *text, Py_ssize_t tlen, PyObject *when, Context *cx,
                      PyObject *out, Py_ssize_t idx) {
    const char *content = text;
    Py_ssize_t clen = tlen;
    PCRE2_SIZE *pov = NULL;
    int rc;
    if (self->prefix_kind != 0) {
        Py_ssize_t plen = self->prefix_limit >= 0 && tlen > self->prefix_limit ? self->prefix_limit : tlen;
        if (self->nhead == 0 || !syslog_head_match(self, text, plen, &pov)) {
            rc = run(self->prefix, text, plen, self->md_pre);
            if (rc < 0)
                return LINE_LIMITED;
            if (rc == 0)
                return LINE_DONE;
            pov = pcre2_get_ovector_pointer(self->md_pre);
        }
        if (self->prefix_kind == 1) {
            content = text + pov[1];
            clen = tlen - (Py_ssize_t)pov[1];
        } else if (self->content_group > 0) {
            PCRE2_SIZE *c = pov + 2 * self->content_group;
            if (c[0] != PCRE2_UNSET && c[1] > c[0]) {
                content = text + c[0];
                clen = (Py_ssize_t)(c[1] - c[0]);
            }
        }
    }
    /* dispatch on the message's first characters */
    const int *cand = self->unheaded;
    Py_ssize_t ncand = self->nunheaded;
    if (clen >= self->heads_len && clen > 0) {
        for (Py_ssize_t h = self->head_first[(unsigned char)content[0]]; h >= 0; h = self->heads[h].next) {
            const Head *hd = &self->heads[h];
            if (memcmp(hd->key, content, (size_t)hd->klen) == 0) {
                cand = hd->rules;
                ncand = hd->n;
                break;
            }
        }
    }
    const Rule *hit = NULL;
    PCRE2_SIZE *hov = NULL;
    for (Py_ssize_t k = 0; k < ncand; k++) {
        const Rule *r = &self->rules[cand[k]];
        if (r->rx == NULL)
            return LINE_SLOW;
        Py_ssize_t rlen = r->limit >= 0 && clen > r->limit ? r->limit : clen;
        rc = run_rule(self, r, content, rlen, &hov);
        if (rc < 0)
            return LINE_LIMITED;
        if (rc > 0) {
            hit = r;
            break;
        }
    }
    if (hit == NULL)
        return LINE_DONE;
    int ignored = 0;
    for (Py_ssize_t k = 0; k < self->nign && !ignored; k++) {
        RegexObject *ig = self->ign[k];
        Py_ssize_t lim = self->ign_limit[k];
        rc = run(ig, content, lim >= 0 && clen > lim ? lim : clen, self->md_ign);
        if (rc < 0)
            return LINE_LIMITED;
        if (rc > 0) {
            ignored = 1;
        } else if (self->ignore_whole && (content != text || clen != tlen)) {
            rc = run(ig, text, lim >= 0 && tlen > lim ? lim : tlen, self->md_ign);
            if (rc < 0)
                return LINE_LIMITED;
            ignored = rc > 0;
        }
    }
    Groups g = {content, hov, text, pov};
    return decide(self, hit, &g, ignored, when, cx, out, idx) < 0 ? LINE_ERROR : LINE_DONE;
}

/* A stamped line (a journal entry: its time travels beside it) has no date to find: the whole line is the
 * text the prefix sees and its `when` is None (the caller's LogLine.time), as fail2ban's processLine with a
 * date given. */
static int scan_line(ScannerObject *self, PyObject *line, const char *b, Py_ssize_t n, Context *cx,
                     StampMemo *memo, PyObject *out, Py_ssize_t idx, int stamped) {
    if (!gate_pass(self, b, n))
        return LINE_DONE;
    const char *text = b;
    Py_ssize_t tlen = n;
    PyObject *when = NULL;
    int st = LINE_DONE;
    if (stamped)
        when = Py_NewRef(Py_None);
    else
        st = timestamp(self, line, b, n, cx, memo, &text, &tlen, &when);
    if (st != LINE_DONE)
        return st;
    st = match_text(self, text, tlen, when, cx, out, idx);
    Py_DECREF(when);
    return st;
}


static PyObject *Scanner_scan(PyObject *op, PyObject *args) {
    ScannerObject *self = (ScannerObject *)op;
    PyObject *lines, *now, *ctx, *slow;
    int stamped = 0;
    if (!PyArg_ParseTuple(args, "OOOO|p", &lines, &now, &ctx, &slow, &stamped))
        return NULL;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Scanner.scan is not re-entrant");
        return NULL;
    }
    Context cx = {NULL, 0.0, 0, ctx, now, PyFloat_AsDouble(now), -1};
    if (cx.now_d == -1.0 && PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(lines, "lines must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    StampMemo memo = {0, {0}, 0, NULL};
    if (out == NULL)
        goto fail;
    if (ctx != Py_None) {
        cx.conns = PyObject_GetAttr(ctx, s_conns);
        if (cx.conns == NULL)
            goto fail;
        if (!PyDict_Check(cx.conns)) {
            PyErr_SetString(PyExc_TypeError, "MatchContext._conns must be a dict");
            goto fail;
        }
        PyObject *v = PyObject_GetAttr(ctx, s_max_age);
        if (v == NULL)
            goto fail;
        cx.max_age = PyFloat_AsDouble(v);
        Py_DECREF(v);
        if (cx.max_age == -1.0 && PyErr_Occurred())
            goto fail;
        v = PyObject_GetAttr(ctx, s_max_entries);
        if (v == NULL)
            goto fail;
        cx.max_entries = PyLong_AsSsize_t(v);
        Py_DECREF(v);
        if (cx.max_entries == -1 && PyErr_Occurred())
            goto fail;
    }
    self->busy = 1;
    Py_ssize_t total = PySequence_Size(seq);
    int is_list = PyList_Check(seq);
    for (Py_ssize_t i = 0; i < total; i++) {
        PyObject *line = is_list ? PyList_GetItem(seq, i) : PyTuple_GetItem(seq, i);
        if (line == NULL)
            goto fail_busy;
        Py_INCREF(line); /* the callbacks run Python code: keep the line alive whatever they do */
        int st = LINE_SLOW;
        Py_ssize_t n = 0;
        const char *b = NULL;
        if (PyUnicode_Check(line)) {
            b = PyUnicode_AsUTF8AndSize(line, &n);
            if (b == NULL)
                PyErr_Clear(); /* lone surrogates (undecodable input): the Python path */
            else if (n != PyUnicode_GetLength(line))
                b = NULL; /* not ASCII: the Python path */
        }
        if (b != NULL) {
            if (n > self->max_line)
                n = self->max_line;
            if (memchr(b, '\n', (size_t)n) == NULL && memchr(b, '\r', (size_t)n) == NULL)
                st = scan_line(self, line, b, n, &cx, &memo, out, i, stamped);
        }
        if (st == LINE_SLOW) {
            self->python_lines++;
            PyObject *r = PyObject_CallFunctionObjArgs(slow, line, now, ctx, NULL);
            if (r == NULL)
                st = LINE_ERROR;
            else if (r == Py_None)
                Py_DECREF(r);
            else if (append(out, i, r) < 0)
                st = LINE_ERROR;
        } else if (st == LINE_LIMITED) {
            self->limited++;
        }
        Py_DECREF(line);
        if (st == LINE_ERROR)
            goto fail_busy;
    }
    self->lines += total;
    self->busy = 0;
    Py_XDECREF(memo.when);
    Py_XDECREF(cx.conns);
    Py_DECREF(seq);
    return out;
fail_busy:
    self->busy = 0;
fail:
    Py_XDECREF(memo.when);
    Py_XDECREF(cx.conns);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *Scanner_get_stats(PyObject *op, void *closure) {
    ScannerObject *self = (ScannerObject *)op;
    (void)closure;
    return Py_BuildValue("{sLsLsLsLsLsL}", "lines", self->lines, "python_lines", self->python_lines, "limited",
                         self->limited, "headers", self->headers, "split_hits", self->split_hits, "split_misses",
                         self->split_misses);
}

static PyObject *Scanner_get_jit(PyObject *op, void *closure) {
    ScannerObject *self = (ScannerObject *)op;
    (void)closure;
    int all = (self->ts == NULL || self->ts->jit) && (self->prefix == NULL || self->prefix->jit);
    for (Py_ssize_t i = 0; all && i < self->nrules; i++)
        all = self->rules[i].rx == NULL || self->rules[i].rx->jit;
    for (Py_ssize_t i = 0; all && i < self->nign; i++)
        all = self->ign[i]->jit;
    return PyBool_FromLong(all);
}

static PyMethodDef Scanner_methods[] = {
    {"scan", Scanner_scan, METH_VARARGS,
     "scan(lines, now, ctx, slow, stamped=False) -> [(index, Match | Rejected), ...]; slow(line, now, ctx) is "
     "the Python path for one line; stamped: the lines carry their time (journal), no date is looked for"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Scanner_getset[] = {
    {"stats", Scanner_get_stats, NULL,
     "lines seen, lines handed to the Python path, lines skipped at a limit, syslog headers read by hand, "
     "split rules answered by their parts and those that ran whole (run_rule)",
     NULL},
    {"jit", Scanner_get_jit, NULL, "every regex runs as machine code", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Scanner_slots[] = {
    {Py_tp_new, Scanner_new},
    {Py_tp_dealloc, Scanner_dealloc},
    {Py_tp_traverse, Scanner_traverse},
    {Py_tp_clear, Scanner_clear},
    {Py_tp_methods, Scanner_methods},
    {Py_tp_getset, Scanner_getset},
    {Py_tp_doc, "A filter compiled for the native scanning core (built by nftblockd.detect.native)."},
    {0, NULL},
};

static PyType_Spec Scanner_spec = {"nftblockd.detect._scan.Scanner", sizeof(ScannerObject), 0,
                                   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, Scanner_slots};

/* ------------------------------------------------------------------------------------------------------ */

static PyObject *mod_limits(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    return Py_BuildValue("{sIsIsIsisi}", "match", MATCH_LIMIT, "depth", DEPTH_LIMIT, "heap_kib", HEAP_LIMIT_KIB,
                         "jit_stack_min", JIT_STACK_MIN, "jit_stack_max", JIT_STACK_MAX);
}

static PyObject *mod_version(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    char buf[64];
    pcre2_config(PCRE2_CONFIG_VERSION, buf);
    return PyUnicode_FromString(buf);
}

/* syslog_shape(text: bytes) -> bool: the scanner's hand check that stands in for FAST_SYSLOG (for tests) */
static PyObject *mod_syslog_shape(PyObject *mod, PyObject *arg) {
    (void)mod;
    char *s;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &s, &n) < 0)
        return NULL;
    return PyBool_FromLong(syslog_shape(s, n));
}

static PyMethodDef module_methods[] = {
    {"compile", mod_compile, METH_VARARGS, "compile(pattern, anchored=False) -> Regex (PCRE2, UTF, JIT if possible)"},
    {"limits", mod_limits, METH_NOARGS, "the bounds every match attempt runs under"},
    {"pcre2_version", mod_version, METH_NOARGS, "the PCRE2 library's version"},
    {"syslog_shape", mod_syslog_shape, METH_O, "syslog_shape(text: bytes) -> the scanner's FAST_SYSLOG check"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "nftblockd.detect._scan",
                                    "The matcher's native scanning core (see nftblockd/detect/native.py).", -1,
                                    module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) {
    init_char_class();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    ScanError = PyErr_NewException("nftblockd.detect._scan.error", PyExc_ValueError, NULL);
    RegexType = PyType_FromSpec(&Regex_spec);
    ScannerType = PyType_FromSpec(&Scanner_spec);
    ConnType = PyType_FromSpec(&Conn_spec);
    if (ScanError == NULL || RegexType == NULL || ScannerType == NULL || ConnType == NULL)
        goto fail;
    if (PyModule_AddObjectRef(m, "error", ScanError) < 0 || PyModule_AddObjectRef(m, "Regex", RegexType) < 0 ||
        PyModule_AddObjectRef(m, "Scanner", ScannerType) < 0 || PyModule_AddObjectRef(m, "Conn", ConnType) < 0)
        goto fail;
#define INTERN(var, text)                                                                                 \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                                 \
        goto fail;
    INTERN(s_conns, "_conns");
    INTERN(s_max_age, "max_age");
    INTERN(s_max_entries, "max_entries");
    INTERN(s_ip4, "ip4");
    INTERN(s_ip6, "ip6");
    INTERN(s_dns, "dns");
    INTERN(s_fid, "fid");
    INTERN(s_nofail, "nofail");
    INTERN(s_gained, "gained");
    INTERN(s_pending, "pending");
    INTERN(s_fields, "fields");
    INTERN(s_user, "user");
    INTERN(s_multi, "multi");
    INTERN(s_seen, "seen");
    INTERN(s_empty, "");
    INTERN(s_no_address, "no-address");
    INTERN(s_ip, "_ip");
    INTERN(s_scope_id, "_scope_id");
#undef INTERN
    PyObject **names[K_N] = {&s_ip4, &s_ip6, &s_dns, &s_fid, &s_nofail, &s_gained, &s_pending, &s_fields, &s_user,
                             &s_multi, &s_seen};
    memcpy(conn_names, names, sizeof names);
    g_mctx = pcre2_match_context_create(NULL);
    if (g_mctx == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    pcre2_set_match_limit(g_mctx, MATCH_LIMIT);
    pcre2_set_depth_limit(g_mctx, DEPTH_LIMIT);
    pcre2_set_heap_limit(g_mctx, HEAP_LIMIT_KIB);
    /* NULL when executable memory is refused (MemoryDenyWriteExecute=): patterns then run interpreted */
    g_jstack = pcre2_jit_stack_create(JIT_STACK_MIN, JIT_STACK_MAX, NULL);
    if (g_jstack != NULL)
        pcre2_jit_stack_assign(g_mctx, NULL, g_jstack);
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
