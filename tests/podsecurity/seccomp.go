package podsecurity

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"unsafe"

	"github.com/containerd/containerd/contrib/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// RuntimeDefault is the seccomp profile containerd applies to a container
// with capabilities caps (Kubernetes' names) for seccompProfile
// RuntimeDefault: containerd's own generator, the one AKS's nodes run.
func RuntimeDefault(caps []string) *specs.LinuxSeccomp {
	bounding := make([]string, len(caps))
	for i, c := range caps {
		bounding[i] = "CAP_" + c
	}
	return seccomp.DefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: bounding}}})
}

// filterEnv carries a compiled filter to the process that installs it
// (this package's init, in a test binary run again) before it runs the
// command.
const filterEnv = "PODSECURITY_SECCOMP_FILTER"

func init() {
	encoded := os.Getenv(filterEnv)
	if encoded == "" {
		return
	}
	// During init the main goroutine holds the main thread: the filter
	// is installed on the thread that then runs execve.
	if err := installFilter(encoded); err != nil {
		fmt.Fprintf(os.Stderr, "podsecurity: %v\n", err)
		os.Exit(125)
	}
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, filterEnv+"=") {
			env = append(env, kv)
		}
	}
	path, err := exec.LookPath(os.Args[1])
	if err == nil {
		err = unix.Exec(path, os.Args[1:], env)
	}
	fmt.Fprintf(os.Stderr, "podsecurity: exec %s: %v\n", os.Args[1], err)
	os.Exit(126)
}

func installFilter(encoded string) error {
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil || len(raw)%8 != 0 {
		return fmt.Errorf("bad filter: %v", err)
	}
	filter := make([]unix.SockFilter, len(raw)/8)
	for i := range filter {
		b := raw[i*8:]
		filter[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.LittleEndian.Uint32(b[4:])}
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	// Without CAP_SYS_ADMIN the kernel takes a filter only under
	// no_new_privs, which allowPrivilegeEscalation: false sets.
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		return fmt.Errorf("install seccomp filter: %w", err)
	}
	return nil
}

// compile turns an OCI seccomp profile into classic BPF for x86-64, as
// libseccomp would: rules in order, the first whose syscall and argument
// conditions match gives its action; others get the default action.
// Syscalls this kernel's headers do not name (other architectures') are
// left out, as libseccomp leaves them.
func compile(p *specs.LinuxSeccomp) ([]unix.SockFilter, error) {
	numbers, err := syscallNumbers("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
	if err != nil {
		return nil, err
	}
	def, err := action(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, err
	}
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jgt  = unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		and  = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
		fail = 255 // a jump to the block's end, resolved below
	)
	ins := func(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf}
	}
	// Another architecture, or x32's numbers: the default action.
	prog := []unix.SockFilter{
		ins(ld, 4, 0, 0), ins(jeq, unix.AUDIT_ARCH_X86_64, 1, 0), ins(ret, def, 0, 0),
		ins(ld, 0, 0, 0), ins(jge, 0x40000000, 0, 1), ins(ret, def, 0, 0),
	}
	for _, rule := range p.Syscalls {
		act, err := action(rule.Action, rule.ErrnoRet)
		if err != nil {
			return nil, err
		}
		for _, name := range rule.Names {
			nr, ok := numbers[name]
			if !ok {
				continue
			}
			// One block: the number, each argument's condition, the
			// action; a condition not met jumps to the next block.
			block := []unix.SockFilter{ins(ld, 0, 0, 0), ins(jeq, nr, 0, fail)}
			for _, a := range rule.Args {
				lo, hi := uint32(a.Value), uint32(a.Value>>32)
				word := func(high bool) unix.SockFilter {
					off := 16 + 8*uint32(a.Index)
					if high {
						off += 4
					}
					return ins(ld, off, 0, 0)
				}
				switch a.Op {
				case specs.OpEqualTo:
					block = append(block, word(true), ins(jeq, hi, 0, fail), word(false), ins(jeq, lo, 0, fail))
				case specs.OpMaskedEqual: // (arg & Value) == ValueTwo
					block = append(block, word(true), ins(and, hi, 0, 0), ins(jeq, uint32(a.ValueTwo>>32), 0, fail),
						word(false), ins(and, lo, 0, 0), ins(jeq, uint32(a.ValueTwo), 0, fail))
				case specs.OpLessThan: // high < hi, or equal and low < lo
					block = append(block, word(true), ins(jgt, hi, fail, 0), ins(jeq, hi, 0, 2),
						word(false), ins(jge, lo, fail, 0))
				case specs.OpGreaterThan: // high > hi, or equal and low > lo
					block = append(block, word(true), ins(jgt, hi, 3, 0), ins(jeq, hi, 0, fail),
						word(false), ins(jgt, lo, 0, fail))
				default:
					return nil, fmt.Errorf("%s: argument operator %s not compiled", name, a.Op)
				}
			}
			block = append(block, ins(ret, act, 0, 0))
			for i := range block { // resolve the jumps to the block's end
				for _, j := range []*uint8{&block[i].Jt, &block[i].Jf} {
					if *j == fail && block[i].Code&0x07 == unix.BPF_JMP {
						*j = uint8(len(block) - 1 - i)
					}
				}
			}
			prog = append(prog, block...)
		}
	}
	prog = append(prog, ins(ret, def, 0, 0))
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("filter of %d instructions", len(prog))
	}
	return prog, nil
}

func action(a specs.LinuxSeccompAction, errno *uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW, nil
	case specs.ActErrno:
		e := uint32(unix.EPERM)
		if errno != nil {
			e = uint32(*errno)
		}
		return unix.SECCOMP_RET_ERRNO | e&unix.SECCOMP_RET_DATA, nil
	}
	return 0, fmt.Errorf("seccomp action %s not compiled", a)
}

// syscallNumbers reads the kernel headers' __NR_ names.
func syscallNumbers(header string) (map[string]uint32, error) {
	f, err := os.Open(header)
	if err != nil {
		return nil, fmt.Errorf("syscall numbers: %w", err)
	}
	defer f.Close()
	numbers := map[string]uint32{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 || fields[0] != "#define" || !strings.HasPrefix(fields[1], "__NR_") {
			continue
		}
		if n, err := strconv.ParseUint(fields[2], 10, 32); err == nil {
			numbers[strings.TrimPrefix(fields[1], "__NR_")] = uint32(n)
		}
	}
	return numbers, sc.Err()
}

// encodeFilter is a filter as filterEnv carries it.
func encodeFilter(prog []unix.SockFilter) string {
	raw := make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		raw = binary.LittleEndian.AppendUint16(raw, in.Code)
		raw = append(raw, in.Jt, in.Jf)
		raw = binary.LittleEndian.AppendUint32(raw, in.K)
	}
	return base64.StdEncoding.EncodeToString(raw)
}
