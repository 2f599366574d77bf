/* JSON messages straight into PostgreSQL's binary COPY rows, for a flat, closed schema.
 *
 * The compiled half of shared/fastcopy.py (read it first: it compiles the
 * contract's JSON Schema into the column specs this module takes, and says what
 * the fast path promises). In short: a batch of messages is encoded only if every
 * one is certainly valid and in the plain form this parser knows; otherwise
 * encode() returns None and the caller takes its other paths, which decide (and
 * name the reason for a refusal). So this code only ever has to decline, never to
 * explain, and it declines anything unusual: escapes and non-ASCII in strings,
 * duplicate or unknown keys, nested values, numbers it cannot convert exactly.
 *
 * Nothing here raises on a message's content: a TypeError means the caller
 * passed the wrong kind of argument (a bug), a MemoryError what it says (the
 * caller then takes its other paths too).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if FLT_EVAL_METHOD != 0
#error "the exact float conversion (number_as_double) needs double arithmetic in double precision"
#endif

enum kind { K_TIME, K_TEXT, K_FLOAT8, K_INT8, K_INT2, K_EMPTY_ARRAY };

typedef struct {
    char *name;
    Py_ssize_t name_len;
    int kind;
    int required, nullable;
    int64_t ilo, ihi;              /* integer kinds: inclusive bounds */
    double flo, fhi;               /* K_FLOAT8 bounds */
    int flo_exclusive, fhi_exclusive;
    Py_ssize_t min_len, max_len;   /* K_TEXT: length bounds (ASCII: bytes are characters) */
    Py_ssize_t n_enum;             /* K_TEXT: if > 0, the only values allowed */
    char **enum_values;
    Py_ssize_t *enum_lens;
} Column;

typedef struct {
    Py_ssize_t n, width;           /* columns; the first `width` are the COPY table's */
    Py_ssize_t key_column;         /* a message key, when given, must equal this text column */
    Py_ssize_t time_column;
    Column *cols;
    Py_ssize_t table_size;         /* open addressing over the names: column index or -1 */
    Py_ssize_t *table;
    /* The key that followed each column's in the last message (follows[n]: its first key), tried
     * before the table: one producer writes its keys in the same order every time. Only a
     * guess, checked before use: written under the GIL, and harmless if another call's
     * guesses overwrite it. */
    Py_ssize_t *follows;
} Spec;

typedef struct {
    int state;                     /* 0 absent, 1 null, 2 a value */
    int64_t i;                     /* integer kinds, and K_TIME (µs since 2000-01-01 UTC) */
    double f;
    const char *s;
    Py_ssize_t len;
} Slot;

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

#define CAPSULE "gpuhealth._fastcopy.Spec"

/* ------------------------------------------------------------------ buffers */

static int buf_reserve(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more)
        cap *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static void put_be16(char *p, uint16_t v) {
    p[0] = (char)(v >> 8);
    p[1] = (char)v;
}

static void put_be32(char *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}

static void put_be64(char *p, uint64_t v) {
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
}

/* ------------------------------------------------------------------ the spec */

/* a == b for n bytes: names are short, and a libc call per key costs more than comparing them */
static inline int same_bytes(const char *a, const char *b, Py_ssize_t n) {
    uint64_t x, y;
    for (; n >= 8; a += 8, b += 8, n -= 8) {
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y)
            return 0;
    }
    for (; n > 0; a++, b++, n--)
        if (*a != *b)
            return 0;
    return 1;
}

static uint64_t name_hash(const char *s, Py_ssize_t len) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t k = 0; k < len; k++) {
        h ^= (unsigned char)s[k];
        h *= 1099511628211ULL;
    }
    return h;
}

static Py_ssize_t column_of(const Spec *spec, const char *name, Py_ssize_t len) {
    Py_ssize_t mask = spec->table_size - 1;
    for (Py_ssize_t at = (Py_ssize_t)(name_hash(name, len) & (uint64_t)mask);; at = (at + 1) & mask) {
        Py_ssize_t c = spec->table[at];
        if (c < 0)
            return -1;
        const Column *col = &spec->cols[c];
        if (col->name_len == len && memcmp(col->name, name, (size_t)len) == 0)
            return c;
    }
}

static void spec_free(Spec *spec) {
    if (spec == NULL)
        return;
    for (Py_ssize_t c = 0; spec->cols && c < spec->n; c++) {
        Column *col = &spec->cols[c];
        PyMem_Free(col->name);
        for (Py_ssize_t e = 0; e < col->n_enum; e++)
            PyMem_Free(col->enum_values[e]);
        PyMem_Free(col->enum_values);
        PyMem_Free(col->enum_lens);
    }
    PyMem_Free(spec->cols);
    PyMem_Free(spec->table);
    PyMem_Free(spec->follows);
    PyMem_Free(spec);
}

static void capsule_free(PyObject *capsule) {
    spec_free(PyCapsule_GetPointer(capsule, CAPSULE));
}

static char *copy_bytes(PyObject *bytes, Py_ssize_t *len) {
    char *s;
    if (PyBytes_AsStringAndSize(bytes, &s, len) < 0)
        return NULL;
    char *out = PyMem_Malloc((size_t)*len + 1);
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, s, (size_t)*len + 1);
    return out;
}

/* compile(columns, width, key_column, time_column) -> spec
 *
 * columns: a sequence of tuples (name: bytes, kind: int, required: bool, nullable: bool,
 * ilo: int, ihi: int, flo: float, fhi: float, flo_exclusive: bool, fhi_exclusive: bool,
 * min_len: int, max_len: int, enum: tuple[bytes, ...]), in the COPY's column order.
 */
static PyObject *fc_compile(PyObject *self, PyObject *args) {
    PyObject *columns;
    Py_ssize_t width, key_column, time_column;
    if (!PyArg_ParseTuple(args, "Onnn", &columns, &width, &key_column, &time_column))
        return NULL;
    PyObject *seq = PySequence_Fast(columns, "columns must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Spec *spec = PyMem_Calloc(1, sizeof(Spec));
    if (spec == NULL || (spec->cols = PyMem_Calloc((size_t)n, sizeof(Column))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    spec->n = n;
    if (width < 1 || width > n || key_column < 0 || key_column >= n || time_column < 0 || time_column >= n) {
        PyErr_SetString(PyExc_ValueError, "width, key_column or time_column out of range");
        goto fail;
    }
    spec->width = width;
    spec->key_column = key_column;
    spec->time_column = time_column;
    for (Py_ssize_t c = 0; c < n; c++) {
        Column *col = &spec->cols[c];
        PyObject *name, *enum_values;
        int required, nullable, flo_ex, fhi_ex;
        long long ilo, ihi;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, c), "SippLLddppnnO!", &name, &col->kind,
                              &required, &nullable, &ilo, &ihi, &col->flo, &col->fhi, &flo_ex, &fhi_ex,
                              &col->min_len, &col->max_len, &PyTuple_Type, &enum_values))
            goto fail;
        col->required = required;
        col->nullable = nullable;
        col->ilo = ilo;
        col->ihi = ihi;
        col->flo_exclusive = flo_ex;
        col->fhi_exclusive = fhi_ex;
        if (col->kind < K_TIME || col->kind > K_EMPTY_ARRAY) {
            PyErr_Format(PyExc_ValueError, "column %zd: unknown kind %d", c, col->kind);
            goto fail;
        }
        if ((col->name = copy_bytes(name, &col->name_len)) == NULL)
            goto fail;
        col->n_enum = PyTuple_GET_SIZE(enum_values);
        if (col->n_enum) {
            col->enum_values = PyMem_Calloc((size_t)col->n_enum, sizeof(char *));
            col->enum_lens = PyMem_Calloc((size_t)col->n_enum, sizeof(Py_ssize_t));
            if (col->enum_values == NULL || col->enum_lens == NULL) {
                col->n_enum = 0;
                PyErr_NoMemory();
                goto fail;
            }
            for (Py_ssize_t e = 0; e < col->n_enum; e++) {
                PyObject *value = PyTuple_GET_ITEM(enum_values, e);
                if (!PyBytes_Check(value)) {
                    col->n_enum = e;
                    PyErr_SetString(PyExc_TypeError, "enum values must be bytes");
                    goto fail;
                }
                if ((col->enum_values[e] = copy_bytes(value, &col->enum_lens[e])) == NULL) {
                    col->n_enum = e;
                    goto fail;
                }
            }
        }
    }
    if (spec->cols[key_column].kind != K_TEXT || spec->cols[time_column].kind != K_TIME) {
        PyErr_SetString(PyExc_ValueError, "the key column must be text and the time column a time");
        goto fail;
    }
    spec->table_size = 8;
    while (spec->table_size < 4 * n)
        spec->table_size *= 2;
    if ((spec->table = PyMem_Malloc((size_t)spec->table_size * sizeof(Py_ssize_t))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t k = 0; k < spec->table_size; k++)
        spec->table[k] = -1;
    if ((spec->follows = PyMem_Malloc((size_t)(n + 1) * sizeof(Py_ssize_t))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t c = 0; c <= n; c++)
        spec->follows[c] = c < n ? c + 1 : 0;
    for (Py_ssize_t c = 0; c < n; c++) {
        const Column *col = &spec->cols[c];
        if (column_of(spec, col->name, col->name_len) >= 0) {
            PyErr_Format(PyExc_ValueError, "column %zd's name is given twice", c);
            goto fail;
        }
        Py_ssize_t mask = spec->table_size - 1, at = (Py_ssize_t)(name_hash(col->name, col->name_len) & (uint64_t)mask);
        while (spec->table[at] >= 0)
            at = (at + 1) & mask;
        spec->table[at] = c;
    }
    Py_DECREF(seq);
    PyObject *capsule = PyCapsule_New(spec, CAPSULE, capsule_free);
    if (capsule == NULL)
        spec_free(spec);
    return capsule;
fail:
    Py_DECREF(seq);
    spec_free(spec);
    return NULL;
}

/* ------------------------------------------------------------------ parsing (0: fine, -1: decline) */

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* A string without escapes, of printable ASCII only; *pp is at its opening quote. */
static int parse_string(const char **pp, const char *end, const char **s, Py_ssize_t *len) {
    const char *p = *pp;
    if (p >= end || *p != '"')
        return -1;
    const char *start = p + 1, *close = memchr(start, '"', (size_t)(end - start));
    if (close == NULL)
        return -1;
    unsigned bad = 0; /* one pass the compiler can vectorise */
    for (const unsigned char *c = (const unsigned char *)start; c < (const unsigned char *)close; c++)
        bad |= (unsigned)(*c < 0x20) | (unsigned)(*c >= 0x7f) | (unsigned)(*c == '\\');
    if (bad)
        return -1;
    *s = start;
    *len = close - start;
    *pp = close + 1;
    return 0;
}

typedef struct {
    int negative, integral;        /* integral: no fraction, no exponent */
    uint64_t mantissa;             /* the significant digits, as an integer */
    int digits;                    /* how many of them (leading zeros not counted) */
    int overflow;                  /* more than 19 significant digits */
    long exp10;                    /* value = mantissa * 10^exp10 */
    const char *start;
    Py_ssize_t len;
} Number;

/* A JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static int parse_number(const char **pp, const char *end, Number *num) {
    const char *p = *pp;
    memset(num, 0, sizeof(*num));
    num->start = p;
    num->integral = 1;
    if (p < end && *p == '-') {
        num->negative = 1;
        p++;
    }
    if (p >= end || *p < '0' || *p > '9')
        return -1;
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9')
            return -1; /* a leading zero */
    } else {
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (num->digits == 19) {
                num->overflow = 1;
                num->exp10++;
                continue;
            }
            num->mantissa = num->mantissa * 10 + (uint64_t)(*p - '0');
            num->digits++;
        }
    }
    if (p < end && *p == '.') {
        num->integral = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9')
            return -1;
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (num->digits == 0 && *p == '0') {
                num->exp10--; /* 0.00x: leading zeros are not significant */
                continue;
            }
            if (num->digits == 19) {
                num->overflow = 1;
                continue;
            }
            num->mantissa = num->mantissa * 10 + (uint64_t)(*p - '0');
            num->digits++;
            num->exp10--;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        num->integral = 0;
        p++;
        int negative = 0;
        if (p < end && (*p == '+' || *p == '-'))
            negative = *p++ == '-';
        if (p >= end || *p < '0' || *p > '9')
            return -1;
        long e = 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++)
            if (e < 100000)
                e = e * 10 + (*p - '0');
        num->exp10 += negative ? -e : e;
    }
    num->len = p - num->start;
    *pp = p;
    return 0;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The number as the nearest double, exactly as Python's float() would round it. */
static int number_as_double(const Number *num, double *out) {
    if (num->integral) { /* an integer for a float: read as an integer, so -0 is 0 (as Python) */
        if (num->overflow || num->mantissa > (1ULL << 53))
            return -1; /* a huge one: leave it to the careful path */
        *out = num->negative && num->mantissa ? -(double)num->mantissa : (double)num->mantissa;
        return 0;
    }
    if (!num->overflow && num->mantissa <= (1ULL << 53) && num->exp10 >= -22 && num->exp10 <= 22) {
        /* both exact doubles, so one correctly rounded operation (Clinger's fast path) */
        double d = (double)num->mantissa;
        d = num->exp10 < 0 ? d / POW10[-num->exp10] : d * POW10[num->exp10];
        *out = num->negative ? -d : d;
        return 0;
    }
    char text[64];
    if (num->len >= (Py_ssize_t)sizeof(text))
        return -1;
    memcpy(text, num->start, (size_t)num->len);
    text[num->len] = '\0';
    char *stop;
    double d = PyOS_string_to_double(text, &stop, NULL); /* correctly rounded; overflow gives inf */
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (stop != text + num->len || !isfinite(d))
        return -1;
    *out = d;
    return 0;
}

static int number_as_int(const Number *num, int64_t *out) {
    if (!num->integral || num->overflow)
        return -1;
    if (num->negative) {
        if (num->mantissa > (uint64_t)INT64_MAX + 1)
            return -1;
        *out = num->mantissa == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)num->mantissa;
    } else {
        if (num->mantissa > (uint64_t)INT64_MAX)
            return -1;
        *out = (int64_t)num->mantissa;
    }
    return 0;
}

/* ------------------------------------------------------------------ time */

static int digits(const char *s, int n, int *out) {
    int v = 0;
    for (int k = 0; k < n; k++) {
        if (s[k] < '0' || s[k] > '9')
            return -1;
        v = v * 10 + (s[k] - '0');
    }
    *out = v;
    return 0;
}

static int64_t days_from_civil(int64_t y, int m, int d) { /* days since 1970-01-01 */
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int days_in_month(int y, int m) {
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

#define PG_EPOCH_DAYS 10957 /* 2000-01-01 in days since 1970-01-01 */

/* Plain RFC 3339, YYYY-MM-DDTHH:MM:SS[.f{1,6}](Z|±HH:MM), as µs since 2000-01-01 UTC. */
static int parse_time(const char *s, Py_ssize_t len, int64_t *out) {
    int y, mo, d, h, mi, sec, frac = 0, frac_digits = 0;
    if (len < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':')
        return -1;
    if (digits(s, 4, &y) || digits(s + 5, 2, &mo) || digits(s + 8, 2, &d) || digits(s + 11, 2, &h) ||
        digits(s + 14, 2, &mi) || digits(s + 17, 2, &sec))
        return -1;
    const char *p = s + 19, *end = s + len;
    if (*p == '.') {
        for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
            if (++frac_digits > 6)
                return -1;
            frac = frac * 10 + (*p - '0');
        }
        if (frac_digits == 0)
            return -1;
        for (int k = frac_digits; k < 6; k++)
            frac *= 10;
    }
    int64_t offset_s = 0;
    if (p < end && *p == 'Z') {
        p++;
    } else if (p < end && (*p == '+' || *p == '-')) {
        int oh, om, negative = *p == '-';
        if (end - p < 6 || p[3] != ':' || digits(p + 1, 2, &oh) || digits(p + 4, 2, &om))
            return -1;
        if (oh > 23 || om > 59)
            return -1;
        offset_s = (negative ? -1 : 1) * (int64_t)(oh * 3600 + om * 60);
        p += 6;
    } else {
        return -1;
    }
    if (p != end)
        return -1;
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 59)
        return -1;
    int64_t days = days_from_civil(y, mo, d) - PG_EPOCH_DAYS;
    int64_t seconds = ((days * 24 + h) * 60 + mi) * 60 + sec - offset_s;
    *out = seconds * 1000000 + frac;
    return 0;
}

/* ------------------------------------------------------------------ one message */

static int parse_value(const Column *col, const char **pp, const char *end, Slot *slot, int64_t lo_us,
                       int64_t hi_us) {
    const char *p = *pp;
    if (p < end && *p == 'n') {
        if (end - p < 4 || memcmp(p, "null", 4) != 0 || !col->nullable)
            return -1;
        slot->state = 1;
        *pp = p + 4;
        return 0;
    }
    slot->state = 2;
    switch (col->kind) {
    case K_TEXT:
        if (parse_string(pp, end, &slot->s, &slot->len))
            return -1;
        if (slot->len < col->min_len || (col->max_len >= 0 && slot->len > col->max_len))
            return -1;
        if (col->n_enum) {
            Py_ssize_t e = 0;
            for (; e < col->n_enum; e++)
                if (col->enum_lens[e] == slot->len && memcmp(col->enum_values[e], slot->s, (size_t)slot->len) == 0)
                    break;
            if (e == col->n_enum)
                return -1;
        }
        return 0;
    case K_TIME: {
        const char *s;
        Py_ssize_t len;
        int64_t t;
        if (parse_string(pp, end, &s, &len) || parse_time(s, len, &t) || t < lo_us || t > hi_us)
            return -1;
        int64_t ms = t >= 0 ? t / 1000 : -((-t + 999) / 1000); /* the contract keeps milliseconds */
        slot->i = ms * 1000;
        return 0;
    }
    case K_FLOAT8: {
        Number num;
        if (parse_number(pp, end, &num) || number_as_double(&num, &slot->f))
            return -1;
        double f = slot->f;
        if (col->flo_exclusive ? !(f > col->flo) : !(f >= col->flo))
            return -1;
        if (col->fhi_exclusive ? !(f < col->fhi) : !(f <= col->fhi))
            return -1;
        return 0;
    }
    case K_INT8:
    case K_INT2: {
        Number num;
        if (parse_number(pp, end, &num) || number_as_int(&num, &slot->i))
            return -1;
        return slot->i < col->ilo || slot->i > col->ihi ? -1 : 0;
    }
    case K_EMPTY_ARRAY: /* only an empty array, stored as NULL: anything in it is the careful path's */
        if (p >= end || *p != '[')
            return -1;
        p = skip_ws(p + 1, end);
        if (p >= end || *p != ']')
            return -1;
        slot->state = 1;
        *pp = p + 1;
        return 0;
    }
    return -1;
}

/* The column of the key at *pp (its opening quote), or -1; *pp moves past the key. */
static Py_ssize_t next_column(Spec *spec, Py_ssize_t previous, const char **pp, const char *end) {
    Py_ssize_t guess = spec->follows[previous];
    const char *p = *pp;
    if (guess < spec->n) { /* the name expected, quoted, is right here: no scan, no lookup */
        const Column *col = &spec->cols[guess];
        if (end - p >= col->name_len + 2 && p[0] == '"' && p[col->name_len + 1] == '"' &&
            same_bytes(p + 1, col->name, col->name_len)) {
            *pp = p + col->name_len + 2;
            return guess;
        }
    }
    const char *name;
    Py_ssize_t len;
    if (parse_string(pp, end, &name, &len))
        return -1;
    Py_ssize_t c = column_of(spec, name, len);
    if (c >= 0)
        spec->follows[previous] = c;
    return c;
}

static int parse_message(Spec *spec, const char *p, const char *end, Slot *slots, int64_t lo_us,
                         int64_t hi_us) {
    Py_ssize_t previous = spec->n;
    memset(slots, 0, (size_t)spec->n * sizeof(Slot));
    p = skip_ws(p, end);
    if (p >= end || *p != '{')
        return -1;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') {
        p++;
    } else {
        for (;;) {
            Py_ssize_t c = next_column(spec, previous, &p, end);
            if (c < 0 || slots[c].state)
                return -1; /* unknown, or given twice */
            previous = c;
            p = skip_ws(p, end);
            if (p >= end || *p != ':')
                return -1;
            p = skip_ws(p + 1, end);
            if (parse_value(&spec->cols[c], &p, end, &slots[c], lo_us, hi_us))
                return -1;
            if (slots[c].state == 0)
                slots[c].state = 1;
            p = skip_ws(p, end);
            if (p < end && *p == ',') {
                p = skip_ws(p + 1, end);
                continue;
            }
            if (p < end && *p == '}') {
                p++;
                break;
            }
            return -1;
        }
    }
    if (skip_ws(p, end) != end)
        return -1;
    for (Py_ssize_t c = 0; c < spec->n; c++)
        if (slots[c].state == 0 && spec->cols[c].required)
            return -1;
    return 0;
}

/* ENCODED_MAX bounds a row's fields in binary COPY form: 12 bytes a field at most, and its texts,
 * which lie within the message. */
#define ENCODED_MAX(spec, message_len) (12 * (spec)->n + (message_len))

/* The row's fields in binary COPY form (no field count) at `out`, which has room for
 * ENCODED_MAX; its length. *cut is where the first `width` end. */
static Py_ssize_t encode_row(const Spec *spec, const Slot *slots, char *out, Py_ssize_t *cut) {
    char *at = out;
    *cut = -1;
    for (Py_ssize_t c = 0; c < spec->n; c++) {
        const Slot *slot = &slots[c];
        if (c == spec->width)
            *cut = at - out;
        if (slot->state != 2) {
            put_be32(at, 0xffffffffu);
            at += 4;
            continue;
        }
        switch (spec->cols[c].kind) {
        case K_TEXT:
            put_be32(at, (uint32_t)slot->len);
            memcpy(at + 4, slot->s, (size_t)slot->len);
            at += 4 + slot->len;
            break;
        case K_FLOAT8: {
            uint64_t bits;
            memcpy(&bits, &slot->f, 8);
            put_be32(at, 8);
            put_be64(at + 4, bits);
            at += 12;
            break;
        }
        case K_TIME:
        case K_INT8:
            put_be32(at, 8);
            put_be64(at + 4, (uint64_t)slot->i);
            at += 12;
            break;
        case K_INT2:
            put_be32(at, 2);
            put_be16(at + 4, (uint16_t)(int16_t)slot->i);
            at += 6;
            break;
        default: /* K_EMPTY_ARRAY is always NULL */
            put_be32(at, 0xffffffffu);
            at += 4;
        }
    }
    if (*cut < 0)
        *cut = at - out;
    return at - out;
}

/* Each key's newest row and its oldest time, in the order the keys first appear. */
typedef struct {
    const char *key;               /* within the message: alive for the whole call */
    Py_ssize_t key_len;
    Py_ssize_t newest;             /* the row */
    int64_t newest_time, first_time;
} Latest;

static uint64_t key_hash(const char *s, Py_ssize_t len) {
    uint64_t h = (uint64_t)len * 0x9e3779b97f4a7c15ULL, w;
    for (; len >= 8; s += 8, len -= 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
    }
    for (; len > 0; s++, len--)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h ^ (h >> 31);
}

/* encode(spec, values, keys, lo_us, hi_us, max_len) -> (table_rows, latest_rows, latest_keys, times) or None
 *
 * values: list of bytes (the messages); keys: list of bytes or None, parallel (a key must
 * equal the key column's text); lo_us, hi_us: the times allowed (µs since 2000-01-01 UTC,
 * inclusive); max_len: the longest message taken. None if any one message is declined. Otherwise:
 * - table_rows: every row's first `width` columns in binary COPY form, each with its field
 *   count (no header, no trailer);
 * - latest_rows: for each distinct key column value, in the order they first appear, the
 *   newest row (the first of equals) with every column and then the oldest row's time
 *   appended, in binary COPY form with its field count;
 * - latest_keys: those key column values, as str;
 * - times: each row's time column (µs since 2000-01-01 UTC, cut to milliseconds) as native
 *   int64s, 8 bytes a row.
 */
static PyObject *fc_encode(PyObject *self, PyObject *args) {
    PyObject *capsule, *values, *keys;
    long long lo_us, hi_us;
    Py_ssize_t max_len;
    if (!PyArg_ParseTuple(args, "OO!O!LLn", &capsule, &PyList_Type, &values, &PyList_Type, &keys, &lo_us, &hi_us,
                          &max_len))
        return NULL;
    Spec *spec = PyCapsule_GetPointer(capsule, CAPSULE);
    if (spec == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), bound = 0;
    if (PyList_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "values and keys differ in length");
        return NULL;
    }
    for (Py_ssize_t m = 0; m < n; m++) {
        PyObject *value = PyList_GET_ITEM(values, m), *key = PyList_GET_ITEM(keys, m);
        if (!PyBytes_Check(value) || (key != Py_None && !PyBytes_Check(key))) {
            PyErr_SetString(PyExc_TypeError, "values must be bytes, and keys bytes or None");
            return NULL;
        }
        if (PyBytes_GET_SIZE(value) > max_len)
            Py_RETURN_NONE; /* longer than the caller's contract allows */
        bound += 2 + ENCODED_MAX(spec, PyBytes_GET_SIZE(value));
    }
    /* The table's rows are written straight into the bytes returned; each row's columns past
     * the table's (its tail) are kept aside, for the latest rows. */
    PyObject *result = NULL, *table = PyBytes_FromStringAndSize(NULL, bound);
    Py_ssize_t table_size = 16, n_latest = 0, table_len = 0;
    while (table_size < 2 * n)
        table_size *= 2;
    Slot *slots = PyMem_Malloc((size_t)spec->n * sizeof(Slot));
    Py_ssize_t *row_at = PyMem_Malloc((size_t)(n + 1) * sizeof(Py_ssize_t)); /* in table, after the count */
    Py_ssize_t *tail_at = PyMem_Malloc((size_t)(n + 2) * sizeof(Py_ssize_t)); /* row m: tails[tail_at[m]..[m + 1]] */
    int64_t *times = PyMem_Malloc((size_t)(n + 1) * sizeof(int64_t));
    Latest *latest = PyMem_Malloc((size_t)(n + 1) * sizeof(Latest));
    Py_ssize_t *index = PyMem_Malloc((size_t)table_size * sizeof(Py_ssize_t)); /* key -> latest entry, or -1 */
    Buf tails = {0};
    int declined = 0;
    if (table == NULL || slots == NULL || row_at == NULL || tail_at == NULL || times == NULL || latest == NULL ||
        index == NULL) {
        if (table != NULL)
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < table_size; k++)
        index[k] = -1;
    tail_at[0] = 0;
    char *out = PyBytes_AS_STRING(table);
    for (Py_ssize_t m = 0; m < n; m++) {
        PyObject *value = PyList_GET_ITEM(values, m), *key = PyList_GET_ITEM(keys, m);
        const char *raw = PyBytes_AS_STRING(value);
        if (parse_message(spec, raw, raw + PyBytes_GET_SIZE(value), slots, lo_us, hi_us)) {
            declined = 1;
            goto done;
        }
        const Slot *k = &slots[spec->key_column];
        if (k->state != 2) {
            declined = 1;
            goto done;
        }
        if (key != Py_None &&
            (PyBytes_GET_SIZE(key) != k->len || memcmp(PyBytes_AS_STRING(key), k->s, (size_t)k->len) != 0)) {
            declined = 1; /* a key that is not the GPU's: the careful path refuses it, with the reason */
            goto done;
        }
        Py_ssize_t cut, len = encode_row(spec, slots, out + table_len + 2, &cut);
        if (buf_reserve(&tails, len - cut))
            goto done;
        put_be16(out + table_len, (uint16_t)spec->width);
        row_at[m] = table_len + 2;
        memcpy(tails.data + tails.len, out + table_len + 2 + cut, (size_t)(len - cut));
        tails.len += len - cut;
        tail_at[m + 1] = tails.len;
        table_len += 2 + cut;
        int64_t t = times[m] = slots[spec->time_column].i;
        Py_ssize_t mask = table_size - 1, at = (Py_ssize_t)(key_hash(k->s, k->len) & (uint64_t)mask);
        for (;; at = (at + 1) & mask) {
            Py_ssize_t e = index[at];
            if (e < 0) {
                index[at] = n_latest;
                latest[n_latest++] = (Latest){k->s, k->len, m, t, t};
                break;
            }
            Latest *l = &latest[e];
            if (l->key_len == k->len && same_bytes(l->key, k->s, k->len)) {
                if (t > l->newest_time) {
                    l->newest = m;
                    l->newest_time = t;
                } else if (t < l->first_time) {
                    l->first_time = t;
                }
                break;
            }
        }
    }
    {
        Buf rows = {0};
        PyObject *latest_keys = PyList_New(n_latest);
        for (Py_ssize_t e = 0; latest_keys != NULL && e < n_latest; e++) {
            const Latest *l = &latest[e];
            Py_ssize_t m = l->newest, head = (m + 1 < n ? row_at[m + 1] - 2 : table_len) - row_at[m];
            Py_ssize_t tail = tail_at[m + 1] - tail_at[m];
            PyObject *text = PyUnicode_DecodeASCII(l->key, l->key_len, NULL);
            if (text == NULL || buf_reserve(&rows, 2 + head + tail + 12)) {
                Py_XDECREF(text);
                Py_CLEAR(latest_keys);
                break;
            }
            PyList_SET_ITEM(latest_keys, e, text);
            char *at = rows.data + rows.len;
            put_be16(at, (uint16_t)(spec->n + 1));
            memcpy(at + 2, out + row_at[m], (size_t)head);
            memcpy(at + 2 + head, tails.data + tail_at[m], (size_t)tail);
            put_be32(at + 2 + head + tail, 8);
            put_be64(at + 2 + head + tail + 4, (uint64_t)l->first_time);
            rows.len += 2 + head + tail + 12;
        }
        if (latest_keys != NULL && _PyBytes_Resize(&table, table_len) == 0)
            result = Py_BuildValue("(Oy#Ny#)", table, rows.data ? rows.data : "", rows.len, latest_keys,
                                   (const char *)times, n * (Py_ssize_t)sizeof(int64_t));
        else
            Py_XDECREF(latest_keys);
        PyMem_Free(rows.data);
    }
done:
    Py_XDECREF(table);
    PyMem_Free(slots);
    PyMem_Free(row_at);
    PyMem_Free(tail_at);
    PyMem_Free(times);
    PyMem_Free(latest);
    PyMem_Free(index);
    PyMem_Free(tails.data);
    if (declined && !PyErr_Occurred())
        Py_RETURN_NONE;
    return result;
}

static PyMethodDef methods[] = {
    {"compile", fc_compile, METH_VARARGS, "compile(columns, width, key_column, time_column) -> spec"},
    {"encode", fc_encode, METH_VARARGS,
     "encode(spec, values, keys, lo_us, hi_us, max_len) -> (table_rows, latest_rows, latest_keys, times) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcopy",
                                    "JSON messages straight into binary COPY rows (see shared/fastcopy.py).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastcopy(void) { return PyModule_Create(&module); }
