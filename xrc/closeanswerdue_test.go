package xrc

import (
	"fmt"
	"testing"
)

// answerDue is what the endpoint's Close would decide for c now: wait for
// the peer's FIN that answers ours, or not.
func answerDue(c *Conn) bool {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.answerDueLocked()
}

// The endpoint's Close waits for an answering FIN only where one can still
// come (TestEndpointCloseWaitsForAnsweringFINs): it waited its whole second
// for a peer that had died, whose INI was gone, or that had answered
// already, at each Close of an endpoint left with such a connection. A
// paused peer, alive, answers once it reads: that one is waited for.
func TestCloseAwaitsOnlyAnswersThatCanCome(t *testing.T) {
	w := newWorld(t)
	t.Run("peer answered", func(t *testing.T) {
		a, b := w.endpoint("10.0.231.1", 7000), w.endpoint("10.0.231.2", 7000)
		ca, cb := pair(t, a, b)
		cb.Close()
		<-ca.done // a answered with its FIN
		<-cb.done
		if answerDue(cb) {
			t.Fatal("an answer is due after the peer's FIN came")
		}
	})
	t.Run("peer killed", func(t *testing.T) {
		a, b := w.endpoint("10.0.231.3", 7000), w.endpoint("10.0.231.4", 7000, longTimers)
		_, cb := pair(t, a, b)
		a.p.Kill()
		cb.Close() // its FIN finds no receiver
		if answerDue(cb) {
			t.Fatal("an answer is due from a killed peer that our FIN did not reach")
		}
	})
	t.Run("peer paused, then its INI gone", func(t *testing.T) {
		a, b := w.endpoint("10.0.231.5", 7000), w.endpoint("10.0.231.6", 7000, longTimers)
		_, cb := pair(t, a, b)
		a.p.PauseReceives()
		cb.Close()
		if !answerDue(cb) {
			t.Fatal("no answer due from a paused peer, alive, that has our FIN")
		}
		a.p.Kill() // its kernel ends its INI: the DREQ comes, no FIN
		eventually(t, "the peer's INI known gone", func() (bool, string) {
			return !answerDue(cb), fmt.Sprintf("%+v", b.Stats())
		})
		select {
		case <-cb.done:
			t.Fatal("the connection ended: the case is the sender gone before the verdict")
		default:
		}
	})
}
