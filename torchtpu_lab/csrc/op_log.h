// A profile's op records, kept in C: `OpLog`, one object in a recorder's list standing for a run of consecutive
// op records that the recording kernel noted there (telemetry.expand turns it into the same events as the
// flat records telemetry.record_op appends).
//
// Why: a profile notes every op. As Python objects that was three floats and seven list appends an op, and the
// lists' teardown after; a profiled tiny transformer step records ~420 ops. Here a record is a struct pushed on a
// vector, holding references to objects that exist already (the op's name, its line and its interned stack).
#pragma once

#include <Python.h>

namespace torchtpu {

// Adds the `OpLog` type to `module` (-1 with a Python error set on failure).
int add_op_log_type(PyObject* module);

// Notes one op record (name, t, dur, cache_hit, source, stack; telemetry.OP_FIELDS' order) at the end of `sink`,
// a recorder's list: into the OpLog that ends it, else into a new one appended. 0, or -1 with a Python error set.
int log_op(PyObject* sink, PyObject* name, double t, double dur, PyObject* hit, PyObject* source, PyObject* stack);

}  // namespace torchtpu
