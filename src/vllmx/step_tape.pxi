# Step tapes (csrc/step_tape.h), included in _C.pyx before the ops: while a thread records,
# each recordable op_* below appends itself to the tape and still runs; any other array op
# raises, so that nothing a tape cannot replay slips into a captured forward.
from cpython.pythread cimport PyThread_get_thread_ident

cdef extern from "step_tape.h" namespace "vllmx" nogil:
    cdef cppclass CStepTape "vllmx::StepTape":
        void embedding(const Tensor&, const Tensor&, const Tensor&, bool)
        void linear(const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool)
        void rms_norm(const Tensor&, const Tensor&, const Tensor&, float, bool)
        void fused_add_rms_norm(const Tensor&, const Tensor&, const Tensor&, float, bool)
        void rotary(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, bool,
                    bool)
        void silu_and_mul(const Tensor&, const Tensor&, bool)
        void gelu_and_mul(const Tensor&, const Tensor&, bool, bool)
        void write_kv_cache(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, bool)
        void paged_attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor&, float, int64_t, float,
                             bool)
        void copy_columns(const Tensor&, int64_t, const Tensor&, int64_t, int64_t)
        void scale(const Tensor&, const Tensor&, float)
        void replay() except +
        void relocate(const void*, int64_t, void*)
        int64_t size()


cdef class StepTape:
    """A recorded op sequence (see vllmx.worker.step_capture). `calls` lists, per recorded op,
    (name, arrays read, arrays written) for the capture's planning; `keep` holds the arrays the
    recorded views point into, for as long as the tape lives."""
    cdef CStepTape c
    cdef public list calls
    cdef public list keep

    def __init__(self):
        self.calls = []
        self.keep = []

    def __len__(self):
        return self.c.size()

    def replay(self):
        with nogil:
            self.c.replay()

    def relocate(self, size_t begin, int64_t nbytes, size_t to):
        """Repoints every recorded view into [begin, begin + nbytes) to the same offset from to."""
        self.c.relocate(<const void*>begin, nbytes, <void*>to)

    cdef void note(self, str name, tuple reads, tuple writes):
        self.calls.append((name, reads, writes))


cdef StepTape _recording = None
cdef unsigned long _recording_thread = 0


cdef inline StepTape _tape():
    """The tape the calling thread records into, or None (other threads' ops run as usual)."""
    if _recording is not None and PyThread_get_thread_ident() == _recording_thread:
        return _recording
    return None


cdef inline _not_recordable(str op):
    if _tape() is not None:
        raise RuntimeError(f"{op} cannot run inside a recorded step (a step tape replays only "
                           f"the model forward's ops)")


def record_begin(StepTape tape):
    """Ops called by this thread from now on are appended to tape (and still run)."""
    global _recording, _recording_thread
    if _recording is not None:
        raise RuntimeError("a step tape is already being recorded")
    _recording, _recording_thread = tape, PyThread_get_thread_ident()


def record_end():
    global _recording
    _recording = None
