package rdmacm

import (
	"github.com/goxrc/goxrc/internal/cbridge"
	"github.com/goxrc/goxrc/verbs"
)

// VerbsContext returns a new *verbs.Context for the device context (struct
// ibv_context) the id is bound to, for creating PDs, CQs and QPs beside the
// CM connection. It is nil before the id is bound to a device (Bind to a
// device's address, ResolveAddr, or a CONNECT_REQUEST) and after Close.
//
// librdmacm owns the device context and keeps it open while the device is
// there; the wrapper is the caller's: Close it after everything created on
// it (that releases only Go-side resources, and verbs.Counts counts it
// until then). Once the device is removed (EventDeviceRemoval), librdmacm
// closes the context when no id is left on the device and it notices the
// device is gone: destroy the PDs, CQs, QPs and other objects made on the
// wrapper before the last id on a removed device (package cm does), or
// their Close uses a freed context; so with the wrapper itself once its
// AsyncEvents were asked for (their reader reads the context until Close). verbs requires
// the objects one QP uses (PD, CQs, SRQ) to come from one wrapper, so take
// the wrapper once per device, for instance from the listener or the first
// id, and reuse it for every id on that device.
func (id *ID) VerbsContext() *verbs.Context {
	return readID(id, func() *verbs.Context {
		p := id.sysVerbs()
		if p == nil || cbridge.WrapContext == nil {
			return nil
		}
		c, _ := cbridge.WrapContext(p).(*verbs.Context)
		return c
	})
}
