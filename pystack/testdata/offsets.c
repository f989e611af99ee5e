/* Prints the offsets gpu-mem reads, from a CPython version's own internal
 * headers: TestLayoutsMatchHeaders compares them with layout.go. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#endif
#include "internal/pycore_code.h"
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#include "internal/pycore_moduleobject.h"
#endif
#define P(name, expr) printf("%s=%zu\n", name, (size_t)(expr))
int main(void) {
	P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
	P("interp_next", offsetof(PyInterpreterState, next));
#if PY_VERSION_HEX < 0x030B0000
	P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#else
	P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#endif
	P("tstate_next", offsetof(PyThreadState, next));
	P("tstate_interp", offsetof(PyThreadState, interp));
	P("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX < 0x030B0000
	P("tstate_frame", offsetof(PyThreadState, frame));
	P("frame_previous", offsetof(PyFrameObject, f_back));
	P("frame_code", offsetof(PyFrameObject, f_code));
	P("frame_instr", offsetof(PyFrameObject, f_lasti));
	P("frame_localsplus", offsetof(PyFrameObject, f_localsplus));
	P("type_flags", offsetof(PyTypeObject, tp_flags));
	P("code_varnames", offsetof(PyCodeObject, co_varnames));
	P("interp_modules", offsetof(PyInterpreterState, modules));
	P("module_dict", offsetof(PyModuleObject, md_dict));
	P("type_dict", offsetof(PyTypeObject, tp_dict));
	P("type_mro", offsetof(PyTypeObject, tp_mro));
	P("heap_type_qualname", offsetof(PyHeapTypeObject, ht_qualname));
	P("dict_version", offsetof(PyDictObject, ma_version_tag));
	P("dict_keys", offsetof(PyDictObject, ma_keys));
	P("dict_values", offsetof(PyDictObject, ma_values));
	P("func_code", offsetof(PyFunctionObject, func_code));
	P("func_qualname", offsetof(PyFunctionObject, func_qualname));
#elif PY_VERSION_HEX < 0x030D0000
	P("tstate_frame", offsetof(PyThreadState, cframe));
	P("tstate_datastack_chunk", offsetof(PyThreadState, datastack_chunk));
	P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
	P("frame_previous", offsetof(_PyInterpreterFrame, previous));
	P("frame_code", offsetof(_PyInterpreterFrame, f_code));
	P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
	P("frame_owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030C0000
	P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
	P("code_qualname", offsetof(PyCodeObject, co_qualname));
	P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#else
	P("tstate_frame", offsetof(PyThreadState, current_frame));
	P("tstate_datastack_chunk", offsetof(PyThreadState, datastack_chunk));
	P("frame_previous", offsetof(_PyInterpreterFrame, previous));
	P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
	P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
	P("frame_owner", offsetof(_PyInterpreterFrame, owner));
	P("code_qualname", offsetof(PyCodeObject, co_qualname));
	P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#endif
	P("code_filename", offsetof(PyCodeObject, co_filename));
	P("code_name", offsetof(PyCodeObject, co_name));
	P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
	P("code_linetable", offsetof(PyCodeObject, co_linetable));
	P("unicode_ascii_size", sizeof(PyASCIIObject));
	P("unicode_compact_size", sizeof(PyCompactUnicodeObject));
	P("bytes_sval", offsetof(PyBytesObject, ob_sval));
	P("tuple_item", offsetof(PyTupleObject, ob_item));
	P("type_name", offsetof(PyTypeObject, tp_name));
	return 0;
}
