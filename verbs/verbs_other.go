//go:build !linux || !cgo

package verbs

import (
	"context"
	"time"
)

// This build has no libibverbs (not Linux, or cgo disabled): every call
// fails with an error matching ErrNotSupported, and the API stays the same.

func unsupported(op string) error {
	return &OpError{Op: op, Err: &stubError{}}
}

type stubError struct{}

func (*stubError) Error() string {
	return "RDMA verbs need Linux and cgo (libibverbs); this build has neither"
}
func (*stubError) Is(target error) bool { return target == ErrNotSupported }

// Devices is not supported in this build.
func Devices() ([]DeviceInfo, error) { return nil, unsupported("ibv_get_device_list") }

// OpenDevice is not supported in this build.
func OpenDevice(name string) (*Context, error) {
	return nil, &OpError{Op: "open device", Addr: name, Err: &stubError{}}
}

// Context is an open RDMA device.
type Context struct{}

func (c *Context) Name() string { return "" }
func (c *Context) QueryDevice() (DeviceAttr, error) {
	return DeviceAttr{}, unsupported("ibv_query_device")
}
func (c *Context) QueryPort(uint8) (PortAttr, error) {
	return PortAttr{}, unsupported("ibv_query_port")
}
func (c *Context) GIDs(uint8) ([]GIDEntry, error) { return nil, unsupported("ibv_query_gid_table") }
func (c *Context) AsyncEvents() <-chan AsyncEvent { return nil }
func (c *Context) AsyncErr() error                { return unsupported("ibv_get_async_event") }
func (c *Context) Close() error                   { return nil }
func (c *Context) AllocPD() (*PD, error)          { return nil, unsupported("ibv_alloc_pd") }
func (c *Context) NewCompChannel() (*CompChannel, error) {
	return nil, unsupported("ibv_create_comp_channel")
}
func (c *Context) NewSharedCompChannel() (*CompChannel, error) {
	return nil, unsupported("ibv_create_comp_channel")
}
func (c *Context) CreateCQ(int, *CompChannel, int) (*CQ, error) {
	return nil, unsupported("ibv_create_cq")
}
func (c *Context) OpenXRCD(string, XRCDFlags) (*XRCD, error) {
	return nil, unsupported("ibv_open_xrcd")
}
func (c *Context) CreateXRCRecvQP(*XRCD) (*QP, error) { return nil, unsupported("ibv_create_qp_ex") }
func (c *Context) OpenQP(*XRCD, uint32) (*QP, error)  { return nil, unsupported("ibv_open_qp") }

// PD is a protection domain.
type PD struct{}

func (p *PD) Context() *Context               { return nil }
func (p *PD) Close() error                    { return nil }
func (p *PD) RegMR(int, Access) (*MR, error)  { return nil, unsupported("ibv_reg_mr") }
func (p *PD) CreateAH(AHAttr) (*AH, error)    { return nil, unsupported("ibv_create_ah") }
func (p *PD) CreateQP(QPInit) (*QP, error)    { return nil, unsupported("ibv_create_qp_ex") }
func (p *PD) CreateSRQ(SRQInit) (*SRQ, error) { return nil, unsupported("ibv_create_srq") }
func (p *PD) CreateXRCSRQ(*XRCD, *CQ, SRQInit) (*SRQ, error) {
	return nil, unsupported("ibv_create_srq_ex")
}

// MR is a registered memory region.
type MR struct{}

func (m *MR) Bytes() []byte      { return nil }
func (m *MR) LKey() uint32       { return 0 }
func (m *MR) RKey() uint32       { return 0 }
func (m *MR) Addr() uint64       { return 0 }
func (m *MR) Len() int           { return 0 }
func (m *MR) SGE(off, n int) SGE { return SGE{} }
func (m *MR) Close() error       { return nil }

// AH is an address handle.
type AH struct{}

func (a *AH) Close() error { return nil }

// XRCD is an XRC domain.
type XRCD struct{}

func (x *XRCD) Path() string { return "" }
func (x *XRCD) Close() error { return nil }

// CompChannel is a completion channel.
type CompChannel struct{}

func (ch *CompChannel) Close() error { return nil }
func (ch *CompChannel) GetEvents(context.Context, []*CQ) (int, error) {
	return 0, unsupported("get CQ events")
}

// CQ is a completion queue.
type CQ struct{}

func (q *CQ) CQE() int                           { return 0 }
func (q *CQ) Poll([]WorkCompletion) (int, error) { return 0, unsupported("ibv_poll_cq") }
func (q *CQ) ReqNotify(bool) error               { return unsupported("ibv_req_notify_cq") }
func (q *CQ) Close() error                       { return nil }
func (q *CQ) PollOrArm([]WorkCompletion) (int, bool, error) {
	return 0, false, unsupported("ibv_poll_cq")
}
func (q *CQ) PollSpin([]WorkCompletion, time.Duration) (int, error) {
	return 0, unsupported("ibv_poll_cq")
}
func (q *CQ) Wait(context.Context, []WorkCompletion) (int, error) {
	return 0, unsupported("wait CQ")
}

// QP is a queue pair.
type QP struct{}

func (q *QP) Num() uint32                      { return 0 }
func (q *QP) Type() QPType                     { return 0 }
func (q *QP) Cap() QPCap                       { return QPCap{} }
func (q *QP) Modify(*QPAttr, QPAttrMask) error { return unsupported("ibv_modify_qp") }
func (q *QP) Query(QPAttrMask) (QPAttr, QPCap, error) {
	return QPAttr{}, QPCap{}, unsupported("ibv_query_qp")
}
func (q *QP) PostSend([]SendWR) error { return unsupported("ibv_post_send") }
func (q *QP) PostRecv([]RecvWR) error { return unsupported("ibv_post_recv") }
func (q *QP) Close() error            { return nil }

// SRQ is a shared receive queue.
type SRQ struct{}

func (s *SRQ) Num() (uint32, error)    { return 0, unsupported("ibv_get_srq_num") }
func (s *SRQ) Arm(uint32) error        { return unsupported("ibv_modify_srq") }
func (s *SRQ) PostRecv([]RecvWR) error { return unsupported("ibv_post_srq_recv") }
func (s *SRQ) Close() error            { return nil }
