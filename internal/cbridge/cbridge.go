// Package cbridge lets rdmacm wrap C objects that librdmacm hands out (the
// ibv_context a CM id is bound to, the ibv_qp_attr from rdma_init_qp_attr) as
// verbs types, without putting C types or unsafe pointers in any exported API.
// cgo gives each package its own C types, so the currency is unsafe.Pointer,
// and only package verbs knows how to read them. verbs fills these hooks in
// its init; rdmacm calls them.
package cbridge

import "unsafe"

var (
	// WrapContext returns a *verbs.Context for a struct ibv_context owned by
	// librdmacm. Closing the wrapper releases only Go-side resources.
	WrapContext func(ctx unsafe.Pointer) any

	// QPAttrFromC converts a struct ibv_qp_attr into a verbs.QPAttr.
	QPAttrFromC func(attr unsafe.Pointer) any

	// AHAttrFromC converts a struct ibv_ah_attr into a verbs.AHAttr.
	AHAttrFromC func(attr unsafe.Pointer) any

	// ModifyQP lets rdmacm change a *verbs.QP's state in C: it calls move
	// with the struct ibv_qp and its current state while holding the QP
	// open and its state lock, and records the state move says it reached
	// (-1: unknown). Its error is move's, or the QP's closed error.
	ModifyQP func(qp any, move func(qp unsafe.Pointer, state int) (reached int, err error)) error
)
