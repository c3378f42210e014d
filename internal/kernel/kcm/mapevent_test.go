package kcm

import (
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/rdmacm"
)

// An ADDR_ERROR or ROUTE_ERROR after the request (the kernel turns a SIDR
// REP whose qkey it refuses into ADDR_ERROR) ends the exchange with its
// errno, as CONNECT_ERROR does; it was dropped, and the exchange waited
// for ever.
func TestLateResolutionErrorsEndTheExchange(t *testing.T) {
	c := &CM{ids: map[kernel.ID]*entry{}}
	for _, typ := range []rdmacm.EventType{rdmacm.EventAddrError, rdmacm.EventRouteError} {
		for _, ex := range []kernel.Exchange{kernel.ExchangeSIDR, kernel.ExchangeXRC} {
			ke, ok := c.mapEvent(1, &entry{ex: ex}, rdmacm.Event{Type: typ, Status: -22})
			if !ok || ke.Type != kernel.EventUnreachable || ke.Status != -22 {
				t.Errorf("%v on a %v exchange: %+v (passed on: %v), want UNREACHABLE with status -22", typ, ex, ke, ok)
			}
		}
	}
}
