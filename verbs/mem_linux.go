//go:build linux && cgo

package verbs

/*
#cgo LDFLAGS: -libverbs
#include "cverbs.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goxrc/goxrc/internal/faults"
)

// PD is a protection domain.
type PD struct {
	l   lifecycle
	c   *Context
	pd  *C.struct_ibv_pd
	tag string
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	if c == nil || c.ctx == nil || !c.l.ref() {
		return nil, closedErr("ibv_alloc_pd", c.addr())
	}
	var p *C.struct_ibv_pd
	err := faults.Check("ibv_alloc_pd")
	if err == nil {
		p, err = C.ibv_alloc_pd(c.ctx)
	}
	if p == nil {
		c.l.unref()
		return nil, &OpError{Op: "ibv_alloc_pd", Addr: c.name, Err: errnoOr(err, syscall.ENOMEM)}
	}
	pd := &PD{c: c, pd: p, tag: c.name + " pd"}
	live.pds.Created(pd)
	return pd, nil
}

func (p *PD) addr() string {
	if p == nil {
		return ""
	}
	return p.tag
}

// Context returns the device the PD belongs to.
func (p *PD) Context() *Context {
	if p == nil {
		return nil
	}
	return p.c
}

// Close deallocates the PD. It fails with EBUSY while MRs, QPs, SRQs or AHs
// of the PD are open. Close is idempotent.
func (p *PD) Close() error {
	if p == nil || p.pd == nil {
		return nil
	}
	already, err := p.l.beginClose("ibv_dealloc_pd", p.tag, "MRs, QPs, SRQs and AHs")
	if already || err != nil {
		return err
	}
	if rc, cerr := C.ibv_dealloc_pd(p.pd); rc != 0 {
		p.l.endClose(false)
		return &OpError{Op: "ibv_dealloc_pd", Addr: p.tag, Err: rcErr(rc, cerr)}
	}
	p.l.endClose(true)
	live.pds.Destroyed(p)
	p.c.l.unref()
	return nil
}

// MR is a registered memory region whose memory lives outside the Go heap
// (an anonymous mapping), so the device may read and write it at any time
// without the Go garbage collector moving or freeing it.
type MR struct {
	l   lifecycle
	pd  *PD
	mr  *C.struct_ibv_mr
	buf []byte // the mapping, page-rounded
	n   int
}

// RegMR maps size bytes of page-aligned memory and registers them with the
// given access. Remote write and remote atomic access need AccessLocalWrite
// too (the verbs rule); RegMR adds it for them.
func (p *PD) RegMR(size int, access Access) (*MR, error) {
	if size <= 0 {
		return nil, &OpError{Op: "ibv_reg_mr", Addr: p.addr(), Err: &explained{syscall.EINVAL, fmt.Sprintf("size %d", size)}}
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 {
		access |= AccessLocalWrite
	}
	if p == nil || p.pd == nil || !p.l.ref() {
		return nil, closedErr("ibv_reg_mr", p.addr())
	}
	page := os.Getpagesize()
	buf, err := unix.Mmap(-1, 0, (size+page-1)/page*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		p.l.unref()
		return nil, &OpError{Op: "mmap", Addr: p.tag, Err: err}
	}
	var m *C.struct_ibv_mr
	cerr := faults.Check("ibv_reg_mr")
	if cerr == nil {
		m, cerr = C.goxrc_reg_mr(p.pd, unsafe.Pointer(&buf[0]), C.size_t(size), C.int(access))
	}
	if m == nil {
		unix.Munmap(buf)
		p.l.unref()
		err := errnoOr(cerr, syscall.ENOMEM)
		if err == syscall.ENOMEM {
			err = memlockHint(size)
		}
		return nil, &OpError{Op: "ibv_reg_mr", Addr: p.tag, Err: err}
	}
	mr := &MR{pd: p, mr: m, buf: buf, n: size}
	live.mrs.Created(mr)
	return mr, nil
}

// memlockHint explains a registration's ENOMEM where RLIMIT_MEMLOCK is
// the cause: the kernel counts the pages a registration pins (VmPin) against
// that limit, unless the process has CAP_IPC_LOCK, and the limit is small by
// default (8 MiB or 64 KiB), under one connection's buffers at cm's default
// sizes.
func memlockHint(size int) error {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) != nil || lim.Cur == unix.RLIM_INFINITY {
		return syscall.ENOMEM
	}
	capEff, pinnedKiB, ok := procStatus()
	if !ok || capEff&(1<<unix.CAP_IPC_LOCK) != 0 || pinnedKiB*1024+uint64(size) <= lim.Cur {
		return syscall.ENOMEM
	}
	return &explained{syscall.ENOMEM, fmt.Sprintf(
		"registering %d bytes beside %d KiB pinned: over RLIMIT_MEMLOCK, %d KiB for this process (ulimit -l), "+
			"which lacks CAP_IPC_LOCK: raise the limit (ulimit -l, systemd's LimitMEMLOCK=, memlock in limits.conf) or register less",
		size, pinnedKiB, lim.Cur/1024)}
}

// procStatus reads the process's effective capabilities and pinned memory
// from /proc/self/status (CapEff, a hex mask; VmPin, in KiB).
func procStatus() (capEff, pinnedKiB uint64, ok bool) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, false
	}
	var seen int
	for _, line := range strings.Split(string(status), "\n") {
		key, value, _ := strings.Cut(line, ":")
		value = strings.TrimSpace(value)
		switch key {
		case "CapEff":
			capEff, err = strconv.ParseUint(value, 16, 64)
		case "VmPin":
			pinnedKiB, err = strconv.ParseUint(strings.TrimSuffix(value, " kB"), 10, 64)
		default:
			continue
		}
		if err != nil {
			return 0, 0, false
		}
		seen++
	}
	return capEff, pinnedKiB, seen == 2
}

// Bytes returns the region's memory. The slice is valid until Close; do not
// keep it beyond that.
func (m *MR) Bytes() []byte {
	if m == nil || m.mr == nil || !m.l.use() {
		return nil
	}
	defer m.l.done()
	return m.buf[:m.n:m.n]
}

// LKey returns the local key for SGEs; 0 after Close.
func (m *MR) LKey() uint32 {
	if m == nil || m.mr == nil || !m.l.use() {
		return 0
	}
	defer m.l.done()
	return uint32(m.mr.lkey)
}

// RKey returns the key a peer uses for RDMA and atomics on this region.
func (m *MR) RKey() uint32 {
	if m == nil || m.mr == nil || !m.l.use() {
		return 0
	}
	defer m.l.done()
	return uint32(m.mr.rkey)
}

// Addr returns the region's start address, for SGEs and for peers.
func (m *MR) Addr() uint64 {
	if m == nil || m.mr == nil || !m.l.use() {
		return 0
	}
	defer m.l.done()
	return uint64(uintptr(unsafe.Pointer(&m.buf[0])))
}

// Len returns the registered length in bytes.
func (m *MR) Len() int {
	if m == nil {
		return 0
	}
	return m.n
}

// SGE returns an SGE for the n bytes at offset off of the region. An SGE's
// length is 32 bits: n must be under 4 GiB (split larger transfers).
func (m *MR) SGE(off, n int) SGE {
	return SGE{Addr: m.Addr() + uint64(off), Length: uint32(n), LKey: m.LKey()}
}

// Close deregisters the region and unmaps its memory. Close is idempotent.
func (m *MR) Close() error {
	if m == nil || m.mr == nil {
		return nil
	}
	already, err := m.l.beginClose("ibv_dereg_mr", m.pd.tag, "")
	if already || err != nil {
		return err
	}
	if rc, cerr := C.ibv_dereg_mr(m.mr); rc != 0 {
		m.l.endClose(false)
		return &OpError{Op: "ibv_dereg_mr", Addr: m.pd.tag, Err: rcErr(rc, cerr)}
	}
	unix.Munmap(m.buf)
	m.buf = nil
	m.l.endClose(true)
	live.mrs.Destroyed(m)
	m.pd.l.unref()
	return nil
}

// AH is an address handle: a destination for UD sends.
type AH struct {
	l  lifecycle
	pd *PD
	ah *C.struct_ibv_ah
}

// CreateAH creates an address handle for UD sends.
func (p *PD) CreateAH(attr AHAttr) (*AH, error) {
	if p == nil || p.pd == nil || !p.l.ref() {
		return nil, closedErr("ibv_create_ah", p.addr())
	}
	var ca C.struct_ibv_ah_attr
	ahAttrToC(&attr, &ca)
	a, err := C.ibv_create_ah(p.pd, &ca)
	if a == nil {
		p.l.unref()
		return nil, &OpError{Op: "ibv_create_ah", Addr: p.tag, Err: errnoOr(err, syscall.EINVAL)}
	}
	ah := &AH{pd: p, ah: a}
	live.ahs.Created(ah)
	return ah, nil
}

// Close destroys the address handle. Close is idempotent.
func (a *AH) Close() error {
	if a == nil || a.ah == nil {
		return nil
	}
	already, err := a.l.beginClose("ibv_destroy_ah", a.pd.tag, "")
	if already || err != nil {
		return err
	}
	if rc, cerr := C.ibv_destroy_ah(a.ah); rc != 0 {
		a.l.endClose(false)
		return &OpError{Op: "ibv_destroy_ah", Addr: a.pd.tag, Err: rcErr(rc, cerr)}
	}
	a.l.endClose(true)
	live.ahs.Destroyed(a)
	a.pd.l.unref()
	return nil
}

// XRCD is an XRC domain. Processes on one node that open the same file on
// the same device share one domain.
type XRCD struct {
	l    lifecycle
	c    *Context
	x    *C.struct_ibv_xrcd
	tag  string
	path string
}

// OpenXRCD opens the XRC domain bound to the file at path, or a private
// domain when path is "". The file is opened (created with mode 0600 under
// XRCDCreate) only to name its inode: the kernel keys domains by inode, so
// it may be closed right after. Errors the kernel gives are explained:
// EAGAIN (no such domain and no XRCDCreate), EINVAL (XRCDExclusive on an
// existing domain); devices without XRC give an error matching
// ErrNotSupported.
func (c *Context) OpenXRCD(path string, flags XRCDFlags) (*XRCD, error) {
	tag := c.addr() + " xrcd"
	if path != "" {
		tag += " " + path
	} else {
		tag += " (private)"
	}
	if c == nil || c.ctx == nil || !c.l.ref() {
		return nil, closedErr("ibv_open_xrcd", tag)
	}
	fd, oflags := -1, 0
	if flags&XRCDCreate != 0 {
		oflags |= unix.O_CREAT
	}
	if flags&XRCDExclusive != 0 {
		oflags |= unix.O_EXCL
	}
	if path != "" {
		// Only the inode names the domain: reading is enough, so a file
		// of another user's, readable to us, serves too.
		fileFlags := unix.O_RDONLY | unix.O_CLOEXEC
		if flags&XRCDCreate != 0 {
			fileFlags |= unix.O_CREAT
		}
		var err error
		fd, err = unix.Open(path, fileFlags, 0o600)
		if err != nil {
			c.l.unref()
			return nil, &OpError{Op: "open XRC domain file", Addr: tag, Err: &os.PathError{Op: "open", Path: path, Err: err}}
		}
		defer unix.Close(fd)
	}
	x, err := C.goxrc_open_xrcd(c.ctx, C.int(fd), C.int(oflags))
	if x == nil {
		c.l.unref()
		e := errnoOr(err, syscall.EOPNOTSUPP).(syscall.Errno)
		return nil, &OpError{Op: "ibv_open_xrcd", Addr: tag, Err: explainXRCD(e, c.name)}
	}
	xd := &XRCD{c: c, x: x, tag: tag, path: path}
	live.xrcds.Created(xd)
	return xd, nil
}

func explainXRCD(e syscall.Errno, dev string) error {
	switch e {
	case syscall.EAGAIN:
		return &explained{e, "no XRC domain exists for this file yet and XRCDCreate was not given"}
	case syscall.EINVAL:
		return &explained{e, "the XRC domain exists already (XRCDExclusive), or the request is invalid"}
	case syscall.EOPNOTSUPP, syscall.ENOSYS:
		return &explained{e, "device " + dev + " has no XRC support"}
	}
	return e
}

func (x *XRCD) addr() string {
	if x == nil {
		return ""
	}
	return x.tag
}

// Path returns the domain file, "" for a private domain.
func (x *XRCD) Path() string {
	if x == nil {
		return ""
	}
	return x.path
}

// Close closes the domain. While this process still has QPs or SRQs in it,
// Close fails with EBUSY and the domain stays open. Close is idempotent.
func (x *XRCD) Close() error {
	if x == nil || x.x == nil {
		return nil
	}
	already, err := x.l.beginClose("ibv_close_xrcd", x.tag, "XRC QPs and SRQs of the domain")
	if already || err != nil {
		return err
	}
	if rc, cerr := C.goxrc_close_xrcd(x.x); rc != 0 {
		x.l.endClose(false)
		e := rcErr(rc, cerr)
		if errors.Is(e, syscall.EBUSY) {
			e = &explained{syscall.EBUSY, "the domain still has QPs or SRQs of this process"}
		}
		return &OpError{Op: "ibv_close_xrcd", Addr: x.tag, Err: e}
	}
	x.l.endClose(true)
	live.xrcds.Destroyed(x)
	x.c.l.unref()
	return nil
}

func ahAttrToC(a *AHAttr, c *C.struct_ibv_ah_attr) {
	*c = C.struct_ibv_ah_attr{}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&c.grh.dgid)), 16), a.GRH.DGID[:])
	c.grh.flow_label = C.uint32_t(a.GRH.FlowLabel)
	c.grh.sgid_index = C.uint8_t(a.GRH.SGIDIndex)
	c.grh.hop_limit = C.uint8_t(a.GRH.HopLimit)
	c.grh.traffic_class = C.uint8_t(a.GRH.TrafficClass)
	c.dlid = C.uint16_t(a.DLID)
	c.sl = C.uint8_t(a.SL)
	c.src_path_bits = C.uint8_t(a.SrcPathBits)
	c.static_rate = C.uint8_t(a.StaticRate)
	if a.IsGlobal {
		c.is_global = 1
	}
	c.port_num = C.uint8_t(a.PortNum)
}

func ahAttrFromC(c *C.struct_ibv_ah_attr) AHAttr {
	var a AHAttr
	copy(a.GRH.DGID[:], unsafe.Slice((*byte)(unsafe.Pointer(&c.grh.dgid)), 16))
	a.GRH.FlowLabel = uint32(c.grh.flow_label)
	a.GRH.SGIDIndex = uint8(c.grh.sgid_index)
	a.GRH.HopLimit = uint8(c.grh.hop_limit)
	a.GRH.TrafficClass = uint8(c.grh.traffic_class)
	a.DLID = uint16(c.dlid)
	a.SL = uint8(c.sl)
	a.SrcPathBits = uint8(c.src_path_bits)
	a.StaticRate = uint8(c.static_rate)
	a.IsGlobal = c.is_global != 0
	a.PortNum = uint8(c.port_num)
	return a
}
