// The events ring buffer, read as the kernel shares it: its records are
// taken in batches and kept (journaled) before the consumer position lets
// the kernel reuse their space, so that a record is either still in the
// ring or kept, whenever the agent dies.

package tracer

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

const (
	ringBusy   = 1 << 31 // BPF_RINGBUF_BUSY_BIT: the record is being written
	ringDrop   = 1 << 30 // BPF_RINGBUF_DISCARD_BIT: the record was discarded
	ringHeader = 8       // BPF_RINGBUF_HDR_SZ
)

// ring reads a BPF ring buffer map through its mappings: the consumer
// page, writable, and the producer page with the data mapped twice, so
// that a record wrapping around the end reads as one slice.
type ring struct {
	consPage, dataPages []byte
	cons, prod          *uint64
	data                []byte
	mask                uint64

	poll     int // epoll on the map and wake
	wake     int // eventfd written by Flush and Close
	events   []unix.EpollEvent
	flushes  atomic.Uint64
	closed   atomic.Bool
	mu       sync.Mutex // wake's writers against release
	released bool       // unmapped: set under mu and the reader's lock (Tracer.readMu)
}

func openRing(m *ebpf.Map) (*ring, error) {
	size := uint64(m.MaxEntries())
	page := os.Getpagesize()
	fd := m.FD()
	consPage, err := unix.Mmap(fd, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the ring buffer's consumer page: %w", err)
	}
	dataPages, err := unix.Mmap(fd, int64(page), page+2*int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(consPage)
		return nil, fmt.Errorf("map the ring buffer: %w", err)
	}
	r := &ring{
		consPage: consPage, dataPages: dataPages,
		cons:   (*uint64)(unsafe.Pointer(&consPage[0])),
		prod:   (*uint64)(unsafe.Pointer(&dataPages[0])),
		data:   dataPages[page:],
		mask:   size - 1,
		events: make([]unix.EpollEvent, 2),
	}
	if err := r.openPoll(fd); err != nil {
		r.unmap()
		return nil, err
	}
	return r, nil
}

func (r *ring) openPoll(fd int) error {
	var err error
	if r.poll, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	if r.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		unix.Close(r.poll)
		return fmt.Errorf("eventfd: %w", err)
	}
	for _, f := range []int{fd, r.wake} {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(f)}
		if err := unix.EpollCtl(r.poll, unix.EPOLL_CTL_ADD, f, &ev); err != nil {
			unix.Close(r.poll)
			unix.Close(r.wake)
			return fmt.Errorf("epoll: %w", err)
		}
	}
	return nil
}

func (r *ring) unmap() {
	unix.Munmap(r.consPage)
	unix.Munmap(r.dataPages)
}

// position is the consumer position: where the next record starts.
func (r *ring) position() uint64 { return atomic.LoadUint64(r.cons) }

// pending is how many bytes the producer wrote past the consumer.
func (r *ring) pending() uint64 { return atomic.LoadUint64(r.prod) - atomic.LoadUint64(r.cons) }

// skipTo moves the consumer position to pos, if ahead: the records before
// are kept already (replayed from the journal).
func (r *ring) skipTo(pos uint64) {
	if pos > r.position() && pos <= atomic.LoadUint64(r.prod) {
		atomic.StoreUint64(r.cons, pos)
	}
}

// skipAll lets every record written so far go unread.
func (r *ring) skipAll() { atomic.StoreUint64(r.cons, atomic.LoadUint64(r.prod)) }

// take calls each with every whole record written since the consumer
// position, and its position, then keep; only once keep succeeded does the
// consumer position pass them. It reports whether it found any.
func (r *ring) take(each func(pos uint64, raw []byte), keep func() error) (bool, error) {
	cons := atomic.LoadUint64(r.cons)
	prod := atomic.LoadUint64(r.prod)
	start := cons
	for cons < prod {
		at := cons & r.mask
		head := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[at])))
		if head&ringBusy != 0 {
			break // written in order: the next ones wait for it
		}
		n := uint64(head &^ (ringBusy | ringDrop))
		if head&ringDrop == 0 {
			each(cons, r.data[at+ringHeader:at+ringHeader+n])
		}
		cons += recordSpan(int(n))
	}
	if cons == start {
		return false, nil
	}
	if err := keep(); err != nil {
		return false, err
	}
	atomic.StoreUint64(r.cons, cons)
	return true, nil
}

// wait blocks until the ring may have records, a flush or close was asked,
// or timeout passed.
func (r *ring) wait(timeout time.Duration) error {
	_, err := unix.EpollWait(r.poll, r.events, int(timeout.Milliseconds()))
	if err != nil && err != unix.EINTR {
		return fmt.Errorf("wait for the ring buffer: %w", err)
	}
	var b [8]byte
	unix.Read(r.wake, b[:]) // the wake-up, consumed; nonblocking
	return nil
}

// flush asks the reader to return ringbuf.ErrFlushed once it read what
// was written before.
func (r *ring) flush() error {
	r.flushes.Add(1)
	return r.signal()
}

func (r *ring) signal() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return os.ErrClosed
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], 1)
	if _, err := unix.Write(r.wake, b[:]); err != nil {
		return fmt.Errorf("wake the ring buffer's reader: %w", err)
	}
	return nil
}

// close wakes the reader to return os.ErrClosed; release unmaps the ring
// once it did.
func (r *ring) close() {
	r.closed.Store(true)
	r.signal()
}

func (r *ring) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return
	}
	r.released = true
	unix.Close(r.poll)
	unix.Close(r.wake)
	r.unmap()
}
