/* nftblockd.kernel._nlenc: set elements encoded in one C loop where Python packs one struct per element
 * (kernel/nfmsg.py's `uniform_range_messages` and `timed_hash_messages`).
 *
 * What it does: `range_elements(keys, key_len, start_head, mid, flags)` takes a list of net keys (address << 8 |
 * prefix length, as `addr.net_key`) of one family (`key_len` 4 or 16 bytes) and returns, concatenated, for
 * each key `start_head + start + mid + end + flags`, where start is the network's first address and end the
 * first address past it, both big-endian in `key_len` bytes: exactly the bytes of the Python loop in
 * nfmsg.py (one struct pack per range), which stays the reference (tests/unit/test_nlenc.py holds the two
 * equal with hypothesis). It returns None, and the caller runs the Python loop, for anything that loop
 * treats differently: an item that is not an exact int, a negative key, a key wider than the family, a
 * prefix length of 0 or beyond the family's bits, or a range that reaches the top of the address space
 * (the Python side encodes that one without an end element, or raises for a bad key).
 * `timed_elements` does the same for hash-set elements that each carry their own timeout (saved bans going
 * back after a restart, a fleet catch-up's bans), against `timed_hash_messages`' loop.
 *
 * Why C: a 1 % refresh of the benchmark's 70k-entry feed sends ~1,200 ranges; the struct pack per range
 * costs 330 ns (IPv4) to 520 ns (IPv6, two `int.to_bytes`) in Python, ~0.47 ms per refresh on the kernel
 * thread, in series with the commit. Here a range is a few nanoseconds (IPv4) and two shifts of a Python int
 * (IPv6: the stable ABI has no 136-bit to-bytes call before 3.13). A catch-up of 100k fleet bans, each with
 * its own end, spent 17-26 ms in `timed_hash_messages`' struct packs, under the same interpreter lock as
 * the catch-up's own work.
 *
 * What it must not do: touch anything but its arguments, keep a borrowed item across a call that can run
 * Python code (the list's items are exact ints, whose shifts run none), or write past the buffer it sized
 * (every element is exactly the same length). Built against the stable ABI (Py_LIMITED_API 3.11): one
 * binary for every CPython >= 3.11.
 */

#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef unsigned __int128 u128;

static PyObject *s_64, *s_128;

/* `v` big-endian in the n bytes at p; the position after them */
static char *put_num(char *p, u128 v, Py_ssize_t n) {
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        p[i] = (char)(unsigned char)(v & 0xff);
        v >>= 8;
    }
    return p + n;
}

/* The n bytes of src at p; the position after them */
static char *put_bytes(char *p, const char *src, Py_ssize_t n) {
    memcpy(p, src, (size_t)n);
    return p + n;
}

/* After an unsigned conversion that returned `v`: 1 it is a value, 0 it was refused (negative, or too wide:
 * the OverflowError is cleared, "not this path"), -1 another error (left set). */
static int converted(unsigned long long v) {
    if (v != (unsigned long long)-1 || !PyErr_Occurred())
        return 1;
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
        return -1;
    PyErr_Clear();
    return 0;
}

/* A bytes object to hold n elements of `elem` bytes each, *p its buffer; NULL with an error set */
static PyObject *new_elements(Py_ssize_t n, Py_ssize_t elem, char **p) {
    if (n > 0 && elem > PY_SSIZE_T_MAX / n) {
        PyErr_SetString(PyExc_OverflowError, "too many elements");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * elem);
    if (out != NULL && (*p = PyBytes_AsString(out)) == NULL)
        Py_CLEAR(out);
    return out;
}

/* The key's value as 136 bits: 1 and (*lo, *hi8) set, 0 "not this path", -1 error (set). */
static int key136(PyObject *k, u128 *lo, unsigned *hi8) {
    /* a negative int: its shift by 128 is negative too, which PyLong_AsUnsignedLongLong refuses below */
    unsigned long long b0 = PyLong_AsUnsignedLongLongMask(k);
    if (b0 == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    PyObject *t = PyNumber_Rshift(k, s_64);
    if (t == NULL)
        return -1;
    unsigned long long b1 = PyLong_AsUnsignedLongLongMask(t);
    Py_DECREF(t);
    if (b1 == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    t = PyNumber_Rshift(k, s_128);
    if (t == NULL)
        return -1;
    unsigned long long top = PyLong_AsUnsignedLongLong(t);
    Py_DECREF(t);
    int ok = converted(top);
    if (ok <= 0)
        return ok;
    if (top > 0xff)
        return 0;
    *lo = ((u128)b1 << 64) | b0;
    *hi8 = (unsigned)top;
    return 1;
}

static PyObject *range_elements(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *keys;
    Py_ssize_t key_len, hl, ml, fl;
    const char *head, *mid, *flags;
    if (!PyArg_ParseTuple(args, "O!ny#y#y#:range_elements", &PyList_Type, &keys, &key_len, &head, &hl, &mid, &ml,
                          &flags, &fl))
        return NULL;
    if (key_len != 4 && key_len != 16)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_Size(keys);
    if (n < 0)
        return NULL;
    char *p = NULL;
    PyObject *out = new_elements(n, hl + ml + fl + 2 * key_len, &p);
    if (out == NULL)
        return NULL;
    unsigned bits = (unsigned)key_len * 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyList_GetItem(keys, i); /* borrowed: nothing below runs Python code on an exact int */
        if (k == NULL)
            goto fail;
        if (!PyLong_CheckExact(k))
            goto not_this_path;
        u128 addr, end;
        unsigned plen;
        if (key_len == 4) {
            unsigned long long v = PyLong_AsUnsignedLongLong(k);
            int ok = converted(v); /* refused: negative or beyond 64 bits */
            if (ok < 0)
                goto fail;
            if (ok == 0)
                goto not_this_path;
            plen = (unsigned)(v & 0xff);
            addr = v >> 8;
            if (addr >> 32)
                goto not_this_path;
        } else {
            u128 lo;
            unsigned hi8;
            int rc = key136(k, &lo, &hi8);
            if (rc < 0)
                goto fail;
            if (rc == 0)
                goto not_this_path;
            plen = (unsigned)(lo & 0xff);
            addr = (lo >> 8) | ((u128)hi8 << 120);
        }
        if (plen == 0 || plen > bits)
            goto not_this_path;
        end = addr + ((u128)1 << (bits - plen));
        if (key_len == 4 ? (end >> 32) != 0 : end < addr) /* the top of the space: no end element */
            goto not_this_path;
        p = put_bytes(put_num(put_bytes(put_num(put_bytes(p, head, hl), addr, key_len), mid, ml), end, key_len),
                      flags, fl);
    }
    return out;
not_this_path:
    Py_DECREF(out);
    Py_RETURN_NONE;
fail:
    Py_DECREF(out);
    return NULL;
}

/* A hash set's key as 32 or 128 bits: 1 and *out set, 0 "not this path", -1 error (set). A negative int
 * is refused by the unsigned conversions (of the int itself, or of it shifted right by 64, still negative). */
static int hash_key(PyObject *k, Py_ssize_t key_len, u128 *out) {
    if (!PyLong_CheckExact(k))
        return 0;
    unsigned long long lo, hi = 0;
    if (key_len == 4) {
        lo = PyLong_AsUnsignedLongLong(k);
    } else {
        lo = PyLong_AsUnsignedLongLongMask(k);
        if (lo == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        PyObject *t = PyNumber_Rshift(k, s_64);
        if (t == NULL)
            return -1;
        hi = PyLong_AsUnsignedLongLong(t);
        Py_DECREF(t);
    }
    int ok = converted(key_len == 4 ? lo : hi);
    if (ok <= 0)
        return ok;
    if (key_len == 4 && (lo >> 32) != 0)
        return 0;
    *out = ((u128)hi << 64) | lo;
    return 1;
}

/*
 * timed_elements(keys, key_len, head, timeout_hdr, expiration_hdr, remaining) -> bytes | None: per element
 * `head + key + timeout_hdr + TIMEOUT + expiration_hdr + remaining`, the key big-endian in key_len (4 or 16)
 * bytes, TIMEOUT the remaining milliseconds rounded up to whole seconds, both big-endian 64-bit: the bytes of
 * nfmsg.py's struct pack per element (`timed_hash_messages`). None for whatever that loop treats otherwise
 * (a key that is not an exact int of the family's width, a remaining time that is not an exact int in
 * 0 .. 2^64 - 1000): the Python loop then runs and decides.
 */
static PyObject *timed_elements(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *keys, *remaining;
    Py_ssize_t key_len, hl, thl, ehl;
    const char *head, *th, *eh;
    if (!PyArg_ParseTuple(args, "O!ny#y#y#O!:timed_elements", &PyList_Type, &keys, &key_len, &head, &hl, &th, &thl,
                          &eh, &ehl, &PyList_Type, &remaining))
        return NULL;
    if (key_len != 4 && key_len != 16)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_Size(keys);
    if (n < 0)
        return NULL;
    if (PyList_Size(remaining) != n)
        Py_RETURN_NONE;
    char *p = NULL;
    PyObject *out = new_elements(n, hl + key_len + thl + 8 + ehl + 8, &p);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* borrowed: nothing below runs Python code on exact ints */
        PyObject *k = PyList_GetItem(keys, i), *t = PyList_GetItem(remaining, i);
        if (k == NULL || t == NULL)
            goto fail;
        u128 key;
        int rc = hash_key(k, key_len, &key);
        if (rc < 0)
            goto fail;
        if (rc == 0 || !PyLong_CheckExact(t))
            goto not_this_path;
        unsigned long long ms = PyLong_AsUnsignedLongLong(t);
        int ok = converted(ms); /* refused: negative or beyond 64 bits */
        if (ok < 0)
            goto fail;
        if (ok == 0 || ms > 0xFFFFFFFFFFFFFFFFull - 999) /* (its whole seconds would not fit in 64 bits) */
            goto not_this_path;
        p = put_num(put_bytes(put_num(put_bytes(put_num(put_bytes(p, head, hl), key, key_len), th, thl),
                                      (ms + 999) / 1000 * 1000, 8), eh, ehl), ms, 8);
    }
    return out;
not_this_path:
    Py_DECREF(out);
    Py_RETURN_NONE;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"timed_elements", timed_elements, METH_VARARGS,
     "timed_elements(keys, key_len, head, timeout_hdr, expiration_hdr, remaining) -> bytes | None: each hash-set "
     "element with its own timeout, concatenated (None: the Python loop must encode these)"},
    {"range_elements", range_elements, METH_VARARGS,
     "range_elements(keys, key_len, start_head, mid, flags) -> bytes | None: each net key's range element "
     "pair, concatenated (None: the Python loop must encode these keys)"},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *Py_UNUSED(m)) {
    if (s_64 == NULL && (s_64 = PyLong_FromLong(64)) == NULL)
        return -1;
    if (s_128 == NULL && (s_128 = PyLong_FromLong(128)) == NULL)
        return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "nftblockd.kernel._nlenc",
    "Set elements in one C loop (kernel/nfmsg.py's uniform_range_messages, timed_hash_messages).", 0, methods, slots,
    NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__nlenc(void) { return PyModuleDef_Init(&module); }
