# The op table (csrc/core/op_table.h), included last in _C.pyx: one generic binding for every
# op that csrc/ops.def declares. `ops.rms_norm(out, x, w, eps)` converts the arguments by the
# op's declared parameters and calls the dispatcher with the GIL released; the dispatcher checks
# them, picks the tensors' device and records into the step tape this thread records.
from cython.operator cimport dereference as deref
from libcpp.string cimport string as cpp_string
from libcpp.vector cimport vector as cpp_vector

cdef extern from "core/op_table.h" namespace "vllmx":
    cdef enum OpArgKind "vllmx::OpArg::Kind":
        kTensor "vllmx::OpArg::kTensor"
        kInt "vllmx::OpArg::kInt"
        kFloat "vllmx::OpArg::kFloat"
        kBool "vllmx::OpArg::kBool"
    cdef cppclass OpArg "vllmx::OpArg":
        OpArgKind kind
        Tensor t
        int64_t i
        double f
    cdef cppclass OpParam "vllmx::OpParam":
        cpp_string name
        OpArgKind kind
        bint read
        bint written
        bint optional
        bint has_default
        OpArg default_value
    cdef cppclass Kernel "vllmx::Kernel":
        void* fn
        bint has_reference
    cdef cppclass OpDef "vllmx::OpDef":
        cpp_string name
        cpp_vector[OpParam] params
        Kernel kernels[2]
    const int kMaxOpArgs "vllmx::kMaxOpArgs"
    const OpDef* find_op(const cpp_string&) except +
    cpp_vector[const OpDef*] all_ops() except +
    void call_op(const OpDef&, const OpArg*, int64_t, bint) except + nogil


_KIND_NAMES = {kTensor: "tensor", kInt: "int", kFloat: "float", kBool: "bool"}


cdef Tensor _op_tensor(object a) except *:
    """A tensor argument: a numpy array, a DeviceArray, (array, dtype id) for bf16 and block
    types, or None (an absent optional tensor)."""
    if isinstance(a, tuple):
        if len(a) != 2:
            raise TypeError("a typed tensor argument is (array, dtype id)")
        return as_tensor(a[0], a[1])
    return as_tensor(a)


cdef class Op:
    """One op of the table, callable with its declared parameters (positional or by name) and
    `reference=True` for the CPU kernel's scalar twin."""
    cdef const OpDef* d
    cdef readonly str name
    cdef readonly tuple param_names
    cdef dict index

    def __init__(self, str name):
        self.d = find_op(name.encode())
        if self.d == NULL:
            raise AttributeError(f"vllmx has no op {name!r} (csrc/ops.def declares them)")
        if self.d.params.size() > kMaxOpArgs or kMaxOpArgs != 24:
            raise RuntimeError(f"{name}: more parameters than the binding's argument array")
        self.name = name
        self.param_names = tuple(self.d.params[j].name.decode()
                                 for j in range(<Py_ssize_t>self.d.params.size()))
        self.index = {n: i for i, n in enumerate(self.param_names)}

    @property
    def schema(self):
        """[(name, kind, read, written, optional)] as ops.def declares them."""
        cdef const OpParam* p
        out = []
        for j in range(<Py_ssize_t>self.d.params.size()):
            p = &self.d.params[j]
            out.append((p.name.decode(), _KIND_NAMES[p.kind], p.read, p.written, p.optional))
        return out

    def has_kernel(self, str device):
        """Whether this build has a kernel for device ("cpu" or "cuda")."""
        return self.d.kernels[1 if device == "cuda" else 0].fn != NULL

    def __call__(self, *args, bint reference=False, **kwargs):
        cdef const OpDef* d = self.d
        cdef Py_ssize_t n = d.params.size(), j
        cdef OpArg a[24]  # kMaxOpArgs (csrc/core/op_table.h), checked when the Op is made
        cdef const OpParam* p
        if len(args) > n:
            raise TypeError(f"{self.name}() takes {n} arguments, got {len(args)}")
        if not kwargs and len(args) == n:
            values = args  # every argument given in order: the common case, no copy
        else:
            values = list(args) + [_MISSING] * (n - len(args))
        for key, v in kwargs.items():
            j = self.index.get(key, -1)
            if j < 0:
                raise TypeError(f"{self.name}() has no parameter {key!r}")
            if values[j] is not _MISSING:
                raise TypeError(f"{self.name}() got {key!r} twice")
            values[j] = v
        for j in range(n):
            p = &d.params[j]
            v = values[j]
            if v is _MISSING:
                if p.has_default:
                    a[j] = p.default_value
                    continue
                if p.kind == kTensor and p.optional:
                    v = None
                else:
                    raise TypeError(f"{self.name}() missing argument {p.name.decode()!r}")
            a[j].kind = p.kind
            if p.kind == kTensor:
                a[j].t = _op_tensor(v)
            elif p.kind == kFloat:
                a[j].f = v
            else:
                a[j].i = v
        if _recording is not None and recording_tape() != NULL:
            _recording.calls.append((self.name, _arrays(values, d, True),
                                     _arrays(values, d, False)))
        with nogil:
            call_op(deref(d), a, n, reference)

    def __repr__(self):
        return f"<vllmx op {self.name}({', '.join(self.param_names)})>"


_MISSING = object()


cdef tuple _arrays(object values, const OpDef* d, bint reads):
    """The arrays behind the tensor arguments that the op reads (or writes)."""
    out = []
    cdef Py_ssize_t j
    for j in range(<Py_ssize_t>d.params.size()):
        if d.params[j].kind != kTensor or values[j] is None or values[j] is _MISSING:
            continue
        if (d.params[j].read if reads else d.params[j].written):
            v = values[j]
            out.append(v[0] if isinstance(v, tuple) else v)
    return tuple(out)


def op_names():
    """Every op the table declares (csrc/ops.def), sorted."""
    return sorted(d.name.decode() for d in all_ops())


class _Ops:
    """`vllmx._C.ops.<name>`: one Op per declared op, made at import as plain attributes (an
    attribute lookup per call, nothing more)."""

    def __init__(self):
        for name in op_names():
            setattr(self, name, Op(name))

    def __getattr__(self, name):  # only reached for names that are no op
        raise AttributeError(f"vllmx has no op {name!r} (csrc/ops.def declares them)")


ops = _Ops()
