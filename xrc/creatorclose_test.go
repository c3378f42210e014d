package xrc

import (
	"fmt"
	"testing"
	"time"
)

// The TGT creator closes its endpoint gracefully while the sender streams
// to a sharer on the same TGT: the stream arrives whole, and the sender
// ends with one uplink and one connection.
func TestEndpointCreatorCloseUnderStream(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.60.1", 7000)
	r1, r2 := w.endpoint("10.0.60.2", 7001), w.endpoint("10.0.60.2", 7002)
	pair(t, s, r1)
	s2, c2 := pair(t, s, r2)
	done := stream(t, ctxT(t, 20*time.Second), s2, c2, r2)
	r1.Close()
	done()
	roundTrip(t, s2, c2, []byte("after"))
	roundTrip(t, c2, s2, []byte("back"))
	eventually(t, "s settled", func() (bool, string) {
		st := s.Stats()
		return st.Conns == 1 && st.Uplinks == 1 && st.LocalCounts == 1, fmt.Sprintf("%+v", st)
	})
}
