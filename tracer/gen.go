// Package tracer loads program.bpf.c, attaches its uprobes to CUDA driver
// libraries and reads the driver calls it reports.
package tracer

// The BPF object is generated from the gadget's program.bpf.c and committed,
// so that `go build` needs no clang. `make generate` runs this with IG set to
// the Inspektor Gadget module directory (its BPF headers).
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target amd64 -type gpumem_event -type gpumem_tensor_free -type gpumem_calls -type gpumem_call -type gpumem_op -type gpumem_python -type gpumem_pyframe -type gpumem_stack_flag -type gpumem_pyframe_flag -type gpumem_ctx_stack -type gpumem_event_type -type gpumem_loss -type gpumem_stack_key -type gpumem_stack -type gpumem_process -type gpumem_process_key -type gpumem_usdt_site -type gpumem_usdt_arg_kind gpumem ../program.bpf.c -- -I.. -isystem ${IG}/include/gadget/amd64 -isystem ${IG}/include -D__TARGET_ARCH_x86
