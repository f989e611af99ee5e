package main

import (
	"github.com/spf13/pflag"

	"github.com/gpu-mem/gpu-mem/profiler"
)

// targetFlags are the flags that say what to trace, shared by every command.
type targetFlags struct {
	pids    []int
	gpus    []int
	library string
	tensors bool
	// tensorNative walks tensors' whole native stacks.
	tensorNative bool
}

func (t *targetFlags) register(fs *pflag.FlagSet) {
	fs.IntSliceVar(&t.pids, "pid", nil, "trace only these processes (repeat or comma-separate)")
	fs.IntSliceVar(&t.gpus, "gpu", nil, "show only memory on these device ordinals (repeat or comma-separate)")
	fs.StringVar(&t.library, "library", "", "attach to this driver library only and trace the processes that map it, instead of finding every libcuda.so* mapped by a process")
	fs.BoolVar(&t.tensors, "tensors", true, "also trace PyTorch's caching allocator (libc10_cuda.so): the tensor view, about 2 us per tensor")
	fs.BoolVar(&t.tensorNative, "tensor-native-stacks", false, "walk the whole native stack (ATen, bindings) of tensors allocated from Python, not only the allocator's frame")
}

func (t *targetFlags) config() profiler.Config {
	return profiler.Config{PIDs: t.pids, GPUs: t.gpus, Library: t.library, NoTensors: !t.tensors, TensorNativeStacks: t.tensorNative, Logf: logf}
}
