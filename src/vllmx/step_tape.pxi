# Step tapes (csrc/engine/step_tape.h), included in _C.pyx. While a thread records, the op
# table's dispatcher appends every op that thread calls to the tape (and still runs it); the
# binding (op_table.pxi) notes the arrays each call read and wrote, for the capture's planning.

cdef extern from "engine/step_tape.h" namespace "vllmx" nogil:
    cdef cppclass CStepTape "vllmx::StepTape":
        void replay() except +
        void relocate(const void*, int64_t, void*)
        int64_t size()

cdef extern from "core/op_table.h" namespace "vllmx" nogil:
    void set_recording_tape(CStepTape*)
    CStepTape* recording_tape()


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


cdef StepTape _recording = None


def record_begin(StepTape tape):
    """Ops called by this thread from now on are appended to tape (and still run); other
    threads' ops run as usual."""
    global _recording
    if _recording is not None:
        raise RuntimeError("a step tape is already being recorded")
    _recording = tape
    set_recording_tape(&tape.c)


def record_end():
    global _recording
    set_recording_tape(NULL)
    _recording = None
