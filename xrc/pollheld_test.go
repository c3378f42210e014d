package xrc

import (
	"testing"
	"time"
)

// Two one-off send poll failures apart on an uplink whose only leg is a
// first-contact dial held for its reverse leg (firstHeld), the second on
// the dial's first frame once it is up: the second recovery spares the
// connection, which then carries messages both ways. It guards against the
// second failure being taken for a poll that fails on every INI
// (errSendPoll), failing the connection, because the first recovery sent
// nothing that proves the new INI's poll (its keepalive would complete the
// acceptor's half: d33f63f), as in TestEndpointSendPollFailsTwiceApart
// before 963f5b0.
func TestHeldDialSendPollFailsTwiceApart(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	a, b, p, g, dialed := heldDialRecovered(t, ctx, "10.0.97.7", "10.0.97.8")
	p.armed.Store(true) // the next poll that takes a completion fails
	close(g.release)
	c, d := dialedAccepted(t, dialed, b)
	defer c.Close()
	defer d.Close()
	requireSecondRecoverySpares(t, a, c)
	roundTrip(t, c, d, []byte("forward"))
	roundTrip(t, d, c, []byte("reverse"))
}
