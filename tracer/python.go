// The Python processes whose frames the BPF program walks.

package tracer

import (
	"fmt"
)

// PythonWalk tells the BPF program how to walk one process's interpreter:
// the address of _PyRuntime and the field offsets (struct gpumem_python).
type PythonWalk = gpumemGpumemPython

// PyNoField marks a field a Python version lacks.
const PyNoField = 0xffff

// AddPython makes the BPF program capture the Python frames of process pid.
func (t *Tracer) AddPython(pid uint32, walk PythonWalk) error {
	t.pythonMu.Lock()
	defer t.pythonMu.Unlock()
	if err := t.objs.PythonProcs.Put(pid, walk); err != nil {
		return fmt.Errorf("register python process %d: %w", pid, err)
	}
	return t.bumpPythonGeneration()
}

// RemovePython forgets an exited Python process.
func (t *Tracer) RemovePython(pid uint32) {
	t.pythonMu.Lock()
	defer t.pythonMu.Unlock()
	if t.objs.PythonProcs.Delete(pid) == nil {
		_ = t.bumpPythonGeneration() // an array's one entry: its update fails only with the map
	}
}

// bumpPythonGeneration has every thread read its process's entry of
// python_procs again: the BPF program keeps a copy per thread. Under
// pythonMu (or in setup, before the tracer is shared), so that the
// generations follow the changes in order.
func (t *Tracer) bumpPythonGeneration() error {
	t.pythonGeneration++
	if err := t.objs.PythonGeneration.Put(uint32(0), t.pythonGeneration); err != nil {
		return fmt.Errorf("announce a change of python processes: %w", err)
	}
	return nil
}
