package model

import (
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A DREQ sent before the node went off, not yet answered with a DREP, must
// time out too (DISCONNECTED, TIMEWAIT_EXIT): the peer that would have
// answered is gone.
func TestZZModelPowerOffPendingDREQ(t *testing.T) {
	_, a, b := twoNodes(t, ReuseLIFO)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	ok(t, sa.p.Disconnect(k.aid))                   // DREQ
	event(t, sb.p, k.pid, kernel.EventDisconnected) // b has not answered yet
	b.PowerOff()
	event(t, sa.p, k.aid, kernel.EventDisconnected)
	event(t, sa.p, k.aid, kernel.EventTimewaitExit)
}
