/* nftblockd.fleet._plain: a catch-up read's plain single-address bans decoded in one C loop (fleet/rawread.py's
 * `_columns`, for the common read).
 *
 * What it does: `columns(raw, own)` takes an XREAD reply's entries as the RESP parser hands them (a list of
 * `[id, [field, value, ...]]`) and the origin of this host, and answers either None ("not the read this loop
 * knows: ask the Python path") or a tuple
 *     (own bans, own unbans, own others, ats, keys, ends, origins, srcs, ts, ends_ms)
 * where, for every entry not this host's own, in order: `ats` is its stream id's millisecond part in seconds
 * (a float: the ms divided by 1000 here, which is Python's `ms / 1000` exactly, the ms being below 2**53;
 * the receive loop made that column in a pass of its own, ~3 ms per 100k, after a list of ints made here),
 * `keys` its IPv4 address as an int, `ends` its until field as a float, `ts` its ts field as an int (`int()`
 * of its digits), `origins` the field values themselves (bytes, not copied), `srcs` the set of distinct
 * src values, and `ends_ms` each end in whole ms, truncated: Python's `int(end * 1000.0)` (`ends.secs_ms`),
 * the ban state's unit, which the state made in a pass of its own (~7 ms per 100k). Python checks each distinct
 * origin and src once, as `_columns` does; tests/unit/test_fleet_rawread.py holds this loop to `_columns`
 * with hypothesis (same answer wherever this one answers).
 *
 * It answers only where every entry is exactly what `codec.encode` writes for an IPv4 ban: the 8 fields in
 * order, every value bytes, schema "2", op "ban", a canonical dotted quad (no leading zeros), an until of
 * digits and at most one dot within [0, 4102444800], oseq and ts of 1 to 19 digits, an id "<ms>-<seq>" of
 * digits (ms at most 18 of them, below 2**53). Anything else (IPv6, "inf", a leading zero, a stranger value) is None:
 * the Python path then decides, so this loop never refuses what Python would accept, and never accepts what
 * it would refuse (glibc's `strtod` of such an until is Python's `float()` of it: both round correctly).
 *
 * Why C: `_columns` (C-level passes: chain, strided slices, map) still cost ~1.3 us per entry, two thirds of
 * the `XREAD` itself, in a catch-up of 100,000 jail bans; this loop is ~0.1 us.
 *
 * `take_live(...)` is the trust gate's token loop (`Gate._take_tokens`) over a run of live events of one
 * origin: the same float operations in the same order, so the bucket comes out bit for bit as the Python loop
 * leaves it (tests/unit/test_fleet_gate.py holds the two to each other with hypothesis). Why C: the Python
 * loop was ~0.1 us per event, ~10 ms of a 100k catch-up on the receive loop's one thread.
 *
 * What it must not do: raise on a peer's bytes (None instead; only MemoryError propagates), keep a borrowed
 * reference beyond the list that owns it (every value stays in `raw`, which the caller holds), or touch
 * anything but its arguments. Built against the stable ABI (Py_LIMITED_API 3.11).
 *
 * Ownership rules (reviewed s10): every value in the answer is either new (ats, keys, ends, ts, ends_ms: made
 * here; one ats or ts object serves a run of entries with the same value, a reference per place) or the read's
 * own bytes object with one reference added per place it appears (origins, srcs); the lists are made at the
 * read's length and cut to the entries put (this host's own take no slot); the loop runs
 * no Python code (exact bytes only: their hash and comparison are C), so the borrowed entries of `raw` stay
 * valid throughout. Any failure releases the seven containers, once, and returns NULL (MemoryError) or None.
 * Lengths bound every read: strtod_l alone reads up to a NUL, which a bytes object always has after its
 * last byte, and only after the field was checked to be digits and one dot. The C-numeric locale is made
 * once per process and kept. tests/unit/test_fleet_rawread.py checks the references of the inputs over every
 * path, and fails each allocation in turn.
 */

#define _GNU_SOURCE 1 /* strtod_l */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <locale.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELD 128
#define MAX_UNTIL 4102444800.0

static const char *const LAYOUT[8] = {"v", "op", "net", "until", "origin", "oseq", "src", "ts"};
static const Py_ssize_t LAYOUT_LEN[8] = {1, 2, 3, 5, 6, 4, 3, 2};

/* The bytes of `o` (exactly bytes, not a subclass) as (pointer, length); 0 if it is anything else. */
static int as_bytes(PyObject *o, const char **p, Py_ssize_t *n) {
    if (!PyBytes_CheckExact(o))
        return 0;
    char *s;
    if (PyBytes_AsStringAndSize(o, &s, n) < 0) {
        PyErr_Clear();
        return 0;
    }
    *p = s;
    return 1;
}

/* The value of `n` digits (at most 19: below 2**64), checked by is_digits first. */
static unsigned long long digits(const char *p, Py_ssize_t n) {
    unsigned long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        v = v * 10 + (unsigned long long)(p[i] - '0');
    return v;
}

static int is_digits(const char *p, Py_ssize_t n, Py_ssize_t most) {
    if (n < 1 || n > most)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return 0;
    return 1;
}

/* A canonical dotted quad (no leading zeros, each part 0-255) into *key; 0 otherwise. */
static int dotted_quad(const char *p, Py_ssize_t n, unsigned long *key) {
    unsigned long value = 0;
    int parts = 0;
    Py_ssize_t i = 0;
    while (parts < 4) {
        Py_ssize_t start = i;
        unsigned long part = 0;
        while (i < n && p[i] >= '0' && p[i] <= '9' && i - start < 3)
            part = part * 10 + (unsigned long)(p[i++] - '0');
        Py_ssize_t len = i - start;
        if (len == 0 || part > 255 || (len > 1 && p[start] == '0'))
            return 0;
        value = value << 8 | part;
        parts++;
        if (parts < 4) {
            if (i >= n || p[i] != '.')
                return 0;
            i++;
        }
    }
    if (i != n)
        return 0;
    *key = value;
    return 1;
}

static locale_t c_numeric; /* the "C" LC_NUMERIC: a dot is the decimal point whatever the process's locale */

/* An until field of digits and at most one dot, as Python's float() reads it, within [0, MAX_UNTIL]. The
 * bytes object's buffer ends in a NUL (CPython guarantees it), which strtod needs. glibc's strtod rounds
 * correctly, as Python's own parser does, so both give the same double for such a string (the property test
 * checks it against float()); it takes ~65 ns where PyOS_string_to_double took ~250 for a 17-digit end
 * (a repr of a float, what `codec.encode` writes). */
static int until_value(const char *p, Py_ssize_t n, double *out) {
    if (n < 1 || n > MAX_FIELD)
        return 0;
    int dots = 0, digits = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] == '.')
            dots++;
        else if (p[i] >= '0' && p[i] <= '9')
            digits++;
        else
            return 0;
    }
    if (dots > 1 || digits == 0)
        return 0;
    /* The usual until ("1796208790.123": at most 15 digits, at most 22 after the dot) without strtod, which
     * took ~1,300 instructions a call (its multi-precision path), a quarter of this loop: the digits as an
     * integer below 2**53 and 10**k are both exact doubles, so their IEEE quotient is the correctly rounded
     * value, strtod's and Python's float()'s (Clinger's fast path). */
    if (digits <= 15) {
        static const double pow10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                         1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
        unsigned long long m = 0;
        int frac = -1; /* digits after the dot; -1: no dot yet */
        for (Py_ssize_t i = 0; i < n; i++) {
            if (p[i] == '.') {
                frac = 0;
                continue;
            }
            m = m * 10 + (unsigned long long)(p[i] - '0');
            if (frac >= 0)
                frac++;
        }
        double v = (double)m / pow10[frac < 0 ? 0 : frac]; /* frac <= digits <= 15 */
        if (!(v <= MAX_UNTIL))
            return 0;
        *out = v;
        return 1;
    }
    char *end = NULL;
    double v = strtod_l(p, &end, c_numeric);
    if (end != p + n || !(v >= 0.0 && v <= MAX_UNTIL))
        return 0;
    *out = v;
    return 1;
}

/* The millisecond part of an id "<digits>-<digits>" (at most 18 digits before the dash); -1 otherwise. */
static long long id_ms(PyObject *id) {
    const char *p;
    Py_ssize_t n;
    if (!as_bytes(id, &p, &n))
        return -1;
    const char *dash = memchr(p, '-', (size_t)n);
    if (dash == NULL)
        return -1;
    Py_ssize_t head = dash - p, tail = n - head - 1;
    if (!is_digits(p, head, 18) || !is_digits(dash + 1, tail, 20))
        return -1;
    long long ms = 0;
    for (Py_ssize_t i = 0; i < head; i++)
        ms = ms * 10 + (p[i] - '0');
    return ms;
}

/* Append a new reference to `list`, stealing it; -1 on error (the reference is released either way). */
static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc;
}

/* Put a new reference at `list[i]` of a list made at its full length, stealing it; -1 on error. (Appending
 * grew seven lists by realloc and copy, ~15 % of this loop; the slots left over are cut at the end.) */
static int put_new(PyObject *list, Py_ssize_t i, PyObject *item) {
    if (item == NULL)
        return -1;
    return PyList_SetItem(list, i, item);
}

static PyObject *columns(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *raw, *own;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &raw, &PyBytes_Type, &own))
        return NULL;
    const char *own_p;
    Py_ssize_t own_n;
    if (!as_bytes(own, &own_p, &own_n))
        Py_RETURN_NONE;
    Py_ssize_t count = PyList_Size(raw), k = 0; /* k: the entries put so far */
    if (count < 0)
        return NULL;
    PyObject *ats = PyList_New(count), *keys = PyList_New(count), *ends = PyList_New(count),
             *origins = PyList_New(count);
    PyObject *srcs = PySet_New(NULL), *ts = PyList_New(count), *ends_ms = PyList_New(count);
    PyObject *last_at = NULL, *last_ts = NULL; /* borrowed from ats, ts */
    long long prev_at = -1;
    unsigned long long prev_ts = 0;
    const char *last_src = NULL; /* the last src added to srcs (its bytes, borrowed from raw) */
    Py_ssize_t last_src_n = 0;
    long own_ban = 0, own_unban = 0, own_other = 0;
    int plain = 1;
    if (!ats || !keys || !ends || !origins || !srcs || !ts || !ends_ms)
        goto fail;
    for (Py_ssize_t e = 0; e < count && plain; e++) {
        plain = 0;
        PyObject *entry = PyList_GetItem(raw, e); /* borrowed: raw holds it */
        if (entry == NULL)
            goto fail;
        if (!PyList_CheckExact(entry) || PyList_Size(entry) != 2)
            break;
        PyObject *fields = PyList_GetItem(entry, 1);
        if (!PyList_CheckExact(fields) || PyList_Size(fields) != 16)
            break;
        const char *p[8];
        Py_ssize_t n[8];
        int ok = 1;
        for (int f = 0; f < 8 && ok; f++) {
            const char *name;
            Py_ssize_t name_n;
            ok = as_bytes(PyList_GetItem(fields, 2 * f), &name, &name_n) && name_n == LAYOUT_LEN[f]
                 && memcmp(name, LAYOUT[f], (size_t)name_n) == 0
                 && as_bytes(PyList_GetItem(fields, 2 * f + 1), &p[f], &n[f]);
        }
        if (!ok)
            break;
        long long at = id_ms(PyList_GetItem(entry, 0));
        if (at < 0 || at >= (1LL << 53)) /* beyond 2**53 a double of the ms is not the ms: Python decides */
            break;
        if (n[4] == own_n && memcmp(p[4], own_p, (size_t)own_n) == 0) { /* this host's own: counted by op */
            if (n[1] == 3 && memcmp(p[1], "ban", 3) == 0)
                own_ban++;
            else if (n[1] == 5 && memcmp(p[1], "unban", 5) == 0)
                own_unban++;
            else
                own_other++;
            plain = 1;
            continue;
        }
        unsigned long key;
        double end;
        if (!(n[0] == 1 && p[0][0] == '2') || !(n[1] == 3 && memcmp(p[1], "ban", 3) == 0)
            || n[2] > MAX_FIELD || !dotted_quad(p[2], n[2], &key) || !until_value(p[3], n[3], &end)
            || !is_digits(p[5], n[5], 19) || !is_digits(p[7], n[7], 19))
            break;
        unsigned long long tsv = digits(p[7], n[7]);
        int new_src = last_src == NULL || last_src_n != n[6] || memcmp(last_src, p[6], (size_t)n[6]) != 0;
        /* a read's entries come in runs of one stream-id millisecond and one ts: one object each per run
         * (`last_at`, `last_ts`: borrowed, the answer's lists hold them); each made where it is put, so a
         * failure leaves nothing made and not put */
        if (put_new(ats, k, k > 0 && at == prev_at ? Py_NewRef(last_at)
                                                   : (last_at = PyFloat_FromDouble((double)at / 1000.0))) < 0
            || put_new(keys, k, PyLong_FromUnsignedLong(key)) < 0 || put_new(ends, k, PyFloat_FromDouble(end)) < 0
            || put_new(origins, k, Py_NewRef(PyList_GetItem(fields, 9))) < 0
            || (new_src && PySet_Add(srcs, PyList_GetItem(fields, 13)) < 0)
            || put_new(ts, k, k > 0 && tsv == prev_ts ? Py_NewRef(last_ts)
                                                      : (last_ts = PyLong_FromUnsignedLongLong(tsv))) < 0
            /* end <= MAX_UNTIL: the product is far below 2**63; a double multiply then truncation, as int() */
            || put_new(ends_ms, k, PyLong_FromLongLong((long long)(end * 1000.0))) < 0)
            goto fail;
        prev_at = at;
        prev_ts = tsv;
        if (new_src) {
            last_src = p[6];
            last_src_n = n[6];
        }
        k++;
        plain = 1;
    }
    if (!plain) {
        Py_DECREF(ats);
        Py_DECREF(keys);
        Py_DECREF(ends);
        Py_DECREF(origins);
        Py_DECREF(srcs);
        Py_DECREF(ts);
        Py_DECREF(ends_ms);
        Py_RETURN_NONE;
    }
    if (k < count) { /* this host's own entries left slots over */
        PyObject *cols[6] = {ats, keys, ends, origins, ts, ends_ms};
        for (int c = 0; c < 6; c++)
            if (PyList_SetSlice(cols[c], k, count, NULL) < 0)
                goto fail;
    }
    return Py_BuildValue("(lllNNNNNNN)", own_ban, own_unban, own_other, ats, keys, ends, origins, srcs, ts, ends_ms);
fail:
    Py_XDECREF(ats);
    Py_XDECREF(keys);
    Py_XDECREF(ends);
    Py_XDECREF(origins);
    Py_XDECREF(srcs);
    Py_XDECREF(ts);
    Py_XDECREF(ends_ms);
    return NULL;
}

/* take_live(origins, ats, decided, start, origin, tokens, at, rate, burst, replay_age, refused)
 *   -> (stop, tokens, at)
 * `Gate._take_tokens`' loop for its live events from index `start` on, while the origin is `origin` itself
 * (the same object: the decoded read maps each origin to one str) and the bucket is (tokens, at): the same
 * float operations in the same order (min(burst, tokens + (at - b.at) * rate), then take 1.0), the index of
 * every refused event appended to `refused`. It stops at the first entry it does not take as the Python loop
 * would without asking (another origin object, a replay: decided > 0 and at - decided > replay_age, an `at`
 * or `decided` that is not exactly a float) and answers that index with the bucket as it left it: the Python
 * loop takes that entry itself and calls this again. Runs no Python code; raises only MemoryError. */
static PyObject *take_live(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *origins, *ats, *decided, *origin, *refused;
    Py_ssize_t i;
    double tokens, b_at, rate, burst, replay_age;
    if (!PyArg_ParseTuple(args, "O!O!OnOdddddO!", &PyList_Type, &origins, &PyList_Type, &ats, &decided, &i, &origin,
                          &tokens, &b_at, &rate, &burst, &replay_age, &PyList_Type, &refused))
        return NULL;
    if (decided != Py_None && !PyList_CheckExact(decided)) {
        PyErr_SetString(PyExc_TypeError, "decided: a list or None");
        return NULL;
    }
    Py_ssize_t n = PyList_Size(origins);
    if (PyList_Size(ats) < n)
        n = PyList_Size(ats);
    if (decided != Py_None && PyList_Size(decided) < n)
        n = PyList_Size(decided);
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "start: not negative");
        return NULL;
    }
    for (; i < n; i++) {
        if (PyList_GetItem(origins, i) != origin)
            break;
        PyObject *at_o = PyList_GetItem(ats, i);
        if (!PyFloat_CheckExact(at_o))
            break;
        double at = PyFloat_AsDouble(at_o);
        if (decided != Py_None) {
            PyObject *d_o = PyList_GetItem(decided, i);
            if (!PyFloat_CheckExact(d_o))
                break;
            double d = PyFloat_AsDouble(d_o);
            if (at - d > replay_age && d > 0)
                break; /* a replay: `_take`, in Python */
        }
        if (at > b_at) {
            double t = tokens + (at - b_at) * rate;
            tokens = t < burst ? t : burst; /* min(burst, t): burst unless t is smaller */
            b_at = at;
        }
        if (tokens < 1.0) {
            if (append_new(refused, PyLong_FromSsize_t(i)) < 0)
                return NULL;
            continue;
        }
        tokens -= 1.0;
    }
    return Py_BuildValue("(ndd)", i, tokens, b_at);
}

static PyMethodDef methods[] = {
    {"columns", columns, METH_VARARGS,
     "columns(raw, own) -> (own bans, own unbans, own others, ms, keys, ends, origins, srcs, ts) or None."},
    {"take_live", take_live, METH_VARARGS,
     "take_live(origins, ats, decided, start, origin, tokens, at, rate, burst, replay_age, refused) -> (stop, tokens, at)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_plain", "A catch-up read's plain bans, decoded in C (see fleet/rawread.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

/* The locale is made once per process and kept for its life (the module, single-phase, is never unloaded);
 * a second init keeps the first one instead of leaking it, and a failed init frees what it made. */
PyMODINIT_FUNC PyInit__plain(void) {
    int made = 0;
    if (c_numeric == (locale_t)0) {
        c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
        if (c_numeric == (locale_t)0)
            return PyErr_SetFromErrno(PyExc_OSError);
        made = 1;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL && made) {
        freelocale(c_numeric);
        c_numeric = (locale_t)0;
    }
    return m;
}
