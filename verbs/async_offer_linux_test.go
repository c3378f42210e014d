//go:build linux && cgo

package verbs

import "testing"

// Once a wrapper's Close has begun (unsubscribeAsync closed its stop), the
// pump delivers it no more events. It offered each one with a select over
// the wrapper's channel and its stop, which with room in the channel picks
// at random: the events read while the Close ran were delivered or dropped
// each by a coin flip, so a reader could get a later event after an
// earlier one was dropped. 32 events after the stop: the old select
// delivers none of them with odds of one in 2^32.
func TestAsyncEventsAfterStopAreNotDelivered(t *testing.T) {
	s := &asyncSub{ch: make(chan AsyncEvent, 64), stop: make(chan struct{})}
	s.offer(AsyncEvent{Type: EventPortActive, Port: 1})
	close(s.stop) // unsubscribeAsync: the wrapper's Close began
	for i := range 32 {
		s.offer(AsyncEvent{Type: EventQPFatal, QPNum: uint32(i)})
	}
	if n := len(s.ch); n != 1 {
		var got []uint32
		for range n {
			if ev := <-s.ch; ev.Type == EventQPFatal {
				got = append(got, ev.QPNum)
			}
		}
		t.Fatalf("%d events delivered, want only the one offered before the stop; after it: QPs %v", n, got)
	}
	if ev := <-s.ch; ev.Type != EventPortActive {
		t.Fatalf("delivered %v, want the event offered before the stop", ev.Type)
	}
}
