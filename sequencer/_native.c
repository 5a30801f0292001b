/* sequencer._native: MonotonicIds and EpochSequencer in C, for the writers' hot path.
 *
 * The same semantics as sequencer/_ids.py and sequencer/_epochs.py (the reference, which
 * holds the transition table as data); tests/sequencer/test_native.py holds the two equal
 * on random histories. Still sans-IO: the clock comes in as a callable (ids) or as an
 * argument (the sequencer); nothing here reads one itself.
 *
 * Thread safety: every call runs with the GIL held and calls no Python code between
 * reading and writing its state (the clock is read first), so each call is atomic with
 * respect to other Python threads; the agent still serialises sequencer calls under its
 * lock, as for the pure-Python version. Integers are 64-bit here: an id outside
 * [0, 2**64) or a time or count outside int64 raises OverflowError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CLEARED (~(uint64_t)0x7F)
#define HALF ((uint64_t)1 << 63)
#define NUMERATOR ((__int128)1 << 23)  /* 2**32 / 10**9 == 2**23 / 5**9 */
#define DENOMINATOR ((__int128)1953125)

/* Bound once by sequencer._accel: the record types, the error and the state names. */
static PyObject *BatchTicket_type, *EpochClosed_type, *SequencerError, *QUIESCENT, *TWO;

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *ticket, *closed, *error, *quiescent, *two;
    if (!PyArg_ParseTuple(args, "O!O!OUU", &PyType_Type, &ticket, &PyType_Type, &closed,
                          &error, &quiescent, &two))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)ticket, &PyTuple_Type)
        || !PyType_IsSubtype((PyTypeObject *)closed, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "BatchTicket and EpochClosed must be tuple types");
        return NULL;
    }
    Py_XSETREF(BatchTicket_type, Py_NewRef(ticket));
    Py_XSETREF(EpochClosed_type, Py_NewRef(closed));
    Py_XSETREF(SequencerError, Py_NewRef(error));
    Py_XSETREF(QUIESCENT, Py_NewRef(quiescent));
    Py_XSETREF(TWO, Py_NewRef(two));
    Py_RETURN_NONE;
}

/* A named tuple of `type` (a tuple subclass without a __dict__), its items stolen. */
static PyObject *
make_tuple(PyObject *type, Py_ssize_t n, PyObject **items)
{
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (items[i] == NULL)
            goto fail;
    if (type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sequencer._native is not bound");
        goto fail;
    }
    result = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, n);
    if (result == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(result, i, items[i]);
    /* Only ints and bools inside: no cycle can pass through it. CPython's collector
     * would untrack such a tuple at its first pass; untracking now spares it that. */
    if (PyObject_GC_IsTracked(result))
        PyObject_GC_UnTrack(result);
    return result;
fail:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(items[i]);
    return NULL;
}

static int
as_u64(PyObject *value, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int
as_i64(PyObject *value, int64_t *out)
{
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* An object made by tp_new whose tp_init never ran (`T.__new__(T)`), or failed, has
 * NULL fields: every method, call and attribute of the types below checks that first
 * and raises this instead of reading them. Returns NULL for the caller to return. */
static PyObject *
not_initialised(PyObject *self)
{
    const char *name = strrchr(Py_TYPE(self)->tp_name, '.');
    name = name ? name + 1 : Py_TYPE(self)->tp_name;
    PyErr_Format(PyExc_RuntimeError, "%s was not initialised (made by __new__ alone, or "
                 "its __init__ failed): create it by calling %s(...)", name, name);
    return NULL;
}

/* ---- MonotonicIds ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *boottime;     /* callable returning nanoseconds */
    PyObject *offset;       /* realtime - boottime at construction (a Python int) */
    int64_t offset64;
    int offset_fits;        /* offset64 is exact */
    uint64_t last;          /* the last id issued; 0 = none yet */
} Ids;

#define IDS_READY(self) ((self)->boottime != NULL && (self)->offset != NULL)

static int
Ids_init(Ids *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"boottime_ns", "realtime_ns", NULL};
    PyObject *boottime, *realtime, *real = NULL, *boot = NULL, *offset;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kwlist, &boottime, &realtime))
        return -1;
    /* As the reference: realtime first, then boottime. */
    real = PyObject_CallNoArgs(realtime);
    if (real == NULL)
        return -1;
    boot = PyObject_CallNoArgs(boottime);
    if (boot == NULL) {
        Py_DECREF(real);
        return -1;
    }
    offset = PyNumber_Subtract(real, boot);
    Py_DECREF(real);
    Py_DECREF(boot);
    if (offset == NULL)
        return -1;
    int overflow = 0;
    long long v = PyLong_Check(offset) ? PyLong_AsLongLongAndOverflow(offset, &overflow) : 0;
    if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(offset);
        return -1;
    }
    self->offset_fits = PyLong_Check(offset) && !overflow;
    self->offset64 = (int64_t)v;
    Py_XSETREF(self->offset, offset);
    Py_XSETREF(self->boottime, Py_NewRef(boottime));
    self->last = 0;
    return 0;
}

static int
Ids_traverse(Ids *self, visitproc visit, void *arg)
{
    Py_VISIT(self->boottime);
    Py_VISIT(self->offset);
    return 0;
}

static int
Ids_clear(Ids *self)
{
    Py_CLEAR(self->boottime);
    Py_CLEAR(self->offset);
    return 0;
}

static void
Ids_dealloc(Ids *self)
{
    PyObject_GC_UnTrack(self);
    Ids_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The candidate id for boot time `now`: ((now + offset) * 2**23 // 5**9) & CLEARED,
 * with Python's floor division and unbounded integers. */
static int
candidate_of(Ids *self, PyObject *now, uint64_t *out)
{
    int overflow = 0;
    long long t = PyLong_Check(now) ? PyLong_AsLongLongAndOverflow(now, &overflow) : 0;
    if (t == -1 && PyErr_Occurred())
        return -1;
    if (PyLong_Check(now) && !overflow && self->offset_fits) {
        __int128 x = ((__int128)t + self->offset64) * NUMERATOR;
        __int128 q = x / DENOMINATOR;
        if (x % DENOMINATOR != 0 && x < 0)
            q -= 1;  /* floor, as Python's // */
        *out = (uint64_t)q & CLEARED;  /* two's complement: Python's & on negatives */
        return 0;
    }
    /* Outside 64 bits: the same arithmetic on Python integers. */
    PyObject *num = PyLong_FromLong(1L << 23), *den = PyLong_FromLong(1953125L);
    PyObject *mask = PyLong_FromUnsignedLongLong(CLEARED);
    PyObject *sum = NULL, *prod = NULL, *quot = NULL, *masked = NULL;
    int rc = -1;
    if (num && den && mask && (sum = PyNumber_Add(now, self->offset))
        && (prod = PyNumber_Multiply(sum, num)) && (quot = PyNumber_FloorDivide(prod, den))
        && (masked = PyNumber_And(quot, mask)))
        rc = as_u64(masked, out);
    Py_XDECREF(num);
    Py_XDECREF(den);
    Py_XDECREF(mask);
    Py_XDECREF(sum);
    Py_XDECREF(prod);
    Py_XDECREF(quot);
    Py_XDECREF(masked);
    return rc;
}

static PyObject *
Ids_next(Ids *self, PyObject *Py_UNUSED(ignored))
{
    if (!IDS_READY(self))
        return not_initialised((PyObject *)self);
    PyObject *now = PyObject_CallNoArgs(self->boottime);
    if (now == NULL)
        return NULL;
    uint64_t candidate;
    int rc = candidate_of(self, now, &candidate);
    Py_DECREF(now);
    if (rc < 0)
        return NULL;
    /* The compare-and-swap: no Python code runs from here on, so the GIL makes it one
     * atomic step (the reference takes a lock for the same span). */
    uint64_t last = self->last, issued;
    if (last < candidate && candidate - last < HALF) {
        issued = candidate;
    } else if (!last || (((candidate - last) != 0) && (candidate - last) < HALF)) {
        issued = candidate ? candidate : 1;
    } else {
        issued = last + 1;
        if (!issued)
            issued = 1;
    }
    self->last = issued;
    return PyLong_FromUnsignedLongLong(issued);
}

static PyObject *
Ids_call(Ids *self, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "MonotonicIds() takes no arguments");
        return NULL;
    }
    return Ids_next(self, NULL);
}

static PyObject *
Ids_last(Ids *self, PyObject *Py_UNUSED(ignored))
{
    if (!IDS_READY(self))
        return not_initialised((PyObject *)self);
    return PyLong_FromUnsignedLongLong(self->last);
}

static PyObject *
Ids_get_offset(Ids *self, void *closure)
{
    if (!IDS_READY(self))
        return not_initialised((PyObject *)self);
    return Py_NewRef(self->offset);
}

static PyMethodDef Ids_methods[] = {
    {"next", (PyCFunction)Ids_next, METH_NOARGS,
     "Return an id strictly greater (modulo 2**64) than every id issued before."},
    {"last", (PyCFunction)Ids_last, METH_NOARGS, "The last id issued (0 before the first)."},
    {NULL}
};

static PyGetSetDef Ids_getset[] = {
    {"offset_ns", (getter)Ids_get_offset, NULL, "realtime - boottime, taken once", NULL},
    {NULL}
};

static PyTypeObject IdsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sequencer._native.MonotonicIds",
    .tp_doc = "sequencer.MonotonicIds in C: the same ids from the same clock.",
    .tp_basicsize = sizeof(Ids),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ids_init,
    .tp_dealloc = (destructor)Ids_dealloc,
    .tp_traverse = (traverseproc)Ids_traverse,
    .tp_clear = (inquiry)Ids_clear,
    .tp_call = (ternaryfunc)Ids_call,
    .tp_methods = Ids_methods,
    .tp_getset = Ids_getset,
};

/* ---- EpochSequencer ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *domain_id;
    int two;                          /* state: 0 QUIESCENT, 1 TWO */
    int has_interval;
    int64_t max_interval;
    int64_t last_quiescence_ns;
    int64_t older_seq, newer_seq, next_seq;
    uint64_t older_begin, older_end, last_end;
    int64_t older_open, older_count, newer_open, newer_count;
} Seq;

static int
Seq_init(Seq *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"domain_id", "now_ns", "max_quiescence_interval_ns", NULL};
    PyObject *domain, *now = NULL, *interval = Py_None;
    int64_t now_ns, max_interval = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OO", kwlist, &domain, &now, &interval))
        return -1;
    if (now == NULL) {
        PyErr_SetString(PyExc_TypeError, "EpochSequencer() missing the keyword argument now_ns");
        return -1;
    }
    /* Every argument read before anything is set: a failed __init__ changes nothing. */
    if (as_i64(now, &now_ns) < 0
        || (interval != Py_None && as_i64(interval, &max_interval) < 0))
        return -1;
    self->last_quiescence_ns = now_ns;
    self->has_interval = interval != Py_None;
    self->max_interval = max_interval;
    self->two = 0;
    self->older_seq = self->newer_seq = 0;
    self->older_begin = self->older_end = 0;
    self->older_open = self->older_count = self->newer_open = self->newer_count = 0;
    self->next_seq = 1;
    self->last_end = 0;
    Py_XSETREF(self->domain_id, Py_NewRef(domain));  /* set last: the object is ready */
    return 0;
}

/* domain_id is set by a successful __init__ only (its last step). */
#define SEQ_READY(self) ((self)->domain_id != NULL)
#define SEQ_CHECK(self) if (!SEQ_READY(self)) return not_initialised((PyObject *)(self))

static int
Seq_traverse(Seq *self, visitproc visit, void *arg)
{
    Py_VISIT(self->domain_id);
    return 0;
}

static int
Seq_clear(Seq *self)
{
    Py_CLEAR(self->domain_id);
    return 0;
}

static void
Seq_dealloc(Seq *self)
{
    PyObject_GC_UnTrack(self);
    Seq_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
interval_exceeded(Seq *self, int64_t now)
{
    /* now - last >= interval, without overflowing int64 */
    return self->has_interval
        && (__int128)now - self->last_quiescence_ns >= self->max_interval;
}

static PyObject *
ticket(uint64_t batch_id, int64_t seq)
{
    PyObject *items[2] = {PyLong_FromUnsignedLongLong(batch_id), PyLong_FromLongLong(seq)};
    return make_tuple(BatchTicket_type, 2, items);
}

/* The open transition: 1 with *epoch_seq set, or 0 when forced quiescence refuses. */
static int
seq_open(Seq *self, uint64_t batch_id, int64_t now, int64_t *epoch_seq)
{
    if (!self->two) {
        /* QUIESCENT, open: start. The new epoch ends right after the new id. */
        int64_t seq = self->next_seq;
        uint64_t after = batch_id + 1;
        self->next_seq = seq + 2;
        self->older_seq = seq;
        self->older_begin = self->last_end;
        self->older_end = after ? after : 1;
        self->older_open = 1;
        self->older_count = 0;
        self->newer_seq = seq + 1;
        self->newer_open = self->newer_count = 0;
        self->two = 1;
        *epoch_seq = seq;
        return 1;
    }
    if (interval_exceeded(self, now))
        return 0;  /* TWO, open, interval exceeded: refuse */
    self->newer_open += 1;  /* TWO, open: join the newer */
    *epoch_seq = self->newer_seq;
    return 1;
}

static PyObject *
Seq_open_batch(Seq *self, PyObject *const *args, Py_ssize_t nargs)
{
    SEQ_CHECK(self);
    uint64_t batch_id;
    int64_t now, seq;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "open_batch(batch_id, now_ns)");
        return NULL;
    }
    if (as_u64(args[0], &batch_id) < 0 || as_i64(args[1], &now) < 0)
        return NULL;
    if (!seq_open(self, batch_id, now, &seq))
        Py_RETURN_NONE;
    return ticket(batch_id, seq);
}

static PyObject *
closed_record(int64_t seq, uint64_t begin, uint64_t end, int64_t count, int quiescent)
{
    PyObject *items[5] = {PyLong_FromLongLong(seq), PyLong_FromUnsignedLongLong(begin),
                          PyLong_FromUnsignedLongLong(end), PyLong_FromLongLong(count),
                          Py_NewRef(quiescent ? Py_True : Py_False)};
    return make_tuple(EpochClosed_type, 5, items);
}

/* The close transitions: the list of epochs closed (a new reference), or NULL with
 * SequencerError set. `batch_obj` (the batch id) only names the batch in errors. */
static PyObject *
seq_close(Seq *self, PyObject *batch_obj, int64_t epoch_seq, int64_t now, uint64_t fresh_id,
          int64_t event_count)
{
    if (!self->two) {
        PyErr_Format(SequencerError, "batch %S closed while the sequencer is quiescent",
                     batch_obj);
        return NULL;
    }
    if (epoch_seq == self->older_seq) {
        if (self->older_open <= 0)
            return PyErr_Format(SequencerError, "epoch %lld has no open batch to close",
                                (long long)epoch_seq);
        self->older_open -= 1;
        self->older_count += event_count;
    } else if (epoch_seq == self->newer_seq) {
        if (self->newer_open <= 0)
            return PyErr_Format(SequencerError, "epoch %lld has no open batch to close",
                                (long long)epoch_seq);
        self->newer_open -= 1;
        self->newer_count += event_count;
    } else {
        PyErr_Format(SequencerError,
                     "batch %S of epoch %lld closed, but the open epochs are %lld and "
                     "%lld (closed twice?)", batch_obj, (long long)epoch_seq,
                     (long long)self->older_seq, (long long)self->newer_seq);
        return NULL;
    }
    if (self->older_open)  /* TWO, close, older still busy: uncount */
        return PyList_New(0);
    if (self->newer_open) {
        /* TWO, close, older drained, newer busy: advance. */
        PyObject *older = closed_record(self->older_seq, self->older_begin, self->older_end,
                                        self->older_count, 0);
        if (older == NULL)
            return NULL;
        PyObject *list = PyList_New(1);
        if (list == NULL) {
            Py_DECREF(older);
            return NULL;
        }
        PyList_SET_ITEM(list, 0, older);
        self->older_seq = self->newer_seq;
        self->older_begin = self->older_end;
        self->older_end = fresh_id;
        self->older_open = self->newer_open;
        self->older_count = self->newer_count;
        self->newer_seq = self->next_seq;
        self->next_seq += 1;
        self->newer_open = self->newer_count = 0;
        return list;
    }
    /* TWO, close, both drained: quiesce (the newer closes at once as the marker). */
    uint64_t newer_begin = self->older_end;
    PyObject *older = closed_record(self->older_seq, self->older_begin, newer_begin,
                                    self->older_count, 0);
    if (older == NULL)
        return NULL;
    PyObject *marker = closed_record(self->newer_seq, newer_begin, fresh_id,
                                     self->newer_count, 1);
    if (marker == NULL) {
        Py_DECREF(older);
        return NULL;
    }
    PyObject *list = PyList_New(2);
    if (list == NULL) {
        Py_DECREF(older);
        Py_DECREF(marker);
        return NULL;
    }
    PyList_SET_ITEM(list, 0, older);
    PyList_SET_ITEM(list, 1, marker);
    self->older_open = self->newer_open = 0;
    self->last_end = fresh_id;
    self->last_quiescence_ns = now;
    self->two = 0;
    return list;
}

static PyObject *
Seq_close_batch(Seq *self, PyObject *args, PyObject *kwds)
{
    SEQ_CHECK(self);
    static char *kwlist[] = {"ticket", "now_ns", "fresh_id", "event_count", NULL};
    PyObject *tick, *now_obj, *fresh_obj, *count_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|O", kwlist, &tick, &now_obj,
                                     &fresh_obj, &count_obj))
        return NULL;
    int64_t now, event_count = 0, epoch_seq;
    uint64_t fresh_id;
    if (as_i64(now_obj, &now) < 0 || as_u64(fresh_obj, &fresh_id) < 0
        || (count_obj && as_i64(count_obj, &event_count) < 0))
        return NULL;
    PyObject *seq_obj = PyObject_GetAttrString(tick, "epoch_seq");
    if (seq_obj == NULL)
        return NULL;
    int rc = as_i64(seq_obj, &epoch_seq);
    Py_DECREF(seq_obj);
    if (rc < 0)
        return NULL;
    if (!self->two || (epoch_seq != self->older_seq && epoch_seq != self->newer_seq)) {
        PyObject *id = PyObject_GetAttrString(tick, "batch_id");  /* for the error only */
        if (id == NULL)
            return NULL;
        PyObject *result = seq_close(self, id, epoch_seq, now, fresh_id, event_count);
        Py_DECREF(id);
        return result;
    }
    return seq_close(self, Py_None, epoch_seq, now, fresh_id, event_count);
}

static PyObject *
Seq_holding_back(Seq *self, PyObject *now_obj)
{
    SEQ_CHECK(self);
    int64_t now;
    if (as_i64(now_obj, &now) < 0)
        return NULL;
    return PyBool_FromLong(self->two && interval_exceeded(self, now));
}

static PyObject *
Seq_open_batches(Seq *self, PyObject *Py_UNUSED(ignored))
{
    SEQ_CHECK(self);
    return PyLong_FromLongLong(self->older_open + self->newer_open);
}

static PyObject *
Seq_open_epochs(Seq *self, PyObject *Py_UNUSED(ignored))
{
    SEQ_CHECK(self);
    if (!self->two)
        return PyTuple_New(0);
    return Py_BuildValue("(LL)", (long long)self->older_seq, (long long)self->newer_seq);
}

static PyObject *
Seq_get_quiescent(Seq *self, void *closure)
{
    SEQ_CHECK(self);
    return PyBool_FromLong(!self->two);
}

static PyObject *
Seq_get_state(Seq *self, void *closure)
{
    SEQ_CHECK(self);
    PyObject *state = self->two ? TWO : QUIESCENT;
    if (state == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sequencer._native is not bound");
        return NULL;
    }
    return Py_NewRef(state);
}

static PyObject *
Seq_get_last_quiescence(Seq *self, void *closure)
{
    SEQ_CHECK(self);
    return PyLong_FromLongLong(self->last_quiescence_ns);
}

static PyObject *
Seq_get_domain(Seq *self, void *closure)
{
    SEQ_CHECK(self);
    return Py_NewRef(self->domain_id);
}

static PyMethodDef Seq_methods[] = {
    {"open_batch", (PyCFunction)(void (*)(void))Seq_open_batch, METH_FASTCALL,
     "Open write batch batch_id (a fresh id), or return None while forced quiescence "
     "holds it back."},
    {"close_batch", (PyCFunction)(void (*)(void))Seq_close_batch,
     METH_VARARGS | METH_KEYWORDS, "Close a batch; return the epochs closed."},
    {"holding_back", (PyCFunction)Seq_holding_back, METH_O,
     "True if forced quiescence is in force."},
    {"open_batches", (PyCFunction)Seq_open_batches, METH_NOARGS,
     "How many batches are in flight."},
    {"open_epochs", (PyCFunction)Seq_open_epochs, METH_NOARGS,
     "The sequence numbers of the epochs open now."},
    {NULL}
};

static PyGetSetDef Seq_getset[] = {
    {"quiescent", (getter)Seq_get_quiescent, NULL, "No batch in flight, no epoch open.", NULL},
    {"state", (getter)Seq_get_state, NULL, "QUIESCENT or TWO", NULL},
    {"last_quiescence_ns", (getter)Seq_get_last_quiescence, NULL, NULL, NULL},
    {"domain_id", (getter)Seq_get_domain, NULL, NULL, NULL},
    {NULL}
};

static PyTypeObject SeqType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sequencer._native.EpochSequencer",
    .tp_doc = "sequencer.EpochSequencer in C: the same transitions, the same records.",
    .tp_basicsize = sizeof(Seq),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Seq_init,
    .tp_dealloc = (destructor)Seq_dealloc,
    .tp_traverse = (traverseproc)Seq_traverse,
    .tp_clear = (inquiry)Seq_clear,
    .tp_methods = Seq_methods,
    .tp_getset = Seq_getset,
};


/* ---- UnscopedWriter: an Agent's write outside any batch, in one call ------------------- */

/* `Agent._set_unscoped` (agent/_agent.py, the reference and the pure-Python fallback) in
 * C: under the agent's lock open the automatic batch (a fresh id, this sequencer), call
 * the store's exchange without the lock, then under the lock again close the batch, hand
 * its one event and the epochs it closed to the shipper's queue, count it, and note a
 * quiescence. Everything that is not the common case calls the agent's own Python
 * methods, under the lock as the reference does: the general path when the agent is
 * closing, holding batches back, its shipper failed or its queue is over its bound
 * (`fallback`); forced quiescence (`_wait_for_ticket`); a store error (`_finish`); a
 * woken or backed-up shipper (`_after_put`); a quiescence someone waits for or watches
 * (`_quiesced`). tests/agent/test_unscoped_native.py holds it to the reference's logs. */

static PyObject *S_closing, *S_hold, *S_error, *S_idle, *S_after_put, *S_raise_if_failed,
    *S_on_quiescence, *S_sleepers, *S_async_waiters, *S_quiesced, *S_wait_for_ticket,
    *S_finish, *S_last_point, *S_batches_closed, *S_batches, *S_events, *S_epochs,
    *S_quiescence_points, *S_exchange, *S_put_wait, *S_append, *S_store;

typedef struct {
    PyObject_HEAD
    Seq *seq;
    PyObject *agent, *shipper, *stats, *items, *acquire, *release, *next_id,
        *clock, *fallback;
    Py_ssize_t max_queue;
    vectorcallfunc vectorcall;
} Writer;

static int
intern_names(void)
{
#define NAME(var, text) if (var == NULL && (var = PyUnicode_InternFromString(text)) == NULL) return -1;
    NAME(S_closing, "_closing") NAME(S_hold, "_hold") NAME(S_error, "error")
    NAME(S_idle, "_idle") NAME(S_after_put, "_after_put")
    NAME(S_raise_if_failed, "_raise_if_failed") NAME(S_on_quiescence, "_on_quiescence")
    NAME(S_sleepers, "_sleepers") NAME(S_async_waiters, "_async_waiters")
    NAME(S_quiesced, "_quiesced") NAME(S_wait_for_ticket, "_wait_for_ticket")
    NAME(S_finish, "_finish") NAME(S_last_point, "_last_point")
    NAME(S_batches_closed, "_batches_closed") NAME(S_batches, "batches")
    NAME(S_events, "events") NAME(S_epochs, "epochs")
    NAME(S_quiescence_points, "quiescence_points") NAME(S_exchange, "exchange")
    NAME(S_put_wait, "put_wait") NAME(S_append, "append") NAME(S_store, "store")
#undef NAME
    return 0;
}

static int
Writer_init(Writer *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"agent", "sequencer", "shipper", "items", "lock", "next_id",
                             "clock", "fallback", "max_queue", NULL};
    PyObject *agent, *seq, *shipper, *items, *lock, *next_id, *clock, *fallback;
    Py_ssize_t max_queue;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OOOOOOn", kwlist, &agent, &SeqType,
                                     &seq, &shipper, &items, &lock, &next_id, &clock,
                                     &fallback, &max_queue))
        return -1;
    if (!SEQ_READY((Seq *)seq)) {  /* the writer drives its state directly */
        not_initialised(seq);
        return -1;
    }
    if (intern_names() < 0)
        return -1;
    PyObject *stats = PyObject_GetAttrString(agent, "stats");
    if (stats == NULL)
        return -1;
    if (!PyDict_Check(stats)) {
        Py_DECREF(stats);
        PyErr_SetString(PyExc_TypeError, "agent.stats must be a dict");
        return -1;
    }
    PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
    PyObject *release = acquire ? PyObject_GetAttrString(lock, "release") : NULL;
    if (release == NULL) {
        Py_DECREF(stats);
        Py_XDECREF(acquire);
        return -1;
    }
    Py_XSETREF(self->seq, (Seq *)Py_NewRef(seq));
    Py_XSETREF(self->agent, Py_NewRef(agent));
    Py_XSETREF(self->shipper, Py_NewRef(shipper));
    Py_XSETREF(self->stats, stats);
    Py_XSETREF(self->items, Py_NewRef(items));
    Py_XSETREF(self->acquire, acquire);
    Py_XSETREF(self->release, release);
    Py_XSETREF(self->next_id, Py_NewRef(next_id));
    Py_XSETREF(self->clock, Py_NewRef(clock));
    Py_XSETREF(self->fallback, Py_NewRef(fallback));
    self->max_queue = max_queue;
    return 0;
}

/* Every field a call uses: all set by a successful __init__, all cleared by tp_clear. */
static int
writer_ready(Writer *w)
{
    return w->seq && w->agent && w->shipper && w->stats && w->items && w->acquire
        && w->release && w->next_id && w->clock && w->fallback;
}

static int
Writer_traverse(Writer *self, visitproc visit, void *arg)
{
    Py_VISIT(self->seq);
    Py_VISIT(self->agent);
    Py_VISIT(self->shipper);
    Py_VISIT(self->stats);
    Py_VISIT(self->items);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->next_id);
    Py_VISIT(self->clock);
    Py_VISIT(self->fallback);
    return 0;
}

static int
Writer_clear(Writer *self)
{
    Py_CLEAR(self->seq);
    Py_CLEAR(self->agent);
    Py_CLEAR(self->shipper);
    Py_CLEAR(self->stats);
    Py_CLEAR(self->items);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->next_id);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
Writer_dealloc(Writer *self)
{
    PyObject_GC_UnTrack(self);
    Writer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Call `fn()` and drop its result: 0, or -1 with the error set. */
static int
call0(PyObject *fn)
{
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* `obj` (new, or NULL) untracked by the collector: the writer's event tuples, lists and
 * queue items only ever hold values, ints and each other, so no cycle can pass through
 * them, and each write would otherwise add five objects to every collection until the
 * shipper drops them (the GC was a third of a write's cost). */
static PyObject *
untracked(PyObject *obj)
{
    if (obj != NULL && PyObject_GC_IsTracked(obj))
        PyObject_GC_UnTrack(obj);
    return obj;
}

/* Release the lock keeping the error in flight (if any). */
static void
unlock(Writer *w)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (call0(w->release) < 0)
        PyErr_WriteUnraisable(w->release);  /* never: the lock is ours */
    PyErr_Restore(type, value, tb);
}

/* obj.name is truthy: 1, 0, or -1 with the error set. */
static int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* stats[key] += n */
static int
bump(PyObject *stats, PyObject *key, Py_ssize_t n)
{
    PyObject *old = PyDict_GetItemWithError(stats, key);  /* borrowed */
    if (old == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    PyObject *delta = PyLong_FromSsize_t(n);
    PyObject *sum = delta ? PyNumber_Add(old, delta) : NULL;
    Py_XDECREF(delta);
    if (sum == NULL)
        return -1;
    int rc = PyDict_SetItem(stats, key, sum);
    Py_DECREF(sum);
    return rc;
}

/* obj.name += 1 */
static int
bump_attr(PyObject *obj, PyObject *name)
{
    PyObject *old = PyObject_GetAttr(obj, name);
    if (old == NULL)
        return -1;
    PyObject *one = PyLong_FromLong(1);
    PyObject *sum = one ? PyNumber_Add(old, one) : NULL;
    Py_XDECREF(one);
    Py_DECREF(old);
    if (sum == NULL)
        return -1;
    int rc = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return rc;
}

/* A fresh id from the agent's id source, as an object and as a uint64. */
static PyObject *
fresh_id(Writer *w, uint64_t *out)
{
    PyObject *id = PyObject_CallNoArgs(w->next_id);
    if (id != NULL && as_u64(id, out) < 0)
        Py_CLEAR(id);
    return id;
}

static int
read_clock(Writer *w, int64_t *now)
{
    PyObject *t = PyObject_CallNoArgs(w->clock);
    if (t == NULL)
        return -1;
    int rc = as_i64(t, now);
    Py_DECREF(t);
    return rc;
}

/* Under the lock: the gate of the fast path (agent._set_unscoped's first test). */
static int
needs_general_path(Writer *w)
{
    int r = attr_true(w->agent, S_closing);
    if (r)
        return r;
    if ((r = attr_true(w->agent, S_hold)))
        return r;
    PyObject *error = PyObject_GetAttr(w->shipper, S_error);
    if (error == NULL)
        return -1;
    r = error != Py_None;
    Py_DECREF(error);
    if (r)
        return 1;
    Py_ssize_t n = PyObject_Length(w->items);
    return n < 0 ? -1 : n > w->max_queue;
}

/* Under the lock: the sequencer just quiesced at `marker` (agent._quiesced, whose common
 * case, nobody watching or waiting, is done here). */
static int
quiesced(Writer *w, PyObject *marker)
{
    PyObject *watcher = PyObject_GetAttr(w->agent, S_on_quiescence);
    if (watcher == NULL)
        return -1;
    int watched = watcher != Py_None;
    Py_DECREF(watcher);
    int sleepers = watched ? 1 : attr_true(w->agent, S_sleepers);
    int waiters = sleepers ? 1 : attr_true(w->agent, S_async_waiters);
    if (sleepers < 0 || waiters < 0)
        return -1;
    if (watched || sleepers || waiters) {
        PyObject *r = PyObject_CallMethodOneArg(w->agent, S_quiesced, marker);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *point = untracked(PyTuple_Pack(2, PyTuple_GET_ITEM(marker, 0),
                                             PyTuple_GET_ITEM(marker, 2)));
    if (point == NULL)
        return -1;
    int rc = PyObject_SetAttr(w->agent, S_last_point, point);
    Py_DECREF(point);
    return rc < 0 ? -1 : bump(w->stats, S_quiescence_points, 1);
}

/* Under the lock: close the batch whose last segment is `events` (a list) after
 * `seq_start` events shipped before, queue it for the shipper with the epochs closed,
 * count it (agent._finish). Steals nothing. */
static int
finish(Writer *w, PyObject *batch_obj, PyObject *seq_obj, int64_t epoch_seq,
       PyObject *start_obj, int64_t seq_start, PyObject *events)
{
    int64_t now;
    uint64_t fresh;
    Py_ssize_t n_events = PyList_GET_SIZE(events);
    if (seq_start < 0 || seq_start > INT64_MAX - n_events) {  /* before an id is spent */
        PyErr_Format(PyExc_OverflowError, "a batch's event count %lld + %zd is out of "
                     "range", (long long)seq_start, n_events);
        return -1;
    }
    if (read_clock(w, &now) < 0)
        return -1;
    PyObject *fresh_obj = fresh_id(w, &fresh);
    if (fresh_obj == NULL)
        return -1;
    Py_DECREF(fresh_obj);
    int64_t count = seq_start + n_events;
    PyObject *closed = seq_close(w->seq, batch_obj, epoch_seq, now, fresh, count);
    if (closed == NULL)
        return -1;
    int rc = -1;
    PyObject *item = NULL, *error = PyObject_GetAttr(w->shipper, S_error);
    if (error == NULL)
        goto done;
    if (error != Py_None) {  /* Shipper.put raises ShippingFailed */
        Py_DECREF(error);
        PyObject *r = PyObject_CallMethodNoArgs(w->shipper, S_raise_if_failed);
        Py_XDECREF(r);
        if (r != NULL)
            PyErr_SetString(PyExc_RuntimeError, "the shipper failed but did not raise");
        goto done;
    }
    Py_DECREF(error);
    item = untracked(PyTuple_Pack(5, batch_obj, seq_obj, start_obj, events, untracked(closed)));
    PyObject *appended = item ? PyObject_CallMethodOneArg(w->items, S_append, item) : NULL;
    if (appended == NULL)
        goto done;
    Py_DECREF(appended);
    int idle = attr_true(w->shipper, S_idle);
    Py_ssize_t queued = PyObject_Length(w->items);
    if (idle < 0 || queued < 0)
        goto done;
    if (idle || queued > w->max_queue) {  /* wake the shipper, or wait for room */
        PyObject *r = PyObject_CallMethodNoArgs(w->shipper, S_after_put);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    if (bump(w->stats, S_events, count) < 0 || bump_attr(w->agent, S_batches_closed) < 0)
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(closed);
    if (n) {
        if (bump(w->stats, S_epochs, n) < 0)
            goto done;
        PyObject *last = PyList_GET_ITEM(closed, n - 1);
        if (PyTuple_GET_ITEM(last, 4) == Py_True && quiesced(w, last) < 0)
            goto done;
    }
    rc = 0;
done:
    Py_XDECREF(item);
    Py_DECREF(closed);
    return rc;
}

/* Under the lock, past needs_general_path: open a batch (agent._open's ticket, and
 * its count), its id and epoch set; 0, or -1 with the error set and nothing set. */
static int
open_locked(Writer *w, PyObject **batch_out, PyObject **seq_out, int64_t *epoch_seq)
{
    PyObject *batch_obj, *seq_obj = NULL;
    uint64_t batch_id;
    int64_t now;
    /* The id first, then the clock: the order of the reference's open_batch arguments. */
    if ((batch_obj = fresh_id(w, &batch_id)) == NULL || read_clock(w, &now) < 0)
        goto fail;
    if (!seq_open(w->seq, batch_id, now, epoch_seq)) {  /* forced quiescence: wait */
        Py_CLEAR(batch_obj);
        PyObject *tick = PyObject_CallMethodNoArgs(w->agent, S_wait_for_ticket);
        if (tick == NULL)
            goto fail;
        if (!PyTuple_Check(tick) || PyTuple_GET_SIZE(tick) != 2) {  /* an override's bug */
            PyErr_Format(PyExc_TypeError, "_wait_for_ticket returned %R, not a "
                         "(batch id, epoch) ticket", tick);
            Py_DECREF(tick);
            goto fail;
        }
        batch_obj = Py_NewRef(PyTuple_GET_ITEM(tick, 0));
        seq_obj = Py_NewRef(PyTuple_GET_ITEM(tick, 1));
        Py_DECREF(tick);
        if (as_i64(seq_obj, epoch_seq) < 0)
            goto fail;
    } else if ((seq_obj = PyLong_FromLongLong(*epoch_seq)) == NULL) {
        goto fail;
    }
    if (bump(w->stats, S_batches, 1) < 0)
        goto fail;  /* (never: a dict of ints) */
    *batch_out = batch_obj;
    *seq_out = seq_obj;
    return 0;
fail:
    Py_XDECREF(batch_obj);
    Py_XDECREF(seq_obj);
    return -1;
}

static PyObject *
Writer_call(Writer *w, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!writer_ready(w))
        return not_initialised((PyObject *)w);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "UnscopedWriter(table, row, column, value)");
        return NULL;
    }
    if (call0(w->acquire) < 0)
        return NULL;
    int general = needs_general_path(w);
    if (general) {  /* the rare cases (or an error): the general path waits or raises */
        unlock(w);
        return general < 0 ? NULL : PyObject_Vectorcall(w->fallback, args, nargs, NULL);
    }
    PyObject *batch_obj = NULL, *seq_obj = NULL, *result = NULL;
    int64_t epoch_seq;
    if (open_locked(w, &batch_obj, &seq_obj, &epoch_seq) < 0)
        goto unlock_fail;
    unlock(w);
    /* agent.store read at each write, as the reference does */
    PyObject *store = PyObject_GetAttr(w->agent, S_store);
    PyObject *call[5] = {store, args[0], args[1], args[2], args[3]};
    PyObject *old = store ? PyObject_VectorcallMethod(S_exchange, call, 5, NULL) : NULL;
    Py_XDECREF(store);
    if (old == NULL) {  /* no event, as when a scoped write raises; then re-raise */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *items[2] = {Py_NewRef(batch_obj), Py_NewRef(seq_obj)};
        PyObject *tick = make_tuple(BatchTicket_type, 2, items);
        PyObject *r = tick ? PyObject_CallMethod(w->agent, "_finish", "OiN", tick, 0,
                                                 PyList_New(0)) : NULL;
        Py_XDECREF(tick);
        if (r == NULL) {
            _PyErr_ChainExceptions(type, value, tb);
        } else {
            Py_DECREF(r);
            PyErr_Restore(type, value, tb);
        }
        goto fail;
    }
    PyObject *event = untracked(PyTuple_Pack(5, args[0], args[1], args[2], old, args[3]));
    PyObject *events = event ? untracked(PyList_New(1)) : NULL;
    if (events == NULL) {
        Py_XDECREF(event);
        Py_DECREF(old);
        goto fail;
    }
    PyList_SET_ITEM(events, 0, event);
    if (call0(w->acquire) < 0) {
        Py_DECREF(events);
        Py_DECREF(old);
        goto fail;
    }
    PyObject *zero = PyLong_FromLong(0);
    int rc = zero ? finish(w, batch_obj, seq_obj, epoch_seq, zero, 0, events) : -1;
    Py_XDECREF(zero);
    unlock(w);
    Py_DECREF(events);
    if (rc < 0)
        Py_DECREF(old);
    else
        result = old;
    goto fail;
unlock_fail:
    unlock(w);
fail:
    Py_XDECREF(batch_obj);
    Py_XDECREF(seq_obj);
    return result;
}

static PyObject *
Writer_tp_call(PyObject *self, PyObject *args, PyObject *kwds)
{
    return PyVectorcall_Call(self, args, kwds);
}

static PyObject *
Writer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *self = PyType_GenericNew(type, args, kwds);
    if (self != NULL)
        *(vectorcallfunc *)((char *)self + offsetof(Writer, vectorcall)) =
            (vectorcallfunc)Writer_call;
    return self;
}

/* open_ticket(): agent._open's ticket in one call (a BatchTicket, counted), or None
 * where agent._open's general path must run (closing, held back, a failed or
 * backed-up shipper); under forced quiescence it waits as agent._open does. */
static PyObject *
Writer_open_ticket(Writer *w, PyObject *Py_UNUSED(ignored))
{
    if (!writer_ready(w))
        return not_initialised((PyObject *)w);
    if (call0(w->acquire) < 0)
        return NULL;
    int general = needs_general_path(w);
    if (general) {
        unlock(w);
        if (general < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *items[2] = {NULL, NULL};
    int64_t epoch_seq;
    int rc = open_locked(w, &items[0], &items[1], &epoch_seq);
    unlock(w);
    return rc < 0 ? NULL : make_tuple(BatchTicket_type, 2, items);
}

/* close_batch(ticket, seq_start, events): agent._finish in one call, for a batch whose
 * last segment is the list `events` after `seq_start` events shipped before. */
static PyObject *
Writer_close_batch(Writer *w, PyObject *const *args, Py_ssize_t nargs)
{
    if (!writer_ready(w))
        return not_initialised((PyObject *)w);
    int64_t seq_start, epoch_seq;
    if (nargs != 3 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 2
        || !PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "close_batch(ticket, seq_start, events: list)");
        return NULL;
    }
    PyObject *batch_obj = PyTuple_GET_ITEM(args[0], 0), *seq_obj = PyTuple_GET_ITEM(args[0], 1);
    if (as_i64(args[1], &seq_start) < 0 || as_i64(seq_obj, &epoch_seq) < 0)
        return NULL;
    if (call0(w->acquire) < 0)
        return NULL;
    int rc = finish(w, batch_obj, seq_obj, epoch_seq, args[1], seq_start, args[2]);
    unlock(w);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Writer_methods[] = {
    {"open_ticket", (PyCFunction)Writer_open_ticket, METH_NOARGS,
     "agent._open's ticket, counted, or None where its general path must run."},
    {"close_batch", (PyCFunction)(void (*)(void))Writer_close_batch, METH_FASTCALL,
     "close_batch(ticket, seq_start, events): agent._finish in one call."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sequencer._native.UnscopedWriter",
    .tp_doc = "Agent._set_unscoped in C: writer(table, row, column, value) -> old value.",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Writer_new,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_traverse = (traverseproc)Writer_traverse,
    .tp_clear = (inquiry)Writer_clear,
    .tp_call = Writer_tp_call,
    .tp_methods = Writer_methods,
    .tp_vectorcall_offset = offsetof(Writer, vectorcall),
};


/* ---- CellWriter: Agent.set in one call ------------------------------------------------ */

/* `Agent.set` (agent/_agent.py, the reference and the pure-Python fallback) in C: the
 * checks of `sequencer.check_write` whose common case (names already seen, an ASCII str
 * or 64-bit int row, a value with no range to check) is done here against the same set
 * of known names, anything else by calling `check_write` itself; the batch in force read
 * from the agent's ContextVar; outside any batch, the agent's `_set_unscoped` (the C
 * UnscopedWriter, or its Python reference); inside one, `agent.store.exchange` and the
 * event appended to the batch's list of events, its full segment handed to the agent's
 * `_ship_segment`. Keyword arguments go to the reference. tests/agent/test_cell_native.py
 * holds it to the reference's logs. */

static PyObject *known_names, *check_write_fn;  /* bound by sequencer._accel */
static PyObject *ABSENT_value;  /* sequencer.ABSENT, bound there too */
static PyObject *S_events_list, *S_ship_segment, *S_set_unscoped;

static PyObject *
bind_checks(PyObject *module, PyObject *args)
{
    PyObject *names, *check, *absent;
    if (!PyArg_ParseTuple(args, "O!OO", &PySet_Type, &names, &check, &absent))
        return NULL;
    Py_XSETREF(ABSENT_value, Py_NewRef(absent));
    Py_XSETREF(known_names, Py_NewRef(names));
    Py_XSETREF(check_write_fn, Py_NewRef(check));
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    PyObject *agent, *current, *reference;
    Py_ssize_t segment_events;
    vectorcallfunc vectorcall;
} CellWriter;

/* `text` is an exact str, all ASCII (str.isascii): 1, 0, or -1 with the error set. */
static int
ascii_str(PyObject *text)
{
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0)
        return -1;
#endif
    return PyUnicode_IS_ASCII(text);
}

/* `v` (an exact int) fits a signed 64-bit integer. */
static int
fits_i64(PyObject *v)
{
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && !overflow && PyErr_Occurred())
        return -1;
    return !overflow;
}

/* check_write's fast test: 1 when it passes, 0 when the full checks must run, -1 with
 * the error set. Only exact types are looked at: anything else may run Python code in
 * `in known`, so it goes to check_write, which does that itself. */
static int
checks_pass(PyObject *table, PyObject *row, PyObject *column, PyObject *value)
{
    if (known_names == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sequencer._native is not bound");
        return -1;
    }
    if (!PyUnicode_CheckExact(table) || !PyUnicode_CheckExact(column))
        return 0;
    int r = PySet_Contains(known_names, table);
    if (r <= 0 || (r = PySet_Contains(known_names, column)) <= 0)
        return r;
    if (PyUnicode_CheckExact(row))
        r = ascii_str(row);
    else if (PyLong_CheckExact(row))
        r = fits_i64(row);
    else
        return 0;
    if (r <= 0)
        return r;
    PyTypeObject *kind = Py_TYPE(value);
    if (value == Py_None || kind == &PyBool_Type || kind == &PyFloat_Type
        || kind == &PyBytes_Type)
        return 1;
    if (kind == &PyUnicode_Type)
        return ascii_str(value);
    if (kind == &PyLong_Type)
        return fits_i64(value);
    return 0;
}

static PyObject *
CellWriter_call(CellWriter *w, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (w->agent == NULL || w->current == NULL || w->reference == NULL)
        return not_initialised((PyObject *)w);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || kwnames != NULL)  /* keywords (or a wrong call): the reference */
        return PyObject_Vectorcall(w->reference, args, nargs, kwnames);
    int pass = checks_pass(args[0], args[1], args[2], args[3]);
    if (pass < 0)
        return NULL;
    if (!pass) {  /* the full checks: they raise InvalidWrite, or pass */
        PyObject *r = PyObject_Vectorcall(check_write_fn, args, 4, NULL);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    PyObject *batch;
    if (PyContextVar_Get(w->current, Py_None, &batch) < 0)
        return NULL;
    if (batch == Py_None) {  /* an automatic short batch for this one write */
        Py_DECREF(batch);
        PyObject *unscoped = PyObject_GetAttr(w->agent, S_set_unscoped);
        if (unscoped == NULL)
            return NULL;
        PyObject *r = PyObject_Vectorcall(unscoped, args, 4, NULL);
        Py_DECREF(unscoped);
        return r;
    }
    PyObject *old = NULL, *store = PyObject_GetAttr(w->agent, S_store);
    if (store == NULL)
        goto done;
    PyObject *call[5] = {store, args[0], args[1], args[2], args[3]};
    old = PyObject_VectorcallMethod(S_exchange, call, 5, NULL);
    Py_DECREF(store);
    if (old == NULL)  /* no event: the write may not have happened */
        goto done;
    PyObject *events = PyObject_GetAttr(batch, S_events_list);
    if (events == NULL)
        goto fail;
    PyObject *event = PyTuple_Pack(5, args[0], args[1], args[2], old, args[3]);
    /* Scalars only (checked above), unless the store's old value is a tracked
     * container: untracked, as the collector itself would untrack it at its first
     * pass (a write's event otherwise adds to every collection until shipped). ABSENT
     * (an insert) is tracked, as every instance of a Python class is, but holds
     * nothing: the collector keeps such a tuple, so it is untracked here (inserts in
     * batches of 100 cost 2.8 instead of 1.5 us a write otherwise). */
    if (event != NULL && (old == ABSENT_value
                          || !(PyObject_IS_GC(old) && PyObject_GC_IsTracked(old))))
        PyObject_GC_UnTrack(event);
    int rc = event == NULL ? -1 : PyList_Check(events) ? PyList_Append(events, event) : -2;
    if (rc == -2) {  /* not a list: its own append */
        PyObject *r = PyObject_CallMethodOneArg(events, S_append, event);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_XDECREF(event);
    Py_ssize_t queued = rc < 0 ? -1 : PyObject_Length(events);
    Py_DECREF(events);
    if (queued < 0)
        goto fail;
    if (queued >= w->segment_events) {  /* a full segment goes to the shipper now */
        PyObject *r = PyObject_CallMethodOneArg(w->agent, S_ship_segment, batch);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
    }
    goto done;
fail:
    Py_CLEAR(old);
done:
    Py_DECREF(batch);
    return old;
}

static int
CellWriter_init(CellWriter *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"agent", "current", "reference", "segment_events", NULL};
    PyObject *agent, *current, *reference;
    Py_ssize_t segment_events;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!On", kwlist, &agent,
                                     &PyContextVar_Type, &current, &reference,
                                     &segment_events))
        return -1;
    if (intern_names() < 0)
        return -1;
#define NAME(var, text) if (var == NULL && (var = PyUnicode_InternFromString(text)) == NULL) return -1;
    NAME(S_events_list, "events") NAME(S_ship_segment, "_ship_segment")
    NAME(S_set_unscoped, "_set_unscoped")
#undef NAME
    Py_XSETREF(self->agent, Py_NewRef(agent));
    Py_XSETREF(self->current, Py_NewRef(current));
    Py_XSETREF(self->reference, Py_NewRef(reference));
    self->segment_events = segment_events;
    return 0;
}

static int
CellWriter_traverse(CellWriter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->agent);
    Py_VISIT(self->current);
    Py_VISIT(self->reference);
    return 0;
}

static int
CellWriter_clear(CellWriter *self)
{
    Py_CLEAR(self->agent);
    Py_CLEAR(self->current);
    Py_CLEAR(self->reference);
    return 0;
}

static void
CellWriter_dealloc(CellWriter *self)
{
    PyObject_GC_UnTrack(self);
    CellWriter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
CellWriter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *self = PyType_GenericNew(type, args, kwds);
    if (self != NULL)
        ((CellWriter *)self)->vectorcall = (vectorcallfunc)CellWriter_call;
    return self;
}

static PyTypeObject CellWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sequencer._native.CellWriter",
    .tp_doc = "Agent.set in C: writer(table, row, column, value) -> old value.",
    .tp_basicsize = sizeof(CellWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = CellWriter_new,
    .tp_init = (initproc)CellWriter_init,
    .tp_dealloc = (destructor)CellWriter_dealloc,
    .tp_traverse = (traverseproc)CellWriter_traverse,
    .tp_clear = (inquiry)CellWriter_clear,
    .tp_call = Writer_tp_call,
    .tp_vectorcall_offset = offsetof(CellWriter, vectorcall),
};


/* ---- helpers for the shipper: columns of tuples, SHA3 of many slices ------------------ */

static PyObject *
transpose(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "transpose(rows: list[tuple], width: int)");
        return NULL;
    }
    PyObject *rows = args[0];
    Py_ssize_t width = PyLong_AsSsize_t(args[1]);
    if (width == -1 && PyErr_Occurred())
        return NULL;
    if (width < 0) {
        PyErr_SetString(PyExc_ValueError, "width must be >= 0");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows);
    PyObject *result = PyTuple_New(width);
    if (result == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < width; k++) {
        PyObject *column = PyList_New(n);
        if (column == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyTuple_SET_ITEM(result, k, column);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != width) {
            PyErr_Format(PyExc_ValueError, "row %zd is not a tuple of %zd items", i, width);
            Py_DECREF(result);
            return NULL;
        }
        for (Py_ssize_t k = 0; k < width; k++)
            PyList_SET_ITEM(PyTuple_GET_ITEM(result, k), i,
                            Py_NewRef(PyTuple_GET_ITEM(row, k)));
    }
    return result;
}

/* Keccak-f[1600] and SHA3-256 (FIPS 202), for the setsum's per-segment digests. */
static const uint64_t KECCAK_RC[24] = {
    0x0000000000000001ULL, 0x0000000000008082ULL, 0x800000000000808AULL,
    0x8000000080008000ULL, 0x000000000000808BULL, 0x0000000080000001ULL,
    0x8000000080008081ULL, 0x8000000000008009ULL, 0x000000000000008AULL,
    0x0000000000000088ULL, 0x0000000080008009ULL, 0x000000008000000AULL,
    0x000000008000808BULL, 0x800000000000008BULL, 0x8000000000008089ULL,
    0x8000000000008003ULL, 0x8000000000008002ULL, 0x8000000000000080ULL,
    0x000000000000800AULL, 0x800000008000000AULL, 0x8000000080008081ULL,
    0x8000000000008080ULL, 0x0000000080000001ULL, 0x8000000080008008ULL,
};
#define ROL64(v, n) (((v) << (n)) | ((v) >> (64 - (n))))  /* 0 < n < 64 */

static void
keccak_f1600(uint64_t a[25])
{
    /* Unrolled (generated from FIPS 202's rho offsets and pi, checked against hashlib by
     * tests/sequencer/test_native.py): theta's column parities d[x] are folded into rho
     * and pi; lane x + 5y moves to y + 5((2x + 3y) mod 5), rotated by its rho offset. */
    uint64_t b[25], c0, c1, c2, c3, c4, d0, d1, d2, d3, d4;
    for (int round = 0; round < 24; round++) {
        c0 = a[0] ^ a[5] ^ a[10] ^ a[15] ^ a[20];
        c1 = a[1] ^ a[6] ^ a[11] ^ a[16] ^ a[21];
        c2 = a[2] ^ a[7] ^ a[12] ^ a[17] ^ a[22];
        c3 = a[3] ^ a[8] ^ a[13] ^ a[18] ^ a[23];
        c4 = a[4] ^ a[9] ^ a[14] ^ a[19] ^ a[24];
        d0 = c4 ^ ROL64(c1, 1);
        d1 = c0 ^ ROL64(c2, 1);
        d2 = c1 ^ ROL64(c3, 1);
        d3 = c2 ^ ROL64(c4, 1);
        d4 = c3 ^ ROL64(c0, 1);
        b[0] = a[0] ^ d0;
        b[10] = ROL64(a[1] ^ d1, 1);
        b[20] = ROL64(a[2] ^ d2, 62);
        b[5] = ROL64(a[3] ^ d3, 28);
        b[15] = ROL64(a[4] ^ d4, 27);
        b[16] = ROL64(a[5] ^ d0, 36);
        b[1] = ROL64(a[6] ^ d1, 44);
        b[11] = ROL64(a[7] ^ d2, 6);
        b[21] = ROL64(a[8] ^ d3, 55);
        b[6] = ROL64(a[9] ^ d4, 20);
        b[7] = ROL64(a[10] ^ d0, 3);
        b[17] = ROL64(a[11] ^ d1, 10);
        b[2] = ROL64(a[12] ^ d2, 43);
        b[12] = ROL64(a[13] ^ d3, 25);
        b[22] = ROL64(a[14] ^ d4, 39);
        b[23] = ROL64(a[15] ^ d0, 41);
        b[8] = ROL64(a[16] ^ d1, 45);
        b[18] = ROL64(a[17] ^ d2, 15);
        b[3] = ROL64(a[18] ^ d3, 21);
        b[13] = ROL64(a[19] ^ d4, 8);
        b[14] = ROL64(a[20] ^ d0, 18);
        b[24] = ROL64(a[21] ^ d1, 2);
        b[9] = ROL64(a[22] ^ d2, 61);
        b[19] = ROL64(a[23] ^ d3, 56);
        b[4] = ROL64(a[24] ^ d4, 14);
        a[0] = b[0] ^ (~b[1] & b[2]);
        a[1] = b[1] ^ (~b[2] & b[3]);
        a[2] = b[2] ^ (~b[3] & b[4]);
        a[3] = b[3] ^ (~b[4] & b[0]);
        a[4] = b[4] ^ (~b[0] & b[1]);
        a[5] = b[5] ^ (~b[6] & b[7]);
        a[6] = b[6] ^ (~b[7] & b[8]);
        a[7] = b[7] ^ (~b[8] & b[9]);
        a[8] = b[8] ^ (~b[9] & b[5]);
        a[9] = b[9] ^ (~b[5] & b[6]);
        a[10] = b[10] ^ (~b[11] & b[12]);
        a[11] = b[11] ^ (~b[12] & b[13]);
        a[12] = b[12] ^ (~b[13] & b[14]);
        a[13] = b[13] ^ (~b[14] & b[10]);
        a[14] = b[14] ^ (~b[10] & b[11]);
        a[15] = b[15] ^ (~b[16] & b[17]);
        a[16] = b[16] ^ (~b[17] & b[18]);
        a[17] = b[17] ^ (~b[18] & b[19]);
        a[18] = b[18] ^ (~b[19] & b[15]);
        a[19] = b[19] ^ (~b[15] & b[16]);
        a[20] = b[20] ^ (~b[21] & b[22]);
        a[21] = b[21] ^ (~b[22] & b[23]);
        a[22] = b[22] ^ (~b[23] & b[24]);
        a[23] = b[23] ^ (~b[24] & b[20]);
        a[24] = b[24] ^ (~b[20] & b[21]);
        a[0] ^= KECCAK_RC[round];
    }
}

#define SHA3_256_RATE 136

static uint64_t
load64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void
sha3_256(const unsigned char *data, size_t len, unsigned char out[32])
{
    uint64_t a[25] = {0};
    while (len >= SHA3_256_RATE) {
        for (int i = 0; i < SHA3_256_RATE / 8; i++)
            a[i] ^= load64(data + 8 * i);
        keccak_f1600(a);
        data += SHA3_256_RATE;
        len -= SHA3_256_RATE;
    }
    unsigned char block[SHA3_256_RATE] = {0};
    memcpy(block, data, len);
    block[len] ^= 0x06;  /* the SHA3 domain bits and the first padding bit */
    block[SHA3_256_RATE - 1] ^= 0x80;
    for (int i = 0; i < SHA3_256_RATE / 8; i++)
        a[i] ^= load64(block + 8 * i);
    keccak_f1600(a);
    for (int i = 0; i < 32; i++)
        out[i] = (unsigned char)(a[i / 8] >> (8 * (i % 8)));
}

/* Four SHA3-256 messages at once, with AVX2 where the CPU has it: the four Keccak
 * states sit side by side, lane i of state j at st[i][j], and one permutation of 256-bit
 * vectors moves all four (measured: about 2.5x the throughput of four scalar
 * permutations). The setsum hashes one item per segment, many short ones, so a lane
 * whose message ends takes the next message at once (multi-buffer); the messages are
 * not in lockstep. The same digests as sha3_256 (tests/sequencer/test_native.py). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_SHA3_X4 1

#define X4_ROL(v, n) _mm256_or_si256(_mm256_slli_epi64((v), (n)), _mm256_srli_epi64((v), 64 - (n)))
#define X4_XOR5(a, b, c, d, e) \
    _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)), e)
/* b ^ (~c & d): chi's step */
#define X4_CHI(b, c, d) _mm256_xor_si256((b), _mm256_andnot_si256((c), (d)))

__attribute__((target("avx2"))) static void
keccak_f1600_x4(uint64_t st[25][4])
{
    /* keccak_f1600's unrolled rounds, lane for lane, on vectors. */
    __m256i a[25], b[25], c0, c1, c2, c3, c4, d0, d1, d2, d3, d4;
    for (int i = 0; i < 25; i++)
        a[i] = _mm256_load_si256((const __m256i *)st[i]);
    for (int round = 0; round < 24; round++) {
        c0 = X4_XOR5(a[0], a[5], a[10], a[15], a[20]);
        c1 = X4_XOR5(a[1], a[6], a[11], a[16], a[21]);
        c2 = X4_XOR5(a[2], a[7], a[12], a[17], a[22]);
        c3 = X4_XOR5(a[3], a[8], a[13], a[18], a[23]);
        c4 = X4_XOR5(a[4], a[9], a[14], a[19], a[24]);
        d0 = _mm256_xor_si256(c4, X4_ROL(c1, 1));
        d1 = _mm256_xor_si256(c0, X4_ROL(c2, 1));
        d2 = _mm256_xor_si256(c1, X4_ROL(c3, 1));
        d3 = _mm256_xor_si256(c2, X4_ROL(c4, 1));
        d4 = _mm256_xor_si256(c3, X4_ROL(c0, 1));
        b[0] = _mm256_xor_si256(a[0], d0);
        b[10] = X4_ROL(_mm256_xor_si256(a[1], d1), 1);
        b[20] = X4_ROL(_mm256_xor_si256(a[2], d2), 62);
        b[5] = X4_ROL(_mm256_xor_si256(a[3], d3), 28);
        b[15] = X4_ROL(_mm256_xor_si256(a[4], d4), 27);
        b[16] = X4_ROL(_mm256_xor_si256(a[5], d0), 36);
        b[1] = X4_ROL(_mm256_xor_si256(a[6], d1), 44);
        b[11] = X4_ROL(_mm256_xor_si256(a[7], d2), 6);
        b[21] = X4_ROL(_mm256_xor_si256(a[8], d3), 55);
        b[6] = X4_ROL(_mm256_xor_si256(a[9], d4), 20);
        b[7] = X4_ROL(_mm256_xor_si256(a[10], d0), 3);
        b[17] = X4_ROL(_mm256_xor_si256(a[11], d1), 10);
        b[2] = X4_ROL(_mm256_xor_si256(a[12], d2), 43);
        b[12] = X4_ROL(_mm256_xor_si256(a[13], d3), 25);
        b[22] = X4_ROL(_mm256_xor_si256(a[14], d4), 39);
        b[23] = X4_ROL(_mm256_xor_si256(a[15], d0), 41);
        b[8] = X4_ROL(_mm256_xor_si256(a[16], d1), 45);
        b[18] = X4_ROL(_mm256_xor_si256(a[17], d2), 15);
        b[3] = X4_ROL(_mm256_xor_si256(a[18], d3), 21);
        b[13] = X4_ROL(_mm256_xor_si256(a[19], d4), 8);
        b[14] = X4_ROL(_mm256_xor_si256(a[20], d0), 18);
        b[24] = X4_ROL(_mm256_xor_si256(a[21], d1), 2);
        b[9] = X4_ROL(_mm256_xor_si256(a[22], d2), 61);
        b[19] = X4_ROL(_mm256_xor_si256(a[23], d3), 56);
        b[4] = X4_ROL(_mm256_xor_si256(a[24], d4), 14);
        for (int y = 0; y < 25; y += 5) {
            a[y] = X4_CHI(b[y], b[y + 1], b[y + 2]);
            a[y + 1] = X4_CHI(b[y + 1], b[y + 2], b[y + 3]);
            a[y + 2] = X4_CHI(b[y + 2], b[y + 3], b[y + 4]);
            a[y + 3] = X4_CHI(b[y + 3], b[y + 4], b[y]);
            a[y + 4] = X4_CHI(b[y + 4], b[y], b[y + 1]);
        }
        a[0] = _mm256_xor_si256(a[0], _mm256_set1_epi64x((long long)KECCAK_RC[round]));
    }
    for (int i = 0; i < 25; i++)
        _mm256_store_si256((__m256i *)st[i], a[i]);
}

/* One message's progress in a lane of sha3_x4. */
typedef struct {
    const unsigned char *next;  /* its bytes not absorbed yet */
    size_t left;
    Py_ssize_t index;           /* which message (-1: the lane is idle) */
    int padded;                 /* its last, padded block is in the state */
} X4Lane;

/* The digests of messages k = 0..count-1, body[at[k] - at[0]:at[k + 1] - at[0]], into
 * out + 32k. */
__attribute__((target("avx2"))) static void
sha3_x4(const unsigned char *body, const int64_t *at, Py_ssize_t count, unsigned char *out)
{
    _Alignas(32) uint64_t st[25][4];
    memset(st, 0, sizeof st);
    X4Lane lane[4];
    Py_ssize_t taken = 0;
    int busy = 0;
    for (int j = 0; j < 4; j++) {
        lane[j].index = taken < count ? taken++ : -1;
        if (lane[j].index >= 0) {
            lane[j].next = body + (at[lane[j].index] - at[0]);
            lane[j].left = (size_t)(at[lane[j].index + 1] - at[lane[j].index]);
            lane[j].padded = 0;
            busy++;
        }
    }
    while (busy) {
        for (int j = 0; j < 4; j++) {
            X4Lane *l = &lane[j];
            if (l->index < 0)
                continue;
            const unsigned char *block = l->next;
            unsigned char last[SHA3_256_RATE];
            if (l->left >= SHA3_256_RATE) {
                l->next += SHA3_256_RATE;
                l->left -= SHA3_256_RATE;
            } else {
                memset(last, 0, sizeof last);
                memcpy(last, l->next, l->left);
                last[l->left] ^= 0x06;  /* as in sha3_256 */
                last[SHA3_256_RATE - 1] ^= 0x80;
                block = last;
                l->padded = 1;
            }
            for (int i = 0; i < SHA3_256_RATE / 8; i++) {
                uint64_t word;
                memcpy(&word, block + 8 * i, 8);  /* x86-64: little-endian, as Keccak's lanes */
                st[i][j] ^= word;
            }
        }
        keccak_f1600_x4(st);
        for (int j = 0; j < 4; j++) {
            X4Lane *l = &lane[j];
            if (l->index < 0 || !l->padded)
                continue;
            for (int i = 0; i < 4; i++)
                memcpy(out + 32 * l->index + 8 * i, &st[i][j], 8);
            for (int i = 0; i < 25; i++)
                st[i][j] = 0;
            if (taken < count) {
                l->index = taken++;
                l->next = body + (at[l->index] - at[0]);
                l->left = (size_t)(at[l->index + 1] - at[l->index]);
                l->padded = 0;
            } else {
                l->index = -1;
                busy--;
            }
        }
    }
}
#endif

/* 1 if sha3_many uses sha3_x4: the CPU has AVX2, and CDC_AGENT_SHA3_X4 is not "0"
 * (read at import; sha3_lanes() switches it, for the tests and benchmarks). */
static int use_sha3_x4 = 0, have_sha3_x4 = 0;

static void
choose_sha3(void)
{
#ifdef HAVE_SHA3_X4
    const char *flag = getenv("CDC_AGENT_SHA3_X4");
    __builtin_cpu_init();
    have_sha3_x4 = __builtin_cpu_supports("avx2");
    use_sha3_x4 = have_sha3_x4 && !(flag && strcmp(flag, "0") == 0);
#endif
}

/* sha3_lanes([lanes]): how many messages the SHA3 helpers hash at once, 4 (AVX2) or 1;
 * with an argument, set it (4 where the CPU has AVX2 only) and return the old one. */
static PyObject *
sha3_lanes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int old = use_sha3_x4 ? 4 : 1;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "sha3_lanes([lanes])");
        return NULL;
    }
    if (nargs == 1) {
        long lanes = PyLong_AsLong(args[0]);
        if (lanes == -1 && PyErr_Occurred())
            return NULL;
        if (lanes != 1 && !(lanes == 4 && have_sha3_x4)) {
            PyErr_Format(PyExc_ValueError, "sha3_lanes: %ld lanes are not available here "
                         "(1%s)", lanes, have_sha3_x4 ? " or 4" : "");
            return NULL;
        }
        use_sha3_x4 = lanes == 4;
    }
    return PyLong_FromLong(old);
}

/* The SHA3-256 digests of body[at[k] - at[0]:at[k + 1] - at[0]] for k < count, into
 * out + 32k (the bounds already checked). Without the GIL: it touches no Python object. */
static void
sha3_many(const unsigned char *body, const int64_t *at, Py_ssize_t count, unsigned char *out)
{
#ifdef HAVE_SHA3_X4
    if (use_sha3_x4 && count > 1) {
        sha3_x4(body, at, count, out);
        return;
    }
#endif
    for (Py_ssize_t k = 0; k < count; k++)
        sha3_256(body + (at[k] - at[0]), (size_t)(at[k + 1] - at[k]), out + 32 * k);
}

/* ---- replay: epoch records as columns (replay/_epoch_columns.py) ---------------------- */

/* The interned attribute names epoch_fields reads (made once, on first use). */
static PyObject *EF_NAMES[9];
static const char *const EF_TEXT[9] = {
    "epoch_seq", "begin_id", "end_id", "event_count", "quiescent", "setsum", "table_counts",
    "domain_id", NULL,
};

#include <structmember.h>  /* T_OBJECT_EX, READ_RESTRICTED */

/* Where the last record type seen keeps each field (slots: a member descriptor's
 * offset), so a field is one load instead of a generic attribute lookup. EF_TYPE is a
 * strong reference (a type freed while cached could be replaced by another at its
 * address), valid while the type's version tag is EF_VERSION: any change to the type
 * or its bases (a field made a property, __getattribute__ set) gives it a new tag. */
static PyTypeObject *EF_TYPE;
static unsigned int EF_VERSION;
static Py_ssize_t EF_OFFSET[8];

/* The cached layout holds for record's type now. Checked before every cached read:
 * reading one field may run Python code (a property, __bool__) that changes the type. */
static inline int
ef_cached(PyObject *record)
{
    PyTypeObject *type = Py_TYPE(record);
    return type == EF_TYPE && (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)
        && type->tp_version_tag == EF_VERSION;
}

static void
ef_resolve(PyTypeObject *type)
{
    Py_CLEAR(EF_TYPE);  /* NULL before the old type may be freed (and code run) */
    if (type->tp_getattro != PyObject_GenericGetAttr)
        return;
    for (int i = 0; i < 8; i++) {
        PyObject *d = _PyType_Lookup(type, EF_NAMES[i]);  /* borrowed */
        /* a slot of this type or a base: another class's descriptor set on it would
         * give an offset outside the record */
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)
                || !PyType_IsSubtype(type, PyDescr_TYPE(d)))
            return;
        PyMemberDef *member = ((PyMemberDescrObject *)d)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READ_RESTRICTED))
            return;
        EF_OFFSET[i] = member->offset;
    }
    /* The lookups above gave the type a version tag, unless the tags ran out: without
     * one a change could not be seen, so nothing is cached. */
    if (!(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        return;
    EF_VERSION = type->tp_version_tag;
    EF_TYPE = (PyTypeObject *)Py_NewRef((PyObject *)type);
}

/* Field i of record, a new reference (NULL with an error set if it has none). */
static inline PyObject *
ef_get(PyObject *record, int i)
{
    if (ef_cached(record)) {
        PyObject *v = *(PyObject **)((char *)record + EF_OFFSET[i]);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(record, EF_NAMES[i]);
}

/* An int as uint64 (the value of PyLong_AsUnsignedLongLong, which converts ints of
 * more than one digit through a byte array: most of epoch_fields' time on 64-bit ids).
 * An exact int of up to 64 bits is read from its 30-bit digits; anything else goes the
 * generic way. Returns 0, or -1 (with or without an error set) where that one fails or
 * v is no int. */
static inline int
ef_u64(PyObject *v, uint64_t *out)
{
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    if (PyLong_CheckExact(v)) {
        Py_ssize_t size = Py_SIZE(v);
        const digit *d = ((PyLongObject *)v)->ob_digit;
        if (size >= 0 && size <= 3 && (size < 3 || (d[2] >> 4) == 0)) {
            uint64_t x = 0;
            for (Py_ssize_t i = size - 1; i >= 0; i--)
                x = (x << PyLong_SHIFT) | d[i];
            *out = x;
            return 0;
        }
    }
#endif
    if (!PyLong_Check(v))
        return -1;
    uint64_t x = PyLong_AsUnsignedLongLong(v);
    if (x == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* Lowercase hex digit values; 0xFF for every other byte (one lookup, no branch). */
static unsigned char HEX_VALUE[256];

static void
fill_hex_value(void)
{
    memset(HEX_VALUE, 0xFF, sizeof HEX_VALUE);
    for (int c = '0'; c <= '9'; c++)
        HEX_VALUE[c] = (unsigned char)(c - '0');
    for (int c = 'a'; c <= 'f'; c++)
        HEX_VALUE[c] = (unsigned char)(c - 'a' + 10);
}

/* What a record's setsum text says: 0 nothing (""), 1 a digest (64 lowercase hex
 * digits, written to out), 2 anything else; -1 if it is not a str (the caller's
 * Python path raises then). The same reading as _epoch_columns._setsum_lanes. */
static int
setsum_kind(PyObject *text, unsigned char out[32])
{
    if (!PyUnicode_Check(text))
        return -1;
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    if (len == 0)
        return 0;
    if (len != 64 || !PyUnicode_IS_ASCII(text))
        return 2;
    const Py_UCS1 *c = PyUnicode_1BYTE_DATA(text);
    unsigned bad = 0;
    for (int i = 0; i < 32; i++) {
        unsigned hi = HEX_VALUE[c[2 * i]], lo = HEX_VALUE[c[2 * i + 1]];
        bad |= hi | lo;
        out[i] = (unsigned char)(hi << 4 | (lo & 0xF));
    }
    if (bad & 0xF0) {
        memset(out, 0, 32);  /* as the Python path leaves it */
        return 2;
    }
    return 1;
}

/* epoch_fields(records): every field the assembler checks, one pass in C. Returns
 * (ints, quiescent, digests, kinds, table_lengths, table_names, table_counts): ints is
 * 5n uint64 (seqs, begins, ends, counts, domain ids, one column after another), quiescent n bytes
 * 0/1, digests 32n bytes, kinds n int8 (setsum_kind), table_lengths n int64, then the
 * flattened (name, count) pairs as a list of str and counts as uint64 bytes. Returns
 * None for anything of another shape (an int out of range, a setsum that is no str, a
 * table_counts item that is no (str, int) pair, a field missing or failing to read, as
 * domain_id on a record of another kind): the Python path then decides, and raises its
 * own error if it must (of_records_native's contract). Only BaseExceptions that are no
 * Exception (KeyboardInterrupt, SystemExit) propagate. */
static PyObject *
epoch_fields(PyObject *module, PyObject *records)
{
    if (EF_NAMES[0] == NULL) {
        fill_hex_value();
        for (int i = 0; EF_TEXT[i] != NULL; i++)
            if ((EF_NAMES[i] = PyUnicode_InternFromString(EF_TEXT[i])) == NULL)
                return NULL;
    }
    /* A tuple of its own: reading a field may run Python code (a property, __bool__, a
     * finalizer) that changes a list it was given and frees the record being read. */
    PyObject *seq = PySequence_Tuple(records);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *ints = PyBytes_FromStringAndSize(NULL, 40 * n);
    PyObject *quiet = PyBytes_FromStringAndSize(NULL, n);
    PyObject *digests = PyBytes_FromStringAndSize(NULL, 32 * n);
    PyObject *kinds = PyBytes_FromStringAndSize(NULL, n);
    PyObject *lengths = PyBytes_FromStringAndSize(NULL, 8 * n);
    PyObject *names = PyList_New(0);
    PyObject *counts = NULL, *result = NULL;
    uint64_t *tc = NULL;
    Py_ssize_t tc_len = 0, tc_cap = 0;
    if (!ints || !quiet || !digests || !kinds || !lengths || !names)
        goto done;
    uint64_t *iv = (uint64_t *)PyBytes_AS_STRING(ints);
    unsigned char *qv = (unsigned char *)PyBytes_AS_STRING(quiet);
    unsigned char *dv = (unsigned char *)PyBytes_AS_STRING(digests);
    signed char *kv = (signed char *)PyBytes_AS_STRING(kinds);
    int64_t *lv = (int64_t *)PyBytes_AS_STRING(lengths);
    memset(dv, 0, 32 * n);
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *record = items[r];
        if (!ef_cached(record))
            ef_resolve(Py_TYPE(record));
        for (int f = 0; f < 5; f++) {
            PyObject *v = ef_get(record, f < 4 ? f : 7);
            if (v == NULL)
                goto unreadable;
            uint64_t x = 0;
            int bad = ef_u64(v, &x) < 0;
            Py_DECREF(v);
            if (bad)
                goto other;
            iv[f * n + r] = x;
        }
        PyObject *v = ef_get(record, 4);
        if (v == NULL)
            goto unreadable;
        int truth = PyObject_IsTrue(v);
        Py_DECREF(v);
        if (truth < 0)
            goto unreadable;
        qv[r] = (unsigned char)truth;
        if ((v = ef_get(record, 5)) == NULL)
            goto unreadable;
        int kind = setsum_kind(v, dv + 32 * r);
        Py_DECREF(v);
        if (kind < 0)
            goto other;
        kv[r] = (signed char)kind;
        if ((v = ef_get(record, 6)) == NULL)
            goto unreadable;
        if (!PyTuple_Check(v)) {
            Py_DECREF(v);
            goto other;
        }
        Py_ssize_t m = PyTuple_GET_SIZE(v);
        lv[r] = m;
        for (Py_ssize_t k = 0; k < m; k++) {
            PyObject *pair = PyTuple_GET_ITEM(v, k);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
                || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))
                || !PyLong_Check(PyTuple_GET_ITEM(pair, 1))) {
                Py_DECREF(v);
                goto other;
            }
            uint64_t count = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(pair, 1));
            if (count == (uint64_t)-1 && PyErr_Occurred()) {
                Py_DECREF(v);
                goto other;
            }
            if (tc_len == tc_cap) {
                tc_cap = tc_cap ? 2 * tc_cap : 64;
                uint64_t *grown = PyMem_Realloc(tc, (size_t)tc_cap * sizeof(uint64_t));
                if (grown == NULL) {
                    Py_DECREF(v);
                    PyErr_NoMemory();
                    goto done;
                }
                tc = grown;
            }
            tc[tc_len++] = count;
            if (PyList_Append(names, PyTuple_GET_ITEM(pair, 0)) < 0) {
                Py_DECREF(v);
                goto done;
            }
        }
        Py_DECREF(v);
    }
    counts = PyBytes_FromStringAndSize((const char *)tc, 8 * tc_len);
    if (counts == NULL)
        goto done;
    result = PyTuple_Pack(7, ints, quiet, digests, kinds, lengths, names, counts);
    goto done;
unreadable:  /* reading a field (or its truth) raised */
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        goto done;
other:
    PyErr_Clear();
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(seq);
    Py_XDECREF(ints);
    Py_XDECREF(quiet);
    Py_XDECREF(digests);
    Py_XDECREF(kinds);
    Py_XDECREF(lengths);
    Py_XDECREF(names);
    Py_XDECREF(counts);
    PyMem_Free(tc);
    return result;
}

/* ---- segment digests: the setsum items of many segments, built and hashed here -------- */

/* One contiguous array argument: its buffer, checked to hold exactly `count` items of
 * `itemsize` bytes (itemsize 0: any bytes). */
static int
get_array(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t count,
          const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (itemsize && (view->itemsize != itemsize || view->len != itemsize * count)) {
        PyErr_Format(PyExc_ValueError, "%s: %zd items of %zd bytes expected", what, count,
                     itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void
put_be(unsigned char *p, uint64_t v, int width)
{
    for (int i = width - 1; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

#define SEGMENT_COLUMNS 5

/* sha3_segments(bounds, domains, batches, seqs, columns): the SHA3-256 digest of each
 * segment's setsum item (sinks.codec's layout: b"CDCSEG1\0", domain u64, batch u64,
 * n u32, n seqs u32, then per variable column n lengths u32 and the values' bytes,
 * big-endian), concatenated. Segment k is rows bounds[k]:bounds[k + 1] (int64, m + 1 of
 * them, from 0, increasing); domains and batches are m uint64; seqs n uint32; columns
 * five (offsets, values) pairs, offsets n + 1 int32 into the values buffer (Arrow's
 * binary layout) for table, row, column, old, new. Used by the shipper (one segment per
 * queue item) and by replay (segments found in a run). Everything is checked before
 * hashing; with the GIL released, the items are built one after the other in a scratch
 * buffer of at most SEGMENT_SCRATCH bytes (or one item; faster than absorbing an item
 * field by field), and each buffer is hashed by sha3_many (four at a time with AVX2). */
#define SEGMENT_SCRATCH (1 << 20)

static PyObject *
sha3_segments(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != SEGMENT_COLUMNS) {
        PyErr_SetString(PyExc_TypeError, "sha3_segments(bounds, domains, batches, seqs, "
                        "((offsets, values) x 5))");
        return NULL;
    }
    Py_buffer views[4 + 2 * SEGMENT_COLUMNS];
    int held = 0;
    PyObject *out = NULL;
    unsigned char *item = NULL;
    int64_t *at = NULL;
    /* bounds first: its length gives m, and n is its last value */
    if (PyObject_GetBuffer(args[0], &views[0], PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    held = 1;
    if (views[0].itemsize != 8 || views[0].len < 8 || views[0].len % 8) {
        PyErr_SetString(PyExc_ValueError, "bounds: at least one int64 expected");
        goto done;
    }
    Py_ssize_t m = views[0].len / 8 - 1;
    const int64_t *bounds = (const int64_t *)views[0].buf;
    int64_t n = bounds[m];
    if (bounds[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "bounds must start at 0");
        goto done;
    }
    for (Py_ssize_t k = 0; k < m; k++)
        if (bounds[k] >= bounds[k + 1] || bounds[k + 1] - bounds[k] > 0xFFFFFFFFLL) {
            PyErr_SetString(PyExc_ValueError, "bounds must increase (by under 2**32)");
            goto done;
        }
    if (get_array(args[1], &views[1], 8, m, "domains") < 0)
        goto done;
    held = 2;
    if (get_array(args[2], &views[2], 8, m, "batches") < 0)
        goto done;
    held = 3;
    if (get_array(args[3], &views[3], 4, n, "seqs") < 0)
        goto done;
    held = 4;
    const int32_t *offsets[SEGMENT_COLUMNS];
    const unsigned char *values[SEGMENT_COLUMNS];
    for (int c = 0; c < SEGMENT_COLUMNS; c++) {
        PyObject *pair = PyTuple_GET_ITEM(args[4], c);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "columns: (offsets, values) pairs");
            goto done;
        }
        if (get_array(PyTuple_GET_ITEM(pair, 0), &views[held], 4, n + 1, "offsets") < 0)
            goto done;
        offsets[c] = (const int32_t *)views[held++].buf;
        if (get_array(PyTuple_GET_ITEM(pair, 1), &views[held], 0, 0, "values") < 0)
            goto done;
        values[c] = (const unsigned char *)views[held].buf;
        Py_ssize_t size = views[held++].len;
        const int32_t *o = offsets[c];  /* untrusted: every value inside the data */
        if (o[0] < 0 || o[n] > size) {
            PyErr_SetString(PyExc_ValueError, "offsets outside the values buffer");
            goto done;
        }
        for (int64_t i = 0; i < n; i++)
            if (o[i] > o[i + 1]) {
                PyErr_SetString(PyExc_ValueError, "offsets must not decrease");
                goto done;
            }
    }
    /* The items, one after the other: at[k] is where item k starts. They are built in
     * chunks of at most SEGMENT_SCRATCH bytes (or one item), each chunk then hashed. */
    at = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(m + 1));
    if (at == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    at[0] = 0;
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t lo = bounds[k], hi = bounds[k + 1];
        int64_t size = 28 + 4 * (hi - lo) * (1 + SEGMENT_COLUMNS);
        for (int c = 0; c < SEGMENT_COLUMNS; c++)
            size += offsets[c][hi] - offsets[c][lo];
        at[k + 1] = at[k] + size;
    }
    int64_t scratch = 1;  /* the largest chunk of items hashed together */
    for (Py_ssize_t k = 0, first = 0; k < m; k++) {
        if (at[k + 1] - at[first] > SEGMENT_SCRATCH && k > first)
            first = k;
        if (at[k + 1] - at[first] > scratch)
            scratch = at[k + 1] - at[first];
    }
    out = PyBytes_FromStringAndSize(NULL, 32 * m);
    item = out ? PyMem_RawMalloc((size_t)scratch) : NULL;
    if (item == NULL) {
        if (out != NULL)
            PyErr_NoMemory();
        Py_CLEAR(out);
        goto done;
    }
    unsigned char *digests = (unsigned char *)PyBytes_AS_STRING(out);
    const uint64_t *domains = (const uint64_t *)views[1].buf;
    const uint64_t *batches = (const uint64_t *)views[2].buf;
    const uint32_t *seqs = (const uint32_t *)views[3].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0, first = 0; k < m; k++) {
        if (at[k + 1] - at[first] > SEGMENT_SCRATCH && k > first) {
            sha3_many(item, at + first, k - first, digests + 32 * first);
            first = k;
        }
        int64_t lo = bounds[k], hi = bounds[k + 1];
        unsigned char *p = item + (at[k] - at[first]);
        memcpy(p, "CDCSEG1\0", 8);
        put_be(p + 8, domains[k], 8);
        put_be(p + 16, batches[k], 8);
        put_be(p + 24, (uint64_t)(hi - lo), 4);
        p += 28;
        for (int64_t i = lo; i < hi; i++, p += 4)
            put_be(p, seqs[i], 4);
        for (int c = 0; c < SEGMENT_COLUMNS; c++) {
            const int32_t *o = offsets[c];
            for (int64_t i = lo; i < hi; i++, p += 4)
                put_be(p, (uint64_t)(o[i + 1] - o[i]), 4);
            size_t bytes = (size_t)(o[hi] - o[lo]);
            if (bytes)
                memcpy(p, values[c] + o[lo], bytes);
            p += bytes;
        }
        if (k == m - 1)
            sha3_many(item, at + first, m - first, digests + 32 * first);
    }
    Py_END_ALLOW_THREADS
done:
    PyMem_RawFree(item);
    PyMem_RawFree(at);
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    return out;
}

/* setsum_fault(digests, owner, lanes, kinds, primes): the first epoch whose record's
 * setsum (lanes: n x 8 uint32, kinds: n int8, 0 none, 1 digest, 2 bogus) is not the
 * setsum of its segments' digests (32 bytes each, segment k belonging to epoch
 * owner[k], int64; others ignored): lane-wise sums modulo primes (8 uint64, none 0).
 * -1: none. ValueError for digests that are no whole number of 32 bytes or a zero prime.
 * What replay._epoch_columns.first_setsum_fault computes in numpy, in one pass. */
static PyObject *
setsum_fault(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "setsum_fault(digests, owner, lanes, kinds, primes)");
        return NULL;
    }
    Py_buffer views[5];
    int held = 0;
    PyObject *out = NULL;
    uint64_t *sums = NULL;
    if (get_array(args[0], &views[held], 0, 0, "digests") < 0)
        goto done;
    if (views[held].len % 32) {  /* as sinks.Setsum.insert_digests refuses them */
        PyErr_Format(PyExc_ValueError, "digests must be a whole number of 32-byte SHA3-256 "
                     "digests, got %zd bytes", views[held].len);
        held++;
        goto done;
    }
    Py_ssize_t m = views[held++].len / 32;
    if (get_array(args[3], &views[held], 0, 0, "kinds") < 0)
        goto done;
    Py_ssize_t n = views[held++].len;
    if (views[1].itemsize != 1) {
        PyErr_SetString(PyExc_ValueError, "kinds: int8 expected");
        goto done;
    }
    if (get_array(args[1], &views[held++], 8, m, "owner") < 0
        || get_array(args[2], &views[held++], 4, 8 * n, "lanes") < 0
        || get_array(args[4], &views[held++], 8, 8, "primes") < 0)
        goto done;
    const unsigned char *digests = (const unsigned char *)views[0].buf;
    const signed char *kinds = (const signed char *)views[1].buf;
    const int64_t *owner = (const int64_t *)views[2].buf;
    const uint32_t *lanes = (const uint32_t *)views[3].buf;
    const uint64_t *primes = (const uint64_t *)views[4].buf;
    for (int i = 0; i < 8; i++)
        if (primes[i] == 0) {  /* each lane is reduced modulo its prime */
            PyErr_Format(PyExc_ValueError, "primes: setsum prime %d is 0 (pass "
                         "sinks.SETSUM_PRIMES)", i);
            goto done;
        }
    sums = PyMem_Calloc((size_t)(n ? n : 1), 8 * sizeof(uint64_t));
    if (sums == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        int64_t e = owner[k];
        if (e < 0 || e >= n)
            continue;
        for (int i = 0; i < 8; i++) {
            const unsigned char *d = digests + 32 * k + 4 * i;
            sums[8 * e + i] += (uint64_t)d[0] | (uint64_t)d[1] << 8 | (uint64_t)d[2] << 16
                               | (uint64_t)d[3] << 24;
        }
    }
    Py_ssize_t bad = -1;
    for (Py_ssize_t e = 0; e < n && bad < 0; e++) {
        if (kinds[e] == 0)
            continue;
        if (kinds[e] != 1) {
            bad = e;
            break;
        }
        for (int i = 0; i < 8; i++)
            if (sums[8 * e + i] % primes[i] != lanes[8 * e + i]) {
                bad = e;
                break;
            }
    }
    out = PyLong_FromSsize_t(bad);
done:
    for (int i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(sums);
    return out;
}

static PyObject *
sha3_slices(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sha3_slices(body, bounds)");
        return NULL;
    }
    Py_buffer body, bounds;
    if (PyObject_GetBuffer(args[0], &body, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &bounds, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&body);
        return NULL;
    }
    PyObject *out = NULL;
    const char *fmt = bounds.format ? bounds.format : "B";
    if (*fmt == '<' || *fmt == '=' || *fmt == '@')
        fmt++;
    if (bounds.itemsize != 8 || (strcmp(fmt, "q") != 0 && strcmp(fmt, "l") != 0)) {
        PyErr_SetString(PyExc_TypeError, "bounds must be a contiguous int64 array");
        goto done;
    }
    Py_ssize_t count = bounds.len / 8 - 1;
    if (count < 0)
        count = 0;
    const int64_t *at = (const int64_t *)bounds.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (at[i] < 0 || at[i] > at[i + 1] || at[i + 1] > body.len) {
            PyErr_Format(PyExc_ValueError, "slice %zd [%lld, %lld) is not inside the body "
                         "of %zd bytes", i, (long long)at[i], (long long)at[i + 1], body.len);
            goto done;
        }
    }
    out = PyBytes_FromStringAndSize(NULL, 32 * count);
    if (out == NULL)
        goto done;
    unsigned char *digests = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *data = (const unsigned char *)body.buf;
    /* The buffers are held: writers may run meanwhile (the shipper's largest step). */
    Py_BEGIN_ALLOW_THREADS
    if (count)
        sha3_many(data + at[0], at, count, digests);
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&body);
    PyBuffer_Release(&bounds);
    return out;
}

/* event_list(): a new empty list the collector does not track, for a batch's events.
 * It only ever holds event tuples (names, row keys, values: what the store handed
 * back), which cannot lead back to it, so no cycle passes through it; untracked, the
 * hundred events a batch gathers are not traversed by every young collection. */
static PyObject *
event_list(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return untracked(PyList_New(0));
}

/* ---- event_columns: a shipment's event columns in Arrow's layout, in one pass -------- */


/* The bytes of `v` in its column: tagged (sinks.codec.encode_value) or, for the table
 * and column names, its UTF-8 alone. The size, or -1 for anything C leaves to Python
 * (the codec then encodes or refuses it, with its own error). */
static Py_ssize_t
column_size(PyObject *v, int tagged)
{
    PyTypeObject *kind = Py_TYPE(v);
    if (kind == &PyUnicode_Type) {
        Py_ssize_t n;
        if (PyUnicode_AsUTF8AndSize(v, &n) == NULL) {
            PyErr_Clear();
            return -1;
        }
        return n + tagged;
    }
    if (!tagged)
        return -1;
    if (kind == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
        return 9;
    }
    if (kind == &PyFloat_Type)
        return 9;
    if (v == Py_None)
        return 1;
    if (kind == &PyBool_Type)
        return 2;
    if (kind == &PyBytes_Type)
        return 1 + PyBytes_GET_SIZE(v);
    if (v == ABSENT_value)
        return 0;
    return -1;
}

/* Write `v` as column_size measured it (it passed there); return the end. */
static unsigned char *
put_column_value(unsigned char *p, PyObject *v, int tagged)
{
    PyTypeObject *kind = Py_TYPE(v);
    if (kind == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(v, &n);  /* cached by column_size */
        if (tagged)
            *p++ = 0x04;
        memcpy(p, utf8, (size_t)n);
        return p + n;
    }
    if (kind == &PyLong_Type) {
        *p = 0x02;
        put_be(p + 1, (uint64_t)PyLong_AsLongLong(v), 8);
        return p + 9;
    }
    if (kind == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        *p = 0x03;
        put_be(p + 1, bits, 8);
        return p + 9;
    }
    if (v == Py_None) {
        *p = 0x00;
        return p + 1;
    }
    if (kind == &PyBool_Type) {
        p[0] = 0x01;
        p[1] = v == Py_True;
        return p + 2;
    }
    if (kind == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        *p++ = 0x05;
        memcpy(p, PyBytes_AS_STRING(v), (size_t)n);
        return p + n;
    }
    return p;  /* ABSENT: no bytes */
}

/* event_columns(lists): the five variable columns (table, row, column, old, new) of the
 * events in `lists` (a list of lists of 5-tuples, in order) as Arrow buffers, a tuple
 * of five (offsets, data) bytes pairs (offsets: n + 1 native int32); the table and
 * column as UTF-8, the others tagged as sinks.codec.encode_value does. None when any
 * event is not a plain 5-tuple or holds anything else than the codec's exact types (or
 * a column would pass 2 GiB): the caller then encodes in Python, which refuses what
 * must be refused with the codec's own error. */
static PyObject *
event_columns(PyObject *module, PyObject *lists)
{
    if (ABSENT_value == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sequencer._native is not bound");
        return NULL;
    }
    if (!PyList_Check(lists)) {
        PyErr_SetString(PyExc_TypeError, "event_columns(lists: list[list[tuple]])");
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(lists), n = 0;
    int64_t total[5] = {0, 0, 0, 0, 0};
    for (Py_ssize_t k = 0; k < m; k++) {  /* pass 1: check every value, size each column */
        PyObject *events = PyList_GET_ITEM(lists, k);
        if (!PyList_Check(events))
            Py_RETURN_NONE;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
            PyObject *event = PyList_GET_ITEM(events, i);
            if (!PyTuple_CheckExact(event) || PyTuple_GET_SIZE(event) != 5)
                Py_RETURN_NONE;
            for (int c = 0; c < 5; c++) {
                Py_ssize_t size = column_size(PyTuple_GET_ITEM(event, c), c != 0 && c != 2);
                if (size < 0)
                    Py_RETURN_NONE;
                total[c] += size;
            }
            n++;
        }
    }
    for (int c = 0; c < 5; c++)
        if (total[c] > INT32_MAX)
            Py_RETURN_NONE;
    /* Bytes objects only until pass 2 is done: they are not the collector's, so no
     * collection (no finalizer, no Python code) can run and change the lists between
     * the passes. */
    PyObject *bufs[10] = {NULL};
    int32_t *offsets[5];
    unsigned char *data[5], *start[5];
    for (int c = 0; c < 5; c++) {
        bufs[2 * c] = PyBytes_FromStringAndSize(NULL, 4 * (n + 1));
        bufs[2 * c + 1] = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total[c]);
        if (bufs[2 * c] == NULL || bufs[2 * c + 1] == NULL) {
            for (int j = 0; j < 10; j++)
                Py_XDECREF(bufs[j]);
            return NULL;
        }
        offsets[c] = (int32_t *)PyBytes_AS_STRING(bufs[2 * c]);
        start[c] = data[c] = (unsigned char *)PyBytes_AS_STRING(bufs[2 * c + 1]);
        offsets[c][0] = 0;
    }
    Py_ssize_t row = 0;
    for (Py_ssize_t k = 0; k < m; k++) {  /* pass 2: what pass 1 checked, unchanged */
        PyObject *events = PyList_GET_ITEM(lists, k);
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++, row++) {
            PyObject *event = PyList_GET_ITEM(events, i);
            for (int c = 0; c < 5; c++) {
                data[c] = put_column_value(data[c], PyTuple_GET_ITEM(event, c), c != 0 && c != 2);
                offsets[c][row + 1] = (int32_t)(data[c] - start[c]);
            }
        }
    }
    PyObject *result = PyTuple_New(5);
    for (int c = 0; c < 5 && result != NULL; c++) {
        PyObject *pair = PyTuple_Pack(2, bufs[2 * c], bufs[2 * c + 1]);
        if (pair == NULL)
            Py_CLEAR(result);
        else
            PyTuple_SET_ITEM(result, c, pair);
    }
    for (int j = 0; j < 10; j++)
        Py_DECREF(bufs[j]);
    return result;
}

/* ---- table_runs: a shipment's per-table counts, per run of one table -------------- */

/* table_runs(lists): the runs of one table in each segment of `lists` (a list of lists
 * of events, 5-tuples whose first item is the table's str), for agent._tally: a tuple
 * (names, segments, counts): names a list of str, one per run; segments and counts
 * bytes of native int64, the run's segment index and its number of events. A run ends
 * where the segment ends or the table changes (equal strs are one table, whether or not
 * they are one object). None when an event is not a 5-tuple with a str table: the
 * shipper then tallies event by event. The Python reference: agent._tally.table_runs. */
static PyObject *
table_runs(PyObject *module, PyObject *lists)
{
    if (!PyList_Check(lists)) {
        PyErr_SetString(PyExc_TypeError, "table_runs(lists: list[list[tuple]])");
        return NULL;
    }
    Py_ssize_t m = PyList_GET_SIZE(lists), runs = 0;
    for (Py_ssize_t k = 0; k < m; k++) {  /* pass 1: check, and count the runs */
        PyObject *events = PyList_GET_ITEM(lists, k), *prev = NULL;
        if (!PyList_Check(events))
            Py_RETURN_NONE;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
            PyObject *event = PyList_GET_ITEM(events, i);
            if (!PyTuple_CheckExact(event) || PyTuple_GET_SIZE(event) != 5
                    || !PyUnicode_CheckExact(PyTuple_GET_ITEM(event, 0)))
                Py_RETURN_NONE;
            PyObject *table = PyTuple_GET_ITEM(event, 0);
            if (prev == NULL || (table != prev && PyUnicode_Compare(table, prev) != 0))
                runs++;
            prev = table;
        }
    }
    PyObject *names = PyList_New(runs);
    PyObject *segs = PyBytes_FromStringAndSize(NULL, 8 * runs);
    PyObject *counts = PyBytes_FromStringAndSize(NULL, 8 * runs);
    if (names == NULL || segs == NULL || counts == NULL) {
        Py_XDECREF(names);
        Py_XDECREF(segs);
        Py_XDECREF(counts);
        return NULL;
    }
    int64_t *seg = (int64_t *)PyBytes_AS_STRING(segs), *count = (int64_t *)PyBytes_AS_STRING(counts);
    Py_ssize_t r = -1;
    /* pass 2: allocating the names list may have run a collection (and so Python code)
     * since pass 1: everything is checked again, and a change gives None */
    int changed = PyList_GET_SIZE(lists) != m;
    for (Py_ssize_t k = 0; k < m && !changed; k++) {
        PyObject *events = PyList_GET_ITEM(lists, k), *prev = NULL;
        changed = !PyList_Check(events);
        for (Py_ssize_t i = 0; !changed && i < PyList_GET_SIZE(events); i++) {
            PyObject *event = PyList_GET_ITEM(events, i);
            if (!PyTuple_CheckExact(event) || PyTuple_GET_SIZE(event) != 5
                    || !PyUnicode_CheckExact(PyTuple_GET_ITEM(event, 0))) {
                changed = 1;
                break;
            }
            PyObject *table = PyTuple_GET_ITEM(event, 0);
            if (prev == NULL || (table != prev && PyUnicode_Compare(table, prev) != 0)) {
                if (++r >= runs) {
                    changed = 1;
                    break;
                }
                Py_INCREF(table);
                PyList_SET_ITEM(names, r, table);
                seg[r] = k;
                count[r] = 0;
            }
            count[r]++;
            prev = table;
        }
    }
    PyObject *result = (changed || r + 1 != runs) ? Py_NewRef(Py_None)
                       : PyTuple_Pack(3, names, segs, counts);
    Py_DECREF(names);
    Py_DECREF(segs);
    Py_DECREF(counts);
    return result;
}

/* ---- tag_faults: sinks.codec's check of a column of tagged keys or values ----------- */

/* Whether s[0:n] is UTF-8 as Python's strict decoder takes it (RFC 3629: no overlong
 * form, no surrogate, nothing past U+10FFFF). */
static int
strict_utf8(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t need;
        unsigned char lo = 0x80, hi = 0xBF;  /* the first continuation byte's range */
        if (c >= 0xC2 && c <= 0xDF)
            need = 1;
        else if (c == 0xE0)
            need = 2, lo = 0xA0;
        else if (c == 0xED)
            need = 2, hi = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF)
            need = 2;
        else if (c == 0xF0)
            need = 3, lo = 0x90;
        else if (c == 0xF4)
            need = 3, hi = 0x8F;
        else if (c >= 0xF1 && c <= 0xF3)
            need = 3;
        else
            return 0;
        if (n - i - 1 < need || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (Py_ssize_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += need + 1;
    }
    return 1;
}

/* One column of tagged keys (kind 0) or values (1: ABSENT allowed, 2: not), `count`
 * entries at `at` (int32 offsets, count + 1 of them) into `data` (`len` bytes): 0 with
 * *bad_tag (the first entry whose tag or length is wrong, or -1) and *bad_text (a str
 * entry is not UTF-8) set, or -1 with the error set for an entry outside the data. */
static int
column_tag_faults(const int32_t *at, Py_ssize_t count, const unsigned char *data,
                  Py_ssize_t len, long kind, Py_ssize_t *bad_tag, int *bad_text)
{
    *bad_tag = -1;
    *bad_text = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int32_t a = at[i], b = at[i + 1];
        if (a < 0 || b < a || b > len) {
            PyErr_Format(PyExc_ValueError, "entry %zd [%d, %d) is not inside the data of "
                         "%zd bytes", i, (int)a, (int)b, len);
            return -1;
        }
        Py_ssize_t length = b - a;
        int ok;
        if (length == 0) {
            ok = kind == 1;
        } else {
            unsigned char tag = data[a];
            if (kind == 0)
                ok = (tag == 0x02 && length == 9) || tag == 0x04;
            else
                ok = (tag == 0x00 && length == 1)
                     || (tag == 0x01 && length == 2 && data[a + 1] <= 1)
                     || ((tag == 0x02 || tag == 0x03) && length == 9)
                     || tag == 0x04 || tag == 0x05;
            if (tag == 0x04 && !*bad_text && !strict_utf8(data + a + 1, length - 1))
                *bad_text = 1;
        }
        if (!ok && *bad_tag < 0)
            *bad_tag = i;
    }
    return 0;
}

/* tag_faults(offsets, body, kind): one Arrow binary column (int32 offsets, count + 1 of
 * them, and its data) checked as sinks.codec._check_tags does, in one pass: None when
 * every entry is well formed, else (the first entry whose tag or length is wrong, or -1;
 * whether a str entry is not UTF-8). */
static PyObject *
tag_faults(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "tag_faults(offsets, body, kind)");
        return NULL;
    }
    long kind = PyLong_AsLong(args[2]);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    if (kind < 0 || kind > 2) {
        PyErr_SetString(PyExc_ValueError, "kind must be 0 (keys), 1 or 2 (values)");
        return NULL;
    }
    Py_buffer offsets, body;
    if (PyObject_GetBuffer(args[0], &offsets, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &body, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&offsets);
        return NULL;
    }
    PyObject *out = NULL;
    if (offsets.len % 4 != 0 || offsets.len < 4) {
        PyErr_SetString(PyExc_ValueError, "offsets must hold count + 1 int32 values");
        goto done;
    }
    Py_ssize_t bad_tag;
    int bad_text;
    if (column_tag_faults((const int32_t *)offsets.buf, offsets.len / 4 - 1,
                          (const unsigned char *)body.buf, body.len, kind, &bad_tag,
                          &bad_text) < 0)
        goto done;
    out = (bad_tag < 0 && !bad_text) ? Py_NewRef(Py_None)
                                     : Py_BuildValue("(nO)", bad_tag, bad_text ? Py_True : Py_False);
done:
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&body);
    return out;
}

/* ---- batch_faults: nulls and tags of a whole record batch, through its C export ------ */

/* The Arrow C data interface's array (its ABI is fixed by the Arrow format). */
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* The nulls of one exported column: its count if known, else counted in its bitmap. */
static int64_t
column_nulls(const struct ArrowArray *column, int64_t start)
{
    if (column->null_count >= 0)
        return column->null_count;
    const unsigned char *bits = column->n_buffers > 0 ? column->buffers[0] : NULL;
    if (bits == NULL)
        return 0;
    int64_t nulls = 0;
    for (int64_t i = start; i < start + column->length; i++)
        nulls += !((bits[i >> 3] >> (i & 7)) & 1);
    return nulls;
}

/* batch_faults(array_capsule, kinds): the record batch exported in the capsule (an
 * "arrow_array" PyCapsule: RecordBatch.__arrow_c_array__()[1]), already validated in
 * full, checked as sinks.codec._check_tags does: no column holds a null, and each
 * column i with kinds[i] in 0..2 is a binary column of tagged keys or values as
 * tag_faults checks. None when all is well; False when the layout is not the plain one
 * this reads (Python checks it); else (column, first bad entry or -1, str not UTF-8),
 * with -2 as the entry for a column that holds nulls. */
static PyObject *
batch_faults(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "batch_faults(array_capsule, kinds: bytes)");
        return NULL;
    }
    const struct ArrowArray *batch = PyCapsule_GetPointer(args[0], "arrow_array");
    if (batch == NULL)
        return NULL;
    const unsigned char *kinds = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    if (batch->release == NULL || batch->offset != 0
        || batch->n_children != PyBytes_GET_SIZE(args[1]))
        Py_RETURN_FALSE;
    for (int64_t i = 0; i < batch->n_children; i++) {
        const struct ArrowArray *column = batch->children[i];
        if (column->length != batch->length)
            Py_RETURN_FALSE;
        if (column_nulls(column, column->offset) > 0)
            return Py_BuildValue("(LnO)", (long long)i, (Py_ssize_t)-2, Py_False);
    }
    for (int64_t i = 0; i < batch->n_children; i++) {
        if (kinds[i] > 2)
            continue;
        const struct ArrowArray *column = batch->children[i];
        if (column->n_buffers != 3 || column->buffers[1] == NULL)
            Py_RETURN_FALSE;
        const int32_t *at = (const int32_t *)column->buffers[1] + column->offset;
        const unsigned char *data = column->buffers[2];
        /* Validated in full: the offsets lie inside the data, which ends at the last. */
        Py_ssize_t len = column->length ? at[column->length] : 0;
        if (data == NULL && len > 0)
            Py_RETURN_FALSE;
        Py_ssize_t bad_tag;
        int bad_text;
        if (column_tag_faults(at, (Py_ssize_t)column->length, data, len, kinds[i],
                              &bad_tag, &bad_text) < 0)
            return NULL;
        if (bad_tag >= 0 || bad_text)
            return Py_BuildValue("(LnO)", (long long)i, bad_tag, bad_text ? Py_True : Py_False);
    }
    Py_RETURN_NONE;
}

/* ---- the module ---------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"transpose", (PyCFunction)(void (*)(void))transpose, METH_FASTCALL,
     "transpose(rows, width): the columns of a list of width-tuples, as a tuple of lists."},
    {"epoch_fields", epoch_fields, METH_O,
     "epoch_fields(records): the fields of epoch records as column buffers, or None "
     "for records of another shape (replay._epoch_columns)."},
    {"sha3_segments", (PyCFunction)(void (*)(void))sha3_segments, METH_FASTCALL,
     "sha3_segments(bounds, domains, batches, seqs, columns): the SHA3-256 digests of "
     "the segments' setsum items (sinks.codec's layout), built and hashed in C."},
    {"setsum_fault", (PyCFunction)(void (*)(void))setsum_fault, METH_FASTCALL,
     "setsum_fault(digests, owner, lanes, kinds, primes): the first epoch whose setsum "
     "is not its segments' (-1: none)."},
    {"sha3_lanes", (PyCFunction)(void (*)(void))sha3_lanes, METH_FASTCALL,
     "sha3_lanes([lanes]): how many messages the SHA3 helpers hash at once: 4 (AVX2) or "
     "1; with an argument, set it and return the old one."},
    {"sha3_slices", (PyCFunction)(void (*)(void))sha3_slices, METH_FASTCALL,
     "sha3_slices(body, bounds): the SHA3-256 digests of body[bounds[i]:bounds[i + 1]], "
     "concatenated (bounds: a contiguous int64 array); the GIL is released meanwhile."},
    {"tag_faults", (PyCFunction)(void (*)(void))tag_faults, METH_FASTCALL,
     "tag_faults(offsets, body, kind): a column of tagged keys (kind 0) or values (1: "
     "ABSENT allowed, 2: not) checked as sinks.codec does: None, or (first entry with a "
     "wrong tag or length or -1, whether a str entry is not UTF-8)."},
    {"batch_faults", (PyCFunction)(void (*)(void))batch_faults, METH_FASTCALL,
     "batch_faults(array_capsule, kinds): nulls and tagged columns of an exported record "
     "batch checked in one call: None, False (not a layout read here), or (column, first "
     "bad entry, -1 or -2 for nulls, whether a str is not UTF-8)."},
    {"event_list", event_list, METH_NOARGS,
     "event_list(): a new empty list untracked by the collector (a batch's events)."},
    {"event_columns", event_columns, METH_O,
     "event_columns(lists): the table, row, column, old and new columns of the events "
     "in lists (of lists of 5-tuples) as Arrow (offsets, data) buffers, or None: "
     "encode them in Python (sinks.codec)."},
    {"table_runs", table_runs, METH_O,
     "table_runs(lists): each segment's runs of one table, as (names, segments, counts) "
     "(int64 bytes), or None for events of another shape (agent._tally)."},
    {"bind_checks", bind_checks, METH_VARARGS,
     "bind_checks(known_names, check_write, ABSENT): the set of names already checked, "
     "the checks CellWriter calls for anything else, and ABSENT (for event_columns); "
     "sequencer._accel calls it once."},
    {"bind", bind, METH_VARARGS,
     "bind(BatchTicket, EpochClosed, SequencerError, QUIESCENT, TWO): the Python types "
     "and names the native types return (sequencer._accel calls it once)."},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sequencer._native",
    "MonotonicIds and EpochSequencer in C (see sequencer._accel).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&IdsType) < 0 || PyType_Ready(&SeqType) < 0)
        return NULL;
    choose_sha3();
    if (PyType_Ready(&WriterType) < 0 || PyType_Ready(&CellWriterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "MonotonicIds", (PyObject *)&IdsType) < 0
        || PyModule_AddObjectRef(m, "EpochSequencer", (PyObject *)&SeqType) < 0
        || PyModule_AddObjectRef(m, "UnscopedWriter", (PyObject *)&WriterType) < 0
        || PyModule_AddObjectRef(m, "CellWriter", (PyObject *)&CellWriterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
